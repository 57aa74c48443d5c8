"""A synthetic env with AllReduceEnv's spaces and a known reward table (unit tests only)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.env import ActionMenu
from commgym.env.spaces import ObservationBuilder

BEST = (2, 1, 2)


class TableEnv(gym.Env):
    """Reward = a smooth bowl over normalised menu indices peaking at ``best`` + noise.

    Same action/observation spaces as ``commgym/AllReduce-v0`` (built with ``ActionMenu``
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
