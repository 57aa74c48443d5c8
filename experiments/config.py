"""Run configuration: one function resolves YAML < CLI flags, unknown keys are errors."""

from __future__ import annotations

import copy
import difflib
import importlib.util
import inspect
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from commgym.collectives.checks import check_int

__all__ = [
    "CLI_FIELDS",
    "CONFIG_DIR",
    "ENV_KINDS",
    "EXECUTORS",
    "CliField",
    "RunConfig",
    "can_fine_tune",
    "keyed_agent_kwargs",
    "load_run_config",
    "shipped_configs",
]

#: Where real episodes run (``RunConfig.executor``): embedded in this process, or on Ray.
EXECUTORS = ("local", "ray")

#: Where an agent learns (``RunConfig.env_kind``): real ranks, the regression surrogate
#: (``commgym/Surrogate-v1``) or the factorised simulator (``commgym/Sim-v1``).
ENV_KINDS = ("real", "surrogate", "sim")

#: Folder of the scenario files shipped with commgym (see :func:`shipped_configs`).
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass
class RunConfig:
    """Everything ``commgym train`` / ``commgym evaluate`` need, with defaults.

    Attributes:
        agent: agent name in ``AGENTS`` (``ppo``, ``bayesopt``, ``static:ddp-default``...).
        agent_kwargs: hyperparameters per agent name (``{"ppo": {"n_steps": 256}}``); the
            learned agent gets its own entry only (:attr:`agent_hyperparams`), so a
            scenario's PPO settings never reach ``--agent bayesopt``. The flat form
            (``{"n_steps": 256}``) is read as the settings of the config's own ``agent``.
        timesteps: decisions used to train the agent.
        seed: seed of the agent and of the training episodes.
        env: ``EnvConfig`` fields (``workload``, ``world_size``, ``steps_per_decision``,
            ``time_budget_s``, ``action_menu``, ...); resolved once into ``env_config``
            (an ``EnvConfig``, set by ``__post_init__``), which the real env is built from.
        episodes: evaluation episodes per agent (seeds ``eval_seed + i``).
        eval_seed: first evaluation seed (shared by every compared agent); the seeds
            ``eval_seed`` .. ``eval_seed + episodes - 1`` lie in ``[0, 10_000)``, below the
            learners' training seeds (:data:`~commgym.agents.rollout_table.FIRST_TRAINING_SEED`),
            and never include ``seed``.
        baselines: agents compared with the trained policy.
        tracking_uri: MLflow tracking URI (default: ``sqlite:///<cwd>/mlflow.db`` or
            ``MLFLOW_TRACKING_URI``).
        experiment: MLflow experiment name.
        output_dir: folder for the policy, plots and CSVs.
        env_kind: where the agent learns: ``"real"`` (``commgym/AllReduce-v1``),
            ``"surrogate"`` (``commgym/Surrogate-v1``) or ``"sim"`` (the factorised
            simulator ``commgym/Sim-v1``); evaluation stays on real ranks.
        surrogate: fitted surrogate model file for ``env_kind="surrogate"``; ``None``
            collects ``surrogate_decisions`` real decisions of the scenario first (sticky
            random exploration) and fits one into ``output_dir``.
        surrogate_decisions: real decisions recorded when ``surrogate`` is ``None``.
        calibration: the simulator's calibration (a ``commgym calibrate-sim`` JSON) for
            ``env_kind="sim"``; ``None``: ``sim-calibration/<workload setting>.json`` under
            the current folder, calibrated on real ranks first when it does not exist
            (:func:`~commgym.experiments.calibrate_sim.calibrate_sim`, its defaults). Also
            the record ``mpc`` plans over when its own kwargs name none.
        sim_randomize: domain randomisation while learning in the simulator
            (``env_kind="sim"``; the schedule's keys need a link schedule): the keyword arguments
            of :class:`~commgym.env.sim.randomize.RandomizedConditions`, e.g.
            ``{length_jitter: 0.4, rate_swap: 0.1}``, with the decisions' timing randomised
            too by ``compute_scale: [lo, hi]``, ``timing_noise`` and ``probe_noise``; ``None``: the
            scenario's own schedule.
            Evaluation and the sim-to-real gap use the scenario as it is.
        sim_warm_start: behaviour cloning before RL in the simulator (``env_kind="sim"``,
            ``ppo`` or ``a2c``): ``{episodes: N, epochs: E}`` (optional ``batch_size``,
            ``learning_rate``): N episodes of the simulator's reactive oracle
            (:class:`~commgym.agents.imitation.SimScheduleExpert`, the best schedule a
            player that sees a new link one decision late can follow) recorded on the
            learning env and cloned (:meth:`~commgym.agents.sb3.SB3Agent.warm_start`),
            then ``timesteps`` decisions of RL fine-tuning (0 allowed here: the clone as
            it is); ``None``: RL from scratch. ``opening``: the expert's first decision
            where each episode draws its link (the expert's ``opening``: an entry,
            ``best`` (default) or ``null``). ``expert: mpc`` clones the model-predictive
            agent instead (it anticipates from the dwells it learns in ``expert_timesteps``
            simulated decisions, default 300; ``expert_kwargs`` are its own, e.g.
            ``{link_from: probe}``), the expert for a policy with a ``link_clock``.
            ``dagger_rounds: R`` (default 0) adds R DAgger rounds after the clone: N
            episodes each played by the clone and labelled by the expert, the policy
            refitted on all of them (:meth:`~commgym.agents.sb3.SB3Agent.warm_start`).
            ``regret_scale_s: s`` (mpc expert only) weighs each decision by the expert's
            priced regret of the entry the clone plays there
            (:meth:`~commgym.agents.sb3.SB3Agent.behaviour_clone`).
        tuning_decisions: real decisions each tuning baseline (``bayesopt``, ``grid``,
            ``bandit``, ``accordion``, ``adacomm``, learning agents) spends tuning before
            it is evaluated; ``None``: as many as the learned agent saw on real ranks
            (``surrogate_decisions`` when it learns on the surrogate or the simulator,
            else ``timesteps``), see :attr:`resolved_tuning_decisions`.
        baseline_kwargs: hyperparameters per baseline name, e.g. ``{"autotune":
            {"tuning_decisions": 4}}`` (sized to the scenario's episodes); names must be
            agents of ``baselines`` or of a leaderboard's agents.
        fine_tune_episodes: after learning on the surrogate, episodes of fine-tuning on
            real ranks (SB3 agents; the sim-to-real recipe, 0 to 10; 0: none), the
            same after learning on the simulator. Their
            real decisions count in the agent's training cost. A scenario file's value
            applies to agents that can fine-tune only (:func:`load_run_config`).
        executor: where real episodes run: ``"local"`` (embedded: this process's env, one
            episode after another) or ``"ray"`` (env actors on a Ray cluster, independent
            episodes in parallel; :mod:`commgym.experiments.executors`, needs the
            ``commgym[ray]`` extra).
        ray_address: the Ray cluster of ``executor="ray"``, as ``ray.init`` takes it
            (``"auto"``, ``HOST:PORT``, ``ray://HOST:PORT``); ``None``: ``$RAY_ADDRESS``,
            else a local Ray instance started on 127.0.0.1 for this run.
        ray_envs: env actors of ``executor="ray"`` (``None``: as many as the cluster's
            CPUs hold, each reserving ``world_size x threads_per_rank``).
    """

    agent: str = "ppo"
    agent_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    timesteps: int = 256
    seed: int = 0
    env: dict[str, Any] = field(default_factory=dict)
    episodes: int = 3
    eval_seed: int = 1000
    baselines: list[str] = field(
        default_factory=lambda: ["static:ddp-default", "static:fp16-dense"]
    )
    tracking_uri: str | None = None
    experiment: str = "commgym"
    output_dir: str = "commgym-out"
    env_kind: str = "real"
    surrogate: str | None = None
    surrogate_decisions: int = 400
    calibration: str | None = None
    sim_randomize: dict[str, float] | None = None
    sim_warm_start: dict[str, Any] | None = None
    tuning_decisions: int | None = None
    fine_tune_episodes: int = 0
    baseline_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    executor: str = "local"
    ray_address: str | None = None
    ray_envs: int | None = None

    def __post_init__(self) -> None:
        if self.env_kind not in ENV_KINDS:
            raise ValueError(f"env_kind must be one of {list(ENV_KINDS)}, got {self.env_kind!r}")
        for name in ("timesteps", "episodes", "surrogate_decisions", "tuning_decisions"):
            v = getattr(self, name)
            if v is None and name == "tuning_decisions":
                continue
            if name == "timesteps" and self.sim_warm_start is not None:
                # a cloned policy may be deployed as cloned: RL fine-tuning is optional
                check_int(name, v, 0, note=" (0: the clone of sim_warm_start, no RL after it)")
                continue
            check_int(name, v, 1)
        ft = self.fine_tune_episodes
        note = " (a few real episodes after learning on the surrogate)"
        check_int("fine_tune_episodes", ft, 0, 10, note)
        if ft and self.env_kind == "real":
            raise ValueError(
                f"fine_tune_episodes={ft} refines a policy learned on the surrogate or the "
                "simulator; with env_kind='real' the agent already learns on real ranks (set "
                "it to 0)"
            )
        if not isinstance(self.baseline_kwargs, dict) or not all(
            isinstance(v, dict) for v in self.baseline_kwargs.values()
        ):
            raise ValueError(
                "baseline_kwargs must map agent names to mappings of hyperparameters, got "
                f"{self.baseline_kwargs!r}"
            )
        if not isinstance(self.env, dict):
            raise ValueError(f"env must be a mapping of EnvConfig fields, got {self.env!r}")
        self._check_executor()
        if isinstance(self.baselines, str):
            self.baselines = [b.strip() for b in self.baselines.split(",") if b.strip()]
        from commgym.agents import AGENTS
        from commgym.agents.baselines import resolve_preset
        from commgym.agents.rollout_table import FIRST_TRAINING_SEED
        from commgym.env import EnvConfig

        check_int(
            "seed", self.seed, 0, note=" (learners train on seeds derived from it, above the "
            "evaluation seeds)"
        )  # fmt: skip
        es = self.eval_seed
        if (
            isinstance(es, bool)
            or not isinstance(es, int)
            or es < 0
            or es + self.episodes > FIRST_TRAINING_SEED
        ):
            raise ValueError(
                f"eval_seed must be an integer >= 0 with eval_seed + episodes <= "
                f"{FIRST_TRAINING_SEED} (learners train on the seeds from there), got "
                f"eval_seed={es!r} with episodes={self.episodes}"
            )
        if isinstance(self.seed, int) and es <= self.seed < es + self.episodes:
            raise ValueError(
                f"the evaluation seeds {es}..{es + self.episodes - 1} include seed={self.seed}, "
                "the seed of the agent's first training episode: move --eval-seed or --seed"
            )

        self.agent_kwargs = keyed_agent_kwargs(self.agent_kwargs, self.agent)
        # resolved and validated once, here; the env is built from this very object
        self.env_config = EnvConfig(**self.env)
        self._check_sim_randomize()
        self._check_sim_warm_start()
        from commgym.agents.autotune import OBJECTIVES

        for name in [self.agent, *self.baselines, *self.baseline_kwargs, *self.agent_kwargs]:
            base, _, preset = name.partition(":")
            if base != "static" and base not in AGENTS:
                close = difflib.get_close_matches(base, sorted(AGENTS), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown agent {name!r}; known: {sorted(AGENTS)}.{hint}")
            if base == "autotune" and preset and preset not in OBJECTIVES:
                raise ValueError(
                    f"unknown autotune objective in {name!r}; valid: "
                    f"{', '.join(f'autotune:{o}' for o in sorted(OBJECTIVES))}"
                )
            if base == "static" and preset:  # on this scenario's menu, before any rank starts
                try:
                    resolve_preset(self.env_config.menu, preset)
                except ValueError as err:
                    raise ValueError(f"agent {name!r}: {err}") from None
        # mpc plans over a calibration record: refused here, before any rank starts
        planners = [(self.agent, self.agent_kwargs.get(self.agent, {}))]
        planners += [(b, self.baseline_kwargs.get(b, {})) for b in self.baselines]
        for name, kwargs in planners:
            if name == "mpc" and not kwargs.get("calibration"):
                where = "agent_kwargs" if name == self.agent else "baseline_kwargs"
                # the run's one calibration: --calibration, or on the simulator the default
                # file, which train calibrates before any agent is built
                if self.calibration or self.env_kind == "sim":
                    from commgym.experiments.calibrate_sim import calibration_path

                    path = str(calibration_path(self.calibration, self.env_config))
                    held = getattr(self, where)
                    held["mpc"] = {**held.get("mpc", {}), "calibration": path}
                    continue
                raise ValueError(
                    "agent 'mpc' plans over a calibrated simulator model: give its record "
                    "(from `commgym calibrate-sim`) as --calibration PATH or as "
                    f"{where}: {{mpc: {{calibration: PATH}}}}"
                )
        # a link clock read by mpc's timing filter plans over the run's calibration too
        for name, kwargs in self.agent_kwargs.items():
            clock = kwargs.get("link_clock")
            if (
                isinstance(clock, dict)
                and clock.get("reader") == "mpc"
                and not clock.get("calibration")
            ):
                if not (self.calibration or self.env_kind == "sim"):
                    raise ValueError(
                        f"{name}'s link_clock {{reader: mpc}} reads mpc's timing filter, which "
                        "plans over a calibrated simulator model: give --calibration PATH or "
                        "learn in the simulator (env_kind: sim)"
                    )
                from commgym.experiments.calibrate_sim import calibration_path

                path = str(calibration_path(self.calibration, self.env_config))
                kwargs["link_clock"] = {**clock, "calibration": path}
        if ft and not can_fine_tune(self.agent):
            raise ValueError(
                f"fine_tune_episodes={ft} refines the policy of an SB3 agent (ppo, "
                f"recurrent-ppo, a2c, dqn); {self.agent!r} has no fine-tuning "
                "(--fine-tune-episodes 0)"
            )

    @property
    def agent_hyperparams(self) -> dict[str, Any]:
        """The learned agent's own hyperparameters: ``agent_kwargs[agent]`` (or none)."""
        return dict(self.agent_kwargs.get(self.agent, {}))

    def _check_sim_randomize(self) -> None:
        r = self.sim_randomize
        if r is None:
            return
        from commgym.env.sim.randomize import check_randomization

        known = tuple(inspect.signature(check_randomization).parameters)
        if not isinstance(r, dict) or not set(r) <= set(known):
            raise ValueError(
                f"sim_randomize must map some of {list(known)} to values (compute_scale: "
                f"[lo, hi]; the others numbers), got {r!r}"
            )
        try:
            check_randomization(**r)
        except ValueError as err:
            raise ValueError(f"sim_randomize: {err}") from None
        if self.env_kind != "sim":
            raise ValueError(
                f"sim_randomize redraws the link schedule while learning in the simulator; "
                f"env_kind is {self.env_kind!r} (set env_kind: sim, or drop sim_randomize)"
            )
        kind = self.env_config.network_plan.kind
        timing = r.get("compute_scale") is not None or bool(
            r.get("timing_noise") or r.get("probe_noise")
        )
        if kind != "schedule" and not timing:
            raise ValueError(
                "sim_randomize redraws a link schedule or the decisions' timing; this "
                f"scenario's network is {kind!r}, which has no schedule (give env.network a "
                "schedule, set compute_scale, timing_noise or probe_noise, or drop sim_randomize)"
            )

    def _check_sim_warm_start(self) -> None:
        w = self.sim_warm_start
        if w is None:
            return
        known = {
            "episodes": 1,
            "epochs": 1,
            "batch_size": 1,
            "expert_timesteps": 1,
            "dagger_rounds": 0,
        }
        others = {"learning_rate", "opening", "expert", "expert_kwargs", "regret_scale_s"}
        if not isinstance(w, dict) or "episodes" not in w or not set(w) <= {*known, *others}:
            raise ValueError(
                "sim_warm_start must be a mapping with 'episodes' and optionally "
                f"{', '.join(repr(k) for k in sorted({*known, *others} - {'episodes'}))}, "
                f"got {w!r}"
            )
        expert = w.get("expert", "oracle")
        if expert not in ("oracle", "mpc"):
            raise ValueError(f"sim_warm_start.expert must be 'oracle' or 'mpc', got {expert!r}")
        if expert != "mpc" and ("expert_kwargs" in w or "expert_timesteps" in w):
            raise ValueError(
                "sim_warm_start.expert_kwargs and expert_timesteps are the mpc expert's; "
                "set expert: mpc, or drop them"
            )
        if expert == "mpc" and "opening" in w:
            raise ValueError(
                "sim_warm_start.opening is the oracle expert's first entry; mpc chooses its "
                "own (drop opening, or set expert: oracle)"
            )
        if not isinstance(w.get("expert_kwargs", {}), dict):
            raise ValueError(
                f"sim_warm_start.expert_kwargs must be a mapping, got {w['expert_kwargs']!r}"
            )
        opening = w.get("opening", "best")
        if opening not in (None, "best"):
            entries = self.env_config.menu.entry_names()
            if opening not in entries:
                raise ValueError(
                    f"sim_warm_start.opening {opening!r} is not an entry of the action menu; "
                    f"valid: {', '.join(entries)}, 'best' or null"
                )
        for name, low in known.items():
            if name in w:
                check_int(f"sim_warm_start.{name}", w[name], low)
        for name in ("learning_rate", "regret_scale_s"):
            v = w.get(name, 1.0)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"sim_warm_start.{name} must be a number > 0, got {v!r}")
        if "regret_scale_s" in w and expert != "mpc":
            raise ValueError(
                "sim_warm_start.regret_scale_s weighs decisions by the expert's priced regret, "
                "which only the mpc expert gives; set expert: mpc, or drop regret_scale_s"
            )
        if self.env_kind != "sim":
            raise ValueError(
                "sim_warm_start clones the simulator's oracle before RL; env_kind is "
                f"{self.env_kind!r} (set env_kind: sim, or drop sim_warm_start)"
            )
        if not can_warm_start(self.agent):
            raise ValueError(
                "sim_warm_start clones into an actor-critic policy (agent "
                f"{' or '.join(WARM_STARTABLE)}); agent is {self.agent!r} (drop sim_warm_start)"
            )

    def _check_executor(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {self.executor!r}")
        envs = self.ray_envs
        if envs is not None:
            check_int("ray_envs", envs, 1)
        if self.executor == "local" and (self.ray_address is not None or envs is not None):
            raise ValueError(
                f"ray_address={self.ray_address!r} / ray_envs={envs!r} take effect with "
                "executor 'ray' only (--executor ray)"
            )
        if self.executor == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError(
                "executor 'ray' needs Ray, which is not installed: pip install 'commgym[ray]'"
            )

    @property
    def resolved_tuning_decisions(self) -> int:
        """Real decisions a tuning baseline gets before evaluation.

        ``tuning_decisions`` when set, else the real-decision budget the learned agent
        had: ``surrogate_decisions`` on the surrogate (its recording), ``timesteps`` on
        real ranks. On the simulator the calibration's real decisions are known only once
        it ran, so the surrogate's budget applies; ``commgym train`` prints the
        calibration's count (pass ``tuning_decisions`` to match it).
        """
        if self.tuning_decisions is not None:
            return self.tuning_decisions
        return self.timesteps if self.env_kind == "real" else self.surrogate_decisions

    def to_dict(self, *, resolved: bool = True) -> dict[str, Any]:
        """Plain values (for YAML and MLflow params).

        Args:
            resolved: expand ``env`` to every ``EnvConfig`` field (defaults included), so
                the record says exactly what ran (backend, network, menu, ...).
        """
        d = asdict(self)
        if resolved:
            d["tuning_decisions"] = self.resolved_tuning_decisions
            d["env"] = self.env_config.to_dict()
        return d


def keyed_agent_kwargs(kwargs: Any, agent: str) -> dict[str, dict[str, Any]]:
    """``agent_kwargs`` keyed by agent name; the flat form is ``agent``'s.

    A mapping whose keys are all agent names (``ppo``, ``static:int8/4MB/H1``, ...) with
    mappings as values is already keyed; any other mapping (``{"n_steps": 256}``) holds
    the hyperparameters of ``agent``.

    Raises:
        ValueError: ``kwargs`` is not a mapping.
    """
    from commgym.agents import AGENTS

    if not isinstance(kwargs, dict):
        raise ValueError(f"agent_kwargs must map agent names to hyperparameters, got {kwargs!r}")
    keyed = all(isinstance(v, dict) and k.partition(":")[0] in AGENTS for k, v in kwargs.items())
    return {k: dict(v) for k, v in kwargs.items()} if keyed else {agent: dict(kwargs)}


def can_fine_tune(agent: str) -> bool:
    """Whether ``agent`` has a real-rank fine-tuning phase (SB3 agents)."""
    from commgym.agents import AGENTS

    cls = AGENTS.get(agent.partition(":")[0])
    return cls is not None and hasattr(cls, "fine_tune")


def can_warm_start(agent: str) -> bool:
    """Whether ``agent`` can start as a clone of the simulator's oracle (``sim_warm_start``)."""
    return agent.partition(":")[0] in WARM_STARTABLE


#: Agents whose policy behaviour cloning fits (a feed-forward actor-critic's likelihood).
WARM_STARTABLE = ("ppo", "a2c")


@dataclass(frozen=True)
class CliField:
    """How one config field is offered on the command line (see :data:`CLI_FIELDS`).

    The option's type comes from the field's annotation (``X | None`` gives ``X``), its
    default is "not given" (the scenario, or the dataclass default, decides), and its
    value lands in :func:`load_run_config`'s overrides under the field's key.

    Attributes:
        help: option help. ``{agents}``, ``{workloads}`` and ``{configs}`` are filled
            from the registries when help is shown; the resolved default is appended.
        flag: option declaration; default ``--<field-name>`` (``--<name>/--no-<name>``
            for a bool).
        min: lower bound the parser enforces (numbers).
        cli_type: the command-line type where the field's own is wider (``network`` also
            takes schedules and profile dicts in YAML; on the command line a spec string).
        show_default: append the resolved default to the help (off where ``help`` says
            what "unset" means).
    """

    help: str
    flag: str | None = None
    min: int | float | None = None
    cli_type: type | None = None
    show_default: bool = True


_TUNING_HELP = (
    "Real decisions each tuning baseline (bayesopt, grid, bandit, ...) tunes on before "
    "evaluation; its wall time is reported as tuning cost. Default: as many real decisions "
    "as the learned agent saw (surrogate_decisions, or timesteps with --env real)."
)

#: Command-line options of config fields, by key: a :class:`RunConfig` field name, or
#: ``env.<EnvConfig field>``. A field listed here becomes an option of every command that
#: takes all config options (``commgym train``) and may be named by the others; its type
#: and value checks are the dataclass's own.
CLI_FIELDS: dict[str, CliField] = {
    "agent": CliField("Agent name: {agents}; or static:<menu entry>, e.g. static:int8/4MB/H1."),
    "env.workload": CliField("Workload: {workloads}."),
    "env.world_size": CliField("Number of ranks.", min=1),
    "timesteps": CliField(
        "Training decisions (0 only with sim_warm_start: the clone, no RL after it).", min=0
    ),
    "env.network": CliField(
        "Emulated cluster network for every rank, a spec or profile, e.g. 100mbit, "
        "1gbit:200us, ethernet-1g, wan-100m (needs root or CAP_NET_ADMIN; default: loopback).",
        cli_type=str,
        show_default=False,
    ),
    "env.network_strict": CliField(
        "Without the kernel's netem (sch_netem), refuse (default) or drop delay/jitter/loss "
        "with a warning and keep the rate shaping.",
        flag="--network-strict/--drop-impairments",
        show_default=False,
    ),
    "seed": CliField("Agent and episode seed (>= 0).", min=0),
    "env.steps_per_decision": CliField("Training iterations per decision.", min=1),
    "env.time_budget_s": CliField("Training seconds per episode (truncates)."),
    "episodes": CliField("Evaluation seeds per agent.", min=1),
    "eval_seed": CliField(
        "First evaluation seed: every agent plays seeds eval-seed, eval-seed + 1, ... "
        "(e.g. 1003 with 3 seeds adds three new seeds to a run on 1000-1002).",
        min=0,
    ),
    "baselines": CliField(
        "Comma-separated agents to compare, e.g. static:ddp-default,static:fp16-dense,"
        "bayesopt. Known: {agents}.",
        cli_type=str,
    ),
    "tuning_decisions": CliField(_TUNING_HELP, min=1, show_default=False),
    "tracking_uri": CliField(
        "MLflow tracking URI (default: sqlite:///$PWD/mlflow.db).", show_default=False
    ),
    "output_dir": CliField("Folder for the policy, plots and CSVs."),
    "env_kind": CliField(
        "Where the agent learns: 'surrogate' (fitted first from real decisions unless "
        "--surrogate is given), 'sim' (the factorised simulator, calibrated first unless "
        "--calibration is given) or 'real' ranks. Evaluation always runs on real ranks.",
        flag="--env",
    ),
    "calibration": CliField(
        "The simulator's calibration JSON (with --env sim; unset: "
        "sim-calibration/<workload setting>.json, calibrated first when missing).",
        show_default=False,
    ),
    "surrogate": CliField(
        "Surrogate model file (with --env surrogate; unset: collect and fit first).",
        show_default=False,
    ),
    "surrogate_decisions": CliField("Real decisions recorded to fit the surrogate.", min=1),
    "env.target_loss": CliField("Held-out loss that ends an episode (time-to-target)."),
    "env.max_decisions": CliField("Cap on decisions per episode (truncates).", min=1),
    "fine_tune_episodes": CliField(
        "Real episodes of fine-tuning after learning on the surrogate or simulator (0-10).",
        min=0,
    ),
    "env.shards": CliField(
        "How the training set is split over ranks: iid, or label-skew[:f] (non-IID: "
        "sorted by label into one block per rank, a fraction f of each block kept).",
    ),
    "env.stragglers": CliField(
        "Straggler jitter: one random rank sleeps this long per iteration, e.g. 40ms or "
        "40ms:p=0.5 (a probability per iteration); YAML also takes schedules (default: off).",
        cli_type=str,
        show_default=False,
    ),
    "env.cross_traffic": CliField(
        "Competing bulk TCP flows on the emulated links, e.g. 1flow (rank 0's link), "
        "2flows@all; needs --network; YAML also takes schedules (default: off).",
        cli_type=str,
        show_default=False,
    ),
    "env.probe_bytes": CliField(
        "Bytes of a probe all-reduce at the end of every decision, timed for the "
        "observation's link estimate (its time counts as training; 0: none).",
        min=0,
    ),
    "env.probe_at": CliField(
        "When the probe runs: decision (at the end of every decision) or reset (once per "
        "episode, after the reset: the first decision sees the link without a probe at "
        "every decision).",
    ),
    "env.probe_for_all": CliField(
        "Run the probe at every decision of every player, as figures were measured before "
        "static players and the oracles became probe-free (default: only players that "
        "read the probe run it).",
        flag="--probe-for-all/--probe-readers-only",
        show_default=False,
    ),
    "env.privileged_obs": CliField(
        "Reveal the configured link rate and straggler jitter in the observation (an "
        "ablation: a real job does not know them).",
        flag="--privileged-obs/--no-privileged-obs",
    ),
    "executor": CliField(
        "Where real episodes run: 'local' (embedded, one after another) or 'ray' (env "
        "actors on a Ray cluster, independent episodes in parallel; needs "
        "pip install 'commgym[ray]')."
    ),
    "ray_address": CliField(
        "Ray cluster of --executor ray: auto (the running one), HOST:PORT or "
        "ray://HOST:PORT (default: $RAY_ADDRESS, else a local Ray instance on 127.0.0.1).",
        show_default=False,
    ),
    "ray_envs": CliField(
        "Env actors of --executor ray (default: as many as the cluster's CPUs hold, each "
        "reserving world size x threads per rank).",
        min=1,
        show_default=False,
    ),
}


def shipped_configs() -> list[str]:
    """Names of the scenarios shipped in :data:`CONFIG_DIR` (``--config NAME``)."""
    return sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))


