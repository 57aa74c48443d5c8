"""Gradient compressors: pure tensor transforms between a flat bucket and its wire payload.

A compressor never calls ``torch.distributed`` and never assumes a device. The
communicator (:class:`~commgym.collectives.GradientSynchronizer` or
:func:`~commgym.collectives.ddp_comm_hook`) follows the class attribute ``summable``:

* ``summable = True``: every payload tensor is all-reduced (SUM) in place, then
  ``decompress(payload, ctx, out)`` writes the dense estimate of the mean into ``out``;
* ``summable = False``: every payload tensor is all-gathered, then
  ``decompress(payload_of_rank_r, ctx, out, accumulate=True)`` is called once per rank.

Inputs are always already divided by the world size (so sums are means and 16-bit sums
cannot overflow where the fp32 mean does not). Multi-round methods (PowerSGD) set
``rounds > 1`` and produce the next round's payload with ``advance``; the communicator
issues each round's collectives in bucket order from the training thread.

A compressor is named by a spec string (``"topk:0.01"``, :class:`CompressionSpec`) whose
method is a key of the :data:`COMPRESSORS` registry; the registry, the spec that reads it
and the built-in compressors that fill it live here together, so a spec is valid exactly
when a compressor for it is registered (:func:`make_compressor` builds it).
"""

from __future__ import annotations

import difflib
import math
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from commgym.collectives import kernels
from commgym.collectives.checks import check_int

__all__ = [
    "COMPRESSORS",
    "VALID_SPEC_FORMS",
    "BF16Compressor",
    "BucketLayout",
    "CompressionSpec",
    "Compressor",
    "FP16Compressor",
    "NoneCompressor",
    "PowerSGDCompressor",
    "QuantizeCompressor",
    "RandomKCompressor",
    "TopKCompressor",
    "make_compressor",
    "register_compressor",
]

#: Valid spec forms, quoted in every parse error.
VALID_SPEC_FORMS = (
    "none",
    "fp16",
    "bf16",
    "int8",
    "int4",
    "int2",
    "topk:<density in (0, 1]>",
    "randomk:<density in (0, 1]>",
    "powersgd:<rank >= 1>",
)

#: Registry of compressor classes by method name (``register_compressor``); the built-in
#: ones below register themselves as this module is imported.
COMPRESSORS: dict[str, type[Compressor]] = {}


