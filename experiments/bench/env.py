"""``commgym bench env``: env-step wall time vs the ranks' own measured training time.

One ``commgym/AllReduce-v1`` environment (real torchrun gloo ranks) runs ``decisions``
steps, either always the DDP default action (``actions="fixed"``) or cycling through
every entry of the action menu (``actions="cycle"``). For every decision it records

* ``env_step_s``: the env-side wall time of ``step()`` (``info["measured"]``, beside the
  decision's :class:`~commgym.env.measure.DecisionMeasurement`);
* ``train_time_s``: the slowest rank's own measured training time of the same
  ``steps_per_decision`` iterations (including decision-boundary consensus);
* ``command_s``: the round trip of the control-plane command inside ``step()`` (timed by
  wrapping the running :class:`~commgym.env.cluster.Cluster` instance's ``command``).

After ``WARMUP_DECISIONS`` warm-up decisions it reports the median times and the
overhead ratio ``median(env_step_s / train_time_s) - 1`` (also the ratio of medians),
the reset times (first reset = launching the ranks; second reset = ranks persist, no
respawn) and a verdict against the target (``<= 5 %``) and goal (``<= 2 %``).

Where the overhead goes (measured without changing the environment):

* env side = ``env_step_s - command_s`` (action decode, reply aggregation);
* fixed per decision = round trip of a ``steps=0`` command minus its training time
  (control-plane messaging + the held-out evaluation every rank runs after each decision
  + building the reply); the evaluation is part of the env step but not of
  ``train_time_s``;
* the remainder of ``command_s - train_time_s`` scales with the iterations: per-iteration
  work outside the ranks' timed region (recording each iteration's statistics after its
  timer) and skew between ranks.

Two local estimates (in this process, ``threads_per_rank`` torch threads, ranks idle) put
numbers on one rank's share of the evaluation and on the per-iteration batch fetch (which
the worker times as part of each training iteration, so it is training time, not overhead).

Run as ``commgym bench env [options]`` or ``python -m commgym.experiments.bench env
[options]`` (the same typer command).
"""

from __future__ import annotations

import math
import pickle
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from commgym.experiments.bench import write_json

__all__ = [
    "ACTIONS",
    "GOAL_OVERHEAD",
    "TARGET_OVERHEAD",
    "WARMUP_DECISIONS",
    "action_sequence",
    "run_env_benchmark",
    "summarize",
]

#: Overhead ``median(env_step_s / train_time_s) - 1`` the benchmark must meet.
TARGET_OVERHEAD = 0.05
#: Overhead we aim for.
GOAL_OVERHEAD = 0.02
#: Decisions at the start that are run but not measured.
WARMUP_DECISIONS = 3
#: Action schedules: the DDP default every decision, or every menu entry in turn.
ACTIONS = ("fixed", "cycle")
#: ``steps=0`` control-plane probes after the measured decisions.
_PROBES = 15
#: Episode length in training seconds: never the reason an episode ends here.
_HUGE_BUDGET_S = 1e9


def _median(values: Sequence[float]) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return statistics.median(vals) if vals else math.nan


def action_sequence(menu: Any, actions: str, decisions: int) -> list[np.ndarray]:
    """The action of every decision.

    Args:
        menu: the env's :class:`~commgym.env.spaces.ActionMenu`.
        actions: ``"fixed"`` (``menu.default_action()`` every decision) or ``"cycle"``
            (all ``prod(menu.nvec)`` entries in row-major order, repeated).
        decisions: number of decisions.

    Returns:
        ``decisions`` MultiDiscrete index arrays.

    Raises:
        ValueError: unknown ``actions``.
    """
    if actions == "fixed":
        return [np.asarray(menu.default_action(), dtype=np.int64) for _ in range(decisions)]
    if actions == "cycle":
        nvec = tuple(int(n) for n in menu.nvec)
        n = int(np.prod(nvec))
        return [np.array(np.unravel_index(i % n, nvec), dtype=np.int64) for i in range(decisions)]
    raise ValueError(f"actions must be one of {list(ACTIONS)}, got {actions!r}")


