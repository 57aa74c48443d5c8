"""The factorised dynamics of one decision: time from compute, codec and wire; progress from curves.

For menu entry ``e`` (compression, one bucket, period ``H``), ``K`` steps per decision and
a link of rate ``R`` (``None``: unshaped loopback)::

    rounds(e)    = K                      (H = 1: a gradient exchange per step)
                 = ceil(K / H)            (H > 1: K // H averagings, plus the consensus
                                           averaging when K is no multiple of H)
    exchange(e,R) = sum over the compressor's rounds r of
                    wire.exchange_s(kind, round_bytes[r], R, collectives[r])
    base(e)      = (train_loop(e) - rounds(e) * (codec(e) + exchange(e, None))) / K
    decision(e,R) = train_loop(e) + rounds(e) (exchange(e, R) - exchange(e, None))
                  = K base(e) + rounds(e) (codec(e) + exchange(e, R))
                  [+ host(e,R)]  [+ probe(R)]  [+ switch(prev -> e, R)]

``train_loop`` is measured on the ranks (unshaped, this world size and thread count),
``codec`` and the payload per round by the kernels, ``exchange`` is the fitted wire
model. ``host(e,R)`` is what the emulated link adds to the entry's decision beyond its wire
model, measured where the calibration ran the entry on that link
(``Calibration.link_train_s``: the measured median minus the composed time; 0 elsewhere, a
rate never recorded included): on the 10 Gbit/s link the sparse entries' decisions took
20-26 % longer than composed (docs/simulator.md), a host cost of the emulated path
(namespaces, veth, the token bucket's per-packet work) that the all-gather's latency fit
does not carry. It is spread over the decision's iterations. ``base`` is what remains per
step: forward, backward, optimizer step, data, the host's share; it is reported next to the
ranks' own ``compute_s``. With one bucket the exchange starts when backward ends, so it
overlaps nothing; the loopback overlap the ranks measured stays inside ``train_loop``.
``switch`` is the optimizer state's all-reduce when a local-SGD period switches to 1
(:meth:`GradientSynchronizer.reconfigure`), on the link in force. The iteration walls (for
``step_time_s``, the median) put each exchange in the iteration that issues it.

Learning progress is :class:`~commgym.env.sim.progress.ProgressModel` (link-independent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from commgym.collectives import CompressionSpec
from commgym.env.sim.calibration import Calibration
from commgym.env.sim.progress import ProgressModel, interp_scalar

__all__ = ["DecisionTiming", "SimModel"]


@dataclass(frozen=True)
class DecisionTiming:
    """One entry's decision on one link, without switch or probe.

    Attributes:
        train_s: decision time, s.
        step_s: median iteration time, s.
        comm_wait_s: mean wait on the gradient exchange per iteration, s.
        comm_s: communication waited on over the decision, s.
        compress_s: codec per iteration as the ranks time it, s.
        exchange_s: one exchange's wire time, s.
        rounds: exchanges per decision.
    """

    train_s: float
    step_s: float
    comm_wait_s: float
    comm_s: float
    compress_s: float
    exchange_s: float
    rounds: int


class SimModel:
    """The dynamics of every menu entry, built once from a :class:`Calibration`.

    Args:
        calibration: the measured parts.
        menu: the env's action menu (entries in flat, row-major order).
        steps_per_decision: ``K`` (equal to the calibration's; checked by the env).
    """

    def __init__(self, calibration: Calibration, menu: Any, steps_per_decision: int) -> None:
        self.cal = calibration
        self.menu = menu
        self.k = int(steps_per_decision)
        nvec = tuple(int(n) for n in menu.nvec)
        self.configs = [menu.decode(np.array(a)) for a in np.ndindex(*nvec)]
        self.entries = [str(c) for c in self.configs]
        self.periods = [int(c.sync_period) for c in self.configs]
        self.specs = [str(CompressionSpec.parse(str(c.compression))) for c in self.configs]
        self.rounds = [self._rounds(h) for h in self.periods]
        self.progress = ProgressModel(
            {e: calibration.entries[e].curves for e in self.entries},
            calibration.switch_penalty,
            calibration.target_loss,
            calibration.switch_penalties,
            calibration.switch_costs,
        )
        #: progress lost switching from flat entry i to j (0 on the diagonal)
        self.penalty = [[self.progress.penalty(a, b) for b in self.entries] for a in self.entries]
        #: progress lost by the decision after a switch into flat entry j that stays on it
        self.after_switch = [self.progress.after_switch(e) for e in self.entries]
        tables = self.progress.tables()
        #: per flat entry: (ascending -log-loss levels, positions), plain lists (scalar
        #: look-ups in pure Python beat np.interp's call overhead on the hot path)
        self.tables = [(tables[e][0].tolist(), tables[e][1].tolist()) for e in self.entries]
        self._cache: dict[Any, list[DecisionTiming]] = {}
        self._wire_cache: dict[Any, float] = {}  # probe and optimizer-state exchanges
        acc = np.asarray(calibration.eval_acc, dtype=np.float64).reshape(-1, 2)
        self._acc = (acc[:, 0].tolist(), acc[:, 1].tolist()) if len(acc) else None

    def _rounds(self, h: int) -> int:
        if h == 1:
            return self.k
        he = min(h, self.k)
        return self.k // he + (1 if self.k % he else 0)

    def exchange_s(self, spec: str, rate_bit_s: float | None) -> float:
        """One exchange of ``spec``'s payload (every round of the compressor), s."""
        c = self.cal.codec[spec]
        return sum(
            self.cal.wire.exchange_s(c.kind, b, rate_bit_s, n)
            for b, n in zip(c.round_bytes, c.round_collectives, strict=True)
        )

    def probe_s(self, probe_bytes: int, rate_bit_s: float | None) -> float:
        """The probe all-reduce of ``probe_bytes`` on the link, s (0 without a probe)."""
        if probe_bytes <= 0:
            return 0.0
        key = ("probe", probe_bytes, rate_bit_s)
        hit = self._wire_cache.get(key)
        if hit is None:
            hit = self._wire_cache[key] = self.cal.wire.exchange_s(
                "allreduce", probe_bytes, rate_bit_s, 1
            )
        return hit

    def switch_s(self, prev: int, k: int, rate_bit_s: float | None) -> float:
        """Extra time of switching from flat entry ``prev`` to ``k`` on the link, s.

        Leaving a local-SGD period for period 1 averages the rank-local optimizer state
        (one fp32 all-reduce of it); every other switch costs no communication.
        """
        if prev < 0 or prev == k or self.periods[k] != 1 or self.periods[prev] == 1:
            return 0.0
        key = ("state", rate_bit_s)
        hit = self._wire_cache.get(key)
        if hit is None:
            hit = self._wire_cache[key] = self.cal.wire.exchange_s(
                "allreduce", self.cal.optimizer_state_bytes, rate_bit_s, 1
            )
        return hit

    def timings(self, rate_bit_s: float | None) -> list[DecisionTiming]:
        """Every flat entry's :class:`DecisionTiming` on the link (cached per rate)."""
        key = None if rate_bit_s is None else int(rate_bit_s)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        link_train = {} if key is None else self.cal.link_train_s.get(str(key), {})
        out = []
        for e, spec, h, rounds in zip(
            self.entries, self.specs, self.periods, self.rounds, strict=True
        ):
            ent = self.cal.entries[e]
            codec = self.cal.codec[spec].codec_s
            ex_loop = self.exchange_s(spec, None)
            ex = self.exchange_s(spec, rate_bit_s)
            # per step outside the exchanges (compute, optimizer, data; reported, and where
            # the iteration walls start); the decision itself is the measured one plus the
            # wire's difference, so the decomposition sums back exactly on loopback
            base = max((ent.train_s - rounds * (codec + ex_loop)) / self.k, 0.0)
            train = max(ent.train_s + rounds * (ex - ex_loop), 0.0)
            measured = link_train.get(e)
            if measured is not None:  # the link's host cost, spread over the iterations
                base = max(base + (measured - train) / self.k, 0.0)
                train = measured
            if h == 1:
                walls = [base + codec + ex] * self.k
            else:
                he = min(h, self.k)
                walls = [base + ((codec + ex) if (i + 1) % he == 0 else 0.0) for i in range(self.k)]
            step = float(np.median(walls))
            consensus = (codec + ex) if (h > 1 and self.k % min(h, self.k)) else 0.0
            wait = ex if h == 1 else 0.0
            out.append(
                DecisionTiming(
                    train_s=train,
                    step_s=step,
                    comm_wait_s=wait,
                    comm_s=wait * self.k + (consensus - codec if consensus else 0.0),
                    compress_s=ent.compress_s,
                    exchange_s=ex,
                    rounds=rounds,
                )
            )
        self._cache[key] = out
        return out

    def position(self, k: int, loss: float) -> float:
        """Flat entry ``k``'s progress at held-out ``loss``, in decisions of that entry.

        A decision without a switch advances it by exactly 1, so
        ``position(k, target) - position(k, loss)`` decisions of ``k`` take ``loss`` to
        ``target`` where :meth:`reaches` holds.
        """
        lv, pos = self.tables[k]
        return interp_scalar(-math.log(max(loss, 1e-8)), lv, pos)

    def reaches(self, k: int, loss: float) -> bool:
        """Whether entry ``k``'s fitted progress ever gets down to ``loss``."""
        return -math.log(max(loss, 1e-8)) <= self.tables[k][0][-1] + 1e-12

    def switch_cost(self, prev: int, k: int) -> float:
        """Progress a switch from flat entry ``prev`` to ``k`` loses over both its decisions.

        ``penalty[prev][k] + after_switch[k]``; 0 when ``prev`` is ``k`` or -1 (none).
        """
        if prev < 0 or prev == k:
            return 0.0
        return self.penalty[prev][k] + self.after_switch[k]

    def advance(self, k: int, loss: float, adv: float) -> float:
        """Held-out loss after ``adv`` decisions' worth of flat entry ``k``'s progress."""
        lv, pos = self.tables[k]
        return math.exp(-interp_scalar(self.position(k, loss) + adv, pos, lv))

    def next_loss(self, k: int, loss: float, prev: int = -1, fresh: bool = False) -> float:
        """Held-out loss after one decision of flat entry ``k`` from ``loss``.

        ``prev``: the flat entry played before it (-1: none, the episode's first decision);
        a switch moves the decision's progress back by its penalty. ``fresh``: the decision
        before switched into ``prev``; playing it again loses ``after_switch[k]``.
        """
        if prev < 0:
            adv = 1.0
        elif fresh and prev == k:
            adv = 1.0 - self.after_switch[k]
        else:
            adv = 1.0 - self.penalty[prev][k]
        return self.advance(k, loss, adv)

    def eval_acc(self, loss: float) -> float:
        """Held-out accuracy at ``loss`` (the calibration's read-out; NaN without one)."""
        if self._acc is None:
            return math.nan
        return interp_scalar(loss, self._acc[0], self._acc[1])
