"""Whole training loops for differential tests: described by :class:`Loop`, run on gloo ranks.

A :class:`Loop` is a plain, picklable description of a user's data-parallel training job
steered by :class:`~commgym.agents.scheduler.CommScheduler`: the model (BatchNorm, a frozen
layer, a branch unused on some steps or ranks), optimizer, gradient accumulation,
clipping, autocast, ``GradScaler``, the policy (static preset, seeded schedule, seeded
random agent), a non-finite gradient on one rank, a checkpoint-and-resume point, a
misuse, the world size and the path (commgym's synchronizer or the user's own DDP model
with commgym's comm hook). :func:`loops` draws them with hypothesis.

:func:`run_loop` runs one on every rank of a real gloo group and returns what each rank
saw; :func:`check_loop` asserts what commgym promises about it:

* replicas bit-identical after every averaging point and every step at period 1;
* ``none`` at period 1 bit-identical to ``DistributedDataParallel(find_unused_parameters=
  True)`` running the same loop;
* a job checkpointed per rank and resumed in fresh objects ends bit-identical to the
  uninterrupted one, with the same decisions;
* a non-finite gradient on one rank: the ``GradScaler`` skips the step on every rank, and
  its state (scale, growth tracker) is the same on every rank at every step;
* a misuse raises on every rank (with what to do), and the group stays usable.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import strategies as st
from torch.nn.parallel import DistributedDataParallel as DDP

from commgym.agents.base import LayoutEnv, StepAgent
from commgym.agents.scheduler import CommScheduler
from commgym.collectives import CommConfig
from commgym.env.spaces import ActionMenu
from tests.collectives.test_ddp_semantics import BNNet, _images

#: The fuzzer's action menu: every compressor family, two bucket sizes (the small one
#: splits the model into several buckets), three periods.
MENU = ActionMenu(
    compression=("none", "fp16", "int8", "topk:0.05", "randomk:0.05", "powersgd:1"),
    bucket_mb=(0.001, 25.0),
    sync_period=(1, 2, 3),
)

#: Bucket size of the user's DDP model on the DDP-hook path (several buckets).
DDP_BUCKET_MB = 0.001

#: Misuses and what the loop does at the drawn step (see :func:`_misuse`).
MISUSES = (
    "sync_twice",  # synchronize() twice in one step (accumulation without no_sync())
    "skip_step",  # opt.step() instead of sched.step(): the next synchronize() is a second one
    "clip_before_sync",  # clipping between backward() and synchronize()
    "step_before_sync",  # optimizer.step() between backward() and synchronize()
    "second_backward",  # a second backward without no_sync()
    "after_close",  # step() after close()
    "seed",  # ranks construct the scheduler with different seeds
)


class ScheduleAgent(StepAgent):
    """Answers ``actions[n % len(actions)]`` at its ``n``-th decision (a seeded schedule).

    The decision count lives in the agent, not in ``predict``'s state, so resuming it
    needs the agent's own state to travel in ``CommScheduler.state_dict()``.
    """

    name = "schedule-test"

    def __init__(self, env: Any, *, seed: int | None = None, actions: tuple = ((0, 0, 0),)):
        super().__init__(env, seed=seed, actions=[list(a) for a in actions])
        self.actions = [np.array(a, dtype=np.int64) for a in actions]
        self.n = 0

    def _act(self, obs, state, deterministic):
        action = self.actions[self.n % len(self.actions)].copy()
        self.n += 1
        return action, None

    def _get_state(self) -> dict[str, Any]:
        return {"n": self.n}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])


@dataclass(frozen=True)
class Loop:
    """One training job (every field plain, so it pickles to the ranks and prints).

    Attributes:
        world_size: ranks (2 to 4).
        path: ``"plain"`` (CommScheduler wraps the module with a GradientSynchronizer) or
            ``"ddp"`` (the user's DDP model with commgym's comm hook).
        optimizer: ``"sgd"`` (momentum 0.9, weight decay) or ``"adamw"``.
        micro: micro-batches per optimizer step (all but the last under ``no_sync()``).
        clip: max gradient norm clipped to after ``synchronize()`` (None: no clipping).
        autocast: None, ``"bf16"`` or ``"fp16"`` (CPU autocast).
        scaler: ``GradScaler`` initial scale (None: no scaler).
        policy: ``("static", entry)``, ``("schedule", actions)`` or ``("random",)``.
        initial: the configuration before the first decision (menu indices).
        decision_every: optimizer steps per decision.
        steps: optimizer steps.
        bad: ``(step, rank)`` whose last micro-batch has an inf input (None: none).
        resume_at: checkpoint after this many steps and resume in fresh objects.
        misuse: ``(kind, step)`` from :data:`MISUSES` (None: none).
        branch: when the branch is used: ``"always"``, ``"never"`` or ``"some"`` (some
            steps, some ranks).
        seed: model initialisation (plus the rank: construction must broadcast), data and
            the scheduler's seed.
    """

    world_size: int = 2
    path: str = "plain"
    optimizer: str = "sgd"
    micro: int = 1
    clip: float | None = None
    autocast: str | None = None
    scaler: float | None = None
    policy: tuple = ("static", "none/25MB/H1")
    initial: tuple[int, int, int] | None = None
    decision_every: int = 2
    steps: int = 6
    bad: tuple[int, int] | None = None
    resume_at: int | None = None
    misuse: tuple[str, int] | None = None
    branch: str = "some"
    seed: int = 0

    @property
    def compares_with_ddp(self) -> bool:
        """Whether the loop is plain ``none`` at period 1 throughout (DDP's semantics)."""
        if self.misuse is not None or self.policy[0] != "static":
            return False
        config = MENU.decode(MENU.encode(_parse_entry(self.policy[1])))
        return config.compression.lossless and config.sync_period == 1


def _parse_entry(entry: str) -> CommConfig:
    comp, bucket, period = entry.split("/")
    return CommConfig(comp, bucket_mb=float(bucket.removesuffix("MB")), sync_period=int(period[1:]))


def entries() -> list[str]:
    """Every menu entry as ``str(CommConfig)`` (the names of static presets)."""
    return [
        str(MENU.decode(np.array(np.unravel_index(i, tuple(MENU.nvec))))) for i in range(MENU.size)
    ]


# -- the hypothesis strategy ---------------------------------------------------------------
_ACTIONS = st.tuples(
    st.integers(0, len(MENU.compression) - 1),
    st.integers(0, len(MENU.bucket_mb) - 1),
    st.integers(0, len(MENU.sync_period) - 1),
)


@st.composite
def loops(draw: Any, *, max_world: int = 4, max_steps: int = 10, misuse: bool = False) -> Loop:
    """Draw a :class:`Loop` (shrinks towards 2 ranks, SGD, no accumulation, static ``none``).

    Args:
        draw: hypothesis' draw function.
        max_world: largest world size drawn.
        max_steps: largest number of optimizer steps.
        misuse: draw a misuse (and no resume point).
    """
    world = draw(st.integers(2, max_world))
    steps = draw(st.integers(2, max_steps))
    kind = draw(st.sampled_from(("static", "schedule", "random")))
    if kind == "static":
        # half of the static loops are `none` at period 1: those are compared with DDP
        ddp_like = [e for e in entries() if e.startswith("none/") and e.endswith("/H1")]
        policy: tuple = ("static", draw(st.sampled_from(ddp_like) | st.sampled_from(entries())))
    elif kind == "schedule":
        policy = ("schedule", tuple(draw(st.lists(_ACTIONS, min_size=1, max_size=4))))
    else:
        policy = ("random",)
    autocast = draw(st.sampled_from((None, "bf16", "fp16")))
    scaler = draw(st.sampled_from((None, 2.0**4, 2.0**16)))
    bad = None
    if scaler is not None and draw(st.booleans()):
        bad = (draw(st.integers(0, steps - 1)), draw(st.integers(0, world - 1)))
    resume_at = None
    bad_use = None
    if misuse:
        bad_use = (draw(st.sampled_from(MISUSES)), draw(st.integers(0, steps - 1)))
    elif draw(st.booleans()):
        resume_at = draw(st.integers(1, steps - 1))
    return Loop(
        world_size=world,
        path=draw(st.sampled_from(("plain", "ddp"))),
        optimizer=draw(st.sampled_from(("sgd", "adamw"))),
        micro=draw(st.integers(1, 3)),
        clip=draw(st.sampled_from((None, 0.5))),
        autocast=autocast,
        scaler=scaler,
        policy=policy,
        initial=draw(st.none() | _ACTIONS) if kind != "static" else None,
        decision_every=draw(st.integers(1, 3)),
        steps=steps,
        bad=bad,
        resume_at=resume_at,
        misuse=bad_use,
        branch=draw(st.sampled_from(("some", "always", "never"))),
        seed=draw(st.integers(0, 3)),
    )


# -- running a loop on one rank ------------------------------------------------------------
def _uses_branch(loop: Loop, rank: int, step: int) -> bool:
    if loop.branch != "some":
        return loop.branch == "always"
    # used everywhere, nowhere, on rank 0 only, nowhere
    return (step % 4 == 0) or (step % 4 == 2 and rank == 0)


def digest(tensors: Any) -> str:
    """Hash of the raw bytes of ``tensors`` (bit-identical iff equal, NaN payloads included)."""
    h = hashlib.blake2b(digest_size=12)
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _opt_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            for key in sorted(opt.state.get(p, {})):
                v = opt.state[p][key]
                out.append(v if isinstance(v, torch.Tensor) else torch.tensor(float(v)))
    return out


@dataclass
class _Job:
    """The objects of one run on one rank."""

    model: torch.nn.Module
    wrapped: torch.nn.Module
    opt: torch.optim.Optimizer
    lr: Any
    scaler: torch.amp.GradScaler | None
    sched: CommScheduler | None
    opt_steps: list[int] = field(default_factory=lambda: [0])


def _policy(loop: Loop) -> Any:
    if loop.policy[0] == "static":
        return "static:" + loop.policy[1]
    if loop.policy[0] == "schedule":
        return ScheduleAgent(LayoutEnv(MENU), seed=loop.seed, actions=loop.policy[1])
    return "random"


def _build(loop: Loop, rank: int, reference: bool = False, seed_offset: int = 0) -> _Job:
    torch.manual_seed(loop.seed * 100 + rank)  # replicas differ: construction broadcasts
    model = BNNet()
    if loop.path == "ddp" or reference:
        # the reference of the plain path is DDP(find_unused_parameters=True); that of the
        # DDP-hook path the user's DDP model with DDP's own all-reduce (same settings)
        find_unused = loop.branch != "always" or (reference and loop.path == "plain")
        # the reference buckets as commgym does (at W > 2 a ring all-reduce's rounding
        # depends on where an element sits in its bucket)
        bucket_mb = _parse_entry(loop.policy[1]).bucket_mb if reference else DDP_BUCKET_MB
        if reference and loop.path == "ddp":
            bucket_mb = DDP_BUCKET_MB
        wrapped: torch.nn.Module = DDP(
            model, find_unused_parameters=find_unused, bucket_cap_mb=bucket_mb
        )
    else:
        wrapped = model
    params = [p for p in model.parameters() if p.requires_grad]
    if loop.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            params, lr=0.05, momentum=0.9, weight_decay=1e-4
        )
    else:
        opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    lr = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=loop.steps)
    scaler = (
        None
        if loop.scaler is None
        else torch.amp.GradScaler("cpu", init_scale=loop.scaler, growth_interval=2)
    )
    job = _Job(model, wrapped, opt, lr, scaler, None)
    opt.register_step_post_hook(lambda *_: job.opt_steps.__setitem__(0, job.opt_steps[0] + 1))
    if reference:
        return job
    initial = None if loop.initial is None else MENU.decode(np.array(loop.initial))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DDP keeps its bucket size (a warning says so)
        job.sched = CommScheduler(
            wrapped,
            opt,
            _policy(loop),
            decision_every=loop.decision_every,
            menu=MENU,
            initial_config=initial,
            time_budget_s=3600.0,
            seed=loop.seed + seed_offset,
            timeout_s=60.0,
        )
    return job