def summarize(records: list[dict[str, Any]], warmup: int = WARMUP_DECISIONS) -> dict[str, Any]:
    """Medians and overhead ratios of the measured decisions.

    Args:
        records: one dict per decision with ``env_step_s``, ``train_time_s`` and
            ``command_s`` (seconds; ``command_s`` may be NaN).
        warmup: leading decisions to skip.

    Returns:
        ``measured_decisions``, ``median_env_step_s``, ``median_train_time_s``,
        ``median_command_s``, ``median_overhead_s`` (median of ``env - train``),
        ``overhead_ratio`` (``median(env / train) - 1``), ``overhead_ratio_of_medians``
        (``median(env) / median(train) - 1``), ``p90_overhead_ratio``,
        ``median_env_side_s`` (``env - command``) and ``median_round_trip_extra_s``
        (``command - train``).

    Raises:
        ValueError: no decision left after the warm-up.
    """
    rows = records[warmup:]
    if not rows:
        raise ValueError(f"no measured decision: {len(records)} decisions, {warmup} warm-up")
    env = [float(r["env_step_s"]) for r in rows]
    train = [float(r["train_time_s"]) for r in rows]
    cmd = [float(r["command_s"]) for r in rows]
    ratios = [e / t - 1.0 for e, t in zip(env, train, strict=True) if t > 0]
    med_env, med_train = _median(env), _median(train)
    return {
        "measured_decisions": len(rows),
        "median_env_step_s": med_env,
        "median_train_time_s": med_train,
        "median_command_s": _median(cmd),
        "median_overhead_s": _median([e - t for e, t in zip(env, train, strict=True)]),
        "overhead_ratio": _median(ratios),
        "overhead_ratio_of_medians": med_env / med_train - 1.0 if med_train > 0 else math.nan,
        "p90_overhead_ratio": float(np.percentile(ratios, 90)) if ratios else math.nan,
        "median_env_side_s": _median([e - c for e, c in zip(env, cmd, strict=True)]),
        "median_round_trip_extra_s": _median([c - t for c, t in zip(cmd, train, strict=True)]),
    }


def _timed_command(cluster: Any, sink: list[float]) -> Callable[..., Any]:
    """Wrap ``cluster.command`` (instance attribute only) to record each round trip."""
    inner = cluster.command

    def command(msg: dict[str, Any], timeout_s: float | None = None) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        try:
            return inner(msg, timeout_s)
        finally:
            sink.append(time.perf_counter() - t0)

    return command


def _probe_fixed_overhead(cluster: Any, config: dict[str, Any], probes: int) -> dict[str, Any]:
    """Round trips of ``steps=0`` commands: no iterations, only consensus + evaluation."""
    rtt, train, reply_bytes = [], [], 0
    for _ in range(probes):
        t0 = time.perf_counter()
        replies = cluster.command({"cmd": "step", "config": config, "steps": 0})
        rtt.append(time.perf_counter() - t0)
        train.append(max(float(r["train_time_s"]) for r in replies))
        reply_bytes = len(pickle.dumps(replies[0]))
    return {
        "probe_round_trip_s": _median(rtt),
        "probe_train_time_s": _median(train),
        "fixed_per_decision_s": _median([a - b for a, b in zip(rtt, train, strict=True)]),
        "reply_pickle_bytes": reply_bytes,
        "command_pickle_bytes": len(pickle.dumps({"cmd": "step", "config": config, "steps": 10})),
    }


def _local_estimates(
    workload: str,
    world_size: int,
    batch_size: int | None,
    steps: int,
    threads: int,
    repeats: int = 30,
) -> dict[str, float]:
    """Time the held-out evaluation and ``steps`` batch fetches in this process."""
    import torch

    from commgym.env.worker import EVAL_SAMPLES
    from commgym.env.workloads import get_workload

    wl = get_workload(workload)
    data = wl.load_data()
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = wl.build_model()
        # one rank's share of the held-out batch, as the worker evaluates it (strided)
        n_eval = len(range(0, min(EVAL_SAMPLES, len(data.eval_x)), world_size))
        ex = data.eval_x[0 : min(EVAL_SAMPLES, len(data.eval_x)) : world_size]
        ey = data.eval_y[0 : min(EVAL_SAMPLES, len(data.eval_x)) : world_size]
        wl.evaluate(model, ex, ey)
        ev = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            wl.evaluate(model, ex, ey)
            ev.append(time.perf_counter() - t0)
        bs = int(batch_size or wl.default_batch_size)
        shard_x = data.train_x[::world_size]
        shard_y = data.train_y[::world_size]
        gen = torch.Generator().manual_seed(0)
        order = torch.randperm(len(shard_x), generator=gen)
        fetch = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(steps):
                lo = (i * bs) % max(len(order) - bs, 1)
                idx = order[lo : lo + bs]
                _ = shard_x[idx], shard_y[idx]
            fetch.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev_threads)
    return {
        "eval_estimate_s": _median(ev),
        "eval_samples": n_eval,
        "batch_fetch_estimate_s": _median(fetch),
    }


def _fmt_ms(seconds: float) -> str:
    return "n/a" if not math.isfinite(seconds) else f"{1e3 * seconds:.2f}"


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.2f} %"


