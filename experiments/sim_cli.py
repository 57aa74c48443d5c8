"""``commgym calibrate-sim`` and ``commgym bench sim``: the simulator's two commands.

Registered on the main app and the ``bench`` group when :mod:`commgym.experiments.cli`
imports this module (after both exist).
"""

from __future__ import annotations

from pathlib import Path

import typer

from commgym.experiments.bench.commands import bench_app
from commgym.experiments.cli_options import RegistryHelpCommand, comma_list, fail, own_options
from commgym.experiments.config import CliField
from commgym.experiments.records import record_option

__all__ = ["register"]

_SCENARIO = CliField("Scenario: a YAML file or a shipped name ({configs}).")
_CALIBRATION = CliField(
    "Calibration JSON (default: sim-calibration/<workload setting>.json under the cwd)."
)

CALIBRATE_OPTIONS = {
    "config": _SCENARIO,
    "out": _CALIBRATION,
    "seeds": CliField("Comma-separated reset seeds of the static calibration episodes."),
    "target_loss": CliField(
        "Held-out loss the episodes run down to (default: 0.9x the scenario's)."
    ),
    "budget_s": CliField("Training-time budget of each calibration episode, s.", min=1),
    "switch_episodes": CliField(
        "Random-switch episodes (the switch penalties' fit; default 8).", min=0
    ),
    "rates": CliField("Comma-separated link rates to time the wire on (default: the plan's)."),
    "link_decisions": CliField(
        "Decisions of each entry's short episode on each shaped link, whose median time the "
        "simulator takes there (default 10; 0: none, the composed time alone).",
        min=0,
    ),
    "refit_switches": CliField(
        "Refit the switch model of this calibration from the switch episodes it kept and "
        "write it to --out; no ranks run (a calibration from before a newer switch form)."
    ),
}

GATES_OPTIONS = {
    "scenario": _SCENARIO,
    "calibration": _CALIBRATION,
    "seeds": CliField("Comma-separated held-out evaluation seeds."),
    "real": CliField("Cache of the real reference runs (JSON; reused across invocations)."),
    "holdout_rate": CliField("A link rate the calibration never recorded (step-time gate)."),
    "run_real": CliField(
        "Run the real reference runs the cache lacks.", flag="--run-real/--cached-only"
    ),
    "json_path": CliField("Also write results as JSON here.", flag="--json"),
}


@bench_app.command("sim", cls=RegistryHelpCommand)
@record_option()
@own_options(GATES_OPTIONS)
def bench_sim_cmd(
    scenario: str = "flaky-link",
    calibration: str | None = None,
    seeds: str = "1000,1001,1002,1003",
    real: str = "sim-calibration/real-reference.json",
    holdout_rate: str = "100mbit",
    run_real: bool = True,
    json_path: str | None = None,
) -> None:
    """Fidelity gates of commgym/Sim-v1 against real ranks (ranking, headroom, step time)."""
    from commgym.experiments.bench.sim import run_sim_gates
    from commgym.experiments.calibrate_sim import calibration_path
    from commgym.experiments.config import load_run_config

    try:
        env_cfg = load_run_config(scenario).env_config
        run_sim_gates(
            scenario, str(calibration_path(calibration, env_cfg)), seeds=comma_list(seeds, int),
            real=real, holdout_rate=holdout_rate, run_real=run_real, json_path=json_path,
        )  # fmt: skip
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        fail(err)


def register(app: typer.Typer) -> None:
    """Add ``calibrate-sim`` to ``app`` (``bench sim`` is on the bench group already)."""

    @app.command("calibrate-sim", cls=RegistryHelpCommand)
    # the record keeps the calibration it wrote (its folder's new files)
    @record_option(lambda kw: [Path(kw["out"]).parent if kw.get("out") else "sim-calibration"])
    @own_options(CALIBRATE_OPTIONS)
    def calibrate_sim_cmd(
        config: str = "flaky-link",
        out: str | None = None,
        seeds: str = "900001,900002",
        target_loss: float | None = None,
        budget_s: float = 60.0,
        switch_episodes: int | None = None,
        rates: str | None = None,
        link_decisions: int | None = None,
        refit_switches: str | None = None,
    ) -> None:
        """Measure the simulator's parts on real ranks (one calibration per workload setting)."""
        from commgym.env.net import NetworkSpec
        from commgym.experiments import calibrate_sim as cs
        from commgym.experiments.config import load_run_config
        from commgym.experiments.progress import console, phase

        if refit_switches is not None:
            from commgym.env.sim import Calibration

            try:
                if out is None or Path(out).resolve() == Path(refit_switches).resolve():
                    raise ValueError(
                        f"--refit-switches {refit_switches} needs --out PATH, another file "
                        "(the calibration read stays as it was)"
                    )
                with console.status("refitting the switch model (no ranks) ..."):
                    cal = cs.refit_switches(Calibration.load(refit_switches))
                cal.save(out)
            except (ValueError, FileNotFoundError) as err:
                fail(err)
            console.print(f"switch model of {refit_switches} refitted -> {out}")
            for line in cs.switch_lines(cal):
                console.print(line)
            return
        try:
            env_cfg = load_run_config(config).env_config
            path = str(cs.calibration_path(out, env_cfg))
            cal = cs.calibrate_sim(
                env_cfg, path, seeds=comma_list(seeds, int), target_loss=target_loss,
                budget_s=budget_s,
                **({} if switch_episodes is None else {"switch_episodes": switch_episodes}),
                rates=None if rates is None else [
                    NetworkSpec.parse(r).rate_bit_s for r in comma_list(rates)
                ],
                **({} if link_decisions is None else {"link_decisions": link_decisions}),
                progress=phase,
            )  # fmt: skip
        except (ValueError, FileNotFoundError, RuntimeError) as err:
            fail(err)
        m = cal.meta
        console.print(
            f"calibration of {cal.key['workload']} (W={cal.key['world_size']}, "
            f"{cal.key['shards']}) -> {path}: {m['real_s']:.0f} s of real ranks, "
            f"{m['real_decisions']} decisions "
            f"(load {m['load_before'][0]:.2f} -> {m['load_after'][0]:.2f})"
        )
        for line in cs.switch_lines(cal):
            console.print(line)
