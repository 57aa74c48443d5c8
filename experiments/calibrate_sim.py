"""``commgym calibrate-sim``: measure the simulator's parts on real ranks, once per workload.

What runs (all on this machine, :mod:`commgym.env.sim` says what each part is):

1. the codec of every compression on the menu, by the kernels, on the workload's bucket;
2. one static episode per menu entry and calibration seed on **unshaped** loopback ranks
   (this world size, threads, shards, learning rate), down to ``target_loss`` (default 0.9x
   the scenario's, so the curves cover its crossing): decision times, compute, bytes and
   the held-out loss curves;
3. ``switch_episodes`` episodes that switch entries at random (held 1-3 decisions), whose
   losses fit the progress a switch costs;
4. timed all-reduces and all-gathers on loopback and on every link rate the scenario's
   plan can put in force (emulated, one namespace per rank), for the wire fit;
5. a short static episode (``link_decisions`` decisions after a first one left out) of
   every entry on every such link where its composed decision takes at most
   ``link_decision_limit_s``: their median decision times are the calibration's
   ``link_train_s``, whose difference from the composed time the simulator adds as the
   entry's host cost on that link (the 10 Gbit/s sparse entries' 20-26 %, which no part
   above carries).

Every episode goes through THE rollout (:func:`~commgym.agents.rollout.rollout`). Seeds
are far from the evaluation seeds (``900_000`` on), so the fidelity gates are held out.
One progress bar over the whole calibration shows the time left.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "CALIBRATION_SEEDS",
    "calibrate_sim",
    "calibration_path",
    "default_calibration_path",
    "fidelity_lines",
    "gates_path",
    "refit_switches",
    "switch_costs_of",
]

#: ``env.reset`` seeds of the calibration's static episodes (never evaluation seeds).
CALIBRATION_SEEDS: tuple[int, ...] = (900_001, 900_002)

#: Decisions of each entry's short episode on each shaped link (step 5 of the module docstring).
LINK_DECISIONS = 10
#: ``env.reset`` seed of those episodes (never an evaluation seed).
LINK_SEED = 920_001

#: Payload sizes per rank of the wire benchmark, B (those whose ring transfer would take
#: more than ~2 s on a link are skipped there).
WIRE_SIZES = (4096, 16384, 65536, 262144, 1048576, 4505600)


def default_calibration_path(env_cfg: Any, root: str | os.PathLike[str] = ".") -> Path:
    """Where a workload setting's calibration lives by default (one file per setting).

    ``<root>/sim-calibration/<workload>-W<world>-<shards>-lr<lr>-K<steps>.json``.
    """
    from commgym.env.sim import workload_key

    k = workload_key(env_cfg)
    name = (
        f"{k['workload']}-W{k['world_size']}-t{k['threads_per_rank']}-{k['shards']}"
        f"-lr{k['lr']:g}-b{k['batch_size']}-K{k['steps_per_decision']}".replace(":", "_")
    )
    return Path(root) / "sim-calibration" / f"{name}.json"


def calibration_path(explicit: str | os.PathLike[str] | None, env_cfg: Any) -> Path:
    """The calibration a command uses: ``explicit`` (``--calibration``), else the default."""
    return Path(explicit) if explicit else default_calibration_path(env_cfg)


def gates_path(calibration: str | os.PathLike[str]) -> Path:
    """Where ``commgym bench sim`` keeps a calibration's fidelity gates: beside it.

    ``<calibration stem>.gates.json``, one entry per scenario, so whoever learns on the
    calibration (``train --env sim``) can say how faithful it was found to be.
    """
    p = Path(calibration)
    return p.with_name(f"{p.stem}.gates.json")


def fidelity_lines(calibration: str | os.PathLike[str]) -> list[str]:
    """One line per scenario whose gates ``bench sim`` recorded for ``calibration``.

    Returns a single line naming the command when none were recorded.
    """
    path = gates_path(calibration)
    if not path.is_file():
        return [
            f"simulator fidelity: no gates recorded for {calibration} (`commgym bench sim "
            f"--scenario SCENARIO --calibration {calibration}` measures them)"
        ]
    lines = []
    for scenario, r in json.loads(path.read_text()).items():
        verdicts = ", ".join(
            f"{gate} {figure} {'PASS' if ok else ('n/a' if ok is None else 'FAIL')}"
            for gate, _, figure, _, ok in r["rows"]
        )
        lines.append(f"simulator fidelity on {scenario} (bench sim, {r['date']}): {verdicts}")
    return lines


#: Random-switch episodes of a calibration: ~20 switches each, so each pair of compressor
#: families on a menu of three families sees ~15 (the per-pair fit needs 4).
SWITCH_EPISODES = 8


def switch_costs_of(fit: dict[str, Any]) -> dict[str, list[float]]:
    """The calibration's ``switch_costs`` from a switch fit.

    Its two-decision costs per family entered where that form won the held-out check
    (``model == "entered"``), else none (the pair form is the simulator's).
    """
    if fit.get("model") != "entered":
        return {}
    return {k: [float(x) for x in v] for k, v in fit.get("costs", {}).items()}


def refit_switches(cal: Any) -> Any:
    """``cal`` with its switch model fitted again from its own random-switch episodes.

    No ranks run: the episodes the calibration kept (``switch_episodes``) and its static
    curves are what :func:`~commgym.env.sim.progress.fit_switch_penalties` reads, so a
    calibration written before a newer form of the switch cost gets it without being
    measured again (``commgym calibrate-sim --refit-switches``).

    Raises:
        ValueError: the calibration kept no switch episodes.
    """
    import dataclasses

    from commgym.env.sim import fit_switch_penalties

    if not cal.switch_episodes:
        raise ValueError(
            "this calibration kept no random-switch episodes to refit from: re-run "
            "`commgym calibrate-sim` (with --switch-episodes > 0)"
        )
    curves = {e: ent.curves for e, ent in cal.entries.items()}
    eps = [(list(e), list(ls)) for e, ls in cal.switch_episodes]
    fit = fit_switch_penalties(curves, eps, cal.target_loss)
    when = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    meta = {**cal.meta, "switch_refit": {"date": when, "commit": _git_commit()}}
    return dataclasses.replace(
        cal,
        switch_penalty=fit["penalty"],
        switch_penalties=fit["penalties"],
        switch_costs=switch_costs_of(fit),
        switch_fit=fit,
        meta=meta,
    )


def switch_lines(cal: Any) -> list[str]:
    """The switch model of a calibration and its leave-one-episode-out check, as lines."""
    f = cal.switch_fit
    if not cal.switch_penalties and f.get("switches") is None:
        return [f"switch penalty {cal.switch_penalty:.2f} (pooled; no per-pair fit in this file)"]
    pairs = ", ".join(
        f"{p} {cal.switch_penalties[p]:.2f} (n={n})" if p in cal.switch_penalties else f"{p} n={n}"
        for p, n in f.get("counts", {}).items()
    )
    lines = [
        f"switch penalties (decisions of progress lost): pooled {cal.switch_penalty:.2f} over "
        f"{f.get('switches', 0)} switches; {pairs or 'no switches'}"
    ]
    if cal.switch_costs:
        costs = ", ".join(f"{k} {a:.2f} + {b:.2f}" for k, (a, b) in cal.switch_costs.items())
        lines.append(
            "in force: per family entered, the switching decision + the next one "
            f"(decisions of progress lost): {costs}"
        )
    gate = switch_gate(f)
    if gate is not None:
        lines.append(
            f"switch gate ({f['episodes']} random-switch episodes, each held out, replayed open "
            f"loop; mean |log-loss error|): {switch_gate_figure(f)}; target <= "
            f"{SWITCH_GATE_RATIO:g}x the static episodes': {'PASS' if gate else 'FAIL'}"
        )
    return lines


def switch_gate_figure(fit: dict[str, Any]) -> str:
    """The switch gate's figures (a measurable fit: :func:`switch_gate` is not None)."""
    entered = fit.get("open_entered")
    two = "" if entered is None else f"per family entered over two decisions {entered:.3f}, "
    return (
        f"{two}per-pair {fit['open_pairs']:.3f} (pooled {fit['open_pooled']:.3f}, free "
        f"switches {fit['open_zero']:.3f}), static episodes {fit['open_static']:.3f}; in force: "
        f"{'per family entered' if fit.get('model') == 'entered' else 'per pair'}"
    )


#: The switch gate: replaying a held-out random-switch episode, the simulator's loss is off
#: by at most this many times what it is off by replaying a held-out static episode.
SWITCH_GATE_RATIO = 1.5


def switch_gate(fit: dict[str, Any]) -> bool | None:
    """Whether a switch fit passes :data:`SWITCH_GATE_RATIO` (None: not measurable).

    The figure is the form in force's (``open_model``; fits before the two-decision form
    have only the pair form's ``open_pairs``).
    """
    a, b = fit.get("open_model", fit.get("open_pairs")), fit.get("open_static")
    if a is None or b is None or not (np.isfinite(a) and np.isfinite(b)):
        return None
    return bool(a <= SWITCH_GATE_RATIO * b)


class _ResetInfo(gym.Wrapper):
    """Keeps the last reset's ``info`` (the curve's first point: the reset's held-out loss)."""

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self.last_reset_info = info
        return obs, info


class _RandomSwitcher:
    """Plays a seeded random entry, held 1-3 decisions: episodes that switch (the penalty fit)."""

    reads_probe = False

    def __init__(self, menu: Any, seed: int) -> None:
        self.menu = menu
        self.rng = np.random.default_rng(seed)
        self.left = 0
        self.action = menu.default_action()

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None, deterministic=True):
        if self.left <= 0:
            self.action = np.array(
                [int(self.rng.integers(0, n)) for n in self.menu.nvec], dtype=np.int64
            )
            self.left = int(self.rng.integers(1, 4))
        self.left -= 1
        return self.action.copy(), state


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _bench_wire(
    world_size: int, rates: Sequence[int | None], repeats: int, advance: Callable[[], None]
) -> list[tuple[str, int | None, float, float]]:
    """Timed all-reduces and all-gathers per rate: ``(kind, rate, bytes per rank, s)`` rows."""
    from commgym.env.cluster import Cluster, LaunchConfig
    from commgym.env.net import EmulatedNetwork, NetworkSpec

    rows: list[tuple[str, int | None, float, float]] = []
    for rate in rates:
        net = None
        if rate is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                net = EmulatedNetwork(world_size, NetworkSpec(int(rate)), strict=False)
        cluster = Cluster(world_size, LaunchConfig(timeout_s=600), network=net)
        try:
            cluster.start()
            for kind in ("allreduce", "allgather"):
                factor = (
                    2 * (world_size - 1) / world_size if kind == "allreduce" else world_size - 1
                )
                sizes = [n for n in WIRE_SIZES if rate is None or n * factor * 8 / rate <= 2.0]
                # the all-gather bench takes the gathered total
                asked = [n if kind == "allreduce" else n * world_size for n in sizes]
                secs = cluster.command(
                    {"cmd": f"{kind}_bench", "sizes_bytes": asked, "repeats": repeats},
                    timeout_s=1800,
                )[0]["seconds"]
                for n, a in zip(sizes, asked, strict=True):
                    rows.append((kind, rate, float(n), float(secs[str(int(a))])))
        finally:
            cluster.close()
            if net is not None:
                net.close()
        advance()
    return rows


