"""``commgym/Sim-v1``: AllReduce-v1's interface over the factorised, measured simulator."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.env.measure import DecisionMeasurement, decision_info
from commgym.env.schedule import condition_label, episode_phases
from commgym.env.schedule import episode_seed as draw_episode_seed
from commgym.env.sim.calibration import Calibration
from commgym.env.sim.model import SimModel
from commgym.env.spaces import REWARDS, ObservationBuilder, decision_outcome
from commgym.env.spaces import probe_gbps as spaces_probe_gbps

__all__ = ["SimEnv", "episode_conditions"]


def episode_conditions(cfg: Any, episode_seed: int) -> tuple[Any, Any, Any]:
    """One episode's resolved conditions, exactly as the real env resolves them.

    The env config's own :class:`~commgym.env.net.NetworkPlan` and
    :class:`~commgym.env.schedule.Condition` values (``for_episode`` of the episode seed):
    the same code the real env's ``reset`` runs, so a seed means the same episode.

    Returns:
        ``(network schedule or None, straggler phases, cross-traffic phases)``.
    """
    return (
        cfg.network_plan.for_episode(episode_seed),
        cfg.straggler_condition.for_episode(episode_seed),
        cfg.cross_traffic_condition.for_episode(episode_seed),
    )


class SimEnv(gym.Env):
    """``commgym/Sim-v1``: the real env's spaces and records; dynamics from measured parts.

    **Why a new env, not Surrogate-v2.** ``commgym/Surrogate-v1`` regresses whole recorded
    decisions (a gradient-boosted correction of a prior, trained on decisions a logging
    policy chose); its errors are not attributable to any part, and it ordered about one
    configuration pair in seven wrongly. This env has no learned regressor: each part of a
    decision is measured where it lives and composed by a fixed, inspectable formula
    (:mod:`commgym.env.sim.model`): compute on the ranks, codec by the kernels, the wire by
    an alpha-beta fit per link rate with the emulation's token bucket, learning progress by
    each entry's measured loss curve followed from the current loss. Different inputs
    (a :class:`~commgym.env.sim.Calibration`, not recorded transitions), different dynamics,
    a different failure mode: a new id, so figures of the two are never confused.

    Observation and action spaces, the observation (:class:`ObservationBuilder` from a
    :class:`~commgym.env.measure.DecisionMeasurement` per decision), rewards, ``info``
    (:func:`~commgym.env.measure.decision_info`), termination and truncation are the real
    env's; see :class:`~commgym.env.AllReduceEnv` for the tables and formulas. Conditions
    are resolved by the config's own plan for the episode seed (:func:`episode_conditions`):
    the same seed gives the same link profile and the same shifted switch times as the real
    env, the link applies from the first decision that starts at or after a switch, and
    ``info["condition"]`` carries the real env's label. The probe all-reduce runs as in the
    real env (``probe_bytes``; a reset with ``options={"probe": False}`` runs none unless
    ``probe_for_all``; once after the reset with ``probe_at="reset"``), priced by the wire
    model. Deterministic by default: no noise is
    added (the fidelity gates measure the error instead; ``commgym bench sim``).

    **Timing randomisation** (off by default; set by
    :class:`~commgym.env.sim.randomize.RandomizedConditions`): the real ranks' decision times
    vary from decision to decision (about 13 % on flaky-link's fast phase) and with the
    machine's load (1.2-1.65x the calibration's on a loaded 2-core machine, record
    2026-12-05_090926_train-flaky-link-bc), while the link's wire time does not. A policy
    that reads the link from its own decisions' timing learns thresholds that this moves;
    Pensieve's simulator multiplied each chunk's delay by ``U(0.9, 1.1)`` for the same
    reason. With :attr:`compute_scale` ``s`` and :attr:`timing_noise` ``sigma``, each
    decision's time off the wire (compute, codec, optimizer) is multiplied by
    ``s * exp(sigma * z - sigma**2 / 2)``, ``z ~ N(0, 1)`` drawn from the env's generator
    (mean ``s``); wire, switch and probe times are unchanged. With :attr:`probe_noise`
    ``sigma_p`` the probe's time is multiplied by ``exp(sigma_p * z' - sigma_p**2 / 2)`` at
    each decision (its own draw, mean unchanged): the real probe's 64 KiB all-reduce spreads
    with the ranks' arrival on a loaded machine, most on a fast link where it is
    latency-bound (record 2026-12-06_085551_train-flaky-link-clock: 1.6-21.3 ms, natural-log
    s.d. 0.50, on 10 Gbit/s; 74.6-84.4 ms, 0.03, on 10 Mbit/s). The spread is applied to
    every link alike: a fast link's spread is the one a reader of the probe must survive.

    Refused (``ValueError``, by :meth:`Calibration.check`): another workload setting, menu
    entries never calibrated, a target below the calibrated curves, straggler jitter, cross
    traffic, link delay/jitter/loss, buckets smaller than the model. A link rate that was
    never recorded is interpolated (alpha and efficiency in ``log R``; burst and ``8/R``
    exact) with a warning.

    **Version history** — v1: first release.

    Args:
        calibration: a :class:`Calibration` or the path of its JSON record
            (``commgym calibrate-sim``).
        config: an ``EnvConfig``; or its fields as keyword arguments (launch settings are
            read only to check the calibration's setting).
        render_mode: unsupported; warns and is ignored.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        calibration: Calibration | str | os.PathLike[str],
        config: Any = None,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        from commgym.env.allreduce_env import EnvConfig

        if render_mode is not None:
            warnings.warn(f"render_mode {render_mode!r} is not supported; ignored", stacklevel=2)
        cal = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
        if config is None:
            config = EnvConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either an EnvConfig or keyword arguments, not both")
        cal.check(config)
        self.calibration = cal
        self.config = config
        self.menu = config.menu
        self.model = SimModel(cal, self.menu, config.steps_per_decision)
        self.action_space = spaces.MultiDiscrete(self.menu.nvec)
        self._obs = ObservationBuilder(self.menu, config.world_size, cal.num_params)
        self.observation_space = self._obs.space
        self._reward = REWARDS[config.reward]
        self._nvec = tuple(int(n) for n in self.menu.nvec)
        self._actions = [c.to_dict() for c in self.model.configs]
        self._ent = [self.calibration.entries[e] for e in self.model.entries]
        self._samples = config.steps_per_decision * cal.key["batch_size"] * config.world_size
        for spec in config.network_plan.specs:
            if not cal.wire.recorded(spec.rate_bit_s):
                warnings.warn(
                    f"link rate {spec} was never recorded by the calibration (recorded: "
                    f"{', '.join(f'{r / 1e6:g} Mbit/s' for r in sorted(cal.wire.links))}): "
                    "its alpha and efficiency are interpolated in log(rate)",
                    stacklevel=2,
                )
        #: multiplies each decision's time off the wire (1.0: the calibration's)
        self.compute_scale = 1.0
        #: log-normal spread of that factor from decision to decision (0.0: none)
        self.timing_noise = 0.0
        #: log-normal spread of the probe's time from decision to decision (0.0: none)
        self.probe_noise = 0.0
        self._needs_reset = True

    # -- gymnasium API ---------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: D102
        probe = not (isinstance(options, dict) and options.get("probe") is False)
        super().reset(seed=seed)
        cfg = self.config
        if seed is None and not hasattr(self, "_seeded"):
            super().reset(seed=cfg.seed)
        self._seeded = True
        self._probe_bytes = (
            cfg.probe_bytes if (probe or getattr(cfg, "probe_for_all", False)) else 0
        )
        # the probe each decision runs (probe_at="reset": one after the reset instead)
        at_reset = cfg.probe_at == "reset"
        self._decision_probe_bytes = 0 if at_reset else self._probe_bytes
        episode_seed = draw_episode_seed(self.np_random)
        self._episode_seed = episode_seed
        self._schedule, self._stragglers, self._crossing = episode_conditions(cfg, episode_seed)
        self._switches = [] if self._schedule is None else [t for t, _ in self._schedule][1:]
        self._next_switch = self._switches[0] if self._switches else math.inf
        self._set_link(0.0)
        self._eval_loss = self.model.progress.initial_loss
        self._action = self.menu.default_action()
        self._prev_k = -1
        self._switched = False  # the last decision switched entries
        self._train_time_s = 0.0
        probe_gbps = 0.0
        if at_reset and self._probe_bytes:
            # as the real env: one probe on the first link, the clock starts at its time
            probe_s = self._noisy_probe_s(self.model.probe_s(self._probe_bytes, self._rate))
            self._train_time_s = probe_s
            probe_gbps = spaces_probe_gbps(self._probe_bytes, probe_s, cfg.world_size)
        self._decisions = 0
        self._needs_reset = False
        obs = self._obs.reset(self._eval_loss, self._action, probe_gbps=probe_gbps)
        self._last_obs = obs
        spec = None if self._schedule is None else self._schedule.spec_at(0.0)
        return obs, {
            "episode_seed": episode_seed,
            "eval_loss": self._eval_loss,
            "train_time_s": self._train_time_s,
            "eval_acc": self.model.eval_acc(self._eval_loss),
            "num_params": self.calibration.num_params,
            "reset_s": 0.0,
            "config": str(self.menu.decode(self._action)),
            "network": None if spec is None else str(spec),
            "simulated": True,
        }

    def _set_link(self, t: float) -> None:
        spec = None if self._schedule is None else self._schedule.spec_at(t)
        self._spec = spec
        self._spec_str = None if spec is None else str(spec)
        # the label changes only where a condition switches (the link's, here)
        self._label = self.condition_at(t)
        rate = None if spec is None else spec.rate_bit_s
        self._rate = rate
        self._timings = self.model.timings(rate)
        self._probe_s = self.model.probe_s(self._decision_probe_bytes, rate)
        self._next_switch = next((s for s in self._switches if s > t), math.inf)

    def step(self, action):  # noqa: D102
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (the episode ended or never started)")
        a = np.asarray(action, dtype=np.int64)
        n0, n1, n2 = self._nvec
        if a.shape != (3,):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        i0, i1, i2 = a.tolist()
        if not (0 <= i0 < n0 and 0 <= i1 < n1 and 0 <= i2 < n2):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        k = (i0 * n1 + i1) * n2 + i2
        cfg = self.config
        if self._train_time_s >= self._next_switch:
            self._set_link(self._train_time_s)
        model = self.model
        tm = self._timings[k]
        prev_k = self._prev_k
        switched = prev_k >= 0 and prev_k != k
        extra = model.switch_s(prev_k, k, self._rate) if switched else 0.0
        f = self.compute_scale
        if self.timing_noise > 0.0:
            sd = self.timing_noise
            f *= math.exp(sd * float(self.np_random.standard_normal()) - 0.5 * sd * sd)
        train_s = tm.train_s
        if f != 1.0:  # scale the time off the wire only (the link's is the link's)
            wire = tm.rounds * tm.exchange_s
            train_s = max(tm.train_s - wire, 0.0) * f + wire
        probe_s = self._noisy_probe_s(self._probe_s)
        train_t = train_s + extra + probe_s
        prev = self._eval_loss
        eval_loss = model.next_loss(k, prev, prev_k, self._switched)
        ent = self._ent[k]
        steps = cfg.steps_per_decision
        measured = DecisionMeasurement(
            train_time_s=train_t,
            step_time_s=tm.step_s + (train_s - tm.train_s) / steps,
            iter_mean_s=train_t / steps,
            compute_s=ent.compute_s * f,
            comm_wait_s=tm.comm_wait_s,
            compress_s=tm.compress_s * f,
            comm_s=tm.comm_s + extra,
            bytes_per_step=ent.bytes_total / steps,
            bytes_total=ent.bytes_total,
            train_loss=prev * ent.train_loss_ratio,
            eval_loss=eval_loss,
            eval_acc=model.eval_acc(eval_loss),
            eval_s=0.0,
            grad_norm=10.0**ent.log10_grad_norm,
            compression_error=ent.compression_error,
            nonfinite=False,
            samples=self._samples,
            steps=steps,
            probe_s=probe_s,
            probe_bytes=self._decision_probe_bytes,
        )
        info_cond = self._label
        self._prev_k = k
        self._switched = switched
        self._decisions += 1
        self._train_time_s += train_t
        elapsed = min(1.0, self._train_time_s / cfg.time_budget_s)
        obs = self._obs.build(measured, a, elapsed, **self._revealed())
        self._action = a
        reward, terminated, truncated, reason = decision_outcome(
            cfg,
            self._reward,
            prev_eval_loss=prev,
            eval_loss=eval_loss,
            dt_s=train_t,
            samples=self._samples,
            diverged=False,
            train_time_s=self._train_time_s,
            decisions=self._decisions,
        )
        self._eval_loss = eval_loss
        if terminated or truncated:
            self._needs_reset = True
        self._last_obs = obs
        m = measured.to_dict()
        m["env_step_s"] = 0.0
        info = decision_info(
            config=model.entries[k],
            action=dict(self._actions[k]),
            measured=m,
            reason=reason,
            train_time_s=self._train_time_s,
            elapsed_frac=elapsed,
            decision=self._decisions,
            diverged=False,
        )
        info["condition"] = info_cond
        if self._spec_str is not None:
            info["network"] = self._spec_str
        return obs, float(reward), terminated, truncated, info

    def _noisy_probe_s(self, probe_s: float) -> float:
        """``probe_s`` with :attr:`probe_noise`'s draw applied (unchanged when it is 0)."""
        if self.probe_noise > 0.0 and probe_s > 0.0:
            sd = self.probe_noise
            probe_s *= math.exp(sd * float(self.np_random.standard_normal()) - 0.5 * sd * sd)
        return probe_s

    def _revealed(self) -> dict[str, float]:
        if not self.config.privileged_obs:
            return {}
        from commgym.env.spaces import UNSHAPED_GBPS

        s = self._stragglers.value_at(self._train_time_s)
        rate = UNSHAPED_GBPS if self._spec is None else self._spec.rate_bit_s / 1e9
        return {"link_gbps": rate, "straggler_ms": s.delay_s * s.prob * 1e3}

    # -- the running episode, read-only (what an expert or a planner reads) ----------------
    @property
    def episode_seed(self) -> int:
        """The running episode's seed (drawn at ``reset`` as the real env draws it)."""
        return self._episode_seed

    @property
    def probe_bytes(self) -> int:
        """Bytes of the probe all-reduce each decision of the running episode runs.

        0: none, also with ``probe_at="reset"`` (its one probe ran at the reset).
        """
        return self._decision_probe_bytes

    @property
    def last_observation(self) -> np.ndarray:
        """The observation the last ``reset`` or ``step`` returned.

        float32, the layout of :data:`~commgym.env.spaces.OBSERVATION_FIELDS`.
        """
        return self._last_obs

    @property
    def decisions(self) -> int:
        """Decisions made in the running episode."""
        return self._decisions

    @property
    def train_time_s(self) -> float:
        """Training time of the running episode so far, s."""
        return self._train_time_s

    @property
    def link_phase_starts(self) -> list[float]:
        """Start times of the running episode's link phases, s of training time.

        The per-seed shift is applied; ``[0.0]`` for a link that never changes.
        """
        return [0.0] if self._schedule is None else [float(t) for t, _ in self._schedule]

    @property
    def link_phases(self) -> list[tuple[float, float | None]]:
        """The running episode's link over its whole budget: ``(start_s, rate)`` pairs.

        ``rate`` in bit/s (None: unshaped), the per-seed shift applied; the phases that
        start within ``time_budget_s``, whether or not the episode gets there (it ends at
        the target). What a learner may read of the simulator's trace, as Pensieve's
        learns from its throughput traces.
        """
        if self._schedule is None:
            return [(0.0, None)]
        budget = float(self.config.time_budget_s)
        return [(float(t), float(spec.rate_bit_s)) for t, spec in self._schedule if t < budget]

    @property
    def episode_phases(self) -> list[tuple[float, str]]:
        """The running episode's condition phases, as the real env's ``episode_phases``."""
        return episode_phases(self.config, self._schedule, self._stragglers, self._crossing)

    def condition_at(self, train_time_s: float) -> str:
        """The real env's label of the conditions in force after ``train_time_s``."""
        return condition_label(
            self.config, self._schedule, self._stragglers, self._crossing, train_time_s
        )

    def close(self) -> None:  # noqa: D102
        self._needs_reset = True