def register_compressor(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator adding a compressor class to ``COMPRESSORS`` under ``cls.name``.

    Raises:
        ValueError: if the name is already registered to another class.
    """
    existing = COMPRESSORS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"compressor name {cls.name!r} is already registered to {existing!r}")
    COMPRESSORS[cls.name] = cls
    return cls


def _unknown(method: str, text: str) -> ValueError:
    close = difflib.get_close_matches(method, sorted(COMPRESSORS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(
        f"unknown compression spec {text!r}: method {method!r} is not one of "
        f"{sorted(COMPRESSORS)}.{hint} Valid forms: {', '.join(VALID_SPEC_FORMS)}"
    )


@dataclass(frozen=True)
class CompressionSpec:
    """A validated gradient-compression choice.

    Attributes:
        method: registry name (``"none"``, ``"fp16"``, ``"bf16"``, ``"int8"``, ``"int4"``,
            ``"int2"``, ``"topk"``, ``"randomk"``, ``"powersgd"``).
        param: density in (0, 1] for ``topk``/``randomk``, integer rank >= 1 for
            ``powersgd``, ``None`` for the others.
    """

    method: str
    param: float | int | None = None

    def __post_init__(self) -> None:
        cls = COMPRESSORS.get(self.method)
        if cls is None:
            raise _unknown(self.method, str(self.method))
        kind = cls.param_kind
        text = self.method if self.param is None else f"{self.method}:{self.param}"
        if kind is None:
            if self.param is not None:
                raise ValueError(
                    f"compression spec {text!r}: {self.method!r} takes no parameter. "
                    f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
                )
        elif kind == "density":
            if isinstance(self.param, bool) or not isinstance(self.param, int | float):
                raise ValueError(
                    f"compression spec {text!r}: {self.method} needs a density in (0, 1], "
                    f"e.g. '{self.method}:0.01'"
                )
            density = float(self.param)
            if not (math.isfinite(density) and 0.0 < density <= 1.0):
                raise ValueError(
                    f"compression spec {text!r}: density must be in (0, 1], got {density}"
                )
            object.__setattr__(self, "param", density)
        elif kind == "rank":
            if (
                isinstance(self.param, bool)
                or not isinstance(self.param, int | float)
                or float(self.param) != int(self.param)
                or int(self.param) < 1
            ):
                raise ValueError(
                    f"compression spec {text!r}: {self.method} needs an integer rank >= 1, "
                    f"e.g. '{self.method}:4'"
                )
            object.__setattr__(self, "param", int(self.param))
        else:  # pragma: no cover - registry invariant
            raise AssertionError(f"unknown param kind {kind!r}")

    @classmethod
    def parse(cls, spec: str | CompressionSpec) -> CompressionSpec:
        """Parse a spec string such as ``"none"``, ``"int4"``, ``"topk:0.01"``, ``"powersgd:2"``.

        Args:
            spec: the spec string (case-insensitive, surrounding blanks ignored) or an
                existing ``CompressionSpec`` (returned unchanged).

        Returns:
            The validated spec.

        Raises:
            ValueError: unknown method, missing/extra parameter, density outside (0, 1]
                or rank < 1; the message names the spec and lists the valid forms.
            TypeError: ``spec`` is neither a string nor a ``CompressionSpec``.
        """
        if isinstance(spec, CompressionSpec):
            return spec
        if not isinstance(spec, str):
            raise TypeError(
                f"compression spec must be a string such as 'topk:0.01', got "
                f"{spec!r} ({type(spec).__name__}). Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            )
        text = spec.strip().lower()
        method, sep, arg = text.partition(":")
        method = method.strip()
        if method not in COMPRESSORS:
            raise _unknown(method, spec)
        kind = COMPRESSORS[method].param_kind
        if not sep:
            if kind is not None:
                what = "a density in (0, 1]" if kind == "density" else "an integer rank >= 1"
                raise ValueError(
                    f"compression spec {spec!r}: {method} needs {what}, e.g. "
                    f"'{method}:{'0.01' if kind == 'density' else '4'}'. "
                    f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
                )
            return cls(method)
        arg = arg.strip()
        try:
            value: float | int = (
                int(arg)
                if kind == "rank"
                else float(arg.rstrip("%")) / (100.0 if arg.endswith("%") else 1.0)
            )
        except ValueError:
            raise ValueError(
                f"compression spec {spec!r}: cannot read parameter {arg!r}. "
                f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            ) from None
        if kind is None:
            raise ValueError(
                f"compression spec {spec!r}: {method!r} takes no parameter. "
                f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            )
        try:
            return cls(method, value)
        except ValueError as err:
            detail = str(err).split(": ", 1)[-1]
            raise ValueError(
                f"compression spec {spec!r}: {detail}. Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            ) from None

    def __str__(self) -> str:
        if self.param is None:
            return self.method
        text = repr(self.param)  # shortest string that round-trips
        return f"{self.method}:{text[:-2] if text.endswith('.0') else text}"

    @property
    def lossless(self) -> bool:
        """True only for ``none`` (fp32, bit-exact all-reduce)."""
        return self.method == "none"


@dataclass(frozen=True)
class BucketLayout:
    """What a compressor may know about a bucket: a stable key and its tensors' shapes.

    Attributes:
        key: stable identifier (same on every rank and for the same bucket plan).
        shapes: shapes of the parameters packed contiguously in the flat bucket, in order.
    """

    key: str
    shapes: tuple[torch.Size, ...]

    @property
    def numel(self) -> int:
        """Total number of elements in the bucket."""
        return sum(int(torch.Size(s).numel()) for s in self.shapes)

    @property
    def key_id(self) -> int:
        """A 32-bit integer derived from ``key`` (stable across processes)."""
        return zlib.crc32(self.key.encode())


class Compressor(ABC):
    """Base class of all compressors (see the module docstring for the protocol).

    Args:
        spec: the validated spec this instance implements.
        seed: base seed for cross-rank randomness; must be equal on all ranks.
        error_feedback: whether the caller passes residuals (changes only estimators
            that depend on it, e.g. random-k's unbiased scaling).
        stochastic_rounding: quantisers round stochastically (unbiased) when True.
        world_size: number of ranks whose payloads are combined (used by methods whose
            error feedback is defined on the aggregate, i.e. PowerSGD).
    """

    name: ClassVar[str]
    #: ``None``, ``"density"`` or ``"rank"``: what the spec's parameter means.
    param_kind: ClassVar[str | None] = None
    #: Whether payloads may be summed by all-reduce (else they are all-gathered).
    summable: ClassVar[bool]
    #: Number of communication rounds per bucket.
    rounds: ClassVar[int] = 1
    #: Whether the method is lossy and benefits from error feedback.
    uses_error_feedback: ClassVar[bool] = False
    #: Whether a NaN/inf anywhere in any rank's input always reaches every rank's output.
    propagates_nonfinite: ClassVar[bool] = True
    #: Whether the decoded mean is exactly zero wherever every rank's input was zero and
    #: non-zero only where some rank's input was (no state carried between steps, no
    #: error feedback). The synchronizer then reads unused parameters off the result and
    #: exchanges a used-parameter map only when some parameter's result is all zero.
    exact_zeros: ClassVar[bool] = False

    def __init__(
        self,
        spec: CompressionSpec,
        *,
        seed: int = 0,
        error_feedback: bool = True,
        stochastic_rounding: bool = False,
        world_size: int = 1,
    ) -> None:
        self.spec = spec
        self.world_size = check_int("world_size", world_size, 1)
        self.seed = int(seed)
        self.error_feedback = bool(error_feedback)
        self.stochastic_rounding = bool(stochastic_rounding)
        self._calls: dict[str, int] = {}
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.spec)!r})"

    # -- protocol -----------------------------------------------------------------
    @abstractmethod
    def compress(
        self, flat: torch.Tensor, layout: BucketLayout, residual: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], Any]:
        """Encode a bucket.

        Args:
            flat: 1-D fp32 bucket (local gradient / world size), shape ``[layout.numel]``.
                Not modified, except by ``none`` whose payload *is* ``flat``.
            layout: the bucket's key and parameter shapes.
            residual: fp32 error-feedback memory like ``flat`` (updated in place) or None.

        Returns:
            ``(payload, ctx)``: the tensors to communicate and local context for decoding.
        """

    def advance(
        self, round_index: int, payload: list[torch.Tensor], ctx: Any
    ) -> list[torch.Tensor]:
        """Produce round ``round_index``'s payload from the reduced previous round.

        Raises:
            RuntimeError: for single-round compressors.
        """
        raise RuntimeError(f"{self!r} has a single communication round")

    @abstractmethod
    def decompress(
        self, payload: list[torch.Tensor], ctx: Any, out: torch.Tensor, *, accumulate: bool = False
    ) -> None:
        """Decode into ``out`` (1-D fp32, in place): overwrite, or add when ``accumulate``."""

    @abstractmethod
    def wire_bytes(self, layout: BucketLayout) -> int:
        """Bytes this rank hands to collectives for one bucket (all rounds)."""

    # -- state --------------------------------------------------------------------
    def reset(self) -> None:
        """Forget per-bucket state (warm starts, counters, scratch buffers)."""
        self._calls.clear()
        self._buffers.clear()

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and tensors that restore this compressor's cross-step state."""
        return {"spec": str(self.spec), "calls": dict(self._calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: the state was saved by a different spec.
        """
        if state.get("spec") != str(self.spec):
            raise ValueError(f"state was saved for {state.get('spec')!r}, this is {self.spec}")
        self._calls = dict(state["calls"])

    # -- helpers --------------------------------------------------------------------
    def _next_seed(self, layout: BucketLayout) -> int:
        calls = self._calls.get(layout.key, 0)
        self._calls[layout.key] = calls + 1
        return kernels.seed_mix(self.seed, layout.key_id, calls)

    def _buffer(
        self, layout: BucketLayout, tag: str, numel: int, dtype: torch.dtype, device
    ) -> torch.Tensor:
        buf = self._buffers.get((layout.key, tag))
        if (
            buf is None
            or buf.numel() != numel
            or buf.dtype != dtype
            or buf.device != torch.device(device)
        ):
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[(layout.key, tag)] = buf
        return buf


@register_compressor
class NoneCompressor(Compressor):
    """No compression: the fp32 bucket itself is all-reduced (bit-exact DDP semantics)."""

    name = "none"
    summable = True
    exact_zeros = True

    def compress(self, flat, layout, residual):  # noqa: D102
        return [flat], None

    def decompress(self, payload, ctx, out, *, accumulate=False):  # noqa: D102
        if accumulate:
            out.add_(payload[0])
        elif payload[0].data_ptr() != out.data_ptr():
            out.copy_(payload[0])

    def wire_bytes(self, layout):  # noqa: D102
        return 4 * layout.numel


class _HalfCompressor(Compressor):
    """16-bit wire format; the sum runs in the collective, everything else in fp32.

    The input is already divided by world size in fp32 *before* the cast (unlike
    torch's ``fp16_compress_hook``, which casts first), so gradients near the 16-bit
    maximum do not overflow when summed over ranks.
    """

    summable = True
    exact_zeros = True
    wire_dtype: ClassVar[torch.dtype]

    def compress(self, flat, layout, residual):
        buf = self._buffer(layout, "wire", flat.numel(), self.wire_dtype, flat.device)
        buf.copy_(flat)
        return [buf], None

    def decompress(self, payload, ctx, out, *, accumulate=False):
        if accumulate:
            out.add_(payload[0].float())
        else:
            out.copy_(payload[0])

    def wire_bytes(self, layout):
        return 2 * layout.numel


@register_compressor
class FP16Compressor(_HalfCompressor):
    """IEEE half precision on the wire (as torch's ``fp16_compress_hook``)."""

    name = "fp16"
    wire_dtype = torch.float16


@register_compressor
class BF16Compressor(_HalfCompressor):
    """bfloat16 on the wire (as torch's ``bf16_compress_hook``)."""

    name = "bf16"
    wire_dtype = torch.bfloat16


class QuantizeCompressor(Compressor):
    """Per-chunk max-scaled integer quantisation with bit packing (QSGD-style).

    Source: Alistarh et al., "QSGD", NeurIPS 2017 (stochastic variant); deterministic
    rounding with error feedback after Karimireddy et al., ICML 2019. Integer codes are
    never summed by a collective (int8 sums wrap around on gloo): each rank's packed codes
    and fp32 chunk scales travel in one uint8 buffer that is all-gathered, and every rank
    dequantises and sums all ``W`` payloads in fp32. See ``kernels.reference`` for the
    exact rounding, scale and packing rules.
    """

    summable = False
    uses_error_feedback = True
    bits: ClassVar[int]

    def _sizes(self, numel: int) -> tuple[int, int, int]:
        nch = kernels.num_chunks(numel)
        nbytes = kernels.packed_nbytes(numel, self.bits)
        total = 4 * nch + nbytes
        return nch, nbytes, (total + 3) // 4 * 4  # keep every rank's slice 4-byte aligned

    def compress(self, flat, layout, residual):  # noqa: D102
        n = flat.numel()
        nch, nbytes, total = self._sizes(n)
        buf = self._buffer(layout, "wire", total, torch.uint8, flat.device)
        seed = self._next_seed(layout) if self.stochastic_rounding else 0
        kernels.quantize_ef(
            flat,
            residual,
            self.bits,
            out_scales=buf[: 4 * nch].view(torch.float32),
            out_codes=buf[4 * nch : 4 * nch + nbytes],
            stochastic=self.stochastic_rounding,
            seed=seed,
        )
        if total > 4 * nch + nbytes:
            buf[4 * nch + nbytes :].zero_()
        return [buf], n

    def decompress(self, payload, ctx, out, *, accumulate=False):  # noqa: D102
        n = out.numel()
        nch, nbytes, _ = self._sizes(n)
        buf = payload[0]
        if not accumulate:
            out.zero_()
        kernels.dequantize_accumulate(
            buf[4 * nch : 4 * nch + nbytes], buf[: 4 * nch].view(torch.float32), self.bits, out
        )

    def wire_bytes(self, layout):  # noqa: D102
        return self._sizes(layout.numel)[2]


@register_compressor
class Int8Compressor(QuantizeCompressor):
    """8-bit codes (levels -127..127) per 512-element chunk scale."""

    name = "int8"
    bits = 8


@register_compressor
class Int4Compressor(QuantizeCompressor):
    """4-bit codes (levels -7..7), two per byte."""

    name = "int4"
    bits = 4


@register_compressor
class Int2Compressor(QuantizeCompressor):
    """2-bit codes (levels -1, 0, 1: ternary as TernGrad, Wen et al. 2017), four per byte."""

    name = "int2"
    bits = 2


@register_compressor
class TopKCompressor(Compressor):
    """Top-k sparsification with error feedback.

    Source: Aji & Heafield, EMNLP 2017; Stich et al., "Sparsified SGD with memory",
    NeurIPS 2018. ``k = max(1, round(density * numel))`` per bucket; values (fp32) and
    int32 indices travel in one int32 buffer of ``2k`` entries that is all-gathered
    (every rank sends the same ``k``, so all-gather sizes always match).
    """

    name = "topk"
    param_kind = "density"
    summable = False
    uses_error_feedback = True
    propagates_nonfinite = False

    def _k(self, numel: int) -> int:
        return kernels.topk_k(numel, float(self.spec.param))

    def compress(self, flat, layout, residual):  # noqa: D102
        k = self._k(flat.numel())
        values, idx = kernels.topk_ef(flat, residual, k)
        buf = self._buffer(layout, "wire", 2 * k, torch.int32, flat.device)
        buf[:k].copy_(values.view(torch.int32))
        buf[k:].copy_(idx)
        return [buf], k

    def decompress(self, payload, ctx, out, *, accumulate=False):  # noqa: D102
        k = ctx
        buf = payload[0]
        if not accumulate:
            out.zero_()
        out.index_add_(0, buf[k:].long(), buf[:k].view(torch.float32))

    def wire_bytes(self, layout):  # noqa: D102
        return 8 * self._k(layout.numel)


@register_compressor
class RandomKCompressor(Compressor):
    """Random-k sparsification with indices shared by all ranks (so payloads are summable).

    Source: Stich et al., NeurIPS 2018; Wangni et al., NeurIPS 2018. Indices are
    stratified (one uniformly drawn element per ``numel / k`` stratum, see
    ``kernels.randomk_indices``) from a counter-based generator seeded with
    ``(seed, bucket key, call count)``, identical on all ranks. With error feedback the
    unsent part stays in the residual and values are sent unscaled; without it values are
    scaled by their stratum size, which makes the estimator unbiased.
    """

    name = "randomk"
    param_kind = "density"
    summable = True
    uses_error_feedback = True
    propagates_nonfinite = False

    def _k(self, numel: int) -> int:
        return kernels.topk_k(numel, float(self.spec.param))

    def compress(self, flat, layout, residual):  # noqa: D102
        n = flat.numel()
        k = self._k(n)
        idx, sizes = kernels.randomk_indices(n, k, self._next_seed(layout), flat.device)
        values = kernels.randomk_gather_ef(flat, residual, idx)
        return [values], (idx, sizes)

    def decompress(self, payload, ctx, out, *, accumulate=False):  # noqa: D102
        idx, sizes = ctx
        weights = None if self.error_feedback else sizes
        if accumulate:
            values = payload[0] if weights is None else payload[0] * weights.to(torch.float32)
            out.index_add_(0, idx, values)  # indices are distinct: same as scatter + add
        else:
            kernels.randomk_scatter(payload[0], idx, out, weights)

    def wire_bytes(self, layout):  # noqa: D102
        return 4 * self._k(layout.numel)


@dataclass
class _PowerSGDBucket:
    """Per-bucket PowerSGD state: layout of matrices and persistent buffers."""

    # (offset, numel, rows, cols, p_offset, q_offset) for compressed tensors
    matrices: list[tuple[int, int, int, int, int, int]]
    # (offset, numel, dense_offset) for tensors sent uncompressed
    dense: list[tuple[int, int, int]]
    dense_buf: torch.Tensor
    p_buf: torch.Tensor
    q_buf: torch.Tensor  # warm-started Q, persistent across steps
    q_init: torch.Tensor  # the seeded initial Q, restored where Q turned non-finite
    work: torch.Tensor  # v = gradient + residual
    dense_mask: torch.Tensor  # bool [numel]: True where the tensor is sent uncompressed


@register_compressor
class PowerSGDCompressor(Compressor):
    """PowerSGD low-rank compression with warm start and error feedback.

    Source: Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient
    Compression for Distributed Optimization", NeurIPS 2019 (Algorithm 1). Each parameter
    tensor of a bucket with ``ndim >= 2`` is viewed as an ``n x m`` matrix ``M`` (first
    dimension by the rest); it is compressed when ``n * m >= 2 * r * (n + m)`` (at least
    2x smaller), otherwise it is sent uncompressed with the 1-D tensors. Round 1
    all-reduces ``[dense part, P = M Q]``; ``P`` is orthonormalised (QR); round 2
    all-reduces ``Q = M^T P``; the estimate is ``P Q^T``. ``P`` and ``Q`` are stored (and
    sent) transposed, ``[r, n]`` and ``[r, m]``. ``Q`` is initialised from a
    generator seeded with ``(seed, bucket key, tensor index)`` (identical on all ranks) and
    warm-started from the previous step (and restored to its initial value where a
    non-finite gradient made it NaN/inf). Error feedback keeps ``M - P Q^T``.

    Tuning (from the paper): rank 1-4 suffices for most CNNs; rank changes reset the warm
    start (a new compressor is built).
    """

    name = "powersgd"
    param_kind = "rank"
    summable = True
    rounds = 2
    uses_error_feedback = True
    min_compression_rate = 2.0

    def __init__(self, spec, **kw) -> None:
        super().__init__(spec, **kw)
        self.rank = int(spec.param)
        self._state: dict[str, _PowerSGDBucket] = {}
        self._loaded_q: dict[str, torch.Tensor] = {}

    def reset(self) -> None:  # noqa: D102
        super().reset()
        self._state.clear()

    def _bucket(self, layout: BucketLayout, device) -> _PowerSGDBucket:
        st = self._state.get(layout.key)
        if st is not None and st.work.device == torch.device(device):
            return st
        r = self.rank
        matrices, dense = [], []
        off = p_off = q_off = d_off = 0
        for shape in layout.shapes:
            numel = int(torch.Size(shape).numel())
            if len(shape) >= 2 and numel > 0:
                n = int(shape[0])
                m = numel // n
                if n * m >= self.min_compression_rate * r * (n + m):
                    matrices.append((off, numel, n, m, p_off, q_off))
                    p_off += n * r
                    q_off += m * r
                    off += numel
                    continue
            dense.append((off, numel, d_off))
            d_off += numel
            off += numel
        dense_mask = torch.zeros(off, dtype=torch.bool)
        for d_start, d_numel, _ in dense:
            dense_mask[d_start : d_start + d_numel] = True
        q_buf = torch.empty(q_off, dtype=torch.float32)
        for i, (_, _, _, m, _, qo) in enumerate(matrices):
            gen = torch.Generator().manual_seed(kernels.seed_mix(self.seed, layout.key_id, i))
            q_buf[qo : qo + m * r] = torch.randn(m * r, generator=gen)
        st = _PowerSGDBucket(
            matrices=matrices,
            dense=dense,
            dense_buf=torch.empty(d_off, dtype=torch.float32, device=device),
            p_buf=torch.empty(p_off, dtype=torch.float32, device=device),
            q_buf=q_buf.to(device, copy=True),
            q_init=q_buf.to(device, copy=True),
            work=torch.empty(off, dtype=torch.float32, device=device),
            dense_mask=dense_mask.to(device),
        )
        loaded = self._loaded_q.pop(layout.key, None)
        if loaded is not None:
            if loaded.numel() != st.q_buf.numel():
                raise ValueError(
                    f"PowerSGD warm start for bucket {layout.key!r} has {loaded.numel()} "
                    f"values, the bucket needs {st.q_buf.numel()}"
                )
            st.q_buf.copy_(loaded)
        self._state[layout.key] = st
        return st

    def compress(self, flat, layout, residual):  # noqa: D102
        st = self._bucket(layout, flat.device)
        r = self.rank
        v = st.work
        if residual is not None:
            torch.add(flat, residual, out=v)
        else:
            v.copy_(flat)
        for off, numel, d_off in st.dense:
            st.dense_buf[d_off : d_off + numel].copy_(v[off : off + numel])
        for off, numel, n, m, po, qo in st.matrices:
            # P^T = Q^T M^T: P and Q are stored transposed ([r, n], [r, m]) because MKL's
            # skinny products are ~3-10x faster that way round on one core
            mat = v[off : off + numel].view(n, m)
            torch.mm(
                st.q_buf[qo : qo + m * r].view(r, m),
                mat.t(),
                out=st.p_buf[po : po + n * r].view(r, n),
            )
        return [st.dense_buf, st.p_buf], (st, residual)

    def advance(self, round_index, payload, ctx):  # noqa: D102
        if round_index != 1:
            raise RuntimeError(f"PowerSGD has rounds 0 and 1, got {round_index}")
        st, _ = ctx
        r = self.rank
        for off, numel, n, m, po, qo in st.matrices:
            pt = st.p_buf[po : po + n * r].view(r, n)
            _orthogonalize_(pt.t())
            mat = st.work[off : off + numel].view(n, m)
            torch.mm(pt, mat, out=st.q_buf[qo : qo + m * r].view(r, m))  # Q^T = P^T M
        return [st.q_buf]

    def decompress(self, payload, ctx, out, *, accumulate=False):  # noqa: D102
        if accumulate:
            raise RuntimeError("PowerSGD payloads are summable; decompress once per bucket")
        st, residual = ctx
        r = self.rank
        for off, numel, d_off in st.dense:
            out[off : off + numel].copy_(st.dense_buf[d_off : d_off + numel])
        for off, numel, n, m, po, qo in st.matrices:
            torch.mm(
                st.p_buf[po : po + n * r].view(r, n).t(),
                st.q_buf[qo : qo + m * r].view(r, m),
                out=out[off : off + numel].view(n, m),
            )
        # A non-finite gradient (flagged by the caller) must not poison the warm start.
        torch.where(torch.isfinite(st.q_buf), st.q_buf, st.q_init, out=st.q_buf)
        if residual is not None:
            kernels.powersgd_residual(st.work, out, self.world_size, residual, st.dense_mask)

    def wire_bytes(self, layout):  # noqa: D102
        r = self.rank
        total = 0
        for shape in layout.shapes:
            numel = int(torch.Size(shape).numel())
            if len(shape) >= 2 and numel > 0:
                n = int(shape[0])
                m = numel // n
                if n * m >= self.min_compression_rate * r * (n + m):
                    total += 4 * r * (n + m)
                    continue
            total += 4 * numel
        return total

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        sd = super().state_dict()
        sd["q"] = {k: st.q_buf.detach().cpu().clone() for k, st in self._state.items()}
        return sd

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        super().load_state_dict(state)
        # Buckets not built yet pick their warm start up when first seen.
        self._loaded_q = {k: q.clone() for k, q in state.get("q", {}).items()}
        for key, st in self._state.items():
            if key in self._loaded_q:
                st.q_buf.copy_(self._loaded_q.pop(key))


def _orthogonalize_(p: torch.Tensor) -> None:
    """Orthonormalise the columns of ``p`` ([n, r] fp32, r <= n) in place.

    Householder QR (``torch.linalg.qr``) rather than Gram-Schmidt: when ``P`` is rank
    deficient (the mean gradient has rank < r) Gram-Schmidt normalises rounding noise
    into columns that are not orthogonal, which double-counts the estimate. ``P`` is
    identical on every rank (all-reduced), so the factorisation is too.
    """
    p.copy_(torch.linalg.qr(p, mode="reduced").Q)


def make_compressor(
    spec: str | CompressionSpec,
    *,
    seed: int = 0,
    error_feedback: bool = True,
    stochastic_rounding: bool = False,
    world_size: int = 1,
) -> Compressor:
    """Build the compressor for a spec from the ``COMPRESSORS`` registry.

    Args:
        spec: spec string or ``CompressionSpec`` (see ``CompressionSpec.parse``).
        seed: cross-rank seed; must be equal on every rank.
        error_feedback: whether residuals will be passed to ``compress``.
        stochastic_rounding: quantisers use unbiased stochastic rounding.
        world_size: ranks whose payloads are combined (the communicator's world size).

    Returns:
        A new compressor with empty state.

    Raises:
        ValueError: invalid spec (message lists valid forms).
    """
    parsed = CompressionSpec.parse(spec)
    cls = COMPRESSORS[parsed.method]
    return cls(
        parsed,
        seed=seed,
        error_feedback=error_feedback,
        stochastic_rounding=stochastic_rounding,
        world_size=world_size,
    )
