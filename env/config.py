"""The env's configuration (:class:`EnvConfig`): every field a user sets, checked once.

Frozen in meaning once built: cross-field rules raise ``ValueError`` with the offending
values in ``__post_init__``; derived values (the action menu, the network plan, the cross
traffic) are parsed here once and read everywhere. Re-exported from
:mod:`commgym.env.allreduce_env` and :mod:`commgym.env`, where it lived before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from commgym.collectives.checks import check_int
from commgym.env.cluster import LaunchConfig
from commgym.env.net.cross_traffic import CrossTrafficSpec
from commgym.env.net.plan import NetworkPlan
from commgym.env.spaces import REWARDS, ActionMenu

__all__ = ["PROBE_AT", "EnvConfig", "check_probe_at"]

#: When the probe all-reduce runs (``EnvConfig.probe_at``): after every decision, or once
#: after each reset.
PROBE_AT = ("decision", "reset")


def check_probe_at(value: object) -> str:
    """``value`` if it is one of :data:`PROBE_AT`.

    Raises:
        ValueError: anything else (the message names the value and the valid ones).
    """
    if value not in PROBE_AT:
        raise ValueError(f"probe_at must be one of {list(PROBE_AT)}, got {value!r}")
    return str(value)


@dataclass
class EnvConfig:
    """Configuration of :class:`~commgym.env.AllReduceEnv` (also ``gymnasium.make`` kwargs).

    Attributes:
        workload: name in ``WORKLOADS`` (``mlp-digits``, ``cnn-digits``, ``charlm``,
            ``wide-mlp``) or a custom one registered in a module listed in
            ``workload_modules`` (ranks are separate processes and import those modules).
        world_size: number of ranks (processes), >= 1.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        device: ``"cpu"`` or ``"cuda"`` (``cuda`` implies ``nccl``).
        steps_per_decision: training iterations per ``step()`` (K), >= 1. Every decision
            ends with the replicas averaged (the consensus model its held-out loss is
            measured on), so a menu period above K trains as period K: the env warns.
        time_budget_s: training wall time per episode (sum over decisions of the slowest
            rank's training time); reaching it truncates the episode.
        target_loss: held-out loss that ends the episode (``terminated``); required by
            ``reward="time_to_target"``.
        reward: ``"log_progress"`` (default), ``"time_to_target"`` or ``"throughput"``.
        action_menu: :class:`ActionMenu` or a dict of lists.
        network: emulated cluster network (needs root or CAP_NET_ADMIN and iproute2;
            ranks then run in their own network namespaces, one torchrun agent each,
            with ``tc``-shaped links). ``None``: unshaped loopback. A spec or profile
            string (``"1gbit"``, ``"100mbit:5ms"``, ``"ethernet-1g"``, see
            ``commgym.env.net``); a schedule ``[[elapsed_training_s, spec], ...]``
            applied while the episode runs (``{"schedule": [...], "shift_s": s}`` moves
            every switch by a seeded uniform shift in ``[-s, s]`` per episode); or
            ``{"profiles": [...]}`` for a seeded random profile per episode.
        network_strict: without the kernel's netem qdisc, delay/jitter/loss raise (True)
            or are dropped with a warning (False; rate shaping still applies).
        seed: base seed (episode seeds are drawn from it unless ``reset(seed=...)``).
        timeout_s: deadline of every command to the ranks (must exceed one decision).
        batch_size: per-rank batch size (default: the workload's).
        lr: learning rate (default: the workload's).
        threads_per_rank: torch threads per rank.
        workload_modules: modules each rank imports (custom workload registration).
        max_decisions: optional hard cap on decisions per episode (truncation).
        shards: how the training set is split over ranks: ``"iid"`` or
            ``"label-skew[:f]"`` (non-IID, see :mod:`commgym.env.workloads.shards`).
        stragglers: straggler jitter (:mod:`commgym.env.stragglers`): ``None``/``"off"``,
            a spec (``"40ms"``, ``"40ms:p=0.5"``), a schedule ``[[elapsed_training_s,
            spec], ...]`` (``{"schedule": [...], "shift_s": s}``) or ``{"profiles":
            [...]}``, in the same forms as ``network`` (:mod:`commgym.env.schedule`).
        cross_traffic: competing bulk TCP flows on the emulated links
            (:mod:`commgym.env.net.cross_traffic`): ``None``/``"off"``, a spec
            (``"1flow"`` on rank 0's link, ``"2flows@all"``), or a schedule/profiles in the
            same forms as ``network``. Needs an emulated ``network``; the flows switch at
            decision boundaries (like the link) and run during the decision's steps.
        probe_bytes: size of a probe all-reduce every rank runs at the end of each decision
            (B; 0: none). Its time, counted as training time, gives the observation's
            ``log10_probe_gbps``: the link as measured independently of the configuration
            the decision ran. Only players that read it run it: the rollout resets an
            episode with ``options={"probe": agent.reads_probe}``, so static entries,
            the oracles' re-runs and baselines that ignore the field pay nothing for an
            observation they never make (``reset`` without that option: probe on).
        probe_at: when the probe runs (:data:`PROBE_AT`): ``"decision"``, at the end of
            every decision (the field reads the link as it is now); ``"reset"``, once per
            episode, right after ``reset`` on the episode's first link: the episode's
            training clock starts at its time, the reset observation carries it and the
            decisions read 0 there. One probe lets a policy choose its first entry for the
            link it is on, without paying the probe at every decision (64 KiB cost ~80 ms
            a decision at 10 Mbit/s); a link that changes later is not seen by it.
        probe_for_all: run the probe at every decision whatever the player (the option
            ``probe=False`` is ignored): how figures were measured before static players
            became probe-free, kept for comparisons with them.
        privileged_obs: reveal the configured conditions in the observation
            (``log10_link_gbps``, ``straggler_ms``): an ablation that tells an observability
            problem from a learning one, not something a real job knows.
        network_plan: ``network`` parsed once (:class:`~commgym.env.net.NetworkPlan`; set
            by ``__post_init__``): what the env, the surrogate and the tables read.

    Raises:
        ValueError: invalid values (messages name the value and what is valid).
    """

    workload: str = "mlp-digits"
    world_size: int = 2
    backend: str = "gloo"
    device: str = "cpu"
    steps_per_decision: int = 10
    time_budget_s: float = 30.0
    target_loss: float | None = None
    reward: str = "log_progress"
    action_menu: ActionMenu | dict[str, Any] | None = None
    network: str | list[Any] | dict[str, Any] | None = None
    network_strict: bool = True
    seed: int = 0
    timeout_s: float = 120.0
    batch_size: int | None = None
    lr: float | None = None
    threads_per_rank: int = 1
    workload_modules: tuple[str, ...] = ()
    max_decisions: int | None = None
    shards: str = "iid"
    stragglers: str | list[Any] | dict[str, Any] | None = None
    cross_traffic: str | list[Any] | dict[str, Any] | None = None
    probe_bytes: int = 0
    probe_at: str = "decision"
    probe_for_all: bool = False
    privileged_obs: bool = False
    menu: ActionMenu = field(init=False, repr=False)
    network_plan: NetworkPlan = field(init=False, repr=False, default_factory=NetworkPlan)

    def __post_init__(self) -> None:
        for name in ("world_size", "steps_per_decision", "threads_per_rank"):
            check_int(name, getattr(self, name), 1)
        for name in ("batch_size", "max_decisions"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        if (
            isinstance(self.probe_bytes, bool)
            or not isinstance(self.probe_bytes, int)
            or not (0 <= self.probe_bytes <= 2**30)
        ):
            raise ValueError(
                f"probe_bytes must be an integer in [0, 2**30], got {self.probe_bytes!r}"
            )
        check_probe_at(self.probe_at)
        for name in ("privileged_obs", "probe_for_all"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("time_budget_s", "timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {v!r}")
        if self.lr is not None and not (isinstance(self.lr, int | float) and self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"unknown reward {self.reward!r}; valid: {sorted(REWARDS)}")
        if self.reward == "time_to_target" and self.target_loss is None:
            raise ValueError("reward 'time_to_target' needs target_loss (held-out loss to reach)")
        if self.target_loss is not None and not (
            math.isfinite(self.target_loss) and self.target_loss > 0
        ):
            raise ValueError(f"target_loss must be a finite loss > 0, got {self.target_loss!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda":
            self.backend = "nccl"
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("backend 'nccl' needs device='cuda'")
        self.network_plan = NetworkPlan.parse(self.network)
        from commgym.env.schedule import Condition
        from commgym.env.stragglers import StragglerSpec
        from commgym.env.workloads.shards import parse_shards

        parse_shards(self.shards)
        self.straggler_condition = Condition.parse(
            self.stragglers, StragglerSpec.parse, "stragglers"
        )
        self.cross_traffic_condition = Condition.parse(
            self.cross_traffic, CrossTrafficSpec.parse, "cross_traffic"
        )
        busy = [c for c in self.cross_traffic_condition.values if c.active]
        for spec in busy:
            spec.busy_ranks(self.world_size)  # raises for a rank outside the world
        if busy and not self.network_plan.emulated:
            raise ValueError(
                f"cross_traffic={self.cross_traffic!r} needs an emulated network (e.g. "
                "network: 1gbit): its flows compete for a shaped link, and an unshaped "
                "one would only load the CPU"
            )
        from commgym.env.workloads import WORKLOADS, get_workload

        if (
            isinstance(self.workload, str)
            and self.workload not in WORKLOADS
            and not self.workload_modules
        ):
            get_workload(self.workload)  # raises with the known names
        self.workload_modules = tuple(self.workload_modules)
        self.menu = ActionMenu.from_any(self.action_menu)

    def launch_config(self) -> LaunchConfig:
        """What every rank receives once before it joins the process group.

        Built from this config's fields of the same names (the field list is
        :class:`~commgym.env.cluster.LaunchConfig`'s own).
        """
        return LaunchConfig(**{f.name: getattr(self, f.name) for f in fields(LaunchConfig)})

    def to_dict(self) -> dict[str, Any]:
        """Plain values (menu as lists), e.g. for MLflow params and YAML."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        d["action_menu"] = self.menu.to_dict()
        d["workload_modules"] = list(self.workload_modules)
        return d