def _averagings(sched: CommScheduler) -> int:
    return sched.sync._averager.averagings + len(sched.records)


class _Misused(Exception):
    """A misuse raised (carries the original exception)."""


def _backward(loop: Loop, job: _Job, rank: int, step: int, *, misuse: str | None) -> torch.Tensor:
    sched = job.sched
    use = _uses_branch(loop, rank, step)
    loss = torch.zeros(())
    for m in range(loop.micro):
        last = m == loop.micro - 1
        x, y = _images(rank, 7 * loop.seed + step, m)
        if last and loop.bad == (step, rank):
            x[0] = float("inf")
        if last:
            ctx: Any = contextlib.nullcontext()
        elif sched is not None:
            ctx = sched.no_sync()
        else:
            ctx = job.wrapped.no_sync()
        with ctx:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(loop.autocast or "")
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(job.wrapped(x, use), y) / loop.micro
            (job.scaler.scale(loss) if job.scaler is not None else loss).backward()
        if last and misuse == "second_backward":
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                again = F.cross_entropy(job.wrapped(x, use), y) / loop.micro
            _expect(lambda a=again: (job.scaler.scale(a) if job.scaler else a).backward())
    return loss.detach() * loop.micro


def _expect(fn: Any) -> None:
    try:
        fn()
    except Exception as err:
        raise _Misused() from err


