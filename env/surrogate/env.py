"""``commgym/Surrogate-v1``: the environment that steps a fitted :class:`SurrogateModel`."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.env.measure import DecisionMeasurement, decision_info
from commgym.env.net.plan import UNSHAPED_LINK_GBPS, link_rate_gbps
from commgym.env.schedule import episode_seed as draw_episode_seed
from commgym.env.spaces import REWARDS, ObservationBuilder, decision_outcome
from commgym.env.surrogate.model import MAX_STREAK, TIMING, SurrogateModel

# -- environment ----------------------------------------------------------------------
_TIMING_SET = frozenset(TIMING)


class SurrogateEnv(gym.Env):
    """``commgym/Surrogate-v1``: AllReduce-v1's interface, dynamics from a fitted model.

    Observation and action spaces, observation construction (:class:`ObservationBuilder`
    from :class:`~commgym.env.measure.DecisionMeasurement` records, as the real env), reward
    functions (``REWARDS``), ``info`` keys, time-budget / ``max_decisions`` truncation,
    target-reached and divergence termination are those of
    :class:`~commgym.env.AllReduceEnv`; see its docstring for the tables and formulas.

    Dynamics per decision, for flat action ``k`` held for ``h`` decisions in a row and
    held-out-loss bucket ``b`` of the current loss: ``y = table[min(h, 4) - 1, b, k] +
    noise * r`` where ``r`` takes its timing columns
    from one bootstrapped out-of-fold residual row of the action's sync period and its
    learning columns from one row of loss bucket ``b`` (:class:`SurrogateModel`); step
    time ``= prior[k] * exp(y_step)``, decision time ``= steps * prior[k] *
    exp(y_train)``, ``L_new = L * exp(-y_loss)``; divergence with the per-action
    frequency observed in the data. Deterministic given the seed.

    The link: ``network`` takes the real env's forms (``None`` unshaped; a spec such as
    ``"1gbit"``; a schedule ``[[elapsed_training_s, spec], ...]``, optionally as
    ``{"schedule": [...], "shift_s": s}`` with seeded switch shifts; ``{"profiles":
    [...]}`` for a seeded random profile per episode) and resolves them as the real env
    does (:meth:`~commgym.env.net.NetworkPlan.for_episode` of ``config.network_plan``: the
    same episode seed picks the same profile and the same shifted switch times; a schedule
    switches when the episode's *predicted* training time passes its entry). ``table`` and
    ``prior`` above are those of the link rate in force for the decision
    (:meth:`SurrogateModel.table_for`); ``info["network"]`` is its spec string, as the
    real env reports it. Only the rate is modelled: delay, jitter and loss of a spec are
    ignored (with a warning), and a rate outside the fitted ones is extrapolated by the
    prior's ``8 / R`` wire term (with a warning).

    **Version history** — v0: first release; model format 3: the configured link rate
    is an input and ``network`` is honoured.

    Args:
        model_path: file written by :meth:`SurrogateModel.save` (a joblib pickle: only
            load trusted files), or a :class:`SurrogateModel`.
        config: an ``EnvConfig``; or its fields as keyword arguments (``workload``,
            ``world_size`` and ``steps_per_decision`` default to the model's data;
            launch settings and ``network_strict`` are ignored).
        noise: scale of the bootstrapped noise (0: noise-free medians).
        render_mode: unsupported; warns and is ignored.

    Raises:
        ValueError: the action menu differs from the model's.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        model_path: str | os.PathLike[str] | SurrogateModel,
        config: Any = None,
        noise: float = 1.0,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        from commgym.env.allreduce_env import EnvConfig

        if render_mode is not None:
            warnings.warn(f"render_mode {render_mode!r} is not supported; ignored", stacklevel=2)
        model = (
            model_path
            if isinstance(model_path, SurrogateModel)
            else SurrogateModel.load(model_path)
        )
        self.model = model
        if config is None:
            kwargs.setdefault("workload", model.workload)
            kwargs.setdefault("world_size", model.world_size)
            kwargs.setdefault("steps_per_decision", model.steps_per_decision)
            kwargs.setdefault("action_menu", model.menu)
            config = EnvConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either an EnvConfig or keyword arguments, not both")
        self.config = config
        if any(c.active for c in config.cross_traffic_condition.values):
            raise ValueError(
                f"cross_traffic={config.cross_traffic!r}: the surrogate models the link rate "
                "and stragglers, not competing flows; learn on real ranks (env_kind: real)"
            )
        if config.probe_bytes and config.probe_at != "decision":
            raise ValueError(
                f"probe_at={config.probe_at!r}: the surrogate regresses recorded decisions, "
                "whose probes ran at every decision's end (probe_at: decision); learn in the "
                "simulator (env_kind: sim) or on real ranks (env_kind: real)"
            )
        if config.menu.to_dict() != model.menu.to_dict():
            raise ValueError(
                f"action menu {config.menu.to_dict()} differs from the surrogate's "
                f"{model.menu.to_dict()}"
            )
        self.menu = config.menu
        self.noise = float(noise)
        self.action_space = spaces.MultiDiscrete(self.menu.nvec)
        self._obs = ObservationBuilder(self.menu, config.world_size, model.num_params)
        self.observation_space = self._obs.space
        self._reward = REWARDS[config.reward]
        nvec = tuple(int(n) for n in self.menu.nvec)
        self._nvec = nvec
        self._configs = [str(self.menu.decode(np.array(a))) for a in np.ndindex(*nvec)]
        self._actions = [self.menu.decode(np.array(a)).to_dict() for a in np.ndindex(*nvec)]
        self._links: dict[Any, tuple[list[Any], list[float]]] = {}
        self._start_episode(config.seed)
        self._p_div = model.p_diverge.tolist()
        self._edges_lo = float(model.loss_edges[0])
        self._edges_w = float(model.loss_edges[1] - model.loss_edges[0])
        self._nbins = len(model.loss_edges) - 1
        self._resid = [r.tolist() for r in model.residuals]
        self._learn_resid = [r.tolist() for r in model.learning_residuals]
        # data were recorded with the model's K; scale time with the configured K
        self._steps = config.steps_per_decision
        self._samples = model.samples * config.steps_per_decision / max(model.steps_per_decision, 1)
        self._needs_reset = True

    def _probe_s(self, spec: Any) -> float:
        """The probe all-reduce's time on the link in force (the fitted alpha-beta prior).

        The recorded decisions' training times already hold their probes' cost; this
        gives the observation's probe field only.
        """
        if not self.config.probe_bytes:
            return 0.0
        rate = None if spec is None else spec.rate_bit_s
        return self.model.alpha_beta.allreduce_s(
            self.config.probe_bytes, self.config.world_size, rate
        )

    def _revealed(self, spec: Any) -> dict[str, float]:
        """The privileged observation fields (as the real env's ``privileged_obs``)."""
        if not self.config.privileged_obs:
            return {}
        from commgym.env.spaces import UNSHAPED_GBPS

        straggler = self._stragglers.value_at(self._train_time_s)
        rate = UNSHAPED_GBPS if spec is None else spec.rate_bit_s / 1e9
        return {"link_gbps": rate, "straggler_ms": straggler.delay_s * straggler.prob * 1e3}

    def _link_tables(self, spec: Any) -> tuple[list[Any], list[float]]:
        """Prediction table and prior (as lists: fast indexing) of a link spec, cached."""
        if spec not in self._links:
            rate = link_rate_gbps(spec)
            fitted = self.model.link_rates_gbps
            if spec is not None and spec.has_impairments:
                warnings.warn(
                    f"the surrogate models the link rate only: delay, jitter and loss of "
                    f"network {str(spec)!r} are ignored",
                    stacklevel=3,
                )
            if not min(fitted) <= rate <= max(fitted):
                where = "an unshaped link" if rate >= UNSHAPED_LINK_GBPS else f"{rate:g} Gbit/s"
                warnings.warn(
                    f"{where} is outside the link rates the surrogate was fitted on "
                    f"({', '.join(f'{r:g}' for r in fitted)} Gbit/s): the prior's wire term "
                    "extrapolates, the learned correction stays at its nearest fitted rate",
                    stacklevel=3,
                )
            table, prior = self.model.table_for(rate)
            self._links[spec] = (table.tolist(), prior.tolist())
        return self._links[spec]

    def _start_episode(self, episode_seed: int) -> Any:
        """Resolve this episode's link timeline and its first spec (``None``: unshaped)."""
        # the real env's resolution of ``network`` (one plan: profiles, schedules and their
        # seeded shifts)
        self._timeline = self.config.network_plan.for_episode(episode_seed)
        self._stragglers = self.config.straggler_condition.for_episode(episode_seed)
        self._switch_times = [] if self._timeline is None else [t for t, _ in self._timeline]
        self._spec = None if self._timeline is None else self._timeline.spec_at(0.0)
        self._table, self._prior = self._link_tables(self._spec)
        self._set_next_switch(0.0)
        return self._spec

    def _set_next_switch(self, elapsed_s: float) -> None:
        self._next_switch_s = min(
            (t for t in self._switch_times if t > elapsed_s), default=math.inf
        )

    def _set_link(self, elapsed_s: float) -> None:
        spec = self._timeline.spec_at(elapsed_s)
        self._set_next_switch(elapsed_s)
        if spec != self._spec:
            self._spec = spec
            self._table, self._prior = self._link_tables(spec)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: D102
        super().reset(seed=seed)
        if seed is None and not hasattr(self, "_seeded"):
            super().reset(seed=self.config.seed)
        self._seeded = True
        episode_seed = draw_episode_seed(self.np_random)
        self._episode_seed = episode_seed
        spec = self._start_episode(episode_seed)
        # per-episode stream: the same seed and actions give the same episode
        self._rng = np.random.default_rng(episode_seed)
        init = self.model.initial_losses
        self._eval_loss = float(init[int(self._rng.integers(len(init)))])
        self._action = self.menu.default_action()
        self._prev_k = -1
        self._held = 0
        self._train_time_s = 0.0
        self._decisions = 0
        self._needs_reset = False
        obs = self._obs.reset(self._eval_loss, self._action)
        self._last_obs = obs
        return obs, {
            "episode_seed": episode_seed,
            "eval_loss": self._eval_loss,
            "eval_acc": float("nan"),
            "num_params": self.model.num_params,
            "reset_s": 0.0,
            "config": str(self.menu.decode(self._action)),
            "network": None if spec is None else str(spec),
            "surrogate": True,
        }

    def step(self, action):  # noqa: D102
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (the episode ended or never started)")
        a = np.asarray(action, dtype=np.int64)
        n0, n1, n2 = self._nvec
        if a.shape != (3,) or not (0 <= a[0] < n0 and 0 <= a[1] < n1 and 0 <= a[2] < n2):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        i0, i1, i2 = int(a[0]), int(a[1]), int(a[2])
        k = (i0 * n1 + i1) * n2 + i2
        cfg = self.config
        # the link changes only where a schedule has its next entry: skip the look-up on
        # the hot path otherwise
        if self._train_time_s >= self._next_switch_s:
            self._set_link(self._train_time_s)
        spec = self._spec
        prev = self._eval_loss
        b = int((math.log(max(prev, 1e-8)) - self._edges_lo) / self._edges_w)
        b = 0 if b < 0 else (self._nbins - 1 if b >= self._nbins else b)
        self._held = self._held + 1 if k == self._prev_k else 1
        self._prev_k = k
        p = self._table[min(self._held, MAX_STREAK) - 1][b][k]
        pool = self._resid[i2]
        r = pool[int(self._rng.random() * len(pool))]  # timing noise (per sync period)
        pool = self._learn_resid[b]
        r_learn = pool[int(self._rng.random() * len(pool))]  # learning noise (per loss bucket)
        s = self.noise
        y = [
            pv + s * (rv if j in _TIMING_SET else rl)
            for j, (pv, rv, rl) in enumerate(zip(p, r, r_learn, strict=True))
        ]
        prior = self._prior[k]
        step_t = prior * math.exp(y[0])
        train_t = self._steps * prior * math.exp(y[1])
        bytes_ps = max(math.expm1(y[2]), 0.0)
        diverged = self._rng.random() < self._p_div[k]
        eval_loss = float("nan") if diverged else max(prev * math.exp(-y[3]), 1e-8)
        comm_s = min(max(y[8], 0.0), 1.0) * train_t
        measured = DecisionMeasurement(
            train_time_s=train_t,
            step_time_s=step_t,
            iter_mean_s=train_t / self._steps,
            compute_s=self.model.compute_s,
            comm_wait_s=min(max(y[6], 0.0), 1.0) * step_t,
            compress_s=max(y[7], 0.0) * step_t,
            comm_s=comm_s,
            bytes_per_step=bytes_ps,
            bytes_total=bytes_ps * self._steps,
            train_loss=prev * math.exp(y[4]),
            eval_loss=eval_loss,
            eval_acc=min(max(y[10], 0.0), 1.0),
            eval_s=0.0,
            grad_norm=10.0 ** y[5],
            compression_error=max(y[9], 0.0),
            nonfinite=diverged,
            samples=int(self._samples),
            steps=self._steps,
            probe_s=self._probe_s(spec),
            probe_bytes=cfg.probe_bytes,
        )
        m = measured.to_dict()
        m["env_step_s"] = 0.0
        self._decisions += 1
        self._train_time_s += train_t
        elapsed = min(1.0, self._train_time_s / cfg.time_budget_s)
        obs = self._obs.build(measured, a, elapsed, **self._revealed(spec))
        self._action = a
        reward, terminated, truncated, reason = decision_outcome(
            cfg,
            self._reward,
            prev_eval_loss=prev,
            eval_loss=eval_loss,
            dt_s=train_t,
            samples=int(self._samples),
            diverged=diverged,
            train_time_s=self._train_time_s,
            decisions=self._decisions,
        )
        if not diverged:
            self._eval_loss = eval_loss
        if terminated or truncated:
            self._needs_reset = True
        self._last_obs = obs
        info = decision_info(
            config=self._configs[k],
            action=dict(self._actions[k]),
            measured=m,
            reason=reason,
            train_time_s=self._train_time_s,
            elapsed_frac=elapsed,
            decision=self._decisions,
            diverged=diverged,
        )
        if spec is not None:
            info["network"] = str(spec)
        return obs, float(reward), terminated, truncated, info

    def close(self) -> None:  # noqa: D102
        self._needs_reset = True


def benchmark_steps(env: gym.Env, steps: int = 20000, seed: int = 0) -> float:
    """Env steps per second with uniformly random actions (resets included)."""
    import time

    rng = np.random.default_rng(seed)
    nvec = np.asarray(env.action_space.nvec)
    actions = rng.integers(0, nvec, size=(steps, len(nvec)))
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for i in range(steps):
        _, _, te, tr, _ = env.step(actions[i])
        if te or tr:
            env.reset()
    return steps / (time.perf_counter() - t0)
