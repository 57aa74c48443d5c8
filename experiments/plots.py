"""Report figures: agent comparison with confidence intervals, loss curves, action timelines.

The plotting functions draw on matplotlib's non-interactive ``Agg`` canvas (no display needed,
pyplot's global backend untouched), write a PNG and return its path. They tolerate NaN
values (dropped from statistics, gaps in lines) and a single seed (no interval drawn).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "action_timeline_figure",
    "action_timeline_plot",
    "comparison_plot",
    "loss_curves_plot",
    "mean_ci",
]


def _figure(**kwargs: Any) -> Any:
    """A figure drawn by the Agg canvas, outside pyplot's global state.

    Using ``Figure`` directly (not ``pyplot``) needs no display, leaves the user's
    pyplot backend alone, is safe in threads and needs no ``plt.close``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """Mean and half-width of a two-sided confidence interval over seeds.

    The interval is Student's t interval ``mean ± t_{(1+c)/2, n-1} · s / sqrt(n)``
    (``s`` the sample standard deviation) when scipy is installed, else the normal
    approximation with ``z_{(1+c)/2}`` (1.96 for 95%), which is too narrow for few seeds.

    Args:
        values: one value per seed; NaN and ±inf are ignored.
        confidence: coverage in (0, 1).

    Returns:
        ``(mean, half_width, n)`` over the finite values; ``half_width`` is NaN when
        ``n < 2``, and ``mean`` is NaN when ``n == 0``.

    Raises:
        ValueError: ``confidence`` outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    x = np.asarray([float(v) for v in values], dtype=np.float64)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, n
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    q = (1.0 + confidence) / 2.0
    try:
        from scipy import stats

        crit = float(stats.t.ppf(q, df=n - 1))
    except ImportError:
        from statistics import NormalDist

        crit = NormalDist().inv_cdf(q)
    return mean, crit * sem, n


def _interval_kind() -> str:
    import importlib.util

    return "t" if importlib.util.find_spec("scipy") is not None else "normal approx."


def _bar_panel(
    ax: Any, results: Mapping[str, Sequence[float]], metric_name: str, confidence: float
) -> None:
    """One bar per agent: mean over finite seeds, its interval, the seeds as dots."""
    names = list(results)
    stats = [mean_ci(results[n], confidence) for n in names]
    means = np.array([s[0] for s in stats])
    half = np.array([s[1] for s in stats])
    xs = np.arange(len(names))
    heights = np.where(np.isfinite(means), means, 0.0)
    bars = ax.bar(xs, heights, color="C0", alpha=0.7)
    for bar, m in zip(bars, means, strict=True):
        if not np.isfinite(m):
            bar.set_visible(False)
    ok = np.isfinite(means) & np.isfinite(half)
    if ok.any():
        ax.errorbar(
            xs[ok],
            means[ok],
            yerr=half[ok],
            fmt="none",
            ecolor="black",
            capsize=5,
            label=f"{confidence:.0%} CI ({_interval_kind()})",
        )
    rng = np.random.default_rng(0)  # fixed jitter: identical figures for identical data
    for i, name in enumerate(names):
        v = np.asarray([float(x) for x in results[name]], dtype=np.float64)
        v = v[np.isfinite(v)]
        if v.size:
            ax.scatter(i + rng.uniform(-0.15, 0.15, v.size), v, s=12, color="black", zorder=3)
    ax.set_xticks(xs)
    ax.set_xticklabels(
        [f"{n}\n(n={s[2]})" for n, s in zip(names, stats, strict=True)],
        rotation=20 if len(names) > 3 else 0,
        ha="right" if len(names) > 3 else "center",
        fontsize=8,
    )
    ax.set_ylabel(metric_name)
    ax.set_title(f"{metric_name}: mean over seeds", fontsize=10)
    if ok.any():
        ax.legend(loc="best", fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def comparison_plot(
    results: Mapping[str, Sequence[float]] | Mapping[str, Mapping[str, Sequence[float]]],
    metric_name: str | None,
    path: str | os.PathLike[str],
    *,
    confidence: float = 0.95,
) -> Path:
    """Bars per agent: mean over seeds with a 95% confidence interval and the seeds as dots.

    The interval is a t-interval (see :func:`mean_ci`); with one finite seed only the
    bar is drawn, with none the agent is labelled ``n=0`` and no bar is drawn. Seeds
    with a NaN value (e.g. a time to target that was not reached) are left out, and the
    ``n=`` under each bar says how many remained.

    Args:
        results: agent name -> one value of the metric per seed; or, for several panels
            side by side, metric name (with its unit) -> such a mapping.
        metric_name: y-axis label of the single panel (put the unit in it, e.g.
            ``"time to target (s)"``); ``None`` with the several-panel form.
        path: output PNG path (parent directories are created).
        confidence: interval coverage.

    Returns:
        The PNG path.

    Raises:
        ValueError: ``results`` (or one of its panels) is empty.
    """
    if not results:
        raise ValueError("results is empty: nothing to compare")
    first = next(iter(results.values()))
    panels: Mapping[str, Mapping[str, Sequence[float]]] = (
        results if isinstance(first, Mapping) else {str(metric_name): results}  # type: ignore[dict-item]
    )
    for name, panel in panels.items():
        if not panel:
            raise ValueError(f"panel {name!r} is empty: nothing to compare")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n_agents = max(len(p) for p in panels.values())
    width = max(4.0, 1.2 * n_agents + 2.0)
    fig = _figure(figsize=(width * len(panels), 4.5))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (name, panel) in zip(axes, panels.items(), strict=True):
        _bar_panel(ax, panel, name, confidence)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _training_time(rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, list[float]]:
    """Continuous x axis over episodes: a drop in ``train_time_s`` starts a new episode."""
    xs, boundaries = [], []
    offset, last = 0.0, -math.inf
    for i, row in enumerate(rows):
        t = _num(row.get("train_time_s"))
        if not math.isfinite(t):
            t = last if math.isfinite(last) else float(i)
        if t < last:
            offset += last
            boundaries.append(offset)
        last = t
        xs.append(offset + t)
    return np.asarray(xs, dtype=np.float64), boundaries


def _bandwidth_gbps(row: Mapping[str, Any]) -> float:
    """Effective bandwidth of one decision row, Gbit/s (the observation's definition)."""
    from commgym.env.measure import effective_bandwidth_gbps

    b, t = _num(row.get("bytes_total")), _num(row.get("comm_s"))
    return effective_bandwidth_gbps(b, t) if math.isfinite(b) and math.isfinite(t) else math.nan


def _as_runs(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, Sequence[Mapping[str, Any]]]:
    return dict(rows) if isinstance(rows, Mapping) else {"": rows}


def action_timeline_figure(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    title: str | None = None,
    target_loss: float | None = None,
) -> Any:
    """The figure of :func:`action_timeline_plot`, not yet saved (its data can be read).

    Axes ``fig.axes[0:3]``: configuration, held-out loss, effective bandwidth; each run
    is one line per panel: ``ax.lines[:n_runs]`` in run order (episode boundaries and the
    loss panel's target line come after them).
    """
    runs = _as_runs(rows)
    configs_by_run = {
        k: [str(r.get("config")) if r.get("config") is not None else "?" for r in v]
        for k, v in runs.items()
    }
    levels = list(dict.fromkeys(c for cs in configs_by_run.values() for c in cs))
    fig = _figure(figsize=(8.0, 2.0 + 0.25 * len(levels) + 4.0))
    axes = fig.subplots(
        3,
        1,
        sharex=True,
        gridspec_kw={"height_ratios": [max(1.0, 0.3 * len(levels)), 1.0, 1.0]},
    )
    ax_cfg, ax_loss, ax_bw = axes
    link_drawn = False
    episode_starts: list[tuple[float, str]] = []
    for i, (label, run) in enumerate(runs.items()):
        x, boundaries = _training_time(run)
        color = f"C{i % 10}"
        y_cfg = np.array([levels.index(c) for c in configs_by_run[label]], dtype=np.float64)
        loss = np.array([_num(r.get("eval_loss")) for r in run], dtype=np.float64)
        bw = np.array([_bandwidth_gbps(r) for r in run], dtype=np.float64)
        # runs are offset a little on the categorical axis so overlapping choices stay visible
        offset = 0.08 * (i - (len(runs) - 1) / 2) if len(runs) > 1 else 0.0
        ax_cfg.step(x, y_cfg + offset, where="post", color=color, lw=1, label=label or None)
        ax_cfg.scatter(x, y_cfg + offset, color=color, s=14, zorder=3)
        ax_loss.plot(x, loss, marker=".", color=color, label=label or None)
        ax_bw.plot(x, bw, marker=".", color=color)
        link = np.array([_num(r.get("link_rate_gbps")) for r in run], dtype=np.float64)
        if np.isfinite(link).any():  # the configured rate, where the link is emulated
            ax_bw.step(x, link, where="pre", color=color, ls="--", lw=1, alpha=0.7)
            link_drawn = True
        episode_starts.extend((b, color) for b in boundaries)
    for ax in axes:
        for b, color in episode_starts:
            ax.axvline(b, color=color, ls=":", lw=0.8)
    ax_cfg.set_yticks(range(len(levels)))
    ax_cfg.set_yticklabels(levels, fontsize=8)
    ax_cfg.set_ylim(-0.5, max(len(levels), 1) - 0.5)
    ax_cfg.set_ylabel("configuration")
    if target_loss is not None:
        ax_loss.axhline(target_loss, color="k", ls="--", lw=1, label=f"target {target_loss:g}")
    finite = np.array(
        [_num(r.get("eval_loss")) for run in runs.values() for r in run], dtype=np.float64
    )
    finite = finite[np.isfinite(finite)]
    if finite.size and (finite > 0).all():
        ax_loss.set_yscale("log")
    ax_loss.set_ylabel("eval loss (nats)")
    if len(runs) > 1 or target_loss is not None:
        ax_loss.legend(loc="best", fontsize=7)
    ax_bw.set_ylabel("effective bandwidth\n(Gbit/s)")
    if link_drawn:
        ax_bw.set_ylabel("bandwidth (Gbit/s)\nline: effective\ndashed: link rate")
    ax_bw.set_xlabel("training time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def action_timeline_plot(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | os.PathLike[str],
    title: str | None = None,
    target_loss: float | None = None,
) -> Path:
    """Which configuration was chosen when, against held-out loss and bandwidth.

    Three stacked panels sharing the x axis (training time, s; a run's episodes are laid
    end to end, with dotted lines at episode boundaries): the chosen configuration as a
    categorical step plot, ``eval_loss`` (log scale when positive) with the target as a
    dashed line, and the effective bandwidth ``bytes_total * 8 / comm_s`` in Gbit/s
    (:func:`commgym.env.measure.effective_bandwidth_gbps`, the observation's definition).
    Several runs (e.g. one per seed) are drawn over each other, one colour each.

    Args:
        rows: one dict per decision, e.g. :attr:`TrackingWrapper.rows
            <commgym.experiments.tracking.TrackingWrapper>` or ``decisions.csv`` read
            with ``csv.DictReader``; or a mapping run label (``"seed 1000"``) -> such
            rows. Keys used: ``train_time_s`` (cumulative in the episode), ``config``,
            ``eval_loss``, ``bytes_total`` and ``comm_s``; optional ``link_rate_gbps`` (the
            configured link rate of an emulated network, drawn dashed in the bandwidth
            panel). Missing or non-numeric values are NaN.
        path: output PNG path (parent directories are created).
        title: figure title.
        target_loss: held-out loss drawn as the target line (``None``: none).

    Returns:
        The PNG path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    action_timeline_figure(rows, title, target_loss).savefig(path, dpi=100)
    return path


def loss_curves_plot(
    runs: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    path: str | os.PathLike[str],
    *,
    target_loss: float | None = None,
    title: str | None = None,
) -> Path:
    """Held-out loss against training time, every seed of every agent overlaid.

    One colour per agent, one line per seed (the first labelled), the target as a dashed
    line: where the curves cross it is each agent's time to target.

    Args:
        runs: agent name -> one list of decision rows per seed (keys ``train_time_s``,
            ``eval_loss``).
        path: output PNG path (parent directories are created).
        target_loss: held-out loss drawn as the target line (``None``: none).
        title: figure title.

    Returns:
        The PNG path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = _figure(figsize=(8.0, 4.5))
    ax = fig.subplots()
    positive = True
    for i, (name, seeds) in enumerate(runs.items()):
        for j, rows in enumerate(seeds):
            x = np.array([_num(r.get("train_time_s")) for r in rows], dtype=np.float64)
            y = np.array([_num(r.get("eval_loss")) for r in rows], dtype=np.float64)
            fin = y[np.isfinite(y)]
            positive &= bool((fin > 0).all())
            ax.plot(x, y, color=f"C{i % 10}", lw=1.2, alpha=0.8, label=name if j == 0 else None)
    if target_loss is not None:
        ax.axhline(target_loss, color="k", ls="--", lw=1, label=f"target {target_loss:g}")
    if positive:
        ax.set_yscale("log")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("held-out loss (nats)")
    ax.set_title(title or "held-out loss vs training time (one line per seed)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