def _check_keys(data: dict[str, Any], valid: list[str], where: str) -> None:
    unknown = sorted(set(data) - set(valid))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, valid, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"unknown {where} keys: {', '.join(hints)}; valid keys: {sorted(valid)}")


def _config_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists() and (CONFIG_DIR / f"{path}.yaml").exists():
        p = CONFIG_DIR / f"{path}.yaml"
    if not p.exists():
        raise FileNotFoundError(
            f"config file {str(path)!r} not found; shipped scenarios: {shipped_configs()}"
        )
    return p


def _read_config(
    path: str | Path, run_fields: list[str], env_fields: list[str], chain: tuple[Path, ...]
) -> dict[str, Any]:
    """One config file's keys, on top of the file it ``extends`` (checked, agent-keyed).

    ``extends: NAME`` (a shipped scenario or a path, relative to the extending file's
    folder when it is one) reads that file first; this file's keys replace its keys, except
    ``env``, whose fields are replaced one by one, and ``agent_kwargs``, merged per agent.
    A variant of a scenario (another agent, another learning recipe) so names the scenario
    once instead of copying its ``env`` block, which would drift from it.
    """
    p = _config_file(path)
    if p.resolve() in chain:
        names = " -> ".join(str(c) for c in (*chain, p.resolve()))
        raise ValueError(f"config files extend each other in a cycle: {names}")
    loaded = yaml.safe_load(p.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {p} must hold a mapping, got {type(loaded).__name__}")
    data = copy.deepcopy(loaded)
    base_name = data.pop("extends", None)
    _check_keys(data, run_fields, f"config ({path})")
    _check_keys(data.get("env") or {}, env_fields, f"config env ({path})")
    # a scenario's agent settings are its own agent's: keyed before --agent replaces it
    own_agent = data.get("agent", RunConfig.agent)
    if "agent_kwargs" in data:
        data["agent_kwargs"] = keyed_agent_kwargs(data["agent_kwargs"] or {}, own_agent)
    if base_name is None:
        return data
    if not isinstance(base_name, str) or not base_name:
        raise ValueError(f"extends in {p} must name a config file or scenario, got {base_name!r}")
    near = p.parent / base_name
    base = _read_config(
        near if near.suffix in (".yaml", ".yml") and near.exists() else base_name,
        run_fields, env_fields, (*chain, p.resolve()),
    )  # fmt: skip
    merged = {**base, **{k: v for k, v in data.items() if k not in ("env", "agent_kwargs")}}
    merged["env"] = {**(base.get("env") or {}), **(data.get("env") or {})}
    kwargs = dict(base.get("agent_kwargs") or {})
    for name, hp in (data.get("agent_kwargs") or {}).items():
        kwargs[name] = {**kwargs.get(name, {}), **hp}
    if kwargs:
        merged["agent_kwargs"] = kwargs
    return merged


def load_run_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """Resolve a run configuration: defaults < YAML file < CLI overrides.

    Args:
        path: YAML file (or a name in ``CONFIG_DIR`` without ``.yaml``, e.g. ``"smoke"``);
            ``None`` for defaults only. A file may start from another with ``extends:
            NAME`` (:func:`_read_config`).
        overrides: values from the command line; ``None`` values are ignored. Keys are
            ``RunConfig`` fields, or ``env.<EnvConfig field>`` for environment settings.

    Returns:
        The validated :class:`RunConfig`.

    Raises:
        FileNotFoundError: the YAML file does not exist.
        ValueError: unknown keys (with close-match suggestions) or invalid values; files
            that extend each other in a cycle.
    """
    from commgym.env.config import EnvConfig

    run_fields = [f.name for f in fields(RunConfig)]
    env_fields = [f.name for f in fields(EnvConfig) if f.init]
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_config(path, run_fields, env_fields, ())
    data.setdefault("env", {})
    data["env"] = dict(data["env"] or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key.startswith("env."):
            sub = key[4:]
            _check_keys({sub: value}, env_fields, "env override")
            data["env"][sub] = value
        else:
            _check_keys({key: value}, run_fields, "override")
            data[key] = value
    given = {k for k, v in (overrides or {}).items() if v is not None}
    if "fine_tune_episodes" not in given and not can_fine_tune(str(data.get("agent", "ppo"))):
        # the scenario fine-tunes its SB3 agent; another agent has nothing to fine-tune
        data.pop("fine_tune_episodes", None)
    if "sim_warm_start" not in given and not can_warm_start(str(data.get("agent", "ppo"))):
        # the scenario clones into its actor-critic agent; another agent has no clone
        data.pop("sim_warm_start", None)
        if data.get("timesteps") == 0 and "timesteps" not in given:
            # 0 is "the clone as it is"; without a clone the agent learns the default count
            data.pop("timesteps")
    return RunConfig(**data)
