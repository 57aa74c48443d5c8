"""Compression kernels: one public function per operation, dispatching on device.

CUDA tensors run fused Triton kernels when Triton is importable (``pip install
commgym[kernels]``); contiguous CPU tensors run the fused numba kernels of
:mod:`commgym.collectives.kernels.cpu_kernels`; anything else runs the pure-torch
reference in :mod:`commgym.collectives.kernels.reference`, which defines the semantics
(rounding, clamping, scale formula, NaN policy, packing layout) that both fused
implementations match bit for bit. The compressors call only these functions, so there is
one code path for CPU and GPU.

``COMMGYM_CPU_KERNELS=reference`` in the environment makes CPU tensors use the reference
(for comparisons; the default is ``fused``).
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

import torch

from commgym.collectives.kernels import reference
from commgym.collectives.kernels.reference import (
    CHUNK_SIZE,
    hash_uniform,
    num_chunks,
    packed_nbytes,
    seed_mix,
    topk_k,
)

__all__ = [
    "CHUNK_SIZE",
    "backend_for",
    "dequantize_accumulate",
    "hash_uniform",
    "num_chunks",
    "packed_nbytes",
    "powersgd_residual",
    "quantize_ef",
    "randomk_gather_ef",
    "randomk_indices",
    "randomk_scatter",
    "seed_mix",
    "topk_ef",
    "topk_k",
    "warmup",
]


@functools.cache
def _triton_module() -> ModuleType | None:
    try:
        from commgym.collectives.kernels import triton_kernels
    except ImportError:
        return None
    return triton_kernels


@functools.cache
def _cpu_module() -> ModuleType | None:
    choice = os.environ.get("COMMGYM_CPU_KERNELS", "fused")
    if choice not in ("fused", "reference"):
        raise ValueError(f"COMMGYM_CPU_KERNELS must be 'fused' or 'reference', got {choice!r}")
    if choice == "reference":
        return None
    try:
        from commgym.collectives.kernels import cpu_kernels
    except ImportError:  # numba missing: the reference still gives the same results
        return None
    return cpu_kernels


def backend_for(t: torch.Tensor, *others: torch.Tensor | None) -> ModuleType:
    """The implementation module used for tensors on ``t``'s device.

    Args:
        t: the tensor that decides the device.
        *others: further operands; the fused CPU path needs all of them contiguous.

    Returns:
        The Triton module for CUDA tensors when Triton is available; the numba module for
        contiguous CPU tensors when numba is available; else ``reference``.
    """
    if t.is_cuda:
        mod = _triton_module()
        if mod is not None:
            return mod
    elif t.device.type == "cpu":
        mod = _cpu_module()
        if mod is not None and mod.supports(t, *others):
            return mod
    return reference


@functools.cache
def warmup(device_type: str = "cpu") -> float:
    """Compile the kernels this process will use on ``device_type``, once per process.

    JIT compilation (numba on CPU; first use costs ~10 s, later processes load the machine
    code from numba's on-disk cache) must never land inside a measured step, so the
    synchronizer calls this at construction.

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (Triton compiles at first launch; nothing
            is done for it here).

    Returns:
        Seconds spent (0 when there is nothing to compile).
    """
    mod = _cpu_module() if device_type == "cpu" else None
    return mod.warmup() if mod is not None else 0.0


def quantize_ef(x, residual, bits, **kw):  # noqa: D103 - documented in reference
    out = (kw.get("out_codes"), kw.get("out_scales"))
    return backend_for(x, residual, *out).quantize_ef(x, residual, bits, **kw)


def dequantize_accumulate(codes, scales, bits, out, **kw):  # noqa: D103
    return backend_for(out, codes, scales).dequantize_accumulate(codes, scales, bits, out, **kw)


def topk_ef(x, residual, k):  # noqa: D103
    return backend_for(x, residual).topk_ef(x, residual, k)


def randomk_indices(numel, k, seed, device="cpu"):  # noqa: D103
    return backend_for(torch.empty(0, device=device)).randomk_indices(numel, k, seed, device)


def randomk_gather_ef(x, residual, indices):  # noqa: D103
    return backend_for(x, residual, indices).randomk_gather_ef(x, residual, indices)


def randomk_scatter(values, indices, out, weights=None):  # noqa: D103
    return backend_for(out).randomk_scatter(values, indices, out, weights)


def powersgd_residual(work, estimate, world_size, residual, dense_mask):  # noqa: D103
    mod = backend_for(work, estimate, residual, dense_mask)
    if not hasattr(mod, "powersgd_residual"):  # no Triton twin: torch ops on the device
        mod = reference
    return mod.powersgd_residual(work, estimate, world_size, residual, dense_mask)


for _name in (
    "quantize_ef",
    "dequantize_accumulate",
    "topk_ef",
    "randomk_indices",
    "randomk_gather_ef",
    "randomk_scatter",
    "powersgd_residual",
):
    globals()[_name].__doc__ = getattr(reference, _name).__doc__
del _name