def _step(loop: Loop, job: _Job, rank: int, step: int, misuse: str | None) -> dict[str, Any]:
    """One optimizer step of the loop; returns what this rank saw."""
    sched = job.sched
    job.opt.zero_grad(set_to_none=True)
    loss = _backward(loop, job, rank, step, misuse=misuse)
    if misuse == "clip_before_sync":
        torch.nn.utils.clip_grad_norm_(job.model.parameters(), 1e-3)
    if misuse == "step_before_sync":
        job.opt.step()
    before = (_averagings(sched), job.opt_steps[0]) if sched is not None else (0, job.opt_steps[0])
    st = None
    if sched is not None:
        if misuse in ("clip_before_sync", "step_before_sync"):
            _expect(sched.synchronize)
        else:
            st = sched.synchronize()
        if misuse == "sync_twice":
            _expect(sched.synchronize)
    if job.scaler is not None:
        job.scaler.unscale_(job.opt)
    if loop.clip is not None:
        torch.nn.utils.clip_grad_norm_(job.model.parameters(), loop.clip)
    if sched is None:  # the DDP reference
        if job.scaler is not None:
            job.scaler.step(job.opt)
            job.scaler.update()
        else:
            job.opt.step()
    elif misuse == "skip_step":
        job.opt.step()
        job.opt.zero_grad(set_to_none=True)
        _backward(loop, job, rank, step + 1, misuse=None)
        _expect(sched.synchronize)
    else:
        st = sched.step(loss, scaler=job.scaler)
    job.lr.step()
    if misuse == "after_close":
        sched.close()
        _expect(sched.step)
    scaler = job.scaler.state_dict() if job.scaler is not None else {}
    return {
        "config": str(sched.config) if sched is not None else "ddp",
        "synced": bool(st.synchronized) if st is not None else True,
        "averaged": sched is not None and _averagings(sched) > before[0],
        "stepped": job.opt_steps[0] > before[1],
        "params": digest(p for p in job.model.parameters()),
        "scaler": (scaler.get("scale"), scaler.get("_growth_tracker")),
    }


