"""Domain randomisation over condition traces, so a policy learns to react, not to memorise.

A policy trained on one scenario's schedule (flaky-link: 4 s fast, 2.4 s slow, shifted by up
to 0.5 s) can learn *when* the link switches instead of *reading* it: the clock in its
observation predicts the schedule. Aurora (Jay et al., ICML 2019) redrew every link parameter
per episode for this reason. :class:`RandomizedConditions` redraws the scenario's link
schedule at every ``reset`` of ``commgym/Sim-v1``: each phase's length scaled by a factor
drawn from ``U(1 - length_jitter, 1 + length_jitter)``, the phases' order kept, and with
probability ``rate_swap`` a phase's rate replaced by another rate of the scenario (so a
fast phase can come twice). The episode's per-seed shift then applies as in the real env.
A fixed link or per-episode profiles are left as they are (they have no trace to vary).

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

__all__ = ["RandomizedConditions"]


class RandomizedConditions(gym.Wrapper):
    """Redraw the link schedule of a ``commgym/Sim-v1`` env at every reset (module docstring).

    Args:
        env: a :class:`~commgym.env.sim.SimEnv` (possibly wrapped) whose config has a
            link schedule.
        length_jitter: relative spread of the phase lengths, in ``[0, 1)``.
        rate_swap: probability, per phase, of taking another of the schedule's rates.

    Raises:
        ValueError: ``length_jitter`` outside ``[0, 1)`` or ``rate_swap`` outside
            ``[0, 1]``; an env whose config has no link schedule.
    """

    def __init__(self, env: gym.Env, *, length_jitter: float = 0.4, rate_swap: float = 0.1):
        super().__init__(env)
        if not 0.0 <= float(length_jitter) < 1.0:
            raise ValueError(f"length_jitter must be in [0, 1), got {length_jitter!r}")
        if not 0.0 <= float(rate_swap) <= 1.0:
            raise ValueError(f"rate_swap must be in [0, 1], got {rate_swap!r}")
        cfg = env.unwrapped.config
        plan = cfg.network_plan
        if plan.kind != "schedule":
            raise ValueError(
                f"RandomizedConditions varies a link schedule; this env's network is "
                f"{plan.kind!r} ({cfg.network!r})"
            )
        self.base = cfg
        self.length_jitter = float(length_jitter)
        self.rate_swap = float(rate_swap)
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
        network = self.draw()
        self.schedule = network["schedule"]
        self.env.unwrapped.config = dataclasses.replace(self.base, network=network)
        return self.env.reset(seed=seed, options=options)
