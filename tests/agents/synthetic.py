"""A synthetic env with AllReduceEnv's spaces and a known reward table (unit tests only)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.env import ActionMenu
from commgym.env.measure import DecisionMeasurement
from commgym.env.spaces import REWARDS, ObservationBuilder, decision_outcome

BEST = (2, 1, 2)


class TableEnv(gym.Env):
    """Reward = a smooth bowl over normalised menu indices peaking at ``best`` + noise.

    Same action/observation spaces as ``commgym/AllReduce-v1`` (built with ``ActionMenu``
    and ``ObservationBuilder``); the eval loss falls by the reward each decision.
    """

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self, menu=None, best=BEST, noise=0.02, episode_len=40, grad_rel=None):
        self.menu = ActionMenu.from_any(menu)
        self.action_space = spaces.MultiDiscrete(self.menu.nvec)
        self._builder = ObservationBuilder(self.menu, world_size=2, num_params=1000)
        self.observation_space = self._builder.space
        self.best = np.asarray(best, dtype=np.int64)
        self.noise = noise
        self.episode_len = episode_len
        self.steps_total = 0

    def table(self, action) -> float:
        x = np.asarray(action) / np.maximum(self.menu.nvec - 1, 1)
        b = self.best / np.maximum(self.menu.nvec - 1, 1)
        return float(1.0 - np.sum((x - b) ** 2))

    def best_action(self) -> np.ndarray:
        return self.best.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._loss = 2.0
        self._grad = 1.0
        return self._builder.reset(self._loss, self.menu.default_action()), {}

    def step(self, action):
        a = np.asarray(action, dtype=np.int64)
        assert self.action_space.contains(a), a
        self.steps_total += 1
        reward = self.table(a) + self.noise * float(self.np_random.normal())
        self._t += 1
        self._loss = self._loss * math.exp(-0.01 * max(reward, 0.0))
        self._grad *= 0.9
        m = {
            "step_time_s": 0.01, "comm_wait_s": 0.002, "compress_s": 0.0,
            "bytes_per_step": 1e5, "bytes_total": 2e5, "comm_s": 0.004,
            "train_loss": self._loss, "eval_loss": self._loss, "grad_norm": self._grad,
            "compression_error": 0.0,
        }  # fmt: skip
        obs = self._builder.build(m, a, min(1.0, self._t / self.episode_len))
        truncated = self._t >= self.episode_len
        return obs, reward, False, truncated, {"config": str(self.menu.decode(a))}


@dataclass
class TimedConfig:
    """The ``EnvConfig`` fields agents and ``decision_outcome`` read."""

    time_budget_s: float = 100.0
    target_loss: float | None = None
    max_decisions: int | None = None
    steps_per_decision: int = 10


class TimedTableEnv(TableEnv):
    """A clocked fake job: each entry has a decision time and a progress rate.

    Entry ``a`` trains for ``decision_time_s(a)`` per decision and lowers the held-out loss
    as ``L <- L * exp(-rate(a) * speed * dt * (1 + noise * N(0, 1)))``, with
    ``rate(a) = exp(sharpness * (table(a) - 1))`` (1 at ``best``, less elsewhere) and ``speed`` a
    per-seed factor ``1 + 0.1 * (seed % 3)`` (``reset(seed=...)``). So log-loss progress
    per second is ``rate(a) * speed`` (best at ``best``) while iterations per second are
    fastest at ``fastest``. Episode ends, ``info["train_time_s"]``, ``info["measured"]``
    and ``elapsed_frac`` follow ``AllReduceEnv`` (``decision_outcome`` decides the end).
    """

    def __init__(
        self,
        menu=None,
        best=BEST,
        noise=0.0,
        episode_len=40,
        fastest=(0, 0, 0),
        sharpness=1.0,
        **config,
    ):
        super().__init__(menu, best, noise, episode_len)
        self.sharpness = sharpness
        self.config = TimedConfig(**config)
        if self.config.max_decisions is None:
            self.config.max_decisions = episode_len
        self.fastest = np.asarray(fastest, dtype=np.int64)
        self.speed = 1.0

    def rate(self, action) -> float:
        return math.exp(self.sharpness * (self.table(action) - 1.0))

    def decision_time_s(self, action) -> float:
        """0.1 s at ``fastest``, + 0.02 s per index step away from it."""
        return 0.1 + 0.02 * float(np.abs(np.asarray(action) - self.fastest).sum())

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        # as the real env: an episode reset with options={"probe": False} runs no probe
        self.probe_on = not (isinstance(options, dict) and options.get("probe") is False)
        if seed is not None:
            self.speed = 1.0 + 0.1 * (seed % 3)
        self._train_time_s = 0.0
        return obs, {"eval_loss": self._loss, "eval_acc": 0.0, "config": info.get("config")}

    def step(self, action):
        a = np.asarray(action, dtype=np.int64)
        assert self.action_space.contains(a), a
        self.steps_total += 1
        self._t += 1
        dt = self.decision_time_s(a)
        progress = self.rate(a) * self.speed * dt
        progress *= 1.0 + self.noise * float(self.np_random.normal())
        prev = self._loss
        cond = self.condition()  # what the decision ran under (its start)
        self._loss = prev * math.exp(-progress)
        self._train_time_s += dt
        cfg = self.config
        step_s = dt / cfg.steps_per_decision
        probe_s = self.probe_s() if getattr(self, "probe_on", True) else 0.0
        m = DecisionMeasurement(
            train_time_s=dt, step_time_s=step_s, iter_mean_s=step_s, compute_s=0.0,
            comm_wait_s=0.002, compress_s=0.0, comm_s=0.004, bytes_per_step=1e5,
            bytes_total=2e5, train_loss=self._loss, eval_loss=self._loss, eval_acc=0.5,
            eval_s=0.0, grad_norm=1.0, compression_error=0.0, nonfinite=False,
            samples=cfg.steps_per_decision, steps=cfg.steps_per_decision,
            probe_s=probe_s, probe_bytes=65536 if probe_s else 0,
        ).to_dict()  # fmt: skip
        elapsed = min(1.0, self._train_time_s / cfg.time_budget_s)
        obs = self._builder.build(m, a, elapsed)
        reward, terminated, truncated, reason = decision_outcome(
            cfg, REWARDS["log_progress"], prev_eval_loss=prev, eval_loss=self._loss, dt_s=dt,
            samples=cfg.steps_per_decision, diverged=False, train_time_s=self._train_time_s,
            decisions=self._t,
        )  # fmt: skip
        info = {
            "config": str(self.menu.decode(a)), "measured": m, "reason": reason,
            "train_time_s": self._train_time_s, "elapsed_frac": elapsed,
        }  # fmt: skip
        if cond is not None:
            info["condition"] = cond
        return obs, reward, terminated, truncated, info

    def probe_s(self) -> float:
        """The probe all-reduce's time the decision reports (0: no probe)."""
        return 0.0

    def condition(self) -> str | None:
        """The condition label a decision reports (None: none)."""
        return None


