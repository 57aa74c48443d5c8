"""Domain randomisation over condition traces, so a policy learns to react, not to memorise.

A policy trained on one scenario's schedule (flaky-link: 4 s fast, 2.4 s slow, shifted by up
to 0.5 s) can learn *when* the link switches instead of *reading* it: the clock in its
observation predicts the schedule. Aurora (Jay et al., ICML 2019) redrew every link parameter
per episode for this reason. :class:`RandomizedConditions` redraws the scenario's link
schedule at every ``reset`` of ``commgym/Sim-v1``: each phase's length scaled by a factor
drawn from ``U(1 - length_jitter, 1 + length_jitter)``, the phases' order kept, and with
probability ``rate_swap`` a phase's rate replaced by another rate of the scenario (so a
fast phase can come twice). The episode's per-seed shift then applies as in the real env.
A fixed link or per-episode profiles are left as they are (they have no trace to vary; the
profiles are already drawn per episode seed): there only the timing below is randomised.

The decisions' timing is randomised too, where asked: ``compute_scale=(lo, hi)`` draws the
episode's :attr:`~commgym.env.sim.SimEnv.compute_scale` from ``U(lo, hi)`` (a machine as
loaded as the real ranks' may be) and ``timing_noise`` sets the per-decision spread
(:attr:`~commgym.env.sim.SimEnv.timing_noise`), so a policy that reads the link from its
own decisions' timing cannot rely on the calibration's exact times (Pensieve's simulator:
each delay times ``U(0.9, 1.1)``); ``probe_noise`` spreads the probe's readings as the real
ranks' spread (0.50 natural-log s.d. on flaky-link's fast link, 0.03 on its slow one: record
2026-12-06_085551_train-flaky-link-clock), so a policy reading the probe meets readings
that stray from the link's level.

The draw uses the wrapper's own generator, seeded by the first ``reset(seed=...)``, so a
training run is reproducible. Each reset rewrites the wrapped env's ``config`` (its network),
so evaluation uses another instance of the simulator (the scenario as it is), as
``commgym train`` does with ``sim_randomize``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["RandomizedConditions", "check_randomization"]


def check_randomization(
    *,
    length_jitter: float | None = None,
    rate_swap: float | None = None,
    compute_scale: tuple[float, float] | list[float] | None = None,
    timing_noise: float | None = None,
    probe_noise: float | None = None,
) -> tuple[float, float] | None:
    """Check :class:`RandomizedConditions`' settings (its Args; ``None``: not given).

    Returns:
        ``compute_scale`` as a ``(lo, hi)`` tuple of floats, or ``None``.

    Raises:
        ValueError: a setting outside its range (the message names it and the range).
    """

    def number(v: Any) -> float | None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        return float(v) if ok else None

    ranges = {
        "length_jitter": (length_jitter, lambda x: 0.0 <= x < 1.0, "in [0, 1)"),
        "rate_swap": (rate_swap, lambda x: 0.0 <= x <= 1.0, "in [0, 1]"),
        "timing_noise": (timing_noise, lambda x: x >= 0.0, ">= 0"),
        "probe_noise": (probe_noise, lambda x: x >= 0.0, ">= 0"),
    }
    for name, (v, inside, what) in ranges.items():
        if v is None:
            continue
        x = number(v)
        if x is None:
            raise ValueError(f"{name} must be a number, got {v!r}")
        if not inside(x):
            raise ValueError(f"{name} must be {what}, got {v!r}")
    if compute_scale is None:
        return None
    pair = (
        [number(v) for v in compute_scale]
        if isinstance(compute_scale, (list, tuple)) and len(compute_scale) == 2
        else [None]
    )
    if None in pair or not 0.0 < pair[0] <= pair[1]:
        raise ValueError(f"compute_scale must be [lo, hi] with 0 < lo <= hi, got {compute_scale!r}")
    return pair[0], pair[1]


class RandomizedConditions(gym.Wrapper):
    """Redraw the link schedule of a ``commgym/Sim-v1`` env at every reset (module docstring).

    Args:
        env: a :class:`~commgym.env.sim.SimEnv` (possibly wrapped).
        length_jitter: relative spread of the phase lengths, in ``[0, 1)`` (a link
            schedule's; ignored where the network has none).
        rate_swap: probability, per phase, of taking another of the schedule's rates
            (likewise).
        compute_scale: ``(lo, hi)``, ``0 < lo <= hi``: the range of each episode's factor
            on the time off the wire; ``None``: the calibration's times (factor 1).
        timing_noise: per-decision log-normal spread of that factor, ``>= 0`` (0: none).
        probe_noise: per-decision log-normal spread of the probe's time
            (:attr:`~commgym.env.sim.SimEnv.probe_noise`), ``>= 0`` (0: none).

    Raises:
        ValueError: ``length_jitter`` outside ``[0, 1)``, ``rate_swap`` outside
            ``[0, 1]``, ``compute_scale`` not two positive ascending numbers, a negative
            ``timing_noise``; an env whose config has no link schedule and no timing
            to randomise (nothing would vary).
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        length_jitter: float = 0.4,
        rate_swap: float = 0.1,
        compute_scale: tuple[float, float] | list[float] | None = None,
        timing_noise: float = 0.0,
        probe_noise: float = 0.0,
    ):
        super().__init__(env)
        compute_scale = check_randomization(
            length_jitter=length_jitter, rate_swap=rate_swap, compute_scale=compute_scale,
            timing_noise=timing_noise, probe_noise=probe_noise,
        )  # fmt: skip
        cfg = env.unwrapped.config
        plan = cfg.network_plan
        timing = compute_scale is not None or timing_noise or probe_noise
        if plan.kind != "schedule" and not timing:
            raise ValueError(
                f"RandomizedConditions varies a link schedule or the decisions' timing; this "
                f"env's network is {plan.kind!r} ({cfg.network!r}), which has no schedule, "
                "and neither compute_scale nor timing_noise nor probe_noise is set"
            )
        self.base = cfg
        self.length_jitter = float(length_jitter)
        self.rate_swap = float(rate_swap)
        self.compute_scale = compute_scale
        self.timing_noise = float(timing_noise)
        self.probe_noise = float(probe_noise)
        self._rng: np.random.Generator | None = None
        #: the schedule of the running episode, ``[[start_s, spec], ...]``
        self.schedule: list[list[Any]] = []

    def draw(self) -> dict[str, Any]:
        """A new ``network`` value: the base schedule with jittered lengths and swapped rates."""
        assert self._rng is not None  # set by reset
        entries = self.base.network_plan.schedule.entries
        specs = [str(spec) for _, spec in entries]
        starts = [float(t) for t, _ in entries]
        lengths = np.diff(starts).tolist()
        t, out = 0.0, []
        for i, base in enumerate(specs):
            swap = self._rng.random() < self.rate_swap
            out.append([round(t, 6), specs[int(self._rng.integers(len(specs)))] if swap else base])
            if i < len(lengths):
                scale = self._rng.uniform(1 - self.length_jitter, 1 + self.length_jitter)
                t += lengths[i] * scale
        return {"schedule": out, "shift_s": self.base.network_plan.schedule.shift_s}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: D102
        if self._rng is None or seed is not None:
            self._rng = np.random.default_rng(seed if seed is not None else self.base.seed)
        sim = self.env.unwrapped
        if self.base.network_plan.kind == "schedule":
            network = self.draw()
            self.schedule = network["schedule"]
            sim.config = dataclasses.replace(self.base, network=network)
        if self.compute_scale is not None:
            sim.compute_scale = float(self._rng.uniform(*self.compute_scale))
        sim.timing_noise = self.timing_noise
        sim.probe_noise = self.probe_noise
        return self.env.reset(seed=seed, options=options)
