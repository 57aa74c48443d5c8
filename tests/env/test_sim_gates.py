"""``commgym bench sim``'s gates against a reference: a "real" record that IS the simulator passes.

The real runs are replaced by a cache filled from the simulator itself (exact agreement:
tau 1, the same best entry, the same h, MAPE 0); swapping two entries' real times must
fail the ranking gate. No rank runs.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import yaml

from commgym.env.net import NetworkSpec
from commgym.env.sim import SimModel, adaptive_times, headroom, simulate, static_ranking
from commgym.experiments.bench.sim import _RealCache, cache_key, kendall_tau, run_sim_gates
from commgym.experiments.config import load_run_config
from tests.env.test_sim import MENU, _calibration

SEEDS = [1000, 1001, 1002, 1003]


@pytest.fixture
def scenario(tmp_path):
    doc = {
        "baselines": ["static:ddp-default"],
        "env": {
            "workload": "mid-mlp", "world_size": 4, "shards": "label-skew", "lr": 0.02,
            "network": {"profiles": ["10mbit", "100mbit"]}, "steps_per_decision": 4,
            "time_budget_s": 120.0, "reward": "time_to_target", "target_loss": 0.2,
            "action_menu": MENU,
        },
    }  # fmt: skip
    path = tmp_path / "lottery.yaml"
    path.write_text(yaml.safe_dump(doc))
    cal = _calibration()
    cal_path = cal.save(tmp_path / "cal.json")
    env_cfg = load_run_config(str(path)).env_config
    model = SimModel(cal, env_cfg.menu, 4)
    from commgym.env import EnvConfig
    from commgym.experiments.bench.sim import _drawn_spec

    cells = {}
    for s in SEEDS:
        spec = _drawn_spec(env_cfg, s)
        fixed = EnvConfig(**{**env_cfg.to_dict(), "network": spec})
        tm = model.timings(NetworkSpec.parse(spec).rate_bit_s)
        for k, e in enumerate(model.entries):
            t, loss, end = simulate(model, fixed, s, [(0.0, k)])
            n = max(round(end / tm[k].train_s) - 1, 1)
            cells[_RealCache.cell(spec, s, e)] = {
                "time": t, "final_loss": loss, "decisions": n + 1, "train_time_s": end,
                "steps": [[tm[k].step_s, tm[k].train_s]] * n,
            }  # fmt: skip
    ranking = static_ranking(model, env_cfg, SEEDS)
    ad = adaptive_times(model, env_cfg, SEEDS, ranking)
    t_ad, h = headroom(ranking[0].mean_s, ad, 120.0)
    real = {
        "key": cache_key(env_cfg),
        "cells": cells,
        "holdout": {},
        "scenarios": {
            f"{path}|{','.join(map(str, SEEDS))}": {
                "seeds": SEEDS, "static_entry": ranking[0].config, "T_static": ranking[0].mean_s,
                "adaptive_times": ad, "T_adaptive": t_ad, "h": h, "source": "the simulator",
            }
        },
    }  # fmt: skip
    real_path = tmp_path / "real.json"
    real_path.write_text(json.dumps(real))
    return path, cal_path, real_path, tmp_path


def _gates(path, cal_path, real_path, tmp_path, track=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_sim_gates(
            str(path), cal_path, seeds=SEEDS, real=real_path, run_real=False,
            tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", speed_steps=200, track=track,
        )  # fmt: skip


def test_a_record_that_is_the_simulator_passes_every_gate(scenario):
    r = _gates(*scenario, track=True)
    assert [row["pass"] for row in r["ranking"]] == [True, True]
    assert all(row["tau"] == pytest.approx(1.0) for row in r["ranking"])
    assert r["headroom"]["pass"] and r["headroom"]["sim_h"] == pytest.approx(
        r["headroom"]["real"]["h"]
    )
    assert r["mape"]["step_time"] == pytest.approx(0.0, abs=1e-9) and r["mape"]["pass"]
    assert r["decisions_per_s"] > 0
    # the reactive bound on drawn links: a blind first decision, then each link's best;
    # between the contextual oracle (the link known) and the best static entry
    h = r["headroom"]
    assert h["sim_T_adaptive"] - 1e-9 <= h["sim_reactive"]["T_adaptive"] <= h["sim_T_static"]
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{scenario[3]}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("commgym").experiment_id])
    assert run.data.metrics["sim/h"] == pytest.approx(r["headroom"]["sim_h"])
    assert run.data.metrics["real/h"] == pytest.approx(r["headroom"]["real"]["h"])
    # kept beside the calibration, where train --env sim reads them next to its gap
    from commgym.experiments.calibrate_sim import fidelity_lines, gates_path

    cal_path = scenario[1]
    assert gates_path(cal_path) == cal_path.with_name("cal.gates.json")
    (line,) = fidelity_lines(cal_path)
    assert line.startswith(f"simulator fidelity on {scenario[0]} (bench sim, ")
    assert line.count("PASS") == 4 and "FAIL" not in line and "tau 1.00" in line


def test_a_swapped_ranking_fails_its_gate(scenario):
    path, cal_path, real_path, tmp_path = scenario
    d = json.loads(real_path.read_text())
    cells = d["cells"]
    for seed in (1001, 1003):  # the seeds that drew 100 Mbit/s
        fast = [
            k for k in cells if k.startswith(f"100mbit|{seed}|") and cells[k]["time"] is not None
        ]
        assert len(fast) >= 2
        times = {k: cells[k]["time"] for k in fast}
        order = sorted(fast, key=lambda k: times[k])
        cells[order[0]]["time"], cells[order[-1]]["time"] = times[order[-1]], times[order[0]]
    real_path.write_text(json.dumps(d))
    r = _gates(path, cal_path, real_path, tmp_path)
    row = next(x for x in r["ranking"] if x["condition"] == "100mbit")
    assert not row["pass"] and row["tau"] < 0.9
    from commgym.experiments.calibrate_sim import fidelity_lines

    (line,) = fidelity_lines(cal_path)  # the newest verdict replaces the scenario's entry
    assert line.count("FAIL") == 1


def test_no_recorded_gates_names_the_command(tmp_path):
    from commgym.experiments.calibrate_sim import fidelity_lines

    (line,) = fidelity_lines(tmp_path / "cal.json")
    assert "no gates recorded" in line and "commgym bench sim --scenario" in line


def test_kendall_tau_reference_values():
    assert kendall_tau([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one discordant pair of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [2, 1, 3, 4]) == pytest.approx(4 / 6)
    assert np.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))


def test_bench_sim_command_on_cached_runs_records_its_gates(scenario):
    """The command: gates from the cache only (no rank starts), a record, the gates file."""
    from tests.experiments.cli_helpers import cli_ok

    path, cal_path, real_path, tmp_path = scenario
    out = cli_ok(
        ["bench", "sim", "--scenario", str(path), "--calibration", str(cal_path),
         "--real", str(real_path), "--seeds", ",".join(map(str, SEEDS)), "--cached-only",
         "--record", str(tmp_path / "rec")],
        tmp_path,  # the default MLflow store: ./mlflow.db under the test's folder
    )  # fmt: skip
    assert "fidelity gates" in out and "PASS" in out
    assert f"gates kept beside the calibration: {cal_path.with_name('cal.gates.json')}" in out
    (rec,) = (tmp_path / "rec").iterdir()
    assert (rec / "run.json").exists() and "fidelity gates" in (rec / "output.txt").read_text()
    assert json.loads((rec / "results.json").read_text())["headroom"]["pass"] is True


def test_a_search_grid_in_the_scenario_is_both_oracles(scenario):
    """``oracle-adaptive``'s ``search_every_s`` moves the simulator's oracle onto the grid
    and keys the real oracles' cache by it (oracles searched without it do not count)."""
    from commgym.experiments.bench.sim import gate_rows

    path, cal_path, real_path, tmp_path = scenario
    doc = yaml.safe_load(path.read_text())
    doc["baseline_kwargs"] = {"oracle-adaptive": {"search_every_s": 1.0}}
    path.write_text(yaml.safe_dump(doc))
    r = _gates(path, cal_path, real_path, tmp_path)
    h = r["headroom"]
    assert h["search_every_s"] == 1.0
    assert h["real"] is None and h["pass"] is None  # the cached oracles had no grid
    env_cfg = load_run_config(str(path)).env_config
    model = SimModel(_calibration(), env_cfg.menu, 4)
    ranking = static_ranking(model, env_cfg, SEEDS)
    grid = adaptive_times(model, env_cfg, SEEDS, ranking, every_s=1.0)
    assert h["sim_T_adaptive"] == pytest.approx(np.mean([120.0 if t is None else t for t in grid]))
    row = next(x for x in gate_rows(r) if x[0] == "headroom")
    assert row[1] == "scenario, a switch possible every 1 s"
