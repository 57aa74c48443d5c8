"""``commgym/AllReduce-v1``: a gymnasium environment over real all-reduce training runs."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.collectives.errors import CommgymError
from commgym.env.cluster import Cluster
from commgym.env.config import EnvConfig
from commgym.env.measure import DecisionMeasurement, combine_eval, decision_info
from commgym.env.net.cross_traffic import CrossTraffic, CrossTrafficSpec
from commgym.env.schedule import condition_label, episode_phases
from commgym.env.schedule import episode_seed as draw_episode_seed
from commgym.env.spaces import (
    REWARDS,
    ObservationBuilder,
    decision_outcome,
    probe_gbps,
    reset_probe_option,
)

__all__ = ["RESET_TIMEOUT_S", "AllReduceEnv", "EnvConfig", "FlattenAction"]

#: Minimum deadline of the ``reset`` command (model/data rebuild), seconds.
RESET_TIMEOUT_S = 120.0


class AllReduceEnv(gym.Env):
    """Choose gradient compression, bucket size and sync period on a real training run.

    Each ``step(action)`` applies one communication configuration to a real
    data-parallel job of ``world_size`` ranks (torchrun subprocesses, gloo or NCCL) for
    ``steps_per_decision`` iterations and returns what the ranks measured. Nothing is
    simulated: times, bytes and losses come from the running ranks.

    **Action** — ``MultiDiscrete([n_compression, n_bucket, n_period])``, zero-based indices
    into ``action_menu`` (default ``compression = [none, fp16, int8, topk:0.01,
    powersgd:2]``, ``bucket_mb = [1, 4, 25]``, ``sync_period = [1, 2, 4]``). Wrap with
    :class:`FlattenAction` for a ``Discrete`` space (row-major, bijective). The decoded
    configuration is echoed in ``info["config"]``.

    **Observation** — ``Box(float32)`` of 20 values; NaN/inf never appear (they become 0
    and values are clipped to the bounds; raw values are in ``info["measured"]``):

    ===  =======================  ============  ============  =====================================
    idx  name                     unit          range         meaning
    ===  =======================  ============  ============  =====================================
    0    step_time_s              s             [0, 1e3]      median iteration time, slowest rank
    1    comm_wait_frac           1             [0, 1]        comm wait / iteration time
    2    compress_s               s             [0, 1e3]      compress+decompress per iteration
    3    log10_bytes_per_step     log10 B       [0, 15]       log10(1 + bytes sent / iteration)
    4    bandwidth_gbps           Gbit/s        [0, 1e4]      effective: bytes * 8 / comm wait
    5    train_loss               nats          [0, 1e4]      mean training loss, all ranks
    6    eval_loss                nats          [0, 1e4]      held-out loss, consensus model
    7    loss_change              log ratio     [-20, 20]     log(L_prev) - log(L)
    8    log10_grad_norm          log10         [-20, 20]     aggregated gradient norm
    9    grad_norm_rel_change     1             [-10, 10]     (g - g_prev) / g_prev
    10   compression_error        1             [0, 10]       ||g - g_hat|| / ||g|| (last iter)
    11   compression_index        1             [0, 1]        index / (n - 1)
    12   bucket_index             1             [0, 1]        index / (n - 1)
    13   period_index             1             [0, 1]        index / (n - 1)
    14   elapsed_frac             1             [0, 1]        training time used / budget
    15   world_size               ranks         [1, 1e5]      number of ranks
    16   log10_num_params         log10         [0, 15]       model size
    17   log10_probe_gbps         log10 Gbit/s  [-4, 4]       probe all-reduce bus bandwidth
    18   log10_link_gbps          log10 Gbit/s  [-4, 4]       configured link (privileged)
    19   straggler_ms             ms            [0, 6e4]      straggler delay x prob (privileged)
    ===  =======================  ============  ============  =====================================

    ``bandwidth_gbps`` is the *effective* bandwidth the training step experienced
    (``effective_bandwidth_gbps``: bytes handed to collectives * 8 / seconds blocked on
    them), not the link rate. Transfers hidden behind backward, and on an emulated link
    bytes carried by the token bucket's burst (``tbf_burst_bytes``: 15 KB at 10 Mbit/s,
    50 KB at 100 Mbit/s) after it refilled during compute, cost no waiting, so it can read
    above the configured rate, more so on a busy machine; it is never below the decision's
    average throughput ``bytes_total * 8 / train_time_s``. The configured link is
    ``info["network"]``.

    ``log10_probe_gbps`` is measured independently of the configuration just played: with
    ``probe_bytes > 0`` every rank all-reduces a buffer of that size at the end of each
    decision (its time counts as training time) and the field is the bus bandwidth
    ``bytes * 2(W-1)/W * 8 / t`` of the fastest rank's time (0 without a probe). An
    episode reset with ``options={"probe": False}`` (the rollout's, for a player whose
    ``reads_probe`` is False: static entries, the oracles, heuristics that never read the
    field) runs no probe and reads 0 there, unless ``probe_for_all``. With
    ``probe_at="reset"`` the probe runs once instead, right after the reset on the
    episode's first link: the reset observation's field 17 reads it, the decisions' read 0,
    and the episode's training clock (``info["train_time_s"]``, which the reset's info
    carries too) starts at its time (the slowest rank's, as a decision's probe counts).
    Indices 18-19 reveal the configured conditions only with ``privileged_obs=True`` (an
    ablation; an unshaped link counts as 100 Gbit/s), else they are 0.

    The reset observation holds no timings (indices 0-4, 7-10 and 18-19 are 0; 17 too unless
    ``probe_at="reset"``), so ``reset(seed=s)`` twice gives identical observations (without
    that probe). Step observations contain measured wall times, so the env is registered
    ``nondeterministic=True``; with deterministic compressors the losses of a seed and action
    sequence are reproducible.

    **Reward** (``reward=``), per decision, with ``L`` the held-out loss of the consensus
    model (local-SGD replicas are averaged at every decision boundary; that cost counts):

    * ``log_progress`` (default): ``log(L_prev) - log(L_now)``. Episodes are truncated at
      ``time_budget_s`` of training time, so a faster configuration fits more progress
      into the same budget, and one that stops learning earns ~0 per decision. Only while
      the held-out loss still falls: once a workload overfits inside the budget (the
      digits MLP does after ~1 s) the return rewards slow configurations; use
      ``time_to_target`` there (the shipped scenarios do).
    * ``time_to_target``: ``-dt / time_budget_s`` (``dt`` = decision's training time);
      terminated when ``L <= target_loss``.
    * ``throughput``: samples per second / 1000. A naive objective that ignores
      convergence (compressing everything to nothing scores best); for comparison only.

    **Episode end** — ``terminated``: diverged (non-finite loss or gradient on any rank:
    ``info["reason"] = "diverged"``), target reached (``"target_reached"``), or a rank
    failed/hung (``"failure"``, with ``info["failure"]``; all ranks are killed and the next
    ``reset()`` relaunches them). ``truncated``: training time reached ``time_budget_s``
    (``"time_budget"``) or ``max_decisions`` was reached.

    Ranks persist across episodes: ``reset()`` rebuilds model, optimizer and data order
    from the episode seed without restarting processes (``info["reset_s"]``). Its
    parameter broadcasts are not training: on an emulated network they run on the plan's
    fastest link (:attr:`NetworkPlan.fastest_spec`), and the episode's own link is applied
    before the first decision.

    **Version history** — v0: first release. v1: the observation gains the probe and the
    privileged condition fields (17-19); at a decision boundary under local SGD only the
    parameters are averaged (the consensus model the held-out loss is measured on), the
    optimizer state stays rank-local until a switch to ``sync_period = 1`` averages it, as
    local SGD does (v0 averaged it uncompressed at every boundary, which cost more than the
    compressed average it followed); new options ``shards``, ``stragglers``,
    ``probe_bytes``, ``privileged_obs``; forking (:meth:`snapshot`/:meth:`restore`); the
    reset option ``probe`` (players that do not read the probe do not run it;
    ``probe_for_all`` restores the earlier charge to every player); later, the option
    ``probe_at`` (a probe once per episode, after the reset).

    Args:
        config: an :class:`EnvConfig`; or pass its fields as keyword arguments.
        render_mode: unsupported; anything but ``None`` warns and is ignored.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self, config: EnvConfig | None = None, render_mode: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__()
        if config is not None and kwargs:
            raise TypeError("pass either an EnvConfig or keyword arguments, not both")
        if render_mode is not None:
            # SB3's make_vec_env asks for "rgb_array" by default: warn, do not fail
            warnings.warn(
                f"render_mode {render_mode!r} is not supported by {type(self).__name__} "
                "(nothing to render); continuing without rendering",
                stacklevel=2,
            )
        self.config = config if config is not None else EnvConfig(**kwargs)
        cfg = self.config
        self.menu = cfg.menu
        longest = max(cfg.menu.sync_period)
        if longest > cfg.steps_per_decision:
            # the consensus model of every decision's end averages the replicas: a longer
            # period would silently train as a shorter one
            warnings.warn(
                f"sync_period {longest} exceeds steps_per_decision {cfg.steps_per_decision}: "
                "the env averages the replicas at the end of every decision (the consensus "
                "model whose held-out loss it measures), so any period above "
                f"{cfg.steps_per_decision} trains as period {cfg.steps_per_decision}; set "
                f"steps_per_decision >= {longest} for that period to take effect",
                UserWarning,
                stacklevel=2,
            )
        self.action_space = spaces.MultiDiscrete(self.menu.nvec)
        from commgym.env.workloads import get_workload

        self._num_params = (
            get_workload(cfg.workload).num_params() if not cfg.workload_modules else 1
        )
        self._obs = ObservationBuilder(self.menu, cfg.world_size, self._num_params)
        self.observation_space = self._obs.space
        self._reward = REWARDS[cfg.reward]
        self._cluster: Cluster | None = None
        self._net: Any = None
        self._net_spec: Any = None
        self._cross: Any = None  # CrossTraffic on self._net, made when a phase needs it
        self._crossing = cfg.cross_traffic_condition.for_episode(None)
        if cfg.network_plan.emulated:  # checked before any rank starts
            from commgym.env.net import host_check

            found = host_check(cfg.network_plan.specs, cfg.network_strict)
            if found is not None:
                kind, problem = found
                fix = {
                    "host": ". Use network=None for unshaped links",
                    "impairments": "; give rate-only specs, or network_strict=False to drop "
                    "delay/jitter/loss with a warning",
                }[kind]
                raise RuntimeError(f"network={cfg.network!r}: {problem}{fix}")
        self._last_obs: np.ndarray | None = None
        self._schedule: Any = None  # this episode's network schedule (shifted per seed)
        self._needs_reset = True
        self._env_snapshots: dict[str, dict[str, Any]] = {}
        # the probe buffer of the running episode's decisions, B (0: its player reads none)
        self._probe_bytes = self.config.probe_bytes
        self.last_reset_s = float("nan")
        self.launches = 0

    # -- cluster ------------------------------------------------------------------------
    def _ensure_cluster(self, first_spec: Any) -> Cluster:
        """Running ranks; an emulated network is built with ``first_spec`` if there is none."""
        if self._cluster is None or not self._cluster.alive:
            if self._cluster is not None:
                self._cluster.kill()
            cfg = self.config
            if first_spec is not None and self._net is None:
                from commgym.env.net import EmulatedNetwork

                self._net_spec = first_spec
                self._net = EmulatedNetwork(cfg.world_size, first_spec, strict=cfg.network_strict)
            self._cluster = Cluster(cfg.world_size, cfg.launch_config(), network=self._net)
            self._cluster.start()
            self.launches += 1
        return self._cluster

    def _set_network(self, spec: Any) -> None:
        if self._net is not None and spec != self._net_spec:
            self._net.apply(spec)
            self._net_spec = spec

    def _set_cross_traffic(self, spec: Any) -> None:
        if self._net is None or (self._cross is None and not spec.active):
            return
        if self._cross is None:
            self._cross = CrossTraffic(self._net)
        self._cross.apply(spec)

    @property
    def network(self) -> Any:
        """The :class:`~commgym.env.net.EmulatedNetwork` (None when unshaped)."""
        return self._net

    @property
    def cluster(self) -> Cluster | None:
        """The running cluster (None before the first reset or after close)."""
        return self._cluster

    # -- gymnasium API ---------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: D102
        probe = reset_probe_option(options)
        super().reset(seed=seed)
        cfg = self.config
        if seed is None and not hasattr(self, "_seeded"):
            # first reset without a seed: derive the stream from config.seed
            super().reset(seed=cfg.seed)
        self._seeded = True
        # a player that never reads the probe does not pay for it (unless probe_for_all)
        self._probe_bytes = cfg.probe_bytes if (probe or cfg.probe_for_all) else 0
        episode_seed = draw_episode_seed(self.np_random)
        # this episode's link, resolved once: it builds the network or is applied to it
        self._schedule = cfg.network_plan.for_episode(episode_seed)
        first_spec = None if self._schedule is None else self._schedule.spec_at(0.0)
        t0 = time.perf_counter()
        # the launch's and the reset's collectives (parameter broadcasts) are not training:
        # they run on the plan's fastest link, the episode's own link from the first step on
        cluster = self._ensure_cluster(cfg.network_plan.fastest_spec)
        if self._net is not None:
            self._set_network(cfg.network_plan.fastest_spec)
        self._crossing = cfg.cross_traffic_condition.for_episode(episode_seed)
        # like the link, the flows wait for training: the reset's broadcasts run without them
        self._set_cross_traffic(CrossTrafficSpec())
        self._action = self.menu.default_action()
        replies = cluster.command(
            # the workload, batch size and learning rate came with the launch config
            {
                "cmd": "reset",
                "seed": episode_seed,
                "config": self.menu.decode(self._action).to_dict(),
            },
            # building model and data is not a training decision: allow it at least
            # RESET_TIMEOUT_S even when timeout_s is tuned tight for steps
            timeout_s=max(cfg.timeout_s, RESET_TIMEOUT_S),
        )
        if self._net is not None:
            self._set_network(first_spec)
        self._set_cross_traffic(self._crossing.value_at(0.0))
        # probe_at="reset": one probe on the episode's first link, charged to its clock
        # as a decision's probe is (the slowest rank's time), read from the fastest rank's
        probe_s = probe_charge_s = 0.0
        if self._probe_bytes and cfg.probe_at == "reset":
            times = [
                float(r["probe_s"])
                for r in cluster.command({"cmd": "probe", "probe_bytes": self._probe_bytes})
            ]
            probe_s, probe_charge_s = min(times), max(times)
        self.last_reset_s = time.perf_counter() - t0
        r0 = replies[0]
        self._num_params = int(r0["num_params"])
        self._obs.num_params = self._num_params
        eval_loss, eval_acc = combine_eval(replies)
        self._eval_loss = eval_loss
        self._train_time_s = probe_charge_s
        self._decisions = 0
        self._episode_seed = episode_seed
        self._stragglers = cfg.straggler_condition.for_episode(episode_seed)
        self._env_snapshots.clear()  # the ranks dropped theirs at reset
        self._needs_reset = False
        obs = self._obs.reset(
            self._eval_loss,
            self._action,
            probe_gbps=probe_gbps(self._probe_bytes, probe_s, cfg.world_size),
        )
        self._last_obs = obs
        info = {
            "episode_seed": episode_seed,
            "train_time_s": self._train_time_s,
            "probe_s": probe_s,
            "eval_loss": self._eval_loss,
            "eval_acc": eval_acc,
            "num_params": self._num_params,
            "reset_s": self.last_reset_s,
            "rank_reset_s": max(float(r["reset_s"]) for r in replies),
            "launches": self.launches,
            "config": str(self.menu.decode(self._action)),
            "network": None if self._net_spec is None else str(self._net_spec),
        }
        return obs, info

    def step(self, action):  # noqa: D102
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (the episode ended or never started)")
        if not self.action_space.contains(np.asarray(action, dtype=np.int64)):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        a = np.asarray(action, dtype=np.int64)
        cfg_comm = self.menu.decode(a)
        cfg = self.config
        info: dict[str, Any] = {"config": str(cfg_comm), "action": cfg_comm.to_dict()}
        if self._net is not None:
            self._set_network(self._schedule.spec_at(self._train_time_s))
        self._set_cross_traffic(self._crossing.value_at(self._train_time_s))
        if self._net_spec is not None:
            info["network"] = str(self._net_spec)
        straggler = self._stragglers.value_at(self._train_time_s)
        info["condition"] = self.condition_at(self._train_time_s)
        t0 = time.perf_counter()
        try:
            msg: dict[str, Any] = {
                "cmd": "step",
                "config": cfg_comm.to_dict(),
                "steps": cfg.steps_per_decision,
            }
            # only what this decision needs (the worker's defaults: no jitter, no probe)
            if straggler.active:
                msg["straggler"] = straggler.to_message()
            if self._probe_bytes and cfg.probe_at == "decision":
                msg["probe_bytes"] = self._probe_bytes
            replies = self._cluster.command(msg)  # type: ignore[union-attr]
        except CommgymError as err:
            if self._cluster is not None:
                self._cluster.kill()
            self._needs_reset = True
            info.update(
                {"failure": str(err), "reason": "failure", "env_step_s": time.perf_counter() - t0}
            )
            return self._last_obs, 0.0, True, False, info
        measured = DecisionMeasurement.from_ranks(replies)
        m = measured.to_dict()
        m["env_step_s"] = time.perf_counter() - t0
        self._decisions += 1
        self._train_time_s += measured.train_time_s
        elapsed = min(1.0, self._train_time_s / cfg.time_budget_s)
        prev = self._eval_loss
        obs = self._obs.build(measured, a, elapsed, **self._revealed(straggler))
        self._action = a
        diverged = measured.nonfinite or not math.isfinite(measured.eval_loss)
        reward, terminated, truncated, reason = decision_outcome(
            cfg,
            self._reward,
            prev_eval_loss=prev,
            eval_loss=measured.eval_loss,
            dt_s=measured.train_time_s,
            samples=measured.samples,
            diverged=diverged,
            train_time_s=self._train_time_s,
            decisions=self._decisions,
        )
        if not diverged:
            self._eval_loss = measured.eval_loss
        if terminated or truncated:
            self._needs_reset = True
        self._last_obs = obs
        info.update(
            decision_info(
                config=info["config"],
                action=info["action"],
                measured=m,
                reason=reason,
                train_time_s=self._train_time_s,
                elapsed_frac=elapsed,
                decision=self._decisions,
                diverged=diverged,
            )
        )
        return obs, float(reward), terminated, truncated, info

    def _revealed(self, straggler: Any) -> dict[str, float]:
        """The privileged observation fields' values (empty unless ``privileged_obs``)."""
        if not self.config.privileged_obs:
            return {}
        from commgym.env.spaces import UNSHAPED_GBPS

        rate = UNSHAPED_GBPS if self._net_spec is None else self._net_spec.rate_bit_s / 1e9
        return {"link_gbps": rate, "straggler_ms": straggler.delay_s * straggler.prob * 1e3}

    # -- forking an episode ---------------------------------------------------------
    def snapshot(self) -> str:
        """Save the running episode's state (ranks and env) and return its key.

        The ranks copy model, optimizer, synchronizer, data order and straggler draws in
        memory; the env keeps its clock, counters and observation state. :meth:`restore`
        of the key continues the episode from this point exactly as it would have gone
        on (measured times aside). Snapshots live until :meth:`drop_snapshots` or the
        next :meth:`reset`. Used by ``oracle-adaptive`` to try every menu entry from the
        same state at each phase boundary.

        Returns:
            The snapshot's key.

        Raises:
            RuntimeError: no episode is running.
        """
        if self._needs_reset or self._cluster is None:
            raise RuntimeError("snapshot() needs a running episode: call reset() first")
        self._snapshot_count = getattr(self, "_snapshot_count", 0) + 1
        key = f"s{self._snapshot_count}"
        self._cluster.command({"cmd": "snapshot", "key": key})
        self._env_snapshots[key] = {
            "train_time_s": self._train_time_s,
            "decisions": self._decisions,
            "eval_loss": self._eval_loss,
            "action": np.array(self._action, copy=True),
            "last_obs": None if self._last_obs is None else self._last_obs.copy(),
            "prev": (self._obs.prev_eval_loss, self._obs.prev_grad_norm),
        }
        return key

    def restore(self, key: str) -> np.ndarray:
        """Continue from the snapshot ``key`` (the episode runs on from that point).

        Returns:
            The observation at the snapshot.

        Raises:
            KeyError: unknown key (snapshots end with the episode).
        """
        env_state = self._env_snapshots[key]
        if self._cluster is None:
            raise RuntimeError("restore() after close()")
        self._cluster.command({"cmd": "restore", "key": key})
        self._train_time_s = env_state["train_time_s"]
        self._decisions = env_state["decisions"]
        self._eval_loss = env_state["eval_loss"]
        self._action = env_state["action"].copy()
        self._last_obs = None if env_state["last_obs"] is None else env_state["last_obs"].copy()
        self._obs.prev_eval_loss, self._obs.prev_grad_norm = env_state["prev"]
        self._needs_reset = False
        return self._last_obs

    def drop_snapshots(self) -> None:
        """Free every snapshot (ranks and env)."""
        if self._cluster is not None and self._cluster.alive:
            self._cluster.command({"cmd": "drop", "keys": None})
        self._env_snapshots.clear()

    @property
    def episode_phases(self) -> list[tuple[float, str]]:
        """The running episode's condition phases: ``(start_training_s, label)`` pairs.

        A new phase starts wherever the link (``network``), the straggler jitter
        (``stragglers``) or the cross traffic (``cross_traffic``) switches; the label names
        them (``"20mbit, stragglers off"``, see :meth:`condition_at`).
        """
        return episode_phases(self.config, self._schedule, self._stragglers, self._crossing)

    def condition_at(self, train_time_s: float) -> str:
        """The conditions in force after ``train_time_s`` of the running episode, as a label.

        ``"<link>, stragglers <spec>"``: the link spec (``loopback`` when unshaped) and
        the straggler jitter (``off`` without); scenarios with cross traffic append
        ``", cross traffic <spec>"``. Decisions carry it in ``info["condition"]``
        (:func:`~commgym.env.schedule.condition_label`, shared with the simulator).
        """
        return condition_label(
            self.config, self._schedule, self._stragglers, self._crossing, train_time_s
        )

    def close(self) -> None:  # noqa: D102
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
        if self._cross is not None:
            self._cross.close()
            self._cross = None
        if self._net is not None:
            self._net.close()
            self._net = None
            self._net_spec = None
        self._needs_reset = True


class FlattenAction(gym.ActionWrapper):
    """``Discrete(prod(nvec))`` view of a ``MultiDiscrete`` env (for DQN).

    Index ``i`` maps to ``np.unravel_index(i, nvec)`` (row-major), a bijection; use
    :meth:`flatten` for the inverse.

    Raises:
        TypeError: the wrapped env's action space is not ``MultiDiscrete``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, spaces.MultiDiscrete):
            raise TypeError(
                f"FlattenAction needs a MultiDiscrete action space, got {env.action_space}"
            )
        self.nvec = np.asarray(env.action_space.nvec, dtype=np.int64)
        self.action_space = spaces.Discrete(int(np.prod(self.nvec)))

    def action(self, action: int) -> np.ndarray:
        """Discrete index -> MultiDiscrete indices.

        Raises:
            ValueError: index outside ``[0, n)``.
        """
        a = int(action)
        if not 0 <= a < self.action_space.n:
            raise ValueError(f"action {action!r} outside 0..{self.action_space.n - 1}")
        return np.array(np.unravel_index(a, tuple(self.nvec)), dtype=np.int64)

    def flatten(self, action: np.ndarray) -> int:
        """MultiDiscrete indices -> Discrete index."""
        return int(np.ravel_multi_index(tuple(int(x) for x in action), tuple(self.nvec)))
