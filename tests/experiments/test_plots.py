"""Report figures: non-empty PNGs, NaN and single-seed robustness, CI arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib import image as mpimg

from commgym.experiments.plots import (
    action_timeline_figure,
    action_timeline_plot,
    comparison_plot,
    loss_curves_plot,
    mean_ci,
)

nan = float("nan")


def _assert_png(path):
    assert path.exists() and path.suffix == ".png" and path.stat().st_size > 1000
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.std(img[..., :3])) > 0.01  # something was drawn


def test_mean_ci_t_interval_and_edge_cases():
    mean, half, n = mean_ci([1.0, 2.0, 3.0, nan])
    assert (mean, n) == (2.0, 3)
    # t_{0.975, 2} = 4.3027; s = 1; sem = 1/sqrt(3)
    assert half == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert mean_ci([5.0])[0] == 5.0 and math.isnan(mean_ci([5.0])[1])
    assert math.isnan(mean_ci([nan, math.inf])[0])
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0], confidence=1.5)


def test_comparison_plot(tmp_path):
    results = {
        "ppo": [10.0, 12.0, 11.5, 9.0],
        "bayesopt": [14.0, nan, 13.0],
        "static-fp16": [20.0],  # single seed: bar, no interval
        "diverged": [nan, nan],  # nothing finite: labelled n=0, no bar
    }
    out = comparison_plot(results, "time to target (s)", tmp_path / "sub" / "cmp.png")
    _assert_png(out)
    _assert_png(comparison_plot({"only": [1.0]}, "x", tmp_path / "one.png"))
    with pytest.raises(ValueError, match="empty"):
        comparison_plot({}, "x", tmp_path / "none.png")


def _rows():
    rows, t = [], 0.0
    configs = ["none/25MB/H1", "int8/4MB/H1", "topk:0.01/1MB/H2"]
    for i in range(12):
        if i == 7:
            t = 0.0  # a new episode starts
        t += 0.5
        rows.append(
            {
                "train_time_s": t,
                "config": configs[i % 3],
                "eval_loss": nan if i == 5 else 2.0 / (i + 1),
                "bytes_per_step": 1e6 / (1 + i % 3),
                "bytes_total": None if i == 2 else 1e7 / (1 + i % 3),
                "comm_s": "" if i == 2 else (0.0 if i == 3 else 0.01),
            }
        )
    return rows


def test_action_timeline_plot(tmp_path):
    _assert_png(action_timeline_plot(_rows(), tmp_path / "timeline.png", title="ppo seed 0"))


def test_action_timeline_plot_all_nan_and_csv_strings(tmp_path):
    rows = [
        {"train_time_s": str(0.5 * (i + 1)), "config": "fp16/4MB/H1", "eval_loss": "nan"}
        for i in range(3)
    ]
    _assert_png(action_timeline_plot(rows, tmp_path / "nan.png"))
    _assert_png(action_timeline_plot([], tmp_path / "empty.png"))


def test_comparison_plot_several_panels(tmp_path):
    panels = {
        "return": {"ppo": [-0.1, -0.12], "ddp": [-0.2, -0.18]},
        "time to target (s)": {"ppo": [0.2, nan], "ddp": [0.4, 0.35]},
        "bytes per step (B)": {"ppo": [4e4, 4e4], "ddp": [1e5, 1e5]},
    }
    _assert_png(comparison_plot(panels, None, tmp_path / "panels.png"))
    with pytest.raises(ValueError, match="empty"):
        comparison_plot({"return": {}}, None, tmp_path / "x.png")


def test_loss_curves_plot_with_target(tmp_path):
    runs = {"ppo": [_rows()[:7], _rows()[7:]], "ddp": [_rows()]}
    _assert_png(loss_curves_plot(runs, tmp_path / "loss.png", target_loss=0.3))


def test_timeline_all_seeds_target_and_bandwidth_from_episode_rows():
    """Rows exactly as ``rollout`` records them, from real ranks: every panel has data."""
    import gymnasium as gym

    import commgym.env  # noqa: F401 - registers the env
    from commgym.agents import make_agent
    from commgym.agents.rollout import rollout
    from commgym.env.measure import effective_bandwidth_gbps

    env = gym.make(
        "commgym/AllReduce-v1", workload="mlp-digits", world_size=2, steps_per_decision=2,
        time_budget_s=0.3, max_decisions=3,
    )  # fmt: skip
    try:
        agent = make_agent("static:ddp-default", env.unwrapped)
        runs = {f"seed {s}": rollout(env, agent, s, target_loss=0.2).rows for s in (1, 2)}
    finally:
        env.close()
    fig = action_timeline_figure(runs, "ddp", target_loss=0.2)
    ax_cfg, ax_loss, ax_bw = fig.axes[:3]
    for seed_index, rows in enumerate(runs.values()):
        bw = np.asarray(ax_bw.lines[seed_index].get_ydata(), dtype=float)
        expected = [effective_bandwidth_gbps(r["bytes_total"], r["comm_s"]) for r in rows]
        assert len(bw) == len(rows) >= 1 and np.isfinite(bw).all() and (bw > 0).all()
        np.testing.assert_allclose(bw, expected)
        loss = np.asarray(ax_loss.lines[seed_index].get_ydata(), dtype=float)
        np.testing.assert_allclose(loss, [r["eval_loss"] for r in rows])
    # every seed is drawn, and the target is a horizontal line at 0.2
    assert len(ax_cfg.lines) >= 2
    target = [ln for ln in ax_loss.lines if ln.get_label() == "target 0.2"]
    assert len(target) == 1 and set(target[0].get_ydata()) == {0.2}
