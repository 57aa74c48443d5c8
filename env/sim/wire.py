"""Wire time of a collective on an emulated link: alpha-beta per link rate, token-bucket burst.

Each rank's link is shaped to rate ``R`` in both directions by a token bucket
(:mod:`commgym.env.net`) whose burst is :func:`~commgym.env.net.tbf_burst_bytes` (the
emulation's own sizing: 15 KB at 10 Mbit/s, 50 KB at 100 Mbit/s). A ring collective
(Thakur, Rabenseifner & Gropp 2005) makes every rank send ``u`` bytes over its uplink:

* all-reduce of ``n`` bytes per rank: ``u = 2 (W-1)/W n``;
* all-gather of ``n`` bytes per rank (``W n`` gathered): ``u = (W-1) n``.

The time of one exchange (``m`` collectives issued back to back) is::

    t(u, R) = m alpha_R + u beta_host + eta_R max(0, u - burst_R) 8 / R

``beta_host`` (s/B) is the host's own cost (gloo's copies and the loopback TCP stack),
fitted on unshaped loopback; ``alpha_R`` and the efficiency ``eta_R`` (>= 1 where headers
and the veth path cost rate, TCP's framing ~1.04) are fitted per *recorded* rate from
timed all-reduces and all-gathers (:func:`fit_wire`). A rate never recorded takes
``alpha`` interpolated in ``log(R)`` between the recorded rates and the per-byte cost of
:meth:`WireModel.per_byte_s` (serialisation at the recorded framing, bounded below by the
ceiling a faster recorded link showed: on this host the 10 Gbit/s veth path is CPU-bound
far below its configured rate, so ``eta`` there measures the host, not the framing); its
burst and ``8 / R`` are exact. The burst is credited once per exchange: between
two exchanges of a training step the bucket refills during compute (15 KB refill in 12 ms
at 10 Mbit/s, shorter than any step here).

Source: Hockney's alpha-beta model (1994); the ring volumes of Thakur et al. (2005); tbf's
token bucket (Linux ``tc-tbf(8)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commgym.env.net.host import tbf_burst_bytes

__all__ = ["LinkFit", "WireModel", "fit_wire", "ring_uplink_bytes"]

#: Collective kinds a payload can travel by (``Compressor.summable`` picks one).
KINDS = ("allreduce", "allgather")


def ring_uplink_bytes(kind: str, n_bytes: float, world_size: int) -> float:
    """Bytes one rank sends over its link in a ring collective of ``n_bytes`` per rank.

    Args:
        kind: ``"allreduce"`` or ``"allgather"``.
        n_bytes: one rank's payload, B (all-gather: the part each rank contributes).
        world_size: ranks ``W``.

    Raises:
        ValueError: unknown ``kind``.
    """
    w = world_size
    if kind == "allreduce":
        return 2 * (w - 1) / w * n_bytes
    if kind == "allgather":
        return (w - 1) * n_bytes
    raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(KINDS)}")


@dataclass(frozen=True)
class LinkFit:
    """Fitted constants of one recorded link rate and collective kind.

    Attributes:
        alpha_s: per-collective latency, s.
        eta: multiple of the ideal serialisation time ``8 / R`` per byte beyond the burst.
    """

    alpha_s: float
    eta: float


@dataclass
class WireModel:
    """Alpha-beta wire time per link rate (see the module docstring).

    Attributes:
        world_size: ranks ``W`` the fit was made with.
        loop_alpha_s: per-collective latency on unshaped loopback, by kind, s.
        beta_host_s: host cost per uplink byte on loopback, by kind, s/B.
        links: recorded rate (bit/s) -> kind -> :class:`LinkFit`.
        mtu: MTU the burst is sized with (the emulation's default).
    """

    world_size: int
    loop_alpha_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    beta_host_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    links: dict[int, dict[str, LinkFit]] = field(default_factory=dict)
    mtu: int = 1500

    def _alpha(self, kind: str, rate_bit_s: float) -> float:
        """Latency at a rate: the recorded one's, else interpolated in ``log R`` (clamped)."""
        rates = sorted(self.links)
        if not rates:
            return self.loop_alpha_s[kind]
        xs = [math.log(r) for r in rates]
        ys = [self.links[r][kind].alpha_s for r in rates]
        return float(np.interp(math.log(rate_bit_s), xs, ys))

    def per_byte_s(self, kind: str, rate_bit_s: float) -> float:
        """Wire seconds per uplink byte beyond the burst at rate ``R`` (see the module docstring).

        A recorded rate: its fitted ``eta * 8 / R``. A rate never recorded: ``max(eta_min *
        8 / R, c_ceil)``, the serialisation time at the least inefficient recorded framing
        (``eta_min >= 1``: a token bucket never passes more than ``R``, so recorded links
        with ``eta < 1``, limited by the host below their rate, are left out; 1 when none
        is left), never below ``c_ceil``, the per-byte cost of the slowest recorded rate at
        or above ``R`` (a host or veth ceiling: a slower link is never faster than a faster
        one measured on the same host; the fastest recorded rate's cost above all of them).
        """
        r = int(rate_bit_s)
        if r in self.links:
            return self.links[r][kind].eta * 8 / rate_bit_s
        if not self.links:
            return 8 / rate_bit_s
        # a recorded eta below 1 is a link the host (not the shaping) limited: it says
        # nothing about a slower link's framing
        eta_min = min([f[kind].eta for f in self.links.values() if f[kind].eta >= 1.0] or [1.0])
        above = [x for x in sorted(self.links) if x >= r] or [max(self.links)]
        ceil = self.links[above[0]][kind].eta * 8 / above[0]
        return max(eta_min * 8 / rate_bit_s, ceil)

    def recorded(self, rate_bit_s: float | None) -> bool:
        """Whether ``rate_bit_s`` was timed in the calibration (``None``: loopback, always)."""
        return rate_bit_s is None or int(rate_bit_s) in self.links

    def exchange_s(
        self, kind: str, n_bytes: float, rate_bit_s: float | None, collectives: int = 1
    ) -> float:
        """Seconds of one exchange of ``n_bytes`` per rank (``collectives`` issued together).

        Args:
            kind: ``"allreduce"`` or ``"allgather"``.
            n_bytes: one rank's payload, B.
            rate_bit_s: the link's rate; ``None``: unshaped loopback.
            collectives: collectives issued for the payload (each pays ``alpha``).

        Raises:
            ValueError: unknown ``kind`` or a rate <= 0.
        """
        u = ring_uplink_bytes(kind, n_bytes, self.world_size)
        host = u * self.beta_host_s[kind]
        if rate_bit_s is None:
            return collectives * self.loop_alpha_s[kind] + host
        if not rate_bit_s > 0:
            raise ValueError(f"link rate must be > 0 bit/s, got {rate_bit_s!r}")
        burst = tbf_burst_bytes(rate_bit_s, self.mtu)
        return (
            collectives * self._alpha(kind, float(rate_bit_s))
            + host
            + max(0.0, u - burst) * self.per_byte_s(kind, float(rate_bit_s))
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        return {
            "world_size": self.world_size,
            "loop_alpha_s": dict(self.loop_alpha_s),
            "beta_host_s": dict(self.beta_host_s),
            "links": {
                str(r): {k: [f.alpha_s, f.eta] for k, f in kinds.items()}
                for r, kinds in self.links.items()
            },
            "mtu": self.mtu,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WireModel:
        """Inverse of :meth:`to_dict`."""
        links = {
            int(r): {k: LinkFit(float(a), float(e)) for k, (a, e) in kinds.items()}
            for r, kinds in d["links"].items()
        }
        return cls(
            int(d["world_size"]),
            {k: float(v) for k, v in d["loop_alpha_s"].items()},
            {k: float(v) for k, v in d["beta_host_s"].items()},
            links,
            int(d.get("mtu", 1500)),
        )


def _nnls2(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, y)
    return coef / scale


def fit_wire(samples: Iterable[Sequence[Any]], world_size: int, mtu: int = 1500) -> WireModel:
    """Fit a :class:`WireModel` from timed collectives.

    Args:
        samples: ``(kind, rate_bit_s or None, n_bytes_per_rank, seconds)`` rows; loopback
            rows (rate ``None``) fit ``alpha`` and ``beta_host`` per kind, shaped rows fit
            ``alpha_R`` and ``eta_R`` per recorded rate and kind (after the host's cost is
            subtracted). Non-negative least squares throughout.
        world_size: ranks the samples were timed with.
        mtu: MTU of the emulated links.

    Returns:
        The fitted model.

    Raises:
        ValueError: no loopback rows for a kind that has shaped rows.
    """
    rows = [(str(k), None if r is None else int(r), float(n), float(t)) for k, r, n, t in samples]
    model = WireModel(world_size, mtu=mtu)
    for kind in KINDS:
        loop = [(n, t) for k, r, n, t in rows if k == kind and r is None]
        shaped = [(r, n, t) for k, r, n, t in rows if k == kind and r is not None]
        if shaped and not loop:
            raise ValueError(f"fit_wire needs loopback {kind} samples to subtract the host's cost")
        if loop:
            a = np.array([[1.0, ring_uplink_bytes(kind, n, world_size)] for n, _ in loop])
            alpha, beta = _nnls2(a, np.array([t for _, t in loop]))
            model.loop_alpha_s[kind], model.beta_host_s[kind] = float(alpha), float(beta)
        for rate in sorted({r for r, _, _ in shaped}):
            pts = [(n, t) for r, n, t in shaped if r == rate]
            burst = tbf_burst_bytes(rate, mtu)
            a_rows, ys = [], []
            for n, t in pts:
                u = ring_uplink_bytes(kind, n, world_size)
                a_rows.append([1.0, max(0.0, u - burst) * 8 / rate])
                ys.append(t - u * model.beta_host_s[kind])
            alpha, eta = _nnls2(np.array(a_rows), np.array(ys))
            model.links.setdefault(rate, {})[kind] = LinkFit(float(alpha), float(eta))
    return model