def calibrate_sim(
    env_cfg: Any,
    out: str | os.PathLike[str],
    *,
    seeds: Sequence[int] = CALIBRATION_SEEDS,
    target_loss: float | None = None,
    budget_s: float = 60.0,
    switch_episodes: int = SWITCH_EPISODES,
    rates: Sequence[int] | None = None,
    repeats: int = 3,
    link_decisions: int = LINK_DECISIONS,
    link_decision_limit_s: float = 1.0,
    progress: Callable[[str, int], Any] | None = None,
) -> Any:
    """Measure every part of the simulator for ``env_cfg``'s workload setting and menu.

    Args:
        env_cfg: the scenario's ``EnvConfig`` (its workload setting, menu, target and the
            link rates its plan can put in force are read; its network is not used for
            the episodes, which run unshaped).
        out: where to write the calibration (JSON).
        seeds: ``env.reset`` seeds of the static episodes.
        target_loss: the episodes' target (default: 0.9x the scenario's).
        budget_s: training-time budget of each calibration episode, s.
        switch_episodes: random-switch episodes for the switch penalty (0: none, penalty 0).
        rates: link rates (bit/s) to time the wire on (default: the plan's); loopback always.
        repeats: timed repetitions per collective size.
        link_decisions: decisions of each entry's short episode on each shaped link (after
            a first one, left out as the ranks' warm-up); 0: none (no host cost per link).
        link_decision_limit_s: entries whose composed decision on a link takes longer than
            this (s) are not run there (the dense entries on a slow link, whose time the wire
            model carries within ~5 %).
        progress: ``progress(description, total) -> context manager yielding advance``
            (:func:`commgym.experiments.progress.phase`); ``None``: silent.

    Returns:
        The written :class:`~commgym.env.sim.Calibration`.

    Raises:
        ValueError: a scenario without ``target_loss`` and no ``target_loss`` given, or a
            menu bucket smaller than the model (the simulator models one bucket).
    """
    import contextlib

    from commgym.agents.baselines import StaticAgent
    from commgym.agents.rollout import rollout
    from commgym.env import AllReduceEnv, EnvConfig
    from commgym.env.measure import measurement_from_info  # noqa: F401 - the record's reader
    from commgym.env.sim import (
        Calibration,
        EntryCalibration,
        fit_switch_penalties,
        fit_wire,
        measure_codec,
        workload_key,
    )
    from commgym.env.workloads import get_workload

    target = target_loss if target_loss is not None else env_cfg.target_loss
    if target is None:
        raise ValueError("calibrate-sim needs a target loss (the scenario's or --target-loss)")
    if target_loss is None:
        target = 0.9 * float(target)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    menu = env_cfg.menu
    wl = get_workload(env_cfg.workload)
    model = wl.build_model()
    shapes = [list(p.shape) for p in reversed(list(model.parameters()))]
    num_params = sum(p.numel() for p in model.parameters())
    opt_buffers = 1 if getattr(wl, "optimizer", "sgd") == "sgd" else 2
    entries = [str(menu.decode(np.array(a))) for a in np.ndindex(*tuple(int(n) for n in menu.nvec))]
    if rates is None:
        rates = sorted({int(s.rate_bit_s) for s in env_cfg.network_plan.specs})
    if (
        not isinstance(link_decisions, int)
        or isinstance(link_decisions, bool)
        or link_decisions < 0
    ):
        raise ValueError(f"link_decisions must be an integer >= 0, got {link_decisions!r}")
    link_units = len(entries) * len(rates) if link_decisions else 0
    units = len(entries) * len(seeds) + switch_episodes + len(rates) + 1 + 1 + link_units
    ctx = progress("calibrating the simulator on real ranks", units) if progress else None
    with ctx if ctx is not None else contextlib.nullcontext(lambda *_: None) as advance:
        codec = {
            spec: measure_codec(spec, shapes, env_cfg.world_size, threads=env_cfg.threads_per_rank)
            for spec in menu.compression
        }
        advance()
        d = env_cfg.to_dict()
        d.update(
            network=None,
            time_budget_s=float(budget_s),
            target_loss=float(target),
            reward="time_to_target",
            probe_bytes=0,
            max_decisions=None,
            stragglers=None,
            cross_traffic=None,
        )
        real = EnvConfig(**d)
        env = _ResetInfo(AllReduceEnv(real))
        decisions = 0
        per_entry: dict[str, list[Any]] = {e: [] for e in entries}
        curves: dict[str, list[list[float]]] = {e: [] for e in entries}
        acc_rows: list[list[float]] = []
        switch_eps: list[tuple[list[str], list[float]]] = []
        try:
            for seed in seeds:
                for entry in entries:
                    ep = rollout(env, StaticAgent(env, preset=entry), seed, target_loss=target)
                    decisions += ep.decisions
                    l0 = float(env.last_reset_info["eval_loss"])
                    curves[entry].append([l0] + [float(s.measured.eval_loss) for s in ep.steps])
                    per_entry[entry].extend(
                        (s.measured, prev) for s, prev in zip(ep.steps[1:], ep.steps, strict=False)
                    )
                    acc_rows.extend(
                        [float(s.measured.eval_loss), float(s.measured.eval_acc)] for s in ep.steps
                    )
                    advance()
            for i in range(switch_episodes):
                agent = _RandomSwitcher(menu, 7_000 + i)
                ep = rollout(env, agent, 910_001 + i, target_loss=target)
                decisions += ep.decisions
                l0 = float(env.last_reset_info["eval_loss"])
                switch_eps.append(
                    (
                        [s.config for s in ep.steps],
                        [l0] + [float(s.measured.eval_loss) for s in ep.steps],
                    )
                )
                advance()
        finally:
            env.close()
        rows = _bench_wire(env_cfg.world_size, [None, *rates], repeats, advance)
        wire = fit_wire(rows, env_cfg.world_size)
        ents = {}
        for e in entries:
            ms = [m for m, _ in per_entry[e]]
            prevs = [p.measured for _, p in per_entry[e]]
            errs = [m.compression_error for m in ms if m.compression_error is not None]
            ents[e] = EntryCalibration(
                train_s=float(np.median([m.train_time_s - m.probe_s for m in ms])),
                step_s=float(np.median([m.step_time_s for m in ms])),
                compute_s=float(np.median([m.compute_s for m in ms])),
                compress_s=float(np.median([m.compress_s for m in ms])),
                bytes_total=float(np.median([m.bytes_total for m in ms])),
                train_loss_ratio=float(
                    np.median([m.train_loss / p.eval_loss for m, p in zip(ms, prevs, strict=True)])
                ),
                log10_grad_norm=float(np.median([np.log10(max(m.grad_norm, 1e-30)) for m in ms])),
                compression_error=float(np.median(errs)) if errs else 0.0,
                decisions=len(ms),
                curves=curves[e],
            )
        switch_fit = fit_switch_penalties(curves, switch_eps, target)
        advance()
        acc_rows = sorted(r for r in acc_rows if np.isfinite(r[0]) and np.isfinite(r[1]))
        cal = Calibration(
            key=workload_key(env_cfg),
            menu=menu.to_dict(),
            num_params=int(num_params),
            param_shapes=shapes,
            optimizer_state_bytes=int(4 * num_params * opt_buffers),
            target_loss=float(target),
            entries=ents,
            codec=codec,
            wire=wire,
            switch_penalty=switch_fit["penalty"],
            switch_penalties=switch_fit["penalties"],
            switch_costs=switch_costs_of(switch_fit),
            switch_fit=switch_fit,
            switch_episodes=[[list(e), list(ls)] for e, ls in switch_eps],
            eval_acc=acc_rows,
            meta={
                "real_s": time.perf_counter() - t_start,
                "real_decisions": decisions,
                "seeds": list(seeds),
                "switch_episodes": switch_episodes,
                "rates_bit_s": list(rates),
                "wire_samples": [list(r) for r in rows],
                "load_before": list(load_before),
                "load_after": list(os.getloadavg()),
                "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "commit": _git_commit(),
                "host_cpus": os.cpu_count(),
            },
        )
        if link_decisions:
            link_train, n = _link_decisions(
                cal, real, rates, link_decisions, link_decision_limit_s, advance
            )
            cal.link_train_s = link_train
            decisions += n
            cal.meta["real_decisions"] = decisions
            cal.meta["link_decisions"] = link_decisions
        cal.meta["real_s"] = time.perf_counter() - t_start
        cal.meta["load_after"] = list(os.getloadavg())
    cal.save(out)
    return cal


