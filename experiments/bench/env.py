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

Where the overhead goes, measured per decision from the replies themselves (their
parts sum to ``env_step_s`` minus the slowest rank's ``train_time_s``; see
:func:`overhead_parts`):

* env side = ``env_step_s - command_s`` (action decode, reply aggregation);
* messaging = ``command_s`` minus the slowest rank's ``handler_s`` (pickling, the control
  connections, waking the processes);
* on the rank whose handler took longest: the held-out evaluation (``eval_s``),
  commgym's statistics inside the iterations (``instrumentation_s``: gradient norm and
  non-finite check, the reference all-reduce behind ``compression_error``), the rest of its
  handler (per-iteration bookkeeping after each timer, reducing the losses, building
  the reply), and the rank skew (its ``train_time_s`` minus the slowest one's, <= 0).

A ``steps=0`` probe after the measured decisions gives the fixed cost of a command
without iterations (messaging, evaluation, reply) and the pickled sizes of a command and
a reply.

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
    "overhead_parts",
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
        (``command - train``); ``median_parts_s``: the median of each of
        :func:`overhead_parts`'s parts (``{}`` when the records carry none).

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
        "median_parts_s": {
            k: _median([float(r["parts"][k]) for r in rows])
            for k in PARTS
            if all("parts" in r for r in rows)
        },
    }


#: The parts of one decision's overhead (:func:`overhead_parts`), in the report's order.
PARTS = ("env_side_s", "messaging_s", "eval_s", "instrumentation_s", "handler_rest_s", "skew_s")


def overhead_parts(
    env_step_s: float, command_s: float, replies: Sequence[dict[str, Any]]
) -> dict[str, float]:
    """Split one decision's overhead ``env_step_s - max(train_time_s)`` into its parts.

    Args:
        env_step_s: the env's wall time of ``step()``, seconds.
        command_s: the control-plane round trip inside it, seconds.
        replies: the ranks' ``step`` replies (``train_time_s``, ``handler_s``, ``eval_s``,
            ``instrumentation_s``; seconds).

    Returns:
        ``PARTS`` -> seconds, summing to ``env_step_s - max(train_time_s)``: the env side,
        the messaging (round trip beyond the slowest handler) and, on the rank whose
        handler took longest, its evaluation, its statistics, the rest of its handler
        and its skew (its training time minus the slowest rank's, <= 0).

    Raises:
        KeyError: a reply lacks one of the fields (ranks of an older commgym).
    """
    slow = max(replies, key=lambda r: float(r["handler_s"]))
    handler, train = float(slow["handler_s"]), float(slow["train_time_s"])
    ev, instr = float(slow["eval_s"]), float(slow["instrumentation_s"])
    return {
        "env_side_s": env_step_s - command_s,
        "messaging_s": command_s - handler,
        "eval_s": ev,
        "instrumentation_s": instr,
        "handler_rest_s": handler - train - ev - instr,
        "skew_s": train - max(float(r["train_time_s"]) for r in replies),
    }


def _timed_command(cluster: Any, sink: list[tuple[float, Any]]) -> Callable[..., Any]:
    """Wrap ``cluster.command`` (instance attribute only) to record each round trip.

    ``sink`` gets ``(seconds, replies)`` per command (``replies`` None when it raised).
    """
    inner = cluster.command

    def command(msg: dict[str, Any], timeout_s: float | None = None) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        replies = None
        try:
            replies = inner(msg, timeout_s)
            return replies
        finally:
            sink.append((time.perf_counter() - t0, replies))

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
        f"({m['warmup']} warm-up), actions={m['actions']}, seed={m['seed']}, "
        f"network={m.get('network') or 'loopback'}"
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
    parts = res["median_parts_s"]
    t2 = Table(
        title="where the overhead goes (median of each part; each decision's parts sum to its "
        "overhead, their medians need not)"
    )
    t2.add_column("part", no_wrap=True)
    t2.add_column("ms", justify="right", no_wrap=True)
    t2.add_column("how it is measured")
    rows = [
        ("env side (decode, aggregate)", "env_side_s", "env_step_s - command round trip"),
        ("messaging", "messaging_s", "command round trip - the slowest rank's handler_s"),
        (
            "held-out evaluation",
            "eval_s",
            "eval_s of the rank whose handler took longest (every rank evaluates its share)",
        ),
        (
            "commgym's statistics",
            "instrumentation_s",
            "its instrumentation_s: on the decision's last iteration, the gradient norm "
            "and the reference all-reduce behind compression_error (lossy entries; sampled "
            "coordinates)",
        ),
        (
            "rest of the handler",
            "handler_rest_s",
            "its handler_s - train_time_s - eval_s - instrumentation_s (bookkeeping after "
            "each iteration's timer, loss reduction, the reply)",
        ),
        ("rank skew", "skew_s", "its train_time_s - the slowest rank's (<= 0)"),
    ]
    for label, key, how in rows:
        t2.add_row(label, _fmt_ms(parts.get(key, math.nan)), how)
    t2.add_row(
        "fixed per decision (steps=0)",
        _fmt_ms(b["fixed_per_decision_s"]),
        f"a steps=0 command's round trip - its train_time_s; command "
        f"{b['command_pickle_bytes']} B, reply {b['reply_pickle_bytes']} B pickled",
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
    network: str | None = None,
    network_strict: bool = True,
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
        network: the ranks' emulated links (``EnvConfig.network``: a profile, spec or
            schedule; root and ``tc``), None for loopback.
        network_strict: ``EnvConfig.network_strict``: refuse (True) or drop with a
            warning (False) impairments this kernel cannot emulate.

    Returns:
        The :func:`summarize` keys plus ``reset_first_s``, ``reset_second_s``,
        ``rank_reset_s``, ``launches``, ``verdict``, ``meets_target``, ``meets_goal``,
        ``target``, ``goal``, ``breakdown`` (the ``steps=0`` probe's
        ``fixed_per_decision_s``, round trip and pickle sizes, and the median of each of
        :data:`PARTS`), ``meta`` and ``per_decision`` (raw records, each with its
        ``parts``).

    Raises:
        ValueError: invalid arguments (a network spec included).
        PermissionError: ``network`` given without root.
        RuntimeError: ``network`` asks for impairments this kernel cannot emulate
            (``network_strict``).
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
        network=network,
        network_strict=network_strict,
    )
    try:
        base = env.unwrapped
        on = f" on {network}" if network else ""
        console.print(f"[dim]launching {world_size} ranks ({workload}){on} ...[/dim]")
        _, info = env.reset(seed=seed)
        reset_first_s = float(info["reset_s"])
        _, info = env.reset(seed=seed)
        reset_second_s = float(info["reset_s"])
        rank_reset_s = float(info["rank_reset_s"])
        round_trips: list[tuple[float, Any]] = []
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
            env_step_s = float(info["measured"]["env_step_s"])
            record = {
                "config": info["config"],
                # the env's own timing of step(), carried next to the measurement
                "env_step_s": env_step_s,
                "train_time_s": float(measured.train_time_s),
                "command_s": math.nan,
                "eval_loss": float(measured.eval_loss),
            }
            if len(round_trips) > n_before:
                cmd_s, replies = round_trips[-1]
                record["command_s"] = cmd_s
                if replies is not None:
                    record["parts"] = overhead_parts(env_step_s, cmd_s, replies)
            records.append(record)
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
        launches = int(base.launches)
    finally:
        env.close()

    breakdown = {**probe, **summary["median_parts_s"]}
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
            "network": network,
        },
        "per_decision": records,
    }
    _print_report(console, result)
    write_json(result, json_path, console)
    return result