def _final(job: _Job) -> str:
    scale = [] if job.scaler is None else [torch.tensor(job.scaler.get_scale())]
    return digest([*job.model.state_dict().values(), *_opt_tensors(job.opt), *scale])


def _checkpoint(job: _Job) -> bytes:
    buf = io.BytesIO()
    torch.save(
        {
            "model": job.model.state_dict(),
            "opt": job.opt.state_dict(),
            "lr": job.lr.state_dict(),
            "scaler": job.scaler.state_dict() if job.scaler is not None else None,
            "sched": job.sched.state_dict(),
        },
        buf,
    )
    return buf.getvalue()


def _restore(job: _Job, blob: bytes) -> None:
    ckpt = torch.load(io.BytesIO(blob), weights_only=False)
    job.model.load_state_dict(ckpt["model"])
    job.opt.load_state_dict(ckpt["opt"])
    job.lr.load_state_dict(ckpt["lr"])
    if job.scaler is not None:
        job.scaler.load_state_dict(ckpt["scaler"])
    job.sched.load_state_dict(ckpt["sched"])


def _run(loop: Loop, job: _Job, rank: int, steps: range, stop: int | None = None) -> dict:
    trace, blob = [], None
    misuse = loop.misuse
    for step in steps:
        kind = misuse[0] if misuse is not None and misuse[1] == step else None
        config = str(job.sched.config) if job.sched is not None else "ddp"
        try:
            trace.append(_step(loop, job, rank, step, kind))
        except _Misused as err:
            return {"trace": trace, "raised": _describe(err.__cause__), "config": config}
        if kind is not None:
            return {"trace": trace, "raised": None, "config": config}
        if stop is not None and step + 1 == stop:
            blob = _checkpoint(job)
    if job.sched is not None:
        job.sched.close()
    return {"trace": trace, "final": _final(job), "checkpoint": blob}


