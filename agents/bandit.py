"""Sliding-window UCB over the action menu (non-stationary multi-armed bandit)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import StepAgent
from commgym.collectives.checks import check_int

__all__ = ["SlidingWindowUCBAgent"]


class SlidingWindowUCBAgent(StepAgent):
    """Sliding-window UCB (SW-UCB) over every menu entry.

    Garivier & Moulines, "On Upper-Confidence Bound Policies for Switching Bandit
    Problems", ALT 2011. Only the last ``window`` decisions count, so the agent tracks a
    reward that drifts as training proceeds. Arm ``i`` (a flat menu index) scores

    ``mean_w(i) + c * B * sqrt(log(min(t, window)) / N_w(i))``

    where ``N_w(i)`` and ``mean_w(i)`` are its count and mean reward within the window,
    ``t`` the number of decisions so far and ``c`` the exploration constant
    (``sqrt(xi)`` in the paper). The paper assumes rewards in ``[0, B]``; commgym rewards
    have no known bound, so ``B`` is the observed reward range within the window (1 while
    it is 0). Arms not played within the window are played first (in flat order).

    ``predict(deterministic=False)`` returns the UCB choice; ``deterministic=True`` the
    best windowed mean (the DDP default before any data).

    Args:
        env: commgym env.
        window: sliding-window length in decisions (int >= 1).
        exploration: exploration constant ``c`` (>= 0).
        seed: breaks ties between equal scores.

    Raises:
        ValueError: invalid ``window`` or ``exploration``.
    """

    reads_probe = False

    name = "bandit"

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        window: int = 200,
        exploration: float = 0.5,
    ) -> None:
        check_int("window", window, 1, note=" (decisions)")
        if not (isinstance(exploration, int | float) and math.isfinite(exploration)) or (
            exploration < 0
        ):
            raise ValueError(f"exploration must be a finite number >= 0, got {exploration!r}")
        super().__init__(env, seed=seed, window=int(window), exploration=float(exploration))
        self.window = int(window)
        self.exploration = float(exploration)
        self.t = 0
        self.history: deque[tuple[int, float]] = deque(maxlen=self.window)
        self._rng = np.random.default_rng(seed)

    def window_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """``(counts int64 (K,), means float64 (K,))`` over the window (mean 0 if unplayed)."""
        k = self.menu.size
        counts = np.zeros(k, dtype=np.int64)
        sums = np.zeros(k, dtype=np.float64)
        for arm, reward in self.history:
            counts[arm] += 1
            sums[arm] += reward
        return counts, sums / np.maximum(counts, 1)

    def ucb_scores(self) -> np.ndarray:
        """SW-UCB index of every arm, float64 ``(K,)`` (``inf`` for unplayed arms)."""
        counts, means = self.window_stats()
        rewards = [r for _, r in self.history]
        scale = (max(rewards) - min(rewards)) if rewards else 0.0
        scale = scale if scale > 0 else 1.0
        log_t = math.log(max(min(self.t, self.window), 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            bonus = self.exploration * scale * np.sqrt(log_t / counts)
        return np.where(counts > 0, means + bonus, np.inf)

    def best_index(self) -> int:
        """Flat index of the best windowed mean (the DDP default before any data)."""
        counts, means = self.window_stats()
        if not counts.any():
            return self._flat(self.menu.default_action())
        return int(np.argmax(np.where(counts > 0, means, -np.inf)))

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        if deterministic:
            return self._unflat(self.best_index()), None
        scores = self.ucb_scores()
        unplayed = np.flatnonzero(np.isinf(scores))
        if unplayed.size:
            return self._unflat(int(unplayed[0])), None
        top = np.flatnonzero(scores == scores.max())
        return self._unflat(int(self._rng.choice(top))), None

    def _observe(self, obs, action, reward, next_obs, terminated, truncated, info) -> None:
        if math.isfinite(reward):
            self.history.append((self._flat(action), float(reward)))
        self.t += 1

    def _get_state(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "history": [[a, r] for a, r in self.history],
            "rng": self._rng.bit_generator.state,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.t = int(state["t"])
        self.history = deque(((int(a), float(r)) for a, r in state["history"]), maxlen=self.window)
        self._rng.bit_generator.state = state["rng"]