def _verdict(overhead: float) -> str:
    if not math.isfinite(overhead):
        return "FAIL (no measurement)"
    if overhead <= GOAL_OVERHEAD:
        return "PASS (goal met)"
    if overhead <= TARGET_OVERHEAD:
        return "PASS (target met, goal not met)"
    return "FAIL"


def _print_report(console: Console, res: dict[str, Any]) -> None:
    m = res["meta"]
    console.print(
        f"[bold]bench env[/bold]: {m['workload']}, {m['world_size']} gloo ranks, "
        f"steps_per_decision={m['steps_per_decision']}, {m['decisions']} decisions "
        f"({m['warmup']} warm-up), actions={m['actions']}, seed={m['seed']}"
    )
    table = Table(title="env step vs ranks' training time (median per decision)")
    table.add_column("quantity", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_row("median env step (env_step_s)", _fmt_ms(res["median_env_step_s"]) + " ms")
    table.add_row(
        "median ranks' training time (train_time_s)", _fmt_ms(res["median_train_time_s"]) + " ms"
    )
    table.add_row("median overhead (env - train)", _fmt_ms(res["median_overhead_s"]) + " ms")
    table.add_row("overhead ratio median(env/train) - 1", _pct(res["overhead_ratio"]))
    table.add_row("overhead ratio of medians", _pct(res["overhead_ratio_of_medians"]))
    table.add_row("p90 overhead ratio", _pct(res["p90_overhead_ratio"]))
    table.add_row("first reset (launch ranks)", f"{res['reset_first_s']:.3f} s")
    table.add_row("second reset (ranks persist)", _fmt_ms(res["reset_second_s"]) + " ms")
    table.add_row("launches", str(res["launches"]))
    console.print(table)

    b = res["breakdown"]
    t2 = Table(title="where the overhead goes (median per decision)")
    t2.add_column("part", no_wrap=True)
    t2.add_column("ms", justify="right", no_wrap=True)
    t2.add_column("how it is measured")
    t2.add_row(
        "env side (decode, aggregate)",
        _fmt_ms(res["median_env_side_s"]),
        "env_step_s - cluster.command round trip",
    )
    t2.add_row(
        "round trip beyond train_time_s",
        _fmt_ms(res["median_round_trip_extra_s"]),
        "cluster.command round trip - train_time_s",
    )
    t2.add_row(
        "  fixed per decision",
        _fmt_ms(b["fixed_per_decision_s"]),
        "steps=0 command round trip - its train_time_s (messaging + eval + reply)",
    )
    t2.add_row(
        "    of which held-out eval (estimate)",
        _fmt_ms(b["eval_estimate_s"]),
        f"workload.evaluate on one rank's {b['eval_samples']} samples, locally; not in "
        "train_time_s",
    )
    t2.add_row(
        "  per-iteration remainder",
        _fmt_ms(b["per_iteration_remainder_s"]),
        "round-trip extra - fixed (bookkeeping after each iteration's timer, rank skew)",
    )
    t2.add_row(
        f"  not overhead: {m['steps_per_decision']} batch fetches (estimate)",
        _fmt_ms(b["batch_fetch_estimate_s"]),
        "_next_batch indexing, locally; inside each iteration's timer (training time)",
    )
    console.print(t2)
    style = "green" if res["meets_target"] else "red"
    console.print(
        f"env overhead = {_pct(res['overhead_ratio'])} (ratio of medians "
        f"{_pct(res['overhead_ratio_of_medians'])})  target <= {100 * TARGET_OVERHEAD:.0f} %, "
        f"goal <= {100 * GOAL_OVERHEAD:.0f} %: [{style}]{res['verdict']}[/{style}]"
    )


def run_env_benchmark(
    workload: str = "mlp-digits",
    world_size: int = 2,
    steps_per_decision: int = 10,
    decisions: int = 60,
    actions: str = "cycle",
    seed: int = 0,
    json_path: str | Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure the environment's per-step overhead over the ranks' own training time.

    Args:
        workload: workload name (``WORKLOADS``).
        world_size: number of gloo ranks.
        steps_per_decision: training iterations per ``env.step`` (K).
        decisions: env steps in the episode, including ``WARMUP_DECISIONS`` warm-up ones
            (must be larger than the warm-up).
        actions: ``"cycle"`` (every menu entry in turn) or ``"fixed"`` (DDP default).
        seed: env seed.
        json_path: also write the result as JSON here.
        console: rich console to print to (default: a new one, at least 120 wide).

    Returns:
        The :func:`summarize` keys plus ``reset_first_s``, ``reset_second_s``,
        ``rank_reset_s``, ``launches``, ``verdict``, ``meets_target``, ``meets_goal``,
        ``target``, ``goal``, ``breakdown`` (``fixed_per_decision_s``,
        ``eval_estimate_s``, ``batch_fetch_estimate_s``, ``per_iteration_remainder_s``,
        probe and pickle sizes), ``meta`` and ``per_decision`` (raw records).

    Raises:
        ValueError: invalid arguments.
        commgym.collectives.WorkerFailed: the ranks failed during the benchmark.
    """
    import gymnasium

    import commgym.env  # noqa: F401 - registers commgym/AllReduce-v1
    from commgym.collectives import WorkerFailed
    from commgym.env.measure import measurement_from_info

    if actions not in ACTIONS:
        raise ValueError(f"actions must be one of {list(ACTIONS)}, got {actions!r}")
    if not isinstance(decisions, int) or isinstance(decisions, bool):
        raise ValueError(f"decisions must be an integer, got {decisions!r}")
    if decisions <= WARMUP_DECISIONS:
        raise ValueError(
            f"decisions must be an integer > {WARMUP_DECISIONS} (warm-up), got {decisions!r}"
        )
    if console is None:
        console = Console()
        if not console.is_terminal or console.width < 120:
            console = Console(width=120)

    env = gymnasium.make(
        "commgym/AllReduce-v1",
        workload=workload,
        world_size=world_size,
        steps_per_decision=steps_per_decision,
        time_budget_s=_HUGE_BUDGET_S,
        max_decisions=decisions,
        seed=seed,
    )
    try:
        base = env.unwrapped
        console.print(f"[dim]launching {world_size} ranks ({workload}) ...[/dim]")
        _, info = env.reset(seed=seed)
        reset_first_s = float(info["reset_s"])
        _, info = env.reset(seed=seed)
        reset_second_s = float(info["reset_s"])
        rank_reset_s = float(info["rank_reset_s"])
        round_trips: list[float] = []
        cluster = base.cluster
        cluster.command = _timed_command(cluster, round_trips)
        records: list[dict[str, Any]] = []
        episodes = 1
        for a in action_sequence(base.menu, actions, decisions):
            n_before = len(round_trips)
            _, _, terminated, truncated, info = env.step(a)
            if "failure" in info:
                raise WorkerFailed(f"the ranks failed during the benchmark: {info['failure']}")
            measured = measurement_from_info(info)
            cmd_s = round_trips[-1] if len(round_trips) > n_before else math.nan
            records.append(
                {
                    "config": info["config"],
                    # the env's own timing of step(), carried next to the measurement
                    "env_step_s": float(info["measured"]["env_step_s"]),
                    "train_time_s": float(measured.train_time_s),
                    "command_s": cmd_s,
                    "eval_loss": float(measured.eval_loss),
                }
            )
            if (terminated or truncated) and len(records) < decisions:
                # e.g. a diverging compression: keep measuring in a fresh episode
                env.reset()
                episodes += 1
                if base.cluster is not cluster:  # relaunched: time the new one too
                    cluster = base.cluster
                    cluster.command = _timed_command(cluster, round_trips)
        summary = summarize(records, WARMUP_DECISIONS)
        default_cfg = base.menu.decode(base.menu.default_action()).to_dict()
        probe = _probe_fixed_overhead(cluster, default_cfg, _PROBES)
        local = _local_estimates(
            workload,
            world_size,
            base.config.batch_size,
            steps_per_decision,
            base.config.threads_per_rank,
        )
        launches = int(base.launches)
    finally:
        env.close()

    breakdown = {**probe, **local}
    breakdown["per_iteration_remainder_s"] = (
        summary["median_round_trip_extra_s"] - probe["fixed_per_decision_s"]
    )
    overhead = summary["overhead_ratio"]
    result: dict[str, Any] = {
        **summary,
        "reset_first_s": reset_first_s,
        "reset_second_s": reset_second_s,
        "rank_reset_s": rank_reset_s,
        "launches": launches,
        "episodes": episodes,
        "target": TARGET_OVERHEAD,
        "goal": GOAL_OVERHEAD,
        "meets_target": bool(math.isfinite(overhead) and overhead <= TARGET_OVERHEAD),
        "meets_goal": bool(math.isfinite(overhead) and overhead <= GOAL_OVERHEAD),
        "verdict": _verdict(overhead),
        "breakdown": breakdown,
        "meta": {
            "workload": workload,
            "world_size": world_size,
            "steps_per_decision": steps_per_decision,
            "decisions": decisions,
            "warmup": WARMUP_DECISIONS,
            "actions": actions,
            "seed": seed,
            "backend": "gloo",
        },
        "per_decision": records,
    }
    _print_report(console, result)
    write_json(result, json_path, console)
    return result