def _describe(err: BaseException | None) -> tuple[str, str]:
    return (type(err).__name__, str(err)) if err is not None else ("", "")


def _group_usable(world: int) -> bool:
    t = torch.ones(1)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    return float(t) == world


def run_loop(rank: int, world: int, loop: Loop) -> dict[str, Any]:
    """Run ``loop`` on this rank (a :class:`~tests.dist_pool.DistPool` rank function).

    Returns:
        ``{"run": ..., "resumed": ..., "reference": ...}``: each a dict with ``trace`` (one
        dict per step: ``config``, ``synced``, ``averaged``, ``stepped``, ``params`` digest,
        ``scaler`` (scale, growth tracker)) and ``final`` (digest of parameters, buffers,
        optimizer state and scale after ``close()``); a misused run has ``raised`` (type,
        message or None) instead of ``final``. ``resumed`` / ``reference`` are None when
        the loop has no resume point / does not compare with DDP.
    """
    assert world == loop.world_size
    out: dict[str, Any] = {"run": None, "resumed": None, "reference": None}
    if loop.misuse is not None and loop.misuse[0] == "seed":
        try:
            _build(loop, rank, seed_offset=rank)
        except Exception as err:
            out["run"] = {"trace": [], "raised": _describe(err), "config": _initial(loop)}
        else:
            out["run"] = {"trace": [], "raised": None, "config": _initial(loop)}
        out["usable"] = _group_usable(world)
        return out
    job = _build(loop, rank)
    out["run"] = _run(loop, job, rank, range(loop.steps), stop=loop.resume_at)
    if loop.misuse is not None:
        out["usable"] = _group_usable(world)
        return out
    if loop.resume_at is not None:
        del job
        fresh = _build(loop, rank)
        _restore(fresh, out["run"].pop("checkpoint"))
        out["resumed"] = _run(loop, fresh, rank, range(loop.resume_at, loop.steps))
    if loop.compares_with_ddp:
        out["reference"] = _run(loop, _build(loop, rank, reference=True), rank, range(loop.steps))
    return out


# -- what every rank must have seen ---------------------------------------------------------
#: Misuse -> (exception type, text the message must contain), where it must raise.
_RAISES = {
    "sync_twice": ("RuntimeError", "no_sync()"),
    "skip_step": ("RuntimeError", "no_sync()"),
    "clip_before_sync": ("RuntimeError", "clip / unscale the synchronised gradient"),
    "step_before_sync": ("RuntimeError", "call synchronize() first"),
    "second_backward": ("RuntimeError", "no_sync()"),
    "after_close": ("RuntimeError", "after close()"),
    "seed": ("ValueError", "seed: rank 0="),
}


def must_raise(loop: Loop, config: str) -> bool:
    """Whether the loop's misuse is one under ``config`` (the configuration in force).

    Some are harmless where gradients stay local (local SGD) or DDP already synchronised
    them inside ``backward()``: the same calls are legal there, as with DDP.
    """
    kind, _ = loop.misuse
    if kind in ("clip_before_sync", "step_before_sync", "second_backward"):
        return loop.path == "plain" and config.endswith("/H1")
    return True


def _initial(loop: Loop) -> str:
    if loop.policy[0] == "static":
        return loop.policy[1]
    if loop.initial is not None:
        return str(MENU.decode(np.array(loop.initial)))
    return str(MENU.decode(MENU.default_action()))