class PhasedTableEnv(TimedTableEnv):
    """A clocked fake job whose best entry changes with training time (phases), forkable.

    Phase ``k`` starts at ``boundaries[k - 1]`` seconds of training (phase 0 at 0 s) and has
    its own bowl peak ``bests[k]``: progress per second of entry ``a`` in phase ``k`` is
    ``exp(sharpness * (table_k(a) - 1))``. Noise-free, so every quantity can be computed by
    hand. ``snapshot``/``restore``/``drop_snapshots``/``episode_phases`` follow
    ``AllReduceEnv``'s forking interface (state: loss, clock, decision count).
    """

    def __init__(self, bests, boundaries, **kw):
        super().__init__(best=bests[0], **kw)
        assert len(bests) >= len(boundaries) + 1
        self.bests = [np.asarray(b, dtype=np.int64) for b in bests]
        self.boundaries = [float(t) for t in boundaries]
        self._snaps: dict[str, tuple] = {}

    def phase(self, t: float) -> int:
        return sum(t >= b for b in self.boundaries)

    def rate(self, action) -> float:
        self.best = self.bests[self.phase(getattr(self, "_train_time_s", 0.0))]
        return super().rate(action)

    def decision_time_s(self, action) -> float:
        return 0.1

    def probe_s(self) -> float:
        # the probe reads the link: 1 ms in even phases, 20 ms in odd ones
        return 0.001 if self.phase(self._train_time_s) % 2 == 0 else 0.02

    def condition(self) -> str:
        return f"phase {self.phase(self._train_time_s)}"

    @property
    def episode_phases(self):
        return [(0.0, "phase 0")] + [(t, f"phase {k + 1}") for k, t in enumerate(self.boundaries)]

    def snapshot(self) -> str:
        key = f"s{len(self._snaps)}"
        self._snaps[key] = (self._loss, self._train_time_s, self._t, self._last)
        return key

    def restore(self, key):
        self._loss, self._train_time_s, self._t, self._last = self._snaps[key]
        return self._last

    def drop_snapshots(self) -> None:
        self._snaps.clear()

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self._last = obs
        self._snaps.clear()
        return obs, info

    def step(self, action):
        out = super().step(action)
        self._last = out[0]
        return out
