"""Report figures: agent comparison with confidence intervals, and action timelines.

Both functions draw on matplotlib's non-interactive ``Agg`` canvas (no display needed,
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

__all__ = ["action_timeline_plot", "comparison_plot", "mean_ci"]


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


def comparison_plot(
    results: Mapping[str, Sequence[float]],
    metric_name: str,
    path: str | os.PathLike[str],
    *,
    confidence: float = 0.95,
) -> Path:
    """Bar per agent: mean over seeds with a 95% confidence interval and the seeds as dots.

    The interval is a t-interval (see :func:`mean_ci`); with one finite seed only the
    bar is drawn, with none the agent is labelled ``n=0`` and no bar is drawn.

    Args:
        results: agent name -> one value of the metric per seed.
        metric_name: y-axis label (put the unit in it, e.g. ``"time to target (s)"``).
        path: output PNG path (parent directories are created).
        confidence: interval coverage.

    Returns:
        The PNG path.

    Raises:
        ValueError: ``results`` is empty.
    """
    if not results:
        raise ValueError("results is empty: nothing to compare")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(results)
    stats = [mean_ci(results[n], confidence) for n in names]
    means = np.array([s[0] for s in stats])
    half = np.array([s[1] for s in stats])
    xs = np.arange(len(names))

    fig = _figure(figsize=(max(4.0, 1.2 * len(names) + 2.0), 4.0))
    ax = fig.subplots()
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
    ax.set_xticklabels([f"{n}\n(n={s[2]})" for n, s in zip(names, stats, strict=True)])
    ax.set_ylabel(metric_name)
    ax.set_title(f"{metric_name}: mean over seeds")
    if ok.any():
        ax.legend(loc="best")
    ax.grid(axis="y", alpha=0.3)
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
    """Measured bus bandwidth, Gbit/s: bytes * 8 / communication time."""
    for b_key, t_key in (("bytes_total", "comm_s"), ("bytes_per_step", "comm_wait_s")):
        b, t = _num(row.get(b_key)), _num(row.get(t_key))
        if math.isfinite(b) and math.isfinite(t) and t > 0:
            return b * 8.0 / t / 1e9
    return math.nan


def action_timeline_plot(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Which configuration was chosen when, against held-out loss and bandwidth.

    Three stacked panels sharing the x axis (training time, s; episodes are laid end to
    end, with dotted lines at episode boundaries): the chosen configuration as a
    categorical step plot, ``eval_loss`` (log scale when positive), and the measured
    bandwidth ``bytes * 8 / comm time`` in Gbit/s (``bytes_total / comm_s`` when
    present, else ``bytes_per_step / comm_wait_s``).

    Args:
        rows: one dict per decision, e.g. :attr:`TrackingWrapper.rows
            <commgym.experiments.tracking.TrackingWrapper>` or ``decisions.csv`` read
            with ``csv.DictReader``; keys used: ``train_time_s`` (cumulative in the
            episode), ``config``, ``eval_loss``, ``bytes_total``/``comm_s`` or
            ``bytes_per_step``/``comm_wait_s``. Missing or non-numeric values are NaN.
        path: output PNG path (parent directories are created).
        title: figure title.

    Returns:
        The PNG path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    x, boundaries = _training_time(rows)
    configs = [str(r.get("config")) if r.get("config") is not None else "?" for r in rows]
    levels = list(dict.fromkeys(configs))
    y_cfg = np.array([levels.index(c) for c in configs], dtype=np.float64)
    loss = np.array([_num(r.get("eval_loss")) for r in rows], dtype=np.float64)
    bw = np.array([_bandwidth_gbps(r) for r in rows], dtype=np.float64)

    fig = _figure(figsize=(8.0, 2.0 + 0.25 * len(levels) + 4.0))
    axes = fig.subplots(
        3,
        1,
        sharex=True,
        gridspec_kw={"height_ratios": [max(1.0, 0.3 * len(levels)), 1.0, 1.0]},
    )
    ax_cfg, ax_loss, ax_bw = axes
    if len(rows):
        ax_cfg.step(x, y_cfg, where="post", color="0.5", lw=1)
        colors = [f"C{levels.index(c) % 10}" for c in configs]
        ax_cfg.scatter(x, y_cfg, c=colors, s=18, zorder=3)
    ax_cfg.set_yticks(range(len(levels)))
    ax_cfg.set_yticklabels(levels, fontsize=8)
    ax_cfg.set_ylim(-0.5, max(len(levels), 1) - 0.5)
    ax_cfg.set_ylabel("configuration")

    ax_loss.plot(x, loss, marker=".", color="C3")
    finite = loss[np.isfinite(loss)]
    if finite.size and (finite > 0).all():
        ax_loss.set_yscale("log")
    ax_loss.set_ylabel("eval loss (nats)")

    ax_bw.plot(x, bw, marker=".", color="C2")
    ax_bw.set_ylabel("bandwidth (Gbit/s)")
    ax_bw.set_xlabel("training time (s)")
    for ax in axes:
        for b in boundaries:
            ax.axvline(b, color="k", ls=":", lw=0.8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
