"""Compression kernels: one public function per operation, dispatching on device.

CUDA tensors run fused Triton kernels when Triton is importable (``pip install
commgym[kernels]``); every other device runs the pure-torch reference in
:mod:`commgym.collectives.kernels.reference`, which defines the semantics (rounding,
clamping, scale formula, NaN policy, packing layout). The compressors call only these
functions, so there is one code path for CPU and GPU.
"""

from __future__ import annotations

import functools
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
    "quantize_ef",
    "randomk_gather_ef",
    "randomk_indices",
    "randomk_scatter",
    "seed_mix",
    "topk_ef",
    "topk_k",
]


@functools.cache
def _triton_module() -> ModuleType | None:
    try:
        from commgym.collectives.kernels import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def backend_for(t: torch.Tensor) -> ModuleType:
    """The implementation module used for tensors on ``t``'s device.

    Returns:
        The Triton module for CUDA tensors when Triton is available, else ``reference``.
    """
    if t.is_cuda:
        mod = _triton_module()
        if mod is not None:
            return mod
    return reference


def quantize_ef(x, residual, bits, **kw):  # noqa: D103 - documented in reference
    return backend_for(x).quantize_ef(x, residual, bits, **kw)


def dequantize_accumulate(codes, scales, bits, out, **kw):  # noqa: D103
    return backend_for(out).dequantize_accumulate(codes, scales, bits, out, **kw)


def topk_ef(x, residual, k):  # noqa: D103
    return backend_for(x).topk_ef(x, residual, k)


def randomk_indices(numel, k, seed, device="cpu"):  # noqa: D103
    return backend_for(torch.empty(0, device=device)).randomk_indices(numel, k, seed, device)


def randomk_gather_ef(x, residual, indices):  # noqa: D103
    return backend_for(x).randomk_gather_ef(x, residual, indices)


def randomk_scatter(values, indices, out, weights=None):  # noqa: D103
    return backend_for(out).randomk_scatter(values, indices, out, weights)


for _name in (
    "quantize_ef",
    "dequantize_accumulate",
    "topk_ef",
    "randomk_indices",
    "randomk_gather_ef",
    "randomk_scatter",
):
    globals()[_name].__doc__ = getattr(reference, _name).__doc__
del _name