def _link_decisions(
    cal: Any,
    real: Any,
    rates: Sequence[int],
    decisions: int,
    limit_s: float,
    advance: Callable[..., Any],
) -> tuple[dict[str, dict[str, float]], int]:
    """Step 5 of the module docstring: each entry's median decision time on each link.

    Args:
        cal: the calibration so far (its composed times choose the entries run).
        real: the unshaped episodes' ``EnvConfig`` (its network is replaced per link).
        rates: the shaped links, bit/s.
        decisions: decisions kept per entry and link (one more runs first).
        limit_s: the composed decision time above which an entry is not run on a link, s.
        advance: the progress bar's step (once per entry and link, run or not).

    Returns:
        ``({str(rate): {entry: median s}}, real decisions run)``.
    """
    import dataclasses

    from commgym.agents.baselines import StaticAgent
    from commgym.agents.rollout import rollout
    from commgym.env import AllReduceEnv
    from commgym.env.net import NetworkSpec
    from commgym.env.sim.model import SimModel

    model = SimModel(cal, real.menu, real.steps_per_decision)
    out: dict[str, dict[str, float]] = {}
    total = 0
    for rate in rates:
        composed = model.timings(rate)
        cfg = dataclasses.replace(
            real, network=str(NetworkSpec(int(rate))), max_decisions=decisions + 1
        )
        env = AllReduceEnv(cfg)
        try:
            for k, entry in enumerate(model.entries):
                if composed[k].train_s <= limit_s:
                    ep = rollout(env, StaticAgent(env, preset=entry), LINK_SEED)
                    total += ep.decisions
                    times = [s.measured.train_time_s - s.measured.probe_s for s in ep.steps[1:]]
                    if times:
                        out.setdefault(str(int(rate)), {})[entry] = float(np.median(times))
                advance()
        finally:
            env.close()
    return out, total
