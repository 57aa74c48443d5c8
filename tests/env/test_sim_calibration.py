"""A tiny real calibration of commgym/Sim-v1 on 2 gloo ranks, and the simulator built from it."""

from __future__ import annotations

import numpy as np
import pytest

from commgym.env.sim import Calibration, SimEnv, simulate


@pytest.fixture(scope="module")
def calibrated(tiny_calibration):
    """The session's tiny real calibration (tests/conftest.py)."""
    return tiny_calibration


def test_calibration_measures_every_part_and_round_trips(calibrated):
    _, path, cal = calibrated
    assert Calibration.load(path).to_dict() == cal.to_dict()
    assert set(cal.entries) == {"none/25MB/H1", "none/25MB/H2", "fp16/25MB/H1", "fp16/25MB/H2"}
    # the kernels' payload is the synchronizer's: fp32 dense = 4 B per parameter, fp16 half
    assert cal.codec["none"].payload_bytes == 4 * cal.num_params
    assert cal.codec["fp16"].payload_bytes == 2 * cal.num_params
    # the ranks' bytes per decision: K exchanges at period 1, one averaging at period 2 (K=2),
    # plus the period-1 steps' control words (two int32 counts per parameter tensor)
    none1, none2 = cal.entries["none/25MB/H1"], cal.entries["none/25MB/H2"]
    assert none2.bytes_total == cal.codec["none"].payload_bytes
    assert 0 <= none1.bytes_total - 2 * cal.codec["none"].payload_bytes <= 2 * 8 * 16
    for e in cal.entries.values():
        for curve in e.curves:
            assert curve[-1] <= 0.9 * 1.0 + 1e-9 < curve[0]  # down to 0.9x the target
    assert cal.wire.beta_host_s["allreduce"] >= 0 and not cal.wire.links  # loopback only
    # one random-switch episode over a dense-only menu: every switch is dense -> dense; the
    # held-out check needs two episodes (None in the file, not NaN)
    assert 0.0 <= cal.switch_penalty < 3.0
    assert set(cal.switch_fit["counts"]) <= {"dense->dense"}
    assert cal.switch_fit["switches"] == sum(cal.switch_fit["counts"].values())
    assert cal.to_dict()["switch_fit"]["open_pairs"] is None
    # the episode is kept: a fit can be redone from the file
    ((entries, losses),) = cal.switch_episodes
    assert len(losses) == len(entries) + 1 and set(entries) <= set(cal.entries)
    assert cal.meta["real_decisions"] > 0 and cal.meta["real_s"] > 0


def test_the_simulator_replays_its_calibration_curves(calibrated):
    cfg, _, cal = calibrated
    env = SimEnv(cal, cfg)
    model = env.model
    for k, entry in enumerate(model.entries):
        # the decision-time decomposition sums back to the ranks' median decision
        assert model.timings(None)[k].train_s == pytest.approx(cal.entries[entry].train_s)
        # one calibration seed: the simulated episode needs the decisions the real one did
        curve = cal.entries[entry].curves[0]
        real_decisions = int(np.argmax(np.asarray(curve[1:]) <= cfg.target_loss)) + 1
        t, _, _ = simulate(model, cfg, 0, [(0.0, k)])
        # (one decision either way: the curve is read through a grid of loss levels)
        assert abs(t / cal.entries[entry].train_s - real_decisions) <= 1 + 1e-6


def test_refit_switches_refits_from_the_kept_episodes_without_ranks(calibrated, tmp_path):
    """`calibrate-sim --refit-switches`: the switch model fitted again from the episodes the
    file kept, written elsewhere; the file read is left as it was; no --out is refused."""
    import dataclasses

    from typer.testing import CliRunner

    from commgym.experiments.calibrate_sim import refit_switches
    from commgym.experiments.cli import app
    from tests.experiments.readme_commands import fill, template

    _, path, cal = calibrated
    before = path.read_bytes()
    out = tmp_path / "refit.json"
    # the docs' command (docs/simulator.md), its placeholders filled
    _, words = fill(template("--refit-switches"), {"OLD.json": str(path), "NEW.json": str(out)})
    assert words[:2] == ["commgym", "calibrate-sim"]
    res = CliRunner().invoke(app, words[1:])
    assert res.exit_code == 0, res.output
    assert "refitted" in res.output and "switch penalties" in res.output
    new = Calibration.load(out)
    # one episode: no held-out check, so the pair form stays in force
    assert new.switch_fit["model"] == "pairs" and new.switch_costs == {}
    assert new.switch_episodes == cal.switch_episodes and new.entries == cal.entries
    assert new.meta["switch_refit"]["date"]
    assert path.read_bytes() == before
    res = CliRunner().invoke(app, ["calibrate-sim", "--refit-switches", str(path)])
    assert res.exit_code == 2 and "needs --out" in res.output
    with pytest.raises(ValueError, match="no random-switch episodes"):
        refit_switches(dataclasses.replace(cal, switch_episodes=[]))


def test_link_decisions_measure_each_entry_on_a_shaped_link(calibrated):
    """Step 5 of calibrate-sim: a short static episode per entry on an emulated link; its
    median decision time replaces the composed one there, and loopback is unchanged."""
    import dataclasses

    from commgym.env import EnvConfig
    from commgym.env.net import netem_available
    from commgym.env.sim.model import SimModel
    from commgym.experiments.calibrate_sim import _link_decisions

    ok, why = netem_available()
    if not ok:
        pytest.skip(f"network emulation unavailable here: {why}")
    cfg, _, cal = calibrated
    real = EnvConfig(**{**cfg.to_dict(), "probe_bytes": 0, "network": None})
    composed = SimModel(cal, cfg.menu, cfg.steps_per_decision).timings(10**9)
    ticks = []
    # every entry but the slowest composed one is run (the limit leaves that one out)
    limit = sorted(t.train_s for t in composed)[-2]
    measured, n = _link_decisions(cal, real, [10**9], 2, limit, lambda: ticks.append(1))
    assert len(ticks) == len(composed)  # one tick per entry, run or not
    ran = measured["1000000000"]
    slowest = max(range(len(composed)), key=lambda k: composed[k].train_s)
    entries = SimModel(cal, cfg.menu, cfg.steps_per_decision).entries
    assert set(ran) == set(entries) - {entries[slowest]}
    assert n == 3 * len(ran)  # 2 kept + the first, left out, per entry
    with_link = dataclasses.replace(cal, link_train_s=measured)
    model = SimModel(with_link, cfg.menu, cfg.steps_per_decision)
    for k, e in enumerate(model.entries):
        want = ran.get(e, composed[k].train_s)
        assert model.timings(10**9)[k].train_s == pytest.approx(want)
        assert model.timings(None)[k].train_s == pytest.approx(cal.entries[e].train_s)
    assert Calibration.from_dict(with_link.to_dict()).link_train_s == measured