def check_loop(loop: Loop, results: list[dict[str, Any]]) -> None:
    """Assert the promised invariants over every rank's :func:`run_loop` result.

    Raises:
        AssertionError: naming the invariant, the step and the ranks' values.
    """
    runs = [r["run"] for r in results]
    if loop.misuse is not None:
        _check_misuse(loop, results)
    _check_replicas(loop, [r["trace"] for r in runs], "run")
    if loop.misuse is not None:
        return
    if loop.resume_at is not None:
        k = loop.resume_at
        resumed = [r["resumed"] for r in results]
        _check_replicas(loop, [r["trace"] for r in resumed], "resumed run", offset=k)
        for rank, (a, b) in enumerate(zip(runs, resumed, strict=True)):
            assert [s["config"] for s in a["trace"][k:]] == [s["config"] for s in b["trace"]], (
                f"rank {rank}: resumed decisions differ",
                [s["config"] for s in a["trace"][k:]],
                [s["config"] for s in b["trace"]],
            )
            for i, (x, y) in enumerate(zip(a["trace"][k:], b["trace"], strict=True)):
                assert x == y, (f"rank {rank} step {k + i}: resumed run differs", x, y)
            assert a["final"] == b["final"], f"rank {rank}: resumed job ends elsewhere"
    if loop.compares_with_ddp:
        for rank, r in enumerate(results):
            ours, ref = r["run"]["trace"], r["reference"]["trace"]
            for step, (x, y) in enumerate(zip(ours, ref, strict=True)):
                assert (x["params"], x["scaler"], x["stepped"]) == (
                    y["params"],
                    y["scaler"],
                    y["stepped"],
                ), (f"rank {rank} step {step}: differs from DDP", x, y)
            assert r["run"]["final"] == r["reference"]["final"], f"rank {rank}: final vs DDP"


def _check_replicas(loop: Loop, traces: list[list[dict]], what: str, offset: int = 0) -> None:
    for i, steps in enumerate(zip(*traces, strict=True)):
        step = offset + i
        for key in ("config", "synced", "averaged", "scaler", "stepped"):
            values = [s[key] for s in steps]
            assert len(set(map(repr, values))) == 1, (
                f"{what} step {step}: ranks disagree on {key}",
                values,
            )
        s0 = steps[0]
        if s0["synced"] or s0["averaged"]:
            params = [s["params"] for s in steps]
            assert len(set(params)) == 1, (
                f"{what} step {step}: replicas differ after a synchronised step or an average",
                s0["config"],
            )
        if loop.bad is not None and loop.bad[0] == step:
            assert not any(s["stepped"] for s in steps), (
                f"{what} step {step}: a non-finite gradient on rank {loop.bad[1]} did not "
                "skip the step on every rank",
                [s["stepped"] for s in steps],
            )


def _check_misuse(loop: Loop, results: list[dict[str, Any]]) -> None:
    kind, step = loop.misuse
    runs = [r["run"] for r in results]
    assert all(r["usable"] for r in results), "the group is not usable after the misuse"
    configs = {r["config"] for r in runs}
    assert len(configs) == 1, ("ranks disagree on the configuration in force", configs)
    if not must_raise(loop, configs.pop()):
        return
    want_type, want_text = _RAISES[kind]
    for rank, r in enumerate(runs):
        assert r["raised"] is not None, f"rank {rank}: misuse {kind} at step {step} did not raise"
        typ, msg = r["raised"]
        assert typ == want_type and want_text in msg, (rank, kind, typ, msg)


def coverage(loop: Loop, results: list[dict[str, Any]]) -> list[str]:
    """Which promises an example exercised (hypothesis events, for the statistics)."""
    run = results[0]["run"]
    out = [f"world size {loop.world_size}, {loop.path} path"]
    if loop.misuse is not None:
        raised = run["raised"] is not None
        out.append(f"misuse {loop.misuse[0]}: {'raised' if raised else 'legal here'}")
        return out
    periods = {s["config"].rsplit("/H", 1)[1] for s in run["trace"]}
    comps = {s["config"].split("/")[0] for s in run["trace"]}
    out.append(f"periods used: {len(periods)}, compressors used: {len(comps)}")
    if loop.compares_with_ddp:
        out.append("compared with DDP")
    if loop.resume_at is not None:
        out.append("resumed")
    if loop.bad is not None:
        out.append(
            "non-finite step"
            + (" at period > 1" if not run["trace"][loop.bad[0]]["synced"] else "")
        )
    if loop.scaler is not None and any(not s["stepped"] for s in run["trace"]):
        out.append("GradScaler skipped a step")
    return out


def with_changes(loop: Loop, **changes: Any) -> Loop:
    """``loop`` with some fields replaced (for hand-written regression cases)."""
    return replace(loop, **changes)
