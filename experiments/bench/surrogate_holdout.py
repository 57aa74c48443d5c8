"""Held-out accuracy of the network-aware surrogate: configurations, seeds and link rates.

Fits :class:`~commgym.env.surrogate.SurrogateModel` on part of real recorded transitions
and reports :func:`~commgym.env.surrogate.holdout_report` (step-time MAPE, p90 absolute
percentage error, Kendall tau of configurations) on what it did not see:

* **held-out rates**: every decision recorded on a configured link rate in
  ``holdout_rates_gbps`` (the fit never sees that rate: the prior's ``8 / R`` term and
  the correction's nearest fitted rate carry the prediction);
* **held-out seeds**: every ``holdout_every``-th episode on the fitted rates;
* **held-out configurations**: a seeded ``holdout_configs_frac`` of the menu entries is
  removed from the fit data; their rows in both held-out sets are reported apart
  (``unseen``);
* **held-out files**: transitions recorded in another run (``holdout_data``).

Run: ``commgym bench surrogate-holdout --data T.csv --bench T.bench.json --config
SCENARIO.yaml --holdout-rate 0.25 --holdout-every 4 --holdout-configs 0.2``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

__all__ = ["run_surrogate_holdout_benchmark", "split_holdout"]

console = Console()


def split_holdout(
    df: Any,
    *,
    holdout_rates_gbps: Sequence[float] = (),
    holdout_every: int = 0,
    holdout_configs_frac: float = 0.0,
    seed: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """Split transitions into a fit set and held-out sets.

    Args:
        df: transitions (:func:`~commgym.env.surrogate.read_transitions`).
        holdout_rates_gbps: configured link rates (Gbit/s) held out entirely.
        holdout_every: hold out episodes ``k`` with ``k % holdout_every ==
            holdout_every - 1`` on the other rates (0: none).
        holdout_configs_frac: fraction of the recorded configurations removed from the
            fit set (chosen with ``seed``), in ``[0, 1)``.
        seed: seed of the configuration choice.

    Returns:
        ``(fit rows, {"held-out rates": rows, "held-out seeds": rows})`` (empty sets left
        out).

    Raises:
        ValueError: ``holdout_every`` < 0, a fraction outside ``[0, 1)``, or nothing
            left to fit.
    """
    from commgym.env.surrogate.record import link_rates

    if holdout_every < 0:
        raise ValueError(f"holdout_every must be >= 0, got {holdout_every}")
    if not 0.0 <= holdout_configs_frac < 1.0:
        raise ValueError(f"holdout_configs_frac must be in [0, 1), got {holdout_configs_frac}")
    rates = link_rates(df)
    by_rate = np.zeros(len(df), dtype=bool)
    for r in holdout_rates_gbps:
        by_rate |= np.isclose(rates, float(r))
    episode = df["episode"].to_numpy(np.int64)
    by_seed = ~by_rate & (
        (episode % holdout_every == holdout_every - 1) if holdout_every else False
    )
    configs = np.unique(df["config"].astype(str))
    rng = np.random.default_rng(seed)
    dropped = rng.choice(configs, round(holdout_configs_frac * len(configs)), replace=False)
    fit = df[~by_rate & ~by_seed & ~df["config"].astype(str).isin(dropped).to_numpy()]
    if fit.empty:
        raise ValueError("no transitions left to fit after the hold-outs")
    held = {"held-out rates": df[by_rate], "held-out seeds": df[by_seed]}
    return fit, {k: v for k, v in held.items() if len(v)}


def run_surrogate_holdout_benchmark(
    data: Sequence[str | Path],
    *,
    bench: str | Path | None = None,
    menu: Any = None,
    holdout_rates_gbps: Sequence[float] = (),
    holdout_every: int = 0,
    holdout_configs_frac: float = 0.0,
    holdout_data: Sequence[str | Path] = (),
    seed: int = 0,
    steps: int = 20000,
) -> dict[str, Any]:
    """Fit on the non-held-out part of ``data``; report every held-out set; time the env.

    Args:
        data: transition files (CSV/Parquet) recorded by ``commgym collect``.
        bench: the collection's ``.bench.json`` (alpha-beta prior samples).
        menu: the action menu the data were recorded with (default menu when ``None``).
        holdout_rates_gbps: link rates held out entirely (:func:`split_holdout`).
        holdout_every: every this many episodes held out (:func:`split_holdout`).
        holdout_configs_frac: fraction of configurations held out (:func:`split_holdout`).
        seed: seed of the configuration choice.
        holdout_data: transition files of other runs, reported as they are.
        steps: ``commgym/Surrogate-v1`` steps timed (on the fitted rates' profiles).

    Returns:
        ``{"fit_rows", "fit_s", "steps_per_s", "reports": {name: holdout_report}}``.
    """
    from commgym.env.spaces import ActionMenu
    from commgym.env.surrogate import (
        AlphaBeta,
        SurrogateModel,
        format_holdout_report,
        holdout_report,
        read_transitions,
    )
    from commgym.experiments.bench.surrogate import time_surrogate

    fit, held = split_holdout(
        read_transitions(*data), holdout_rates_gbps=holdout_rates_gbps,
        holdout_every=holdout_every, holdout_configs_frac=holdout_configs_frac, seed=seed,
    )  # fmt: skip
    for p in holdout_data:
        held[f"held-out file {Path(p).name}"] = read_transitions(p)
    ab = None
    if bench is not None:
        ab = AlphaBeta.fit([tuple(s) for s in json.loads(Path(bench).read_text())])
    t0 = time.perf_counter()
    model = SurrogateModel(ActionMenu.from_any(menu), alpha_beta=ab).fit(fit)
    fit_s = time.perf_counter() - t0
    console.print(
        f"fitted on {len(fit)} decisions at {', '.join(f'{r:g}' for r in model.link_rates_gbps)}"
        f" Gbit/s in {fit_s:.1f} s; prior {model.alpha_beta}"
    )
    reports = {}
    for name, part in held.items():
        reports[name] = holdout_report(model, part)
        console.print(f"[bold]{name}[/bold]\n{format_holdout_report(reports[name])}")
    rate, _ = time_surrogate(model, steps)
    console.print(f"commgym/Surrogate-v1: {rate:,.0f} env steps/s ({steps} steps, one core)")
    return {"fit_rows": len(fit), "fit_s": fit_s, "steps_per_s": rate, "reports": reports}
