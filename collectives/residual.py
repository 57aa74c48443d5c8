"""Error-feedback memory (residuals) keyed by a stable bucket key."""

from __future__ import annotations

import torch

__all__ = ["ResidualMemory"]


class ResidualMemory:
    """Per-bucket error-feedback residuals.

    Source: Seide et al., "1-bit SGD", Interspeech 2014; Karimireddy et al., "Error
    Feedback Fixes SignSGD", ICML 2019. For every bucket the compressor sends an estimate
    of ``v = gradient + residual`` and the residual keeps what was not sent, so per step
    ``sent + residual_new == gradient + residual_old`` (element-wise, up to fp32 rounding).

    Buffers are fp32, allocated once per key (zero-filled) on first use and updated in
    place by the compression kernels, which never store NaN/inf (an element whose new
    residual would be non-finite keeps its old value).
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """The residual for ``key``, allocated as ``zeros(like.numel())`` fp32 on first use.

        Args:
            key: stable bucket key.
            like: the bucket's flat tensor (gives size and device).

        Returns:
            1-D fp32 tensor on ``like``'s device, to be updated in place.

        Note:
            If the bucket under ``key`` changed size or device (e.g. DDP rebuilt its
            buckets) the residual restarts from zeros.
        """
        buf = self._buffers.get(key)
        if buf is None or buf.numel() != like.numel() or buf.device != like.device:
            buf = torch.zeros(like.numel(), dtype=torch.float32, device=like.device)
            self._buffers[key] = buf
        return buf

    def __contains__(self, key: str) -> bool:
        return key in self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    def keys(self) -> list[str]:
        """Keys with an allocated residual."""
        return list(self._buffers)

    def lookup(self, key: str) -> torch.Tensor | None:
        """The residual under ``key`` as stored, or None (never allocates)."""
        return self._buffers.get(key)

    def discard(self, key: str) -> None:
        """Drop the residual under ``key`` (no error if there is none)."""
        self._buffers.pop(key, None)

    def reset(self) -> None:
        """Drop all residuals (the next ``get`` returns zeros)."""
        self._buffers.clear()

    def norm(self) -> float:
        """L2 norm over all residuals (host sync; call outside measured regions)."""
        if not self._buffers:
            return 0.0
        sq = sum(float(torch.linalg.vector_norm(b)) ** 2 for b in self._buffers.values())
        return sq**0.5

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """``{"residuals": {key: cpu fp32 tensor}}`` (copies)."""
        return {"residuals": {k: v.detach().cpu().clone() for k, v in self._buffers.items()}}

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Restore :meth:`state_dict` output (tensors move to their device on next ``get``).

        Raises:
            ValueError: a residual holds NaN/inf or is not 1-D.
        """
        loaded = {}
        for key, t in state["residuals"].items():
            if t.dim() != 1 or not bool(torch.isfinite(t).all()):
                raise ValueError(f"residual {key!r} must be a finite 1-D tensor")
            loaded[key] = t.detach().float().clone()
        self._buffers = loaded
