"""Replay a communication policy inside a user's own data-parallel training job.

A policy trained on ``commgym/AllReduce-v1`` (or any agent of :data:`AGENTS`) steers the
gradient compression, bucket size and local-SGD period of a real ``torchrun`` job::

    import torch.distributed as dist
    from commgym.agents.scheduler import CommScheduler

    dist.init_process_group("gloo")                     # or "nccl"; torchrun sets the rest
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = CommScheduler(model, opt, "policy.zip", decision_every=10,
                          time_budget_s=120.0, eval_fn=held_out_loss)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        sched.step(loss)            # synchronize + optimizer.step + local-SGD + decisions
    sched.close()                   # consensus model on every rank, detach hooks

Every ``decision_every`` optimizer steps (one *decision*, the env's ``steps_per_decision``)
the scheduler

1. averages local-SGD replicas (``GradientSynchronizer.consensus``; cost counted), as the
   env does at every decision boundary;
2. measures what a rank of the env measures for a decision (wall time per iteration,
   ``StepStats`` timings and bytes, training loss, held-out loss) and exchanges these
   scalars with ONE small all-gather (18 float64 per rank);
3. aggregates them with :meth:`commgym.env.measure.DecisionMeasurement.from_ranks` and
   builds the observation with :meth:`commgym.env.spaces.ObservationBuilder.build`, the
   very code the environment runs, so the policy sees the observation it was trained on;
4. asks the policy for an action on rank 0 only (``predict(obs, deterministic=True)``),
   broadcasts the three menu indices, and reconfigures the synchronizer on every rank at
   the same step.

**Held-out loss.** ``eval_fn() -> float`` is called on every rank after the consensus
averaging (so on identical parameters); the ranks' values are averaged with equal weight,
so each rank may evaluate a disjoint share of the held-out set or all of it. It must not
issue collectives that other ranks do not issue. Without ``eval_fn`` the ``eval_loss``
(and ``loss_change``) fields use the mean training loss of the decision's last
``decision_every`` steps over all ranks (the values passed to :meth:`CommScheduler.step`),
which is noisier and optimistic; a policy trained on held-out losses then sees slightly
different inputs.

**Elapsed fraction.** ``elapsed_frac`` = training time so far (sum over decisions of the
slowest rank's iteration wall time, consensus and reconfiguration, as the env counts it;
evaluation and the decision itself are excluded) / ``time_budget_s``. Without
``time_budget_s`` the field is 0 (a warning says so).

**Decision time.** The policy's ``predict`` time on rank 0 is measured per decision
(:attr:`DecisionRecord.policy_s`), as is each rank's whole decision overhead
(:attr:`DecisionRecord.decision_s`: consensus, exchange, observation, policy, broadcast,
reconfiguration; evaluation excluded and reported as ``eval_s``).

.. warning::
   Loading a policy file from an untrusted source can execute arbitrary code:
   stable-baselines3 policy files (``ppo``, ``a2c``, ``dqn``) contain pickles. Only
   rank 0 opens the file with SB3; the layout check before it reads the JSON member only.
   Only load policy files you created or trust.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commgym.agents.base import Agent, LayoutEnv, check_compatible, read_policy_json
from commgym.collectives import CommConfig, GradientSynchronizer
from commgym.collectives.amp import FOUND_INF_BYTES, agree_found_inf
from commgym.collectives.checks import check_int
from commgym.collectives.ddp_sync import DDPHookSynchronizer
from commgym.collectives.stats import StepStats
from commgym.env.config import PROBE_AT, check_probe_at
from commgym.env.measure import (
    RANK_FIELDS,
    DecisionMeasurement,
    DecisionRecorder,
    LinkProbe,
    RankMeasurement,
    combine_eval,
)
from commgym.env.spaces import ActionMenu, ObservationBuilder, probe_gbps

__all__ = [
    "EXCHANGED_FIELDS",
    "CommScheduler",
    "DecisionRecord",
    "is_policy_file",
    "policy_mismatch",
    "policy_time_budget",
    "resolve_policy",
]

#: Per-rank scalars exchanged at every decision (one float64 each; ``None`` as NaN): the
#: fields of :class:`~commgym.env.measure.RankMeasurement` but ``bucket_bytes``, which is
#: identical on every rank (same bucket plan) and stays local.
EXCHANGED_FIELDS: tuple[str, ...] = tuple(k for k in RANK_FIELDS if k != "bucket_bytes")


def is_policy_file(policy: str | os.PathLike[str]) -> bool:
    """Whether ``policy`` names a policy file (else an agent name like ``static:...``).

    A path object, an existing path or a name ending in ``.zip`` is a file; anything
    else is looked up in the agent registry (``static:int8/4MB/H1``, ``bandit``).
    """
    return isinstance(policy, os.PathLike) or Path(policy).exists() or str(policy).endswith(".zip")


def resolve_policy(
    policy: Agent | str | os.PathLike[str], menu: ActionMenu, *, seed: int | None = None
) -> Agent:
    """Turn a policy argument into an :class:`Agent` that acts on ``menu``.

    .. warning:: a stable-baselines3 policy file is a pickle: loading one from an
       untrusted source can execute arbitrary code.

    Args:
        policy: an agent; a path to a policy zip written by ``Agent.save`` (``commgym
            train`` writes ``policy.zip``); or an agent name of ``AGENTS`` such as
            ``"static:ddp-default"``, ``"static:int8/4MB/H1"`` or ``"bandit"`` (an
            untrained agent: tuners then answer their default).
        menu: the action menu the scheduler decodes actions with.
        seed: seed of an agent built by name.

    Returns:
        The agent, checked against ``menu`` and the current observation layout.

    Raises:
        ValueError: the policy was saved for a different action menu or observation
            layout (the message lists every difference), or an unknown agent name.
        FileNotFoundError: a path ending in ``.zip`` that does not exist.
        TypeError: ``policy`` is of another type.
    """
    from commgym.agents.registry import load_agent, make_agent

    env = LayoutEnv(menu)
    if isinstance(policy, Agent):
        check_compatible(policy.layout, env)
        _check_acts(policy)
        return policy
    if not isinstance(policy, str | os.PathLike):
        raise TypeError(
            f"policy must be an Agent, a policy file path or an agent name, got {policy!r}"
        )
    path = Path(policy)
    if is_policy_file(policy):
        meta = read_policy_json(path)  # JSON member only: nothing is unpickled yet
        try:
            check_compatible(meta.get("layout", {}), env)
        except ValueError as err:
            raise ValueError(f"policy file {path} cannot steer this job: {err}") from None
        agent = load_agent(path)
        agent.trained_on = meta.get("trained_on") or agent.trained_on
        return _check_acts(agent)
    return _check_acts(make_agent(str(policy), env, seed=seed))


def _check_acts(agent: Agent) -> Agent:
    if not agent.acts:
        raise ValueError(
            f"{agent.name or type(agent).__name__} is a bound found per evaluation seed in "
            "hindsight and cannot steer a job; replay one seed's schedule with "
            "agent.for_seed(seed), or pass a policy (a trained agent, a policy file, a "
            "static preset)"
        )
    return agent


def policy_time_budget(policy: str | os.PathLike[str]) -> float | None:
    """The training-time budget a saved policy was trained with, seconds (None: unknown).

    Reads the policy file's JSON member only (nothing is unpickled): the env's
    ``time_budget_s`` that ``commgym train`` recorded. Give it to
    :class:`CommScheduler` as ``time_budget_s`` so the observation's ``elapsed_frac``
    means what it meant in training. Agent names (``static:...``) have none.
    """
    if not is_policy_file(policy):
        return None
    budget = (read_policy_json(Path(policy)).get("trained_on") or {}).get("time_budget_s")
    return float(budget) if isinstance(budget, int | float) else None


def policy_mismatch(
    trained_on: dict[str, Any] | None,
    *,
    num_params: int,
    decision_every: int,
    time_budget_s: float | None = None,
) -> list[str]:
    """What differs between the job a policy was trained on and this one (human text).

    A model size off by more than 2x or another decision interval changes the
    observation (``log10(num_params)``, per-decision sums) the policy acts on; so does a
    training-time budget off by more than 2x (``elapsed_frac`` = training time / budget
    then runs that much faster or slower than in training).
    """
    if not trained_on:
        return []
    out = []
    trained_b = trained_on.get("time_budget_s")
    if trained_b and time_budget_s is not None and not 0.5 <= time_budget_s / trained_b <= 2.0:
        out.append(
            f"training-time budget: policy trained with time_budget_s={trained_b:g} s, job uses "
            f"time_budget_s={time_budget_s:g} s (elapsed_frac runs "
            f"{max(trained_b / time_budget_s, time_budget_s / trained_b):.0f}x "
            f"{'slower' if time_budget_s > trained_b else 'faster'} than in training; give "
            "the policy's own budget, see policy_time_budget)"
        )
    trained_n = trained_on.get("num_params")
    if trained_n and not 0.5 <= num_params / trained_n <= 2.0:
        out.append(
            f"model size: policy trained on {trained_n:,} parameters, job has {num_params:,}"
        )
    trained_k = trained_on.get("steps_per_decision")
    if trained_k and trained_k != decision_every:
        out.append(
            f"decision interval: policy trained with {trained_k} steps per decision, job uses "
            f"decision_every={decision_every}"
        )
    return out


@dataclass(frozen=True)
class DecisionRecord:
    """One decision of a :class:`CommScheduler` (identical on every rank except timings).

    Attributes:
        decision: 1-based decision count.
        optimizer_step: optimizer steps taken when the decision was made.
        previous_config: configuration of the window that was just measured.
        config: configuration applied for the next window (``str(CommConfig)``).
        action: its menu indices ``(compression, bucket, period)``.
        changed: whether the configuration changed.
        observation: the observation the policy saw (float32 values as a tuple).
        measured: aggregated measurements (``DecisionMeasurement.to_dict()``).
        train_time_s: training time so far (the env's definition), seconds.
        elapsed_frac: ``train_time_s / time_budget_s`` clipped to 1 (0 without a budget).
        policy_s: rank 0's ``predict`` time, seconds.
        decision_s: this rank's decision overhead, seconds (evaluation excluded).
        eval_s: this rank's ``eval_fn`` time, seconds.
        diverged: a non-finite gradient, training or held-out loss was seen.
    """

    decision: int
    optimizer_step: int
    previous_config: str
    config: str
    action: tuple[int, int, int]
    changed: bool
    observation: tuple[float, ...]
    measured: dict[str, Any] = field(repr=False)
    train_time_s: float
    elapsed_frac: float
    policy_s: float
    decision_s: float
    eval_s: float
    diverged: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-friendly except possible NaN in ``measured``)."""
        return asdict(self)


class CommScheduler:
    """Lets a commgym policy choose compression, bucket size and period during training.

    Wraps ``model`` with a :class:`~commgym.collectives.GradientSynchronizer` (which keeps
    DDP's guarantees; do not also wrap it in DDP), or, when ``model`` already is a
    ``DistributedDataParallel``, registers ONE commgym comm hook on it
    (:class:`~commgym.collectives.ddp_sync.DDPHookSynchronizer`: compression and period
    switch, DDP's bucket size stays). Call on every rank, in this order::

        opt.zero_grad(set_to_none=True)
        with sched.no_sync():                    # optional: accumulate micro-batches
            loss_fn(model(x0), y0).backward()
        loss = loss_fn(model(x1), y1)
        scaler.scale(loss).backward()            # or loss.backward()
        sched.synchronize()                      # gradients are now averaged
        scaler.unscale_(opt)                     # optional (AMP)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # optional
        sched.step(loss, scaler=scaler)          # optimizer step (skipped on inf/NaN)
        lr_scheduler.step()

    ``step()`` without a preceding ``synchronize()`` synchronises first. :meth:`close`
    once at the end (a collective: averages local-SGD replicas so every rank ends with
    the same parameters). See the module docstring for what a decision does and how
    ``eval_fn`` / ``time_budget_s`` enter the observation.

    Construction is a collective: parameters and buffers are broadcast from rank 0 (as
    ``DistributedDataParallel`` does) and the policy is loaded on rank 0 only; a policy
    that cannot be used raises the same ``ValueError`` on every rank. A static policy
    (``"static:int8/4MB/H1"``) is in force from the first step. A policy trained on a
    model of another size (more than 2x) or with another decision interval gets a
    warning naming both.

    **Checkpoints.** :meth:`state_dict` holds this rank's state (synchronizer residuals
    and counters, DDP-hook layouts, decision history, the window being measured, and on
    rank 0 the policy's own state, :meth:`Agent.get_state
    <commgym.agents.base.Agent.get_state>`): save
    it per rank next to the model and optimizer state (``torch.save(...,
    f"ckpt.rank{rank}.pt")``), since error-feedback residuals and local-SGD replicas
    differ between ranks. Resume: build model, optimizer and scheduler as before, then
    load the model, optimizer and :meth:`load_state_dict` on every rank (after the
    constructor, whose broadcast would otherwise overwrite per-rank state).

    Args:
        model: the replicated module (same architecture on every rank).
        optimizer: its optimizer; :meth:`step` calls ``optimizer.step()``.
        policy: an agent, a policy zip path or an agent name (see :func:`resolve_policy`).
            Only rank 0 uses it; other ranks may pass the same value (nothing is loaded
            there).
        decision_every: optimizer steps per decision (the env's ``steps_per_decision``
            the policy was trained with), >= 1.
        menu: the action menu (default: the env's default menu); must equal the policy's.
        initial_config: configuration before the first decision (must be on the menu;
            default: the menu's DDP default, as each env episode starts).
        eval_fn: ``eval_fn() -> float``, called with no arguments on EVERY rank, once at
            construction and at every decision boundary after the local-SGD consensus (so
            on identical parameters); returns this rank's held-out loss in nats (mean
            cross-entropy per sample, the env's ``eval_loss``). The ranks' values are
            averaged with equal weight, so a rank may evaluate its own share of the
            held-out set or all of it. Its time is not training time (``eval_s``). It
            must issue the same collectives on every rank (a forward that broadcasts
            buffers is one). None: the training loss stands in (noisier).
        time_budget_s: the training-time budget the policy was trained with (the env's
            ``time_budget_s``; :func:`policy_time_budget` reads it from a policy file):
            the observation's ``elapsed_frac`` is training time / this budget, clipped to
            1. More than 2x off the policy's own budget warns; None sets ``elapsed_frac``
            to 0 with a warning.
        run: optional ``RunLogger`` (``commgym.experiments.tracking``); rank 0 logs the
            parameters, per-decision metrics (with ``step=decision``) including the
            chosen menu indices, and ``replay_decisions.json`` at :meth:`close`.
        callback: ``callback(record: DecisionRecord)`` after every decision, every rank.
        group: process group (default: the world).
        seed: seed of the synchronizer's cross-rank randomness and of a named agent.
        deterministic: passed to ``policy.predict``.
        timeout_s: collective timeout of the synchronizer, seconds (default: its own).
        probe_bytes: size of the probe all-reduce timed at every decision's end, B (the
            env's ``probe_bytes``; its time counts as training time). None: what the
            policy was trained with (its file's ``trained_on``; 0, no probe, if unknown).
        probe_at: when that probe runs, as the env's ``probe_at``: ``"decision"`` (every
            decision's end) or ``"reset"`` (once, at construction: the first observation
            reads it and the training clock starts at its time). None: what the policy
            was trained with (``"decision"`` if unknown).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
        ValueError: invalid ``decision_every`` / ``time_budget_s`` / ``initial_config`` /
            ``probe_bytes`` / ``probe_at``, or a policy saved for another action menu or
            observation layout.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        policy: Agent | str | os.PathLike[str],
        *,
        decision_every: int = 10,
        menu: ActionMenu | dict[str, Any] | None = None,
        initial_config: CommConfig | None = None,
        eval_fn: Callable[[], float] | None = None,
        time_budget_s: float | None = None,
        run: Any = None,
        callback: Callable[[DecisionRecord], None] | None = None,
        group: dist.ProcessGroup | None = None,
        seed: int = 0,
        deterministic: bool = True,
        timeout_s: float | None = None,
        probe_bytes: int | None = None,
        probe_at: str | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "CommScheduler needs an initialised process group: call "
                "torch.distributed.init_process_group(...) first (e.g. under torchrun)"
            )
        if (
            isinstance(decision_every, bool)
            or not isinstance(decision_every, int)
            or (decision_every < 1)
        ):
            raise ValueError(f"decision_every must be an integer >= 1, got {decision_every!r}")
        if time_budget_s is not None and not (
            isinstance(time_budget_s, int | float)
            and math.isfinite(time_budget_s)
            and time_budget_s > 0
        ):
            raise ValueError(f"time_budget_s must be a finite number > 0, got {time_budget_s!r}")
        self.model = model
        self.optimizer = optimizer
        self.decision_every = decision_every
        self.menu = ActionMenu.from_any(menu)
        self.eval_fn = eval_fn
        self.time_budget_s = None if time_budget_s is None else float(time_budget_s)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._src = 0 if group is None else dist.get_global_rank(group, 0)
        self.run = run if self.rank == 0 else None
        self.callback = callback
        self.deterministic = deterministic
        params = list(model.parameters())
        if not params:
            raise ValueError("model has no parameters")
        nccl = dist.get_backend(group) == "nccl"
        self._device = params[0].device if nccl else torch.device("cpu")
        if initial_config is None:
            self._action = self.menu.default_action()
        else:
            self._action = self.menu.encode(initial_config)  # ValueError if off the menu
        if time_budget_s is None and self.rank == 0:
            warnings.warn(
                "CommScheduler without time_budget_s: the observation's elapsed_frac stays 0 "
                "(a policy trained with a budget may act differently)",
                stacklevel=2,
            )

        from commgym.agents.baselines import StaticAgent

        self.policy: Agent | None = None
        self._policy_name = str(policy) if not isinstance(policy, Agent) else repr(policy)
        num_params = sum(p.numel() for p in params if p.requires_grad)
        if probe_bytes is not None:
            check_int("probe_bytes", probe_bytes, 0, note=" (0: no probe)")
        if probe_at is not None:
            check_probe_at(probe_at)
        err, start, mismatch, no_state, probe = "", None, [], "", probe_bytes or 0
        at = probe_at or "decision"
        if self.rank == 0:
            try:
                self.policy = resolve_policy(policy, self.menu, seed=seed)
            except (ValueError, TypeError, FileNotFoundError) as exc:
                # every rank raises ValueError; the original's name only where it says more
                err = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"
            if isinstance(self.policy, StaticAgent) and initial_config is None:
                start = [int(a) for a in self.policy.menu.encode(self.policy.config)]
            if self.policy is not None:
                mismatch = policy_mismatch(
                    getattr(self.policy, "trained_on", None),
                    num_params=num_params,
                    decision_every=decision_every,
                    time_budget_s=self.time_budget_s,
                )
                trained = getattr(self.policy, "trained_on", None) or {}
                if probe_bytes is None:
                    probe = int(trained.get("probe_bytes") or 0)
                if probe_at is None and trained.get("probe_at") in PROBE_AT:
                    at = str(trained["probe_at"])
                if trained.get("privileged_obs"):
                    mismatch.append(
                        "it was trained with the privileged condition fields "
                        "(log10_link_gbps, straggler_ms), which read 0 in a job"
                    )
                try:  # known on every rank, so state_dict() refuses on every rank
                    self.policy.get_state()
                except NotImplementedError as exc:
                    no_state = str(exc)
        box = [err, start, no_state, probe, at]
        dist.broadcast_object_list(box, src=self._src, group=group, device=self._device)
        #: size of the probe all-reduce, B (0: none)
        self.probe_bytes: int = int(box[3])
        #: when it runs: at every decision's end or once, at construction (``probe_at``)
        self.probe_at: str = str(box[4])
        self._decision_probe_bytes = self.probe_bytes if self.probe_at == "decision" else 0
        self._link_probe = LinkProbe(self._device, group)
        if box[0]:
            raise ValueError(f"CommScheduler cannot use policy {self._policy_name!r}: {box[0]}")
        if box[1] is not None:  # a static preset is in force from the first step
            self._action = np.array(box[1], dtype=np.int64)
        # as in the env, the policy chooses the first decision's entry from the reset
        # observation (unless the caller set the start or a static preset is in force)
        ask_first = initial_config is None and box[1] is None
        self._no_policy_state: str = box[2]
        if mismatch:
            warnings.warn(
                f"policy {self._policy_name!r} was trained on another job: "
                + "; ".join(mismatch)
                + " (its observations differ from training: expect other decisions)",
                stacklevel=2,
            )
        # the observation reads the gradient norm of a window's last step only: measured
        # there (request_grad_norm), not on every step (a pass DDP does not make)
        kw: dict[str, Any] = {"seed": seed, "optimizer": optimizer, "grad_norm_every": 0}
        if timeout_s is not None:
            kw["timeout_s"] = timeout_s
        config = self.menu.decode(self._action)
        if isinstance(model, DistributedDataParallel):
            self.sync: GradientSynchronizer | DDPHookSynchronizer = DDPHookSynchronizer(
                model, config, group, **kw
            )
        else:  # broadcasts parameters and buffers, as DDP's constructor
            self.sync = GradientSynchronizer(model, config, group, error_every=0, **kw)
        self._synced: StepStats | None = None
        self.builder = ObservationBuilder(self.menu, self.world_size, num_params)
        self.records: list[DecisionRecord] = []
        self.optimizer_steps = 0
        self._train_time_s = 0.0
        self._state: Any = None
        self._episode_start = True
        self._pending_s = 0.0  # reconfigure time counted in the next window (env's rule)
        self._recorder = DecisionRecorder()
        self._t_mark: float | None = None
        # weakly: the finaliser below holds the synchronizer, which holds the model; a
        # strong hook would keep the scheduler alive until exit
        on_forward = weakref.WeakMethod(self._on_forward)

        def forward_pre_hook(module: torch.nn.Module, args: Any) -> None:
            method = on_forward()
            if method is not None:
                method(module, args)

        self._hook = model.register_forward_pre_hook(forward_pre_hook)
        self._closed = False
        # forgetting close() under local SGD leaves every rank's model apart with nothing
        # said; a collective at exit could hang, so the end of an unclosed scheduler warns
        self._unclosed = weakref.finalize(self, _warn_unclosed, self.sync, self.rank)

        eval_loss = math.nan
        if eval_fn is not None:
            loss, _, _ = self._evaluate()
            per_rank = self._exchange({"eval_loss": loss, "eval_acc": math.nan, "eval_n": 1})
            eval_loss = combine_eval(per_rank)[0]
        self._t_mark = None  # eval_fn's forward is not the first iteration
        self.initial_eval_loss = eval_loss
        reset_probe_gbps = 0.0
        if self.probe_at == "reset" and self.probe_bytes:
            # the env's reset probe: the clock starts at the slowest rank's time, the
            # observation reads the fastest rank's (as a decision's probe is counted)
            mine = torch.tensor(
                [self._link_probe(self.probe_bytes)], dtype=torch.float64, device=self._device
            )
            times = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(times, mine, group=self.group)
            secs = [float(t) for t in times]
            self._train_time_s = max(secs)
            reset_probe_gbps = probe_gbps(self.probe_bytes, min(secs), self.world_size)
        self.observation = self.builder.reset(eval_loss, self._action, probe_gbps=reset_probe_gbps)
        if ask_first:
            try:
                action, _ = self._ask_policy(self.observation)
            except BaseException:
                self._detach()  # every rank raises here: the model is left as it was given
                raise
            r0 = time.perf_counter()
            self.sync.reconfigure(self.menu.decode(action))
            self._pending_s = time.perf_counter() - r0  # counted in the first window
            self._action = action
        if self.run is not None:
            self.run.log_params(
                {
                    "replay.policy": self._policy_name,
                    "replay.decision_every": decision_every,
                    "replay.time_budget_s": time_budget_s,
                    "replay.world_size": self.world_size,
                    "replay.num_params": num_params,
                    "replay.initial_config": str(self.config),
                    "replay.eval_fn": eval_fn is not None,
                    "replay.action_menu": self.menu.to_dict(),
                }
            )

    # -- public --------------------------------------------------------------------------
    @property
    def config(self) -> CommConfig:
        """The configuration in force."""
        return self.sync.config

    @property
    def train_time_s(self) -> float:
        """Training time so far (the env's definition; see the module docstring)."""
        return self._train_time_s

    def no_sync(self) -> Any:
        """Gradient accumulation: backward passes inside communicate nothing (DDP's name)."""
        return self.sync.no_sync()

    def synchronize(self) -> StepStats:
        """Average this step's gradients into ``.grad`` (call after the last backward).

        After it, ``.grad`` holds the synchronised gradient on every rank: clip it,
        unscale it (``GradScaler.unscale_``) or inspect it, then call :meth:`step`. A
        non-finite gradient on any rank makes it non-finite on every rank.

        Returns:
            This rank's :class:`StepStats`.

        Raises:
            RuntimeError: after :meth:`close`, or called twice for one step (accumulate
                micro-batches under :meth:`no_sync` instead; the message says so).
        """
        if self._closed:
            raise RuntimeError("CommScheduler.synchronize() after close()")
        if self._synced is not None:
            raise RuntimeError(
                "CommScheduler.synchronize() called twice for one step. To accumulate "
                "micro-batches, run all but the last backward inside `with sched.no_sync():` "
                "and call synchronize() once per optimizer step; after synchronize() call "
                "sched.step() (not optimizer.step()) on every rank"
            )
        if len(self._recorder) == self.decision_every - 1:
            # compression error and gradient norm of the window's last step (observed)
            self.sync.request_error_measurement()
            self.sync.request_grad_norm()
        self._synced = self.sync.synchronize()
        return self._synced

    def step(self, loss: torch.Tensor | float | None = None, *, scaler: Any = None) -> StepStats:
        """Step the optimizer on the synchronised gradient, count the step, decide when due.

        Call after ``loss.backward()`` (and optionally :meth:`synchronize`) on every
        rank. Does, in order: :meth:`synchronize` unless already called for this step,
        ``optimizer.step()`` (or ``scaler.step(optimizer)`` + ``scaler.update()``, which
        skip the step on every rank when any rank's gradient is non-finite, so the
        scaler's state stays the same on every rank under every period: on a local-SGD
        step the found-inf flag is reduced across ranks first, one 4-byte all-reduce,
        :func:`~commgym.collectives.amp.agree_found_inf`),
        ``after_optimizer_step()`` (local-SGD averaging every ``sync_period``) and, every
        ``decision_every`` calls, a decision (collectives on every rank; see the class
        docstring).

        Args:
            loss: this step's training loss (a tensor is detached, never synchronised
                here); used for the ``train_loss`` field, and for ``eval_loss`` without
                ``eval_fn``. None: the field is NaN, shown as 0. Pass the unscaled loss.
            scaler: a ``torch.amp.GradScaler`` to step and update the optimizer with
                (``unscale_`` it yourself after :meth:`synchronize` to clip, or let
                ``scaler.step`` do it). Pass it at every step on every rank, or at none.

        Returns:
            This rank's :class:`StepStats` of the step.

        Raises:
            RuntimeError: after :meth:`close`, or a policy answered an off-menu action.
            CollectiveTimeout: a rank did not join a collective within ``timeout_s``.
        """
        if self._closed:
            raise RuntimeError("CommScheduler.step() after close()")
        st = self._synced if self._synced is not None else self.synchronize()
        self._synced = None
        sync = self.sync
        rec = self._recorder
        extra_bytes = 0
        if scaler is not None:
            if not st.synchronized and scaler.is_enabled():
                # local gradients (sync_period > 1): one rank's overflow must make every
                # rank skip and back off, or the scales (and, at period 1 again, the
                # replicas) part for good. A synchronised gradient is bit-identical on
                # every rank, non-finite everywhere if anywhere, so there the verdicts
                # already agree without a collective.
                agree_found_inf(scaler, self.optimizer, self.group, timeout_s=sync.timeout_s)
                extra_bytes = FOUND_INF_BYTES
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        avg = sync.after_optimizer_step()
        now = time.perf_counter()
        start = self._t_mark if self._t_mark is not None else now - st.step_time_s
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
        wall_s = now - start - float(getattr(st, "instrumentation_s", 0.0))
        rec.record_step(wall_s, loss, st, avg.bytes_sent + extra_bytes)
        self._t_mark = now
        self.optimizer_steps += 1
        if len(rec) >= self.decision_every:
            self._decide()
            self._t_mark = time.perf_counter()  # the decision is not training time
        return st

    def state_dict(self) -> dict[str, Any]:
        """This rank's scheduler state (plain values and tensors; save one per rank).

        Holds the synchronizer's state, the decision history, the observation and
        action in force, the policy's recurrent state (what ``predict`` returned), the
        policy's own state (:meth:`Agent.get_state <commgym.agents.base.Agent.get_state>`:
        random generators, counters, search state; rank 0's file) and the measurements
        of the window in progress, so a job resumed at any step continues as if not
        stopped.

        Raises:
            NotImplementedError: on every rank, when the policy does not declare its
                state (an :class:`~commgym.agents.base.Agent` subclass without
                ``get_state``): a resumed job could not decide as this one would.
        """
        if self._no_policy_state:
            raise NotImplementedError(
                f"CommScheduler cannot checkpoint policy {self._policy_name!r}: "
                f"{self._no_policy_state}"
            )
        return {
            "sync": self.sync.state_dict(),
            "optimizer_steps": self.optimizer_steps,
            "train_time_s": self._train_time_s,
            "action": [int(a) for a in self._action],
            "observation": [float(x) for x in self.observation],
            "episode_start": self._episode_start,
            "policy_state": self._state,
            "policy": self.policy.get_state() if self.policy is not None else None,
            "pending_s": self._pending_s,
            "records": [r.to_dict() for r in self.records],
            "builder": {
                "prev_eval_loss": self.builder.prev_eval_loss,
                "prev_grad_norm": self.builder.prev_grad_norm,
            },
            "window": {
                "walls": list(self._recorder.walls),
                "losses": [float(torch.as_tensor(x).float()) for x in self._recorder.losses],
                "stats": [s.to_dict() for s in self._recorder.stats],
                "avg_bytes": self._recorder.extra_bytes,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a collective: the synchronizer checks ranks).

        Rank 0 restores the policy's own state from its file
        (:meth:`Agent.set_state <commgym.agents.base.Agent.set_state>`).

        Raises:
            ValueError: the saved action is not on this scheduler's menu; on every rank,
                when rank 0's policy cannot take the saved policy state (another policy,
                or rank 0 loaded a file saved by another rank).
        """
        action = np.array(state["action"], dtype=np.int64)
        if action.shape != (3,) or (action < 0).any() or (action >= self.menu.nvec).any():
            raise ValueError(f"saved action {state['action']} is not on the menu {self.menu}")
        self._load_policy_state(state)
        self.sync.load_state_dict(state["sync"])
        self._action = action
        self.optimizer_steps = int(state["optimizer_steps"])
        self._train_time_s = float(state["train_time_s"])
        self.observation = np.array(state["observation"], dtype=np.float32)
        self._episode_start = bool(state["episode_start"])
        self._state = state["policy_state"]
        self._pending_s = float(state["pending_s"])
        self.records = [
            DecisionRecord(
                **{**r, "action": tuple(r["action"]), "observation": tuple(r["observation"])}
            )
            for r in state["records"]
        ]
        self.builder.prev_eval_loss = float(state["builder"]["prev_eval_loss"])
        self.builder.prev_grad_norm = float(state["builder"]["prev_grad_norm"])
        w = state["window"]
        rec = self._recorder
        rec.reset()
        rec.walls = [float(x) for x in w["walls"]]
        rec.losses = list(w["losses"])
        rec.stats = [
            StepStats(**{**d, "bucket_bytes": tuple(d["bucket_bytes"])}) for d in w["stats"]
        ]
        rec.extra_bytes = int(w["avg_bytes"])
        self._synced = None
        self._t_mark = None

    def _load_policy_state(self, state: dict[str, Any]) -> None:
        """Rank 0 restores its policy's state; every rank raises if that failed."""
        err = ""
        if self.rank == 0:
            assert self.policy is not None
            if "policy" not in state:  # a checkpoint written before policies had state
                warnings.warn(
                    "checkpoint holds no policy state (written by an older commgym): the "
                    f"policy {self._policy_name!r} continues from its current state, so a "
                    "stateful policy (random, bandit, autotune, ...) decides differently "
                    "than the job that wrote it would have",
                    stacklevel=3,
                )
            elif state["policy"] is None:
                err = "this file holds no policy state: it was saved on a rank other than 0"
            else:
                try:
                    self.policy.set_state(state["policy"])
                except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
                    err = f"{type(exc).__name__}: {exc}"
        box = [err]
        dist.broadcast_object_list(box, src=self._src, group=self.group, device=self._device)
        if box[0]:
            raise ValueError(
                f"CommScheduler.load_state_dict: rank 0's policy {self._policy_name!r} "
                f"cannot take the saved policy state ({box[0]}); load each rank's own "
                "checkpoint into a scheduler built with the same policy"
            )

    def summary(self) -> dict[str, Any]:
        """Decisions, configuration changes and decision timings (plain values).

        ``changes`` counts the decisions that reconfigured the job, the first one's switch
        away from the starting configuration (DDP's default, in force until the first
        decision) included; ``commgym replay`` counts changes between an episode's decisions
        (its first decision sets the configuration, nothing trained before it).
        """
        pol = [r.policy_s for r in self.records]
        dec = [r.decision_s for r in self.records]
        return {
            "decisions": len(self.records),
            "optimizer_steps": self.optimizer_steps,
            "changes": sum(r.changed for r in self.records),
            "configs": [r.config for r in self.records],
            "final_config": str(self.config),
            "train_time_s": self._train_time_s,
            "policy_ms_median": 1e3 * statistics.median(pol) if pol else None,
            "policy_ms_max": 1e3 * max(pol) if pol else None,
            "decision_ms_median": 1e3 * statistics.median(dec) if dec else None,
        }

    def close(self) -> None:
        """Average local-SGD replicas (a collective), detach hooks, log the decisions.

        Safe to call twice. Parameters are identical on every rank afterwards.
        """
        if self._closed:
            return
        self.sync.consensus()
        self._detach()
        if self.run is not None:
            self.run.log_dict(
                {
                    "summary": self.summary(),
                    "decisions": [
                        {
                            k: v
                            for k, v in r.to_dict().items()
                            if k not in ("measured", "observation")
                        }
                        for r in self.records
                    ],
                },
                "replay_decisions.json",
            )

    # -- internals -----------------------------------------------------------------------
    def _detach(self) -> None:
        """Remove every hook from the model and mark the scheduler closed (no collective)."""
        self._unclosed.detach()
        self._hook.remove()
        self.sync.remove_hooks()
        self._closed = True

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self._t_mark is None:  # the first iteration's clock starts at its forward
            self._t_mark = time.perf_counter()

    def _reset_window(self) -> None:
        self._recorder.reset()

    def _evaluate(self) -> tuple[float, float, int]:
        if self.eval_fn is None:
            return math.nan, math.nan, 0
        t0 = time.perf_counter()
        value = float(self.eval_fn())
        return value, time.perf_counter() - t0, 1

    def _measure(
        self, consensus_s: float, consensus_comm_s: float, consensus_bytes: int, probe_s: float
    ) -> RankMeasurement:
        """This rank's record of the window (the env worker's, with the replay's eval)."""
        rec = self._recorder
        train_loss = rec.train_loss()
        if self.eval_fn is not None:
            eval_loss, eval_s, eval_n = self._evaluate()
        else:
            eval_loss, eval_s, eval_n = train_loss, 0.0, 1
        return rec.finish(
            overhead_s=consensus_s + self._pending_s + probe_s,
            consensus_comm_s=consensus_comm_s,
            consensus_bytes=consensus_bytes,
            eval_loss=eval_loss,
            eval_acc=math.nan,
            eval_n=eval_n,
            eval_s=eval_s,
            samples=0,
            train_loss=train_loss,
            check_eval=self.eval_fn is not None,
            probe_s=probe_s,
            probe_bytes=self._decision_probe_bytes,
        )

    def _exchange(self, local: RankMeasurement | dict[str, Any]) -> list[RankMeasurement]:
        """All-gather this rank's scalars; returns every rank's record (rank order).

        Fields missing from a partial ``local`` dict travel as NaN; ``bucket_bytes``
        (identical on every rank: same bucket plan) is copied from ``local``.
        """
        if isinstance(local, RankMeasurement):
            values, bucket_bytes = local.to_row(), local.bucket_bytes
        else:
            values = [
                math.nan if local.get(k) is None else float(local[k]) for k in EXCHANGED_FIELDS
            ]
            bucket_bytes = local.get("bucket_bytes", [])
        row = torch.tensor(values, dtype=torch.float64).to(self._device)
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        dist.all_gather(rows, row, group=self.group)
        return [RankMeasurement.from_row(r.cpu().tolist(), bucket_bytes) for r in rows]

    def _observe(self, per_rank: list[RankMeasurement]) -> tuple[dict[str, Any], np.ndarray]:
        """Aggregate the ranks' measurements and build the observation (env's code)."""
        measured = DecisionMeasurement.from_ranks(per_rank)
        self._train_time_s += measured.train_time_s
        elapsed = min(1.0, self._train_time_s / self.time_budget_s) if self.time_budget_s else 0.0
        m = measured.to_dict()
        m["elapsed_frac"] = elapsed
        return m, self.builder.build(measured, self._action, elapsed)

    def _decide(self) -> None:
        t0 = time.perf_counter()
        cons = self.sync.consensus()  # one consensus model per decision, as in the env
        consensus_s = time.perf_counter() - t0
        # after the last collective, as the env
        probe_s = self._link_probe(self._decision_probe_bytes)
        local = self._measure(consensus_s, cons.comm_s, cons.bytes_sent, probe_s)
        m, obs = self._observe(self._exchange(local))
        self.observation = obs
        prev_action = self._action
        prev_config = str(self.config)
        action, policy_s = self._ask_policy(obs)
        config = self.menu.decode(action)
        r0 = time.perf_counter()
        self.sync.reconfigure(config)  # every rank, same step (may average replicas)
        self._pending_s = time.perf_counter() - r0
        self._action = action
        rec = DecisionRecord(
            decision=len(self.records) + 1,
            optimizer_step=self.optimizer_steps,
            previous_config=prev_config,
            config=str(config),
            action=(int(action[0]), int(action[1]), int(action[2])),
            changed=not np.array_equal(action, prev_action),
            observation=tuple(float(x) for x in obs),
            measured=m,
            train_time_s=self._train_time_s,
            elapsed_frac=float(m["elapsed_frac"]),
            policy_s=policy_s,
            decision_s=time.perf_counter() - t0 - local.eval_s,
            eval_s=local.eval_s,
            diverged=bool(m["nonfinite"]),
        )
        self.records.append(rec)
        self._reset_window()
        if self.run is not None:
            self._log(rec)
        if self.callback is not None:
            self.callback(rec)

    def _ask_policy(self, obs: np.ndarray) -> tuple[np.ndarray, float]:
        """Rank 0's policy answer for ``obs``, broadcast: ``(menu indices, predict seconds)``.

        Raises (on every rank): the policy's own error on rank 0 (a RuntimeError naming it
        elsewhere), or RuntimeError for an action outside the menu.
        """
        msg = torch.full((4,), -1.0, dtype=torch.float64)
        failure: BaseException | None = None
        if self.rank == 0:
            assert self.policy is not None
            p0 = time.perf_counter()
            try:
                action, self._state = self.policy.predict(
                    obs,
                    state=self._state,
                    episode_start=np.array([self._episode_start]),
                    deterministic=self.deterministic,
                )
            except Exception as exc:  # the other ranks must raise too, not wait for it
                failure = exc
                msg[0] = -2.0
            else:
                a = np.asarray(action, dtype=np.int64).reshape(-1)
                if a.shape == (3,) and (a >= 0).all() and (a < self.menu.nvec).all():
                    msg[:3] = torch.from_numpy(a.astype(np.float64))
            msg[3] = time.perf_counter() - p0
        self._episode_start = False
        msg = msg.to(self._device)
        dist.broadcast(msg, src=self._src, group=self.group)
        vals = msg.cpu().tolist()
        if vals[0] == -2.0:
            if failure is not None:
                raise failure
            raise RuntimeError(
                f"policy {self._policy_name!r} raised in predict on rank 0 (its error is "
                "rank 0's); every rank stops at this decision"
            )
        if vals[0] < 0:
            raise RuntimeError(
                f"policy {self._policy_name!r} answered an action outside the menu "
                f"(valid index ranges {self.menu.nvec.tolist()})"
            )
        return np.array([int(v) for v in vals[:3]], dtype=np.int64), float(vals[3])

    def _log(self, rec: DecisionRecord) -> None:
        m = rec.measured
        values = {
            "replay/compression_index": rec.action[0],
            "replay/bucket_mb": self.menu.bucket_mb[rec.action[1]],
            "replay/sync_period": self.menu.sync_period[rec.action[2]],
            "replay/menu_index": int(np.ravel_multi_index(rec.action, tuple(self.menu.nvec))),
            "replay/changed": int(rec.changed),
            "replay/train_loss": m["train_loss"],
            "replay/eval_loss": m["eval_loss"],
            "replay/step_time_s": m["step_time_s"],
            "replay/bytes_per_step": m["bytes_per_step"],
            "replay/train_time_s": rec.train_time_s,
            "replay/elapsed_frac": rec.elapsed_frac,
            "replay/policy_ms": 1e3 * rec.policy_s,
            "replay/decision_ms": 1e3 * rec.decision_s,
        }
        # non-finite values would tag the run "diverged"; only a real divergence should
        self.run.log_metrics(
            {k: v for k, v in values.items() if math.isfinite(float(v)) or rec.diverged},
            step=rec.decision,
        )


def _warn_unclosed(sync: GradientSynchronizer | DDPHookSynchronizer, rank: int) -> None:
    """Say so where a scheduler ends unclosed with the replicas apart (see ``close``)."""
    if sync.replicas_apart:
        warnings.warn(
            f"CommScheduler on rank {rank} ended without close() while local-SGD steps since "
            "the last average left the replicas apart (each rank's model differs): call "
            "sched.close() on every rank at the end of training (a collective that averages "
            "them) before saving or evaluating the model",
            RuntimeWarning,
            stacklevel=1,
        )
