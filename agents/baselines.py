"""Baselines and heuristics: static presets, random, grid search, Accordion, AdaComm."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import StepAgent
from commgym.collectives import CommConfig
from commgym.collectives.checks import check_int
from commgym.env.spaces import OBSERVATION_FIELDS, ActionMenu

__all__ = [
    "STATIC_PRESETS",
    "resolve_preset",
    "AccordionAgent",
    "AdaCommAgent",
    "GridAgent",
    "RandomAgent",
    "StaticAgent",
]

_FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}

#: Named static configurations (``static:<preset>``).
STATIC_PRESETS: dict[str, CommConfig] = {
    # what a PyTorch DDP user gets without tuning: fp32 all-reduce, 25 MiB buckets
    "ddp-default": CommConfig("none", bucket_mb=25.0, sync_period=1),
    # DDP's fp16_compress_hook with default buckets
    "fp16-dense": CommConfig("fp16", bucket_mb=25.0, sync_period=1),
}


def _check_index(name: str, value: Any, n: int) -> int:
    return check_int(name, value, 0, n - 1, note=" (a menu index)")


def _positive_int(name: str, value: Any) -> int:
    return check_int(name, value, 1)


def resolve_preset(menu: ActionMenu, preset: str) -> CommConfig:
    """The configuration a static preset names on ``menu`` (no env or ranks needed).

    Args:
        menu: the action menu the preset must be on.
        preset: a name in :data:`STATIC_PRESETS` or a menu entry such as ``"int8/4MB/H1"``.

    Returns:
        The :class:`CommConfig`.

    Raises:
        ValueError: unknown preset or one that is not on ``menu``; the message lists the
            menu's entries.
    """
    entries = {
        str(menu.decode(np.array(np.unravel_index(i, tuple(menu.nvec))))): menu.decode(
            np.array(np.unravel_index(i, tuple(menu.nvec)))
        )
        for i in range(menu.size)
    }
    if preset in STATIC_PRESETS:
        config = STATIC_PRESETS[preset]
        if str(config) not in entries:
            raise ValueError(
                f"static preset {preset!r} = {config} is not on the env's action menu "
                f"{menu.to_dict()}; its entries: {', '.join(entries)}"
            )
        return config
    if preset in entries:
        return entries[preset]
    raise ValueError(
        f"unknown static preset {preset!r}: use one of {sorted(STATIC_PRESETS)} or an entry "
        f"'compression/<bucket>MB/H<period>' of the action menu: {', '.join(entries)}"
    )


class StaticAgent(StepAgent):
    """Always the same configuration: the baselines a user would otherwise pick.

    Args:
        env: commgym env.
        preset: ``"ddp-default"`` (``none``, 25 MiB, period 1: PyTorch DDP's default),
            ``"fp16-dense"`` (``fp16``, 25 MiB, period 1: DDP's ``fp16_compress_hook``),
            or any action-menu entry by its ``str(CommConfig)`` string, e.g.
            ``"int8/4MB/H1"`` (compression/bucket MiB/period).
        seed: unused (kept for a uniform constructor).

    Raises:
        ValueError: unknown preset, or a configuration that is not on the env's action
            menu (e.g. 25 MiB buckets missing); the message names the menu.
    """

    reads_probe = False

    name = "static"

    def __init__(
        self, env: gym.Env, *, seed: int | None = None, preset: str = "ddp-default"
    ) -> None:
        super().__init__(env, seed=seed, preset=preset)
        self.config = self._resolve(preset)
        self._action = self.menu.encode(self.config)

    def _resolve(self, preset: str) -> CommConfig:
        return resolve_preset(self.menu, preset)

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        return self._action.copy(), None


class RandomAgent(StepAgent):
    """Uniformly random menu entries from a seeded generator (a lower baseline).

    ``predict`` draws from the agent's generator whatever ``deterministic`` says (a
    random policy has no best action); the generator state is saved, so a loaded agent
    continues the same sequence.
    """

    reads_probe = False

    name = "random"

    def __init__(self, env: gym.Env, *, seed: int | None = None) -> None:
        super().__init__(env, seed=seed)
        self._rng = np.random.default_rng(seed)

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        return self._unflat(int(self._rng.integers(self.menu.size))), None

    def _get_state(self) -> dict[str, Any]:
        return {"rng": self._rng.bit_generator.state}

    def _set_state(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self._rng.bit_generator.state = state["rng"]


class GridAgent(StepAgent):
    """Exhaustive search: every menu entry for ``decisions_per_arm`` decisions.

    Entries are visited in flat (row-major, ``FlattenAction``) order; after the sweep
    ``learn`` keeps playing the entry with the best mean reward, which
    ``predict(deterministic=True)`` returns (the DDP default before any data).

    Args:
        env: commgym env.
        decisions_per_arm: decisions spent on each entry (int >= 1).
        seed: unused.
    """

    reads_probe = False

    name = "grid"

    def __init__(
        self, env: gym.Env, *, seed: int | None = None, decisions_per_arm: int = 1
    ) -> None:
        decisions_per_arm = _positive_int("decisions_per_arm", decisions_per_arm)
        super().__init__(env, seed=seed, decisions_per_arm=decisions_per_arm)
        self.decisions_per_arm = decisions_per_arm
        self.sums = np.zeros(self.menu.size, dtype=np.float64)
        self.counts = np.zeros(self.menu.size, dtype=np.int64)
        self.cursor = 0  # decisions of the sweep done so far

    @property
    def done(self) -> bool:
        """True once every entry has had its ``decisions_per_arm`` decisions."""
        return self.cursor >= self.menu.size * self.decisions_per_arm

    def best_index(self) -> int:
        """Flat index of the best mean reward (the DDP default before any data)."""
        if not self.counts.any():
            return self._flat(self.menu.default_action())
        means = np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), -np.inf)
        return int(np.argmax(means))

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        if deterministic or self.done:
            return self._unflat(self.best_index()), None
        return self._unflat(self.cursor // self.decisions_per_arm), None

    def _observe(self, obs, action, reward, next_obs, terminated, truncated, info) -> None:
        i = self._flat(action)
        self.sums[i] += reward
        self.counts[i] += 1
        if not self.done:
            self.cursor += 1

    def _get_state(self) -> dict[str, Any]:
        return {"sums": self.sums.tolist(), "counts": self.counts.tolist(), "cursor": self.cursor}

    def _set_state(self, state: dict[str, Any]) -> None:
        if state:
            self.sums = np.asarray(state["sums"], dtype=np.float64)
            self.counts = np.asarray(state["counts"], dtype=np.int64)
            self.cursor = int(state["cursor"])


class AccordionAgent(StepAgent):
    """Accordion: light compression in critical regimes, heavy compression otherwise.

    Agarwal, Wang, Acun, Jha, Venkataraman, "Accordion: Adaptive Gradient Communication
    via Critical Learning Regime Identification", MLSys 2021. Accordion detects critical
    regimes by the relative change of the gradient norm, ``|g - g_prev| / g_prev >= eta``
    (``eta = 0.5`` in the paper), and uses low compression there, high compression
    elsewhere. Here the signal is observation field ``grad_norm_rel_change`` (index 9,
    measured over the previous decision). The first decision of an episode
    (``elapsed_frac == 0``, no gradient yet) counts as critical: early training is the
    paper's first critical regime.

    Args:
        env: commgym env.
        light: compression index for critical regimes (default: ``fp16`` if on the
            menu, else index 0).
        heavy: compression index elsewhere (default: the last menu compression).
        bucket: bucket index (default: 25 MiB if on the menu, else the largest).
        period: sync-period index (default: the smallest period).
        eta: critical-regime threshold on ``|grad_norm_rel_change|`` (> 0).
        seed: unused.

    Raises:
        ValueError: an index outside the menu or ``eta <= 0``.
    """

    reads_probe = False

    name = "accordion"
    #: adapts inside every episode from what it observes; nothing to tune beforehand
    online = True

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        light: int | None = None,
        heavy: int | None = None,
        bucket: int | None = None,
        period: int | None = None,
        eta: float = 0.5,
    ) -> None:
        from commgym.agents.base import menu_of

        menu = menu_of(env)
        default = menu.default_action()
        nc = len(menu.compression)
        light = (
            (menu.compression.index("fp16") if "fp16" in menu.compression else 0)
            if (light is None)
            else light
        )
        heavy = nc - 1 if heavy is None else heavy
        bucket = int(default[1]) if bucket is None else bucket
        period = int(default[2]) if period is None else period
        light = _check_index("light", light, nc)
        heavy = _check_index("heavy", heavy, nc)
        bucket = _check_index("bucket", bucket, len(menu.bucket_mb))
        period = _check_index("period", period, len(menu.sync_period))
        if not (isinstance(eta, int | float) and math.isfinite(eta) and eta > 0):
            raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
        super().__init__(
            env, seed=seed, light=light, heavy=heavy, bucket=bucket, period=period,
            eta=float(eta),
        )  # fmt: skip
        self.eta = float(eta)
        self._light = np.array([light, bucket, period], dtype=np.int64)
        self._heavy = np.array([heavy, bucket, period], dtype=np.int64)

    def critical(self, obs: np.ndarray) -> bool:
        """True in a critical regime (``|grad_norm_rel_change| >= eta`` or episode start)."""
        if obs[_FIELD["elapsed_frac"]] == 0.0:
            return True
        return abs(float(obs[_FIELD["grad_norm_rel_change"]])) >= self.eta

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        return (self._light if self.critical(obs) else self._heavy).copy(), None


class AdaCommAgent(StepAgent):
    """AdaComm: the local-SGD period shrinks with the loss.

    Wang & Joshi, "Adaptive Communication Strategies to Achieve the Best Error-Runtime
    Trade-off in Local-Update SGD", MLSys 2019. The period follows
    ``H = ceil(sqrt(L / L0) * H0)``: infrequent averaging while the loss is high (fast
    progress per second), more frequent averaging as it falls (lower error floor).
    ``L`` is observation field ``eval_loss``, ``L0`` the first eval loss of the episode
    (re-read when ``elapsed_frac == 0``); ``H`` is mapped to the nearest menu period
    (ties to the smaller).

    ``L0`` lives in the predict ``state`` (float64 array of shape ``(1,)``) when the caller
    threads it through, otherwise in the agent.

    Args:
        env: commgym env.
        h0: initial period ``H0`` (int >= 1; default: the largest menu period).
        compression: compression index (default: ``none`` if on the menu, else 0).
        bucket: bucket index (default: 25 MiB if on the menu, else the largest).
        seed: unused.

    Raises:
        ValueError: an index outside the menu or ``h0 < 1``.
    """

    reads_probe = False

    name = "adacomm"
    #: adapts inside every episode from what it observes; nothing to tune beforehand
    online = True

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        h0: int | None = None,
        compression: int | None = None,
        bucket: int | None = None,
    ) -> None:
        from commgym.agents.base import menu_of

        menu = menu_of(env)
        default = menu.default_action()
        h0 = max(menu.sync_period) if h0 is None else h0
        h0 = _positive_int("h0", h0)
        compression = int(default[0]) if compression is None else compression
        bucket = int(default[1]) if bucket is None else bucket
        compression = _check_index("compression", compression, len(menu.compression))
        bucket = _check_index("bucket", bucket, len(menu.bucket_mb))
        super().__init__(env, seed=seed, h0=h0, compression=compression, bucket=bucket)
        self.h0 = h0
        self._compression = compression
        self._bucket = bucket
        self.l0: float | None = None

    def period_for(self, loss: float, l0: float) -> int:
        """``ceil(sqrt(loss / l0) * h0)`` (>= 1) before mapping to the menu."""
        if not (l0 > 0 and math.isfinite(loss) and loss >= 0):
            return self.h0
        return max(1, math.ceil(math.sqrt(loss / l0) * self.h0 - 1e-9))

    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        loss = float(obs[_FIELD["eval_loss"]])
        l0 = self.l0 if state is None else float(np.asarray(state).reshape(-1)[0])
        if l0 is None or not l0 > 0 or obs[_FIELD["elapsed_frac"]] == 0.0:
            l0 = loss
        self.l0 = l0
        h = self.period_for(loss, l0)
        periods = self.menu.sync_period
        idx = min(range(len(periods)), key=lambda i: (abs(periods[i] - h), periods[i]))
        return (
            np.array([self._compression, self._bucket, idx], dtype=np.int64),
            np.array([l0], dtype=np.float64),
        )

    def _episode_start(self, obs: np.ndarray) -> None:
        self.l0 = None

    def _get_state(self) -> dict[str, Any]:
        return {"l0": self.l0}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.l0 = state.get("l0")
