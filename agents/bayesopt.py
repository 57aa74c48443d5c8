"""Bayesian optimisation over the action menu (a one-shot autotuner, optionally retuning)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import StepAgent
from commgym.collectives.checks import check_int

__all__ = [
    "BayesOptAgent",
    "best_sampled",
    "expected_improvement",
    "fit_gp",
    "menu_features",
    "propose_ei",
]


def expected_improvement(
    mu: np.ndarray, sigma: np.ndarray, best: float, xi: float = 0.0
) -> np.ndarray:
    """Expected improvement for maximisation (Jones, Schonlau & Welch 1998).

    ``EI = (mu - best - xi) * Phi(z) + sigma * phi(z)``, ``z = (mu - best - xi) / sigma``;
    0 where ``sigma == 0`` and ``mu <= best + xi``.

    Args:
        mu: posterior means, float64 ``(n,)``.
        sigma: posterior standard deviations, float64 ``(n,)``, >= 0.
        best: incumbent value.
        xi: exploration margin (same unit as ``mu``).

    Returns:
        float64 ``(n,)``, >= 0.
    """
    from scipy.stats import norm

    mu = np.asarray(mu, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64)
    gain = mu - best - xi
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sigma > 0, gain / sigma, 0.0)
        ei = np.where(sigma > 0, gain * norm.cdf(z) + sigma * norm.pdf(z), np.maximum(gain, 0.0))
    return np.maximum(ei, 0.0)


def menu_features(nvec: np.ndarray) -> np.ndarray:
    """GP inputs of every menu entry: normalised indices, in flat (row-major) order.

    Args:
        nvec: int ``(3,)``, sizes of the compression, bucket and period lists.

    Returns:
        float64 ``(prod(nvec), 3)``: ``[i_c / (n_c - 1), i_b / (n_b - 1), i_h / (n_h - 1)]``
        (0 for a list of one entry); row ``k`` is flat index ``k``.
    """
    nvec = np.asarray(nvec, dtype=np.int64)
    grid = np.array(np.unravel_index(np.arange(int(np.prod(nvec))), tuple(nvec))).T
    return grid / np.maximum(nvec - 1, 1)


def fit_gp(x: np.ndarray, y: Sequence[float], seed: int | None, min_length_scale: float = 1e-2):
    """Fit the GP surrogate of the menu-search agents (Horovod's model).

    ``Constant * Matern(nu=2.5, ARD) + WhiteKernel`` with ``normalize_y=True`` and two
    optimiser restarts: the white-noise term absorbs the run-to-run noise of timings.

    Args:
        x: float64 ``(n, 3)`` sample features (rows of :func:`menu_features`).
        y: ``n`` objective values (any unit; they are normalised).
        seed: seeds the optimiser restarts (None: not reproducible).
        min_length_scale: lower bound of the Matern length scales, in normalised index
            units (upper bound 100).

    Returns:
        The fitted ``sklearn.gaussian_process.GaussianProcessRegressor``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(
        length_scale=np.full(3, 0.5), length_scale_bounds=(min_length_scale, 1e2), nu=2.5
    ) + WhiteKernel(1e-2, (1e-6, 1e1))
    gp = GaussianProcessRegressor(
        kernel=kernel,
        normalize_y=True,
        n_restarts_optimizer=2,
        random_state=None if seed is None else int(seed),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    return gp


def best_sampled(
    features: np.ndarray,
    sampled: Sequence[int],
    values: Sequence[float],
    seed: int | None,
    min_length_scale: float = 1e-2,
) -> int:
    """The sampled entry with the best GP posterior mean (maximisation).

    With fewer than two samples, or all values equal, the best observed value decides
    (nothing to smooth).

    Args:
        features: float64 ``(menu.size, 3)`` from :func:`menu_features`.
        sampled: flat index of each sample (non-empty).
        values: objective value of each sample (same length).
        seed: GP optimiser seed.
        min_length_scale: see :func:`fit_gp`.

    Returns:
        A flat menu index out of ``sampled``.
    """
    if len(set(values)) == 1 or len(values) < 2:
        return int(sampled[int(np.argmax(values))])
    candidates = sorted(set(sampled))
    gp = fit_gp(features[list(sampled)], values, seed, min_length_scale)
    mu = gp.predict(features[candidates])
    return int(candidates[int(np.argmax(mu))])


def propose_ei(
    features: np.ndarray,
    sampled: Sequence[int],
    values: Sequence[float],
    xi: float,
    rng: np.random.Generator,
    seed: int | None,
    candidates: Sequence[int] | None = None,
    min_length_scale: float = 1e-2,
) -> int:
    """The menu entry that maximises expected improvement over the sampled incumbent.

    The incumbent is the best posterior mean among sampled entries; the EI margin is
    ``xi`` standard deviations of the samples. Until the values carry information (fewer
    than two, or all equal) an unsampled entry is drawn from ``rng`` instead.

    Args:
        features: float64 ``(menu.size, 3)`` from :func:`menu_features`.
        sampled: flat index of each sample.
        values: objective value of each sample (maximised).
        xi: EI margin in standard deviations of ``values`` (>= 0).
        rng: generator of the random fallback draws.
        seed: GP optimiser seed.
        candidates: flat indices EI may return (default: every entry).
        min_length_scale: see :func:`fit_gp`.

    Returns:
        A flat menu index.
    """
    if len(values) < 2 or np.std(values) == 0:
        unsampled = sorted(set(range(len(features))) - set(sampled))
        return int(rng.choice(unsampled or list(range(len(features)))))
    pool = np.arange(len(features)) if candidates is None else np.asarray(candidates, dtype=int)
    gp = fit_gp(features[list(sampled)], values, seed, min_length_scale)
    mu, sigma = gp.predict(features[pool], return_std=True)
    incumbent = float(np.max(gp.predict(features[sorted(set(sampled))])))
    ei = expected_improvement(mu, sigma, incumbent, xi * float(np.std(values)))
    return int(pool[int(np.argmax(ei))])


class BayesOptAgent(StepAgent):
    """Gaussian-process Bayesian optimisation of the configuration, as system autotuners do.

    Follows Horovod's autotuner (``horovod/common/parameter_manager.cc``,
    ``optim/bayesian_optimization.cc``: GP regression + expected improvement, warmup
    samples discarded after each parameter change, a fixed number of samples then
    frozen) and ByteScheduler's Bayesian-optimisation auto-tuning of partition and
    credit sizes (Peng et al., "A Generic Communication Scheduler for Distributed DNN
    Training Acceleration", SOSP 2019).

    * Search space: every menu entry, encoded as normalised indices
      ``[i_c / (n_c - 1), i_b / (n_b - 1), i_h / (n_h - 1)]`` (float64 ``(3,)``).
    * Model: ``sklearn`` ``GaussianProcessRegressor`` with
      ``Constant * Matern(nu=2.5, ARD) + WhiteKernel`` and ``normalize_y=True``.
    * One sample = median reward of ``repeats`` decisions on one entry; the first
      ``warmup`` decisions after a configuration change are discarded.
    * The first sample is the DDP default, then ``n_initial - 1`` random entries, then
      the expected-improvement maximiser (``xi`` times the std of the samples).
    * After ``budget`` samples it freezes on the entry with the best posterior mean
      among the sampled ones (one-shot tuning, like Horovod and ByteScheduler). With
      ``retune_every`` set, every ``retune_every`` decisions after freezing it takes one
      more EI sample, so ``predict(deterministic=False)`` keeps exploring.

    Tuning advice: with the ``log_progress`` reward rewards shrink as training proceeds,
    so samples from late in an episode look worse; keep ``budget * (warmup + repeats)``
    well below one episode's decisions or use ``reward="throughput"``/``time_to_target``.

    Args:
        env: commgym env.
        budget: samples before freezing (int >= 1).
        repeats: decisions per sample (median taken; int >= 1).
        warmup: decisions discarded after a configuration change (int >= 0).
        n_initial: samples before EI is used (default first, then random; int >= 1).
        xi: EI margin, in standard deviations of the samples (>= 0).
        retune_every: decisions between retuning samples after freezing (None: never).
        seed: seeds the random initial samples and the GP optimiser restarts.

    Raises:
        ValueError: invalid hyperparameters (the message gives the value).
    """

    reads_probe = False

    name = "bayesopt"

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        budget: int = 12,
        repeats: int = 3,
        warmup: int = 1,
        n_initial: int = 3,
        xi: float = 0.01,
        retune_every: int | None = None,
    ) -> None:
        for name, value, low in (
            ("budget", budget, 1), ("repeats", repeats, 1), ("warmup", warmup, 0),
            ("n_initial", n_initial, 1),
        ):  # fmt: skip
            check_int(name, value, low)
        if retune_every is not None and (
            isinstance(retune_every, bool)
            or not isinstance(retune_every, int | np.integer)
            or retune_every < 1
        ):
            raise ValueError(f"retune_every must be None or an integer >= 1, got {retune_every!r}")
        if not (isinstance(xi, int | float) and math.isfinite(xi) and xi >= 0):
            raise ValueError(f"xi must be a finite number >= 0, got {xi!r}")
        super().__init__(
            env, seed=seed, budget=int(budget), repeats=int(repeats), warmup=int(warmup),
            n_initial=int(n_initial), xi=float(xi),
            retune_every=None if retune_every is None else int(retune_every),
        )  # fmt: skip
        self.budget, self.repeats, self.warmup = int(budget), int(repeats), int(warmup)
        self.n_initial, self.xi = int(n_initial), float(xi)
        self.retune_every = None if retune_every is None else int(retune_every)
        self._rng = np.random.default_rng(seed)
        #: features of every menu entry, float64 ``(menu.size, 3)``
        self.features = menu_features(self.menu.nvec)
        self.sampled: list[int] = []  # flat index of each sample
        self.values: list[float] = []  # median reward of each sample
        self.frozen = False
        self._default = self._flat(self.menu.default_action())
        self._current: int | None = self._default
        self._pending: list[float] = []
        self._last_applied: int | None = None
        self._skip = self.warmup
        self._since_freeze = 0
        self._best_cache: tuple[int, int] | None = None  # (len(values), best index)

    # -- model ------------------------------------------------------------------------
    def best_index(self) -> int:
        """Flat index of the sampled entry with the best posterior mean (default if none)."""
        if not self.values:
            return self._default
        if self._best_cache is not None and self._best_cache[0] == len(self.values):
            return self._best_cache[1]
        best = best_sampled(self.features, self.sampled, self.values, self.seed)
        self._best_cache = (len(self.values), best)
        return best

    def _propose(self) -> int:
        unsampled = sorted(set(range(self.menu.size)) - set(self.sampled))
        if len(self.sampled) < self.n_initial and unsampled:
            return int(self._rng.choice(unsampled))
        return propose_ei(self.features, self.sampled, self.values, self.xi, self._rng, self.seed)

    # -- StepAgent ----------------------------------------------------------------------
    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        if deterministic or self._current is None:
            return self._unflat(self.best_index()), None
        return self._unflat(self._current), None

    def _start_sample(self, index: int) -> None:
        self._current = index
        self._pending = []
        self._skip = self.warmup if index != self._last_applied else 0

    def _observe(self, obs, action, reward, next_obs, terminated, truncated, info) -> None:
        i = self._flat(action)
        changed = i != self._last_applied
        self._last_applied = i
        if self._current is None:  # frozen, exploiting
            self._since_freeze += 1
            if self.retune_every is not None and self._since_freeze >= self.retune_every:
                self._start_sample(self._propose())
            return
        if i != self._current:  # someone else chose the action: not our sample
            return
        if changed and self._skip == 0 and not self._pending:
            self._skip = self.warmup
        if self._skip > 0:
            self._skip -= 1
            return
        if not math.isfinite(reward):
            return
        self._pending.append(float(reward))
        if len(self._pending) < self.repeats:
            return
        self.sampled.append(i)
        self.values.append(float(np.median(self._pending)))
        self._pending = []
        if self.frozen or len(self.values) >= self.budget:
            self.frozen = True
            self._current = None
            self._since_freeze = 0
        else:
            self._start_sample(self._propose())

    def _episode_start(self, obs: np.ndarray) -> None:
        # reset() puts the env back on the default configuration
        self._last_applied = self._default
        if self._current is not None and self._current != self._default:
            self._pending = []
            self._skip = self.warmup

    def _get_state(self) -> dict[str, Any]:
        return {
            "sampled": list(self.sampled),
            "values": list(self.values),
            "frozen": self.frozen,
            "current": self._current,
            "pending": list(self._pending),
            "last_applied": self._last_applied,
            "skip": self._skip,
            "since_freeze": self._since_freeze,
            "rng": self._rng.bit_generator.state,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.sampled = [int(i) for i in state["sampled"]]
        self.values = [float(v) for v in state["values"]]
        self.frozen = bool(state["frozen"])
        self._current = state["current"]
        self._pending = [float(v) for v in state["pending"]]
        self._last_applied = state["last_applied"]
        self._skip = int(state["skip"])
        self._since_freeze = int(state["since_freeze"])
        self._rng.bit_generator.state = state["rng"]
        self._best_cache = None
