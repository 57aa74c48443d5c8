"""The learned surrogate model: prior times a learned correction, plus calibrated noise."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from commgym.env.net.plan import UNSHAPED_LINK_GBPS
from commgym.env.spaces import (
    ActionMenu,
)
from commgym.env.surrogate.prior import AlphaBeta
from commgym.env.surrogate.record import held_decisions, link_rates

#: Version of the saved model layout (:meth:`SurrogateModel.save`); others are refused.
#: 3: the configured link rate is an input (prior wire term and ``log(rate)`` feature).
#: 4: recorded on AllReduce-v1 (probe fields in the measurement, parameter-only consensus).
MODEL_VERSION = 4

#: Decisions a configuration has been held are a feature up to this many (error feedback
#: residuals, PowerSGD's warm start and momentum restart at every switch).
MAX_STREAK = 4

#: What the learned correction predicts (one regressor each).
TARGETS = (
    "log_step_ratio",  # log(step_time_s / prior step time)
    "log_train_ratio",  # log(train_time_s / (steps * prior step time))
    "log_bytes",  # log(1 + bytes_per_step)
    "loss_decrease",  # log(prev eval loss) - log(eval loss)
    "log_train_loss_ratio",  # log(train_loss / prev eval loss)
    "log10_grad_norm",
    "comm_wait_frac",  # comm_wait_s / step_time_s
    "compress_frac",  # compress_s / step_time_s
    "comm_frac",  # comm_s / train_time_s
    "compression_error",  # 0 when not measured
    "eval_acc",
)

#: Columns of :data:`TARGETS` whose noise is drawn from the per-sync-period pool; the
#: others (learning progress) from the pool of the current held-out-loss bucket.
TIMING = (0, 1, 2, 6, 7, 8)


# -- learned model --------------------------------------------------------------------
class SurrogateModel:
    """Prior (alpha-beta + measured compute) times a learned correction, plus noise.

    Fit with :meth:`fit` on recorded transitions; save/load one joblib file.

    The configured link rate ``R`` (Gbit/s, the transitions' ``link_rate_gbps``;
    :data:`~commgym.env.net.UNSHAPED_LINK_GBPS` for unshaped links) enters
    twice: the prior's per-byte cost is ``beta + 8 / R`` (:class:`AlphaBeta`), so
    communication time scales with ``1 / R`` on rates never recorded, and the learned
    correction sees ``log(R)`` (what the prior misses: overlap with backward, the token
    bucket's burst, the host's share). Predictions for a rate come from
    :meth:`table_for`, built once per rate and cached.

    Args:
        menu: the action menu the data was recorded with.
        alpha_beta: the fitted prior (default: zero communication cost, i.e. the learned
            correction models communication alone).
        loss_bins: held-out-loss buckets of the precomputed prediction table.
        max_iter: boosting iterations per regressor.
    """

    def __init__(
        self,
        menu: ActionMenu | None = None,
        alpha_beta: AlphaBeta | None = None,
        loss_bins: int = 64,
        max_iter: int = 80,
    ) -> None:
        self.menu = menu or ActionMenu()
        self.alpha_beta = alpha_beta or AlphaBeta()
        self.loss_bins = int(loss_bins)
        self.max_iter = int(max_iter)
        self.fitted = False

    # features ---------------------------------------------------------------------
    def _action_table(self) -> np.ndarray:
        nvec = tuple(int(n) for n in self.menu.nvec)
        return np.array(list(np.ndindex(*nvec)), dtype=np.int64)

    def _comm_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """Per flat action: host collective seconds and wire seconds at 1 byte/s.

        The collective (all-reduce or all-gather) is the one each compressor declares
        (:meth:`AlphaBeta.collective_s`); its wire term is linear in ``8 / R``, so it is
        evaluated once at 8 bit/s (one byte per second) and scaled per rate.
        """
        nvec = tuple(int(n) for n in self.menu.nvec)
        host = np.empty(self.menu.size)
        wire = np.empty(self.menu.size)
        unit = AlphaBeta()
        for k in range(self.menu.size):
            c, _, _ = np.unravel_index(k, nvec)
            spec, n = self.menu.compression[c], float(self.bytes_table[k])
            host[k] = self.alpha_beta.collective_s(spec, n, self.world_size)
            wire[k] = unit.collective_s(spec, n, self.world_size, rate_bit_s=8.0)
        return host, wire

    def _prior_s(
        self, flat: np.ndarray, rate_gbps: np.ndarray | float = UNSHAPED_LINK_GBPS
    ) -> np.ndarray:
        """Prior iteration time of each flat action at link rate ``rate_gbps`` (Gbit/s).

        ``compute_s + (host + wire_per_byte_s * 8 / R) / sync_period``, seconds; no wire
        term at :data:`~commgym.env.net.UNSHAPED_LINK_GBPS`.
        """
        host, wire = self._comm_terms()
        flat = np.asarray(flat, dtype=np.int64)
        rate = np.broadcast_to(np.asarray(rate_gbps, dtype=np.float64), flat.shape)
        h = np.unravel_index(flat, tuple(int(n) for n in self.menu.nvec))[2]
        period = np.asarray(self.menu.sync_period, dtype=np.float64)[h]
        # the unshaped sentinel has no wire term (the host's beta is the whole cost)
        per_byte_s = np.where(rate >= UNSHAPED_LINK_GBPS, 0.0, 8.0 / (rate * 1e9))
        comm = host[flat] + wire[flat] * per_byte_s
        return self.compute_s + comm / period

    def _features(
        self,
        flat: np.ndarray,
        log_loss: np.ndarray,
        streak: np.ndarray | int = 1,
        rate_gbps: np.ndarray | float = UNSHAPED_LINK_GBPS,
    ) -> np.ndarray:
        nvec = tuple(int(n) for n in self.menu.nvec)
        c, b, h = np.unravel_index(flat.astype(np.int64), nvec)
        onehot = np.eye(nvec[0])[c]
        bucket = np.log2(np.asarray(self.menu.bucket_mb)[b])
        period = np.asarray(self.menu.sync_period, dtype=np.float64)[h]
        prior = np.log(self._prior_s(flat, rate_gbps))
        wl = np.tile([float(self.world_size), math.log10(max(self.num_params, 1))], (len(flat), 1))
        held = np.minimum(
            np.broadcast_to(np.asarray(streak, dtype=np.float64), flat.shape), MAX_STREAK
        )
        log_rate = np.log(np.broadcast_to(np.asarray(rate_gbps, dtype=np.float64), flat.shape))
        return np.column_stack([onehot, bucket, period, prior, log_loss, held, log_rate, wl])

    # fitting ----------------------------------------------------------------------
    def _targets(self, df: Any, prior: np.ndarray) -> np.ndarray:
        st = df["step_time_s"].to_numpy(float)
        tt = df["train_time_s"].to_numpy(float)
        steps = df["steps"].to_numpy(float)
        prev = df["prev_eval_loss"].to_numpy(float)
        err = df["compression_error"].astype(float).fillna(0.0).to_numpy()
        tiny = 1e-9
        cols = [
            np.log(np.maximum(st, tiny) / prior),
            np.log(np.maximum(tt, tiny) / (steps * prior)),
            np.log1p(df["bytes_per_step"].to_numpy(float)),
            np.log(np.maximum(prev, 1e-8))
            - np.log(np.maximum(df["eval_loss"].to_numpy(float), 1e-8)),
            np.log(np.maximum(df["train_loss"].to_numpy(float), 1e-8) / np.maximum(prev, 1e-8)),
            np.log10(np.maximum(df["grad_norm"].to_numpy(float), 1e-20)),
            np.clip(df["comm_wait_s"].to_numpy(float) / np.maximum(st, tiny), 0, 5),
            np.clip(df["compress_s"].to_numpy(float) / np.maximum(st, tiny), 0, 5),
            np.clip(df["comm_s"].to_numpy(float) / np.maximum(tt, tiny), 0, 5),
            err,
            df["eval_acc"].to_numpy(float),
        ]  # fmt: skip
        return np.column_stack(cols)

    def fit(self, df: Any, *, folds: int = 3, seed: int = 0) -> SurrogateModel:
        """Fit the prior's constants, the correction regressors and the noise pools.

        Args:
            df: transitions (:func:`read_transitions`); rows without measurements
                (failures) and diverged rows are dropped for regression (divergence
                frequency is kept per action).
            folds: folds of the out-of-fold residuals that calibrate the noise.
            seed: seed of the fold split.

        Returns:
            ``self``.

        Raises:
            ValueError: no usable rows, or actions outside the menu.
        """
        df = df[df["step_time_s"].notna()].copy()
        if df.empty:
            raise ValueError("no measured transitions to fit")
        nvec = tuple(int(n) for n in self.menu.nvec)
        acts = df[["a_compression", "a_bucket", "a_period"]].to_numpy(np.int64)
        if (acts < 0).any() or (acts >= np.asarray(nvec)).any():
            raise ValueError(f"transitions hold actions outside the menu {self.menu.to_dict()}")
        flat_all = np.ravel_multi_index(acts.T, nvec)
        div = df["nonfinite"].astype(bool).to_numpy() | df["diverged"].astype(bool).to_numpy()
        counts = np.bincount(flat_all, minlength=self.menu.size)
        self.p_diverge = np.bincount(flat_all[div], minlength=self.menu.size) / np.maximum(
            counts, 1
        )
        ok = ~div & np.isfinite(df["eval_loss"].to_numpy(float))
        df, flat = df[ok], flat_all[ok]
        self.world_size = int(df["world_size"].iloc[0])
        self.num_params = int(df["num_params"].iloc[0])
        self.workload = str(df["workload"].iloc[0])
        self.steps_per_decision = int(df["steps"].iloc[0])
        self.samples = int(np.median(df["samples"].to_numpy(float)))
        self.compute_s = float(np.median(df["compute_s"].to_numpy(float)))
        # bytes are deterministic per configuration: a table (global median as fallback)
        bpts = df["bytes_per_step"].to_numpy(float)
        self.bytes_table = np.full(self.menu.size, float(np.median(bpts)))
        for k in np.unique(flat):
            self.bytes_table[k] = float(np.median(bpts[flat == k]))
        first = df[df["decision"] == 1]["prev_eval_loss"].to_numpy(float)
        self.initial_losses = first if len(first) else df["prev_eval_loss"].to_numpy(float)[:1]
        prev = df["prev_eval_loss"].to_numpy(float)
        rates = link_rates(df)
        #: configured link rates of the data, Gbit/s (the correction's fitted range)
        self.link_rates_gbps = tuple(float(r) for r in np.unique(rates))
        #: flat actions with at least one usable transition
        self.seen_actions = frozenset(int(k) for k in np.unique(flat))
        x = self._features(flat, np.log(np.maximum(prev, 1e-8)), held_decisions(df), rates)
        y = self._targets(df, self._prior_s(flat, rates))
        self.regressors = []
        oof = np.zeros_like(y)
        n_folds = min(folds, len(df))
        # one OpenMP thread for these small fits (hundreds of rows): its workers spin while
        # they wait, and beside other jobs on a 2-core machine that made `commgym train`'s
        # fit take 137 s instead of 4.7 s (a newcomer's run, load ~3); measured on the same
        # 400 transitions under load ~2: 3.2 s with one thread against 5.5-6.4 s without
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="openmp"):
            self._fit_targets(x, y, n_folds, seed, oof)
        resid = y - oof
        self.residual_std = dict(zip(TARGETS, resid.std(axis=0).tolist(), strict=True))
        lo = np.log(max(float(np.nanmin(prev)) * 0.25, 1e-4))
        hi = np.log(float(np.nanmax(prev)) * 1.5)
        self.loss_edges = np.linspace(lo, hi, self.loss_bins + 1)
        self._fit_noise(resid, acts[ok][:, 2], np.log(np.maximum(prev, 1e-8)), nvec[2])
        self._tables: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self.fitted = True
        for r in self.link_rates_gbps:
            self.table_for(r)
        return self

    def _fit_targets(
        self, x: np.ndarray, y: np.ndarray, n_folds: int, seed: int, oof: np.ndarray
    ) -> None:
        """A regressor per target into :attr:`regressors`, out-of-fold predictions into ``oof``."""
        from sklearn.ensemble import HistGradientBoostingRegressor
        from sklearn.model_selection import KFold

        for j, name in enumerate(TARGETS):
            # timing targets are heavy-tailed: fit a median, not a mean
            loss = "absolute_error" if name.startswith("log_") else "squared_error"
            # step time: the 1/t-weighted median of t is the MAPE-optimal point
            # prediction (the log is monotone, so weighting the log target is the same)
            w = np.exp(-y[:, j]) if j == 0 else None

            def make(loss: str = loss) -> Any:
                return HistGradientBoostingRegressor(
                    loss=loss, max_iter=self.max_iter, learning_rate=0.1, max_leaf_nodes=7,
                    min_samples_leaf=min(20, max(len(x) // 4, 2)), random_state=seed,
                )  # fmt: skip

            self.regressors.append(make().fit(x, y[:, j], sample_weight=w))
            if n_folds >= 2:
                for tr, te in KFold(n_folds, shuffle=True, random_state=seed).split(x):
                    wt = None if w is None else w[tr]
                    oof[te, j] = make().fit(x[tr], y[tr, j], sample_weight=wt).predict(x[te])
            else:
                oof[:, j] = self.regressors[-1].predict(x)

    def _fit_noise(
        self, resid: np.ndarray, period_idx: np.ndarray, log_loss: np.ndarray, n_periods: int
    ) -> None:
        """Noise pools: out-of-fold residual rows, split by what the noise depends on.

        Timing residuals (columns :data:`TIMING`) are pooled per sync period (local SGD
        makes per-iteration times bimodal). Learning residuals are heteroscedastic in the
        training phase (a log-loss step of 0.3 is typical at the start and an outlier near
        convergence), so each held-out-loss bucket of the table gets the rows whose
        previous held-out loss is nearest to the bucket centre (at least 20 rows or 10 %).
        """
        self.residuals = [
            resid[period_idx == h] if (period_idx == h).sum() >= 5 else resid
            for h in range(n_periods)
        ]
        centers = 0.5 * (self.loss_edges[1:] + self.loss_edges[:-1])
        m = min(len(resid), max(20, len(resid) // 10))
        order = np.argsort(np.abs(log_loss[None, :] - centers[:, None]), axis=1)[:, :m]
        self.learning_residuals = [resid[idx] for idx in order]

    def table_for(self, rate_gbps: float) -> tuple[np.ndarray, np.ndarray]:
        """Precomputed predictions at one configured link rate (built once, cached).

        Args:
            rate_gbps: configured link rate, Gbit/s (> 0; ``UNSHAPED_LINK_GBPS`` for an
                unshaped link).

        Returns:
            ``(table, prior)``: ``table[held - 1, loss bucket, flat action, target]``
            (float64, shape ``(MAX_STREAK, loss_bins, menu.size, len(TARGETS))``) and the
            prior iteration time per flat action (seconds, shape ``(menu.size,)``).

        Raises:
            ValueError: the model is not fitted, or the rate is not positive.
        """
        if not self.fitted:
            raise ValueError("fit the surrogate model before building its tables")
        rate = float(rate_gbps)
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"link rate must be a finite number of Gbit/s > 0, got {rate_gbps!r}")
        if rate not in self._tables:
            centers = 0.5 * (self.loss_edges[1:] + self.loss_edges[:-1])
            flat = np.tile(np.arange(self.menu.size), len(centers))
            ll = np.repeat(centers, self.menu.size)
            tables = []
            for held in range(1, MAX_STREAK + 1):
                x = self._features(flat, ll, held, rate)
                pred = np.column_stack([r.predict(x) for r in self.regressors])
                tables.append(pred.reshape(len(centers), self.menu.size, len(TARGETS)))
            prior = self._prior_s(np.arange(self.menu.size), rate)
            self._tables[rate] = (np.stack(tables), prior)
        return self._tables[rate]

    def predict_step_time(self, df: Any) -> np.ndarray:
        """Noise-free (median) step-time prediction for recorded transitions, seconds.

        Each row is predicted at its own configured link rate (``link_rate_gbps``).
        """
        nvec = tuple(int(n) for n in self.menu.nvec)
        acts = df[["a_compression", "a_bucket", "a_period"]].to_numpy(np.int64)
        flat = np.ravel_multi_index(acts.T, nvec)
        prev = df["prev_eval_loss"].to_numpy(float)
        rates = link_rates(df)
        x = self._features(flat, np.log(np.maximum(prev, 1e-8)), held_decisions(df), rates)
        return self._prior_s(flat, rates) * np.exp(self.regressors[0].predict(x))

    # persistence ------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the whole model to one joblib file. Returns the path."""
        import joblib

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump({"format": "commgym-surrogate", "version": MODEL_VERSION, "model": self}, p)
        return p

    @staticmethod
    def load(path: str | os.PathLike[str]) -> SurrogateModel:
        """Load a model saved by :meth:`save` (a pickle: only load trusted files).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ValueError: the file is not a commgym surrogate model (or not a joblib file
                at all), or one of another layout version (refit it).
        """
        import joblib

        try:
            data = joblib.load(Path(path))
        except FileNotFoundError:
            raise
        except Exception as exc:  # not a pickle/joblib file at all
            raise ValueError(
                f"{path} is not a commgym surrogate model file ({type(exc).__name__}: {exc})"
            ) from None
        if not isinstance(data, dict) or data.get("format") != "commgym-surrogate":
            raise ValueError(f"{path} is not a commgym surrogate model file")
        if data.get("version") != MODEL_VERSION:
            raise ValueError(
                f"{path} is a version {data.get('version')} surrogate model; this commgym "
                f"reads version {MODEL_VERSION}: refit it with `commgym fit-surrogate`"
            )
        return data["model"]


def step_time_mape(model: SurrogateModel, df: Any) -> float:
    """Mean absolute percentage error of step-time predictions on transitions, in %."""
    df = df[df["step_time_s"].notna()]
    y = df["step_time_s"].to_numpy(float)
    return float(np.mean(np.abs(model.predict_step_time(df) - y) / y) * 100)


def step_time_noise_floor(df: Any) -> float:
    """MAPE, in %, of an oracle that knows each configuration's step-time distribution.

    Predicts every transition's step time by the 1/t-weighted median (the MAPE-optimal
    constant) of all transitions of the same configuration on the same configured link
    rate *in ``df`` itself*. No model that sees only the configuration and the rate can
    do better on ``df``: the figure is the run-to-run noise of the measurement, the floor
    for :func:`step_time_mape`.
    """
    df = df[df["step_time_s"].notna()]
    err = []
    keys = [df["config"].astype(str).to_numpy(), link_rates(df)]
    for _, g in df.groupby(keys):
        t = np.sort(g["step_time_s"].to_numpy(float))
        w = np.cumsum(1.0 / t)
        best = t[int(np.searchsorted(w, w[-1] / 2))]
        err.extend(np.abs(best - t) / t)
    return float(np.mean(err) * 100)


def holdout_report(model: SurrogateModel, df: Any) -> dict[str, Any]:
    """Step-time accuracy and configuration ranking of ``model`` on held-out transitions.

    Configurations are ranked by **mean step time per configuration** (measured vs
    predicted over the same rows), not by time to target: the recorded exploration holds
    each configuration for a few decisions inside mixed episodes, so no configuration's
    time to target is measured on its own. The ranking is computed within each configured
    link rate (a controller compares configurations on the link it has) and averaged,
    weighted by the number of configurations per rate.

    Args:
        model: a fitted :class:`SurrogateModel`.
        df: held-out transitions (:func:`~commgym.env.surrogate.read_transitions`); rows
            without a measured step time (failures) are dropped.

    Returns:
        ``{"rows", "configs", "mape_pct", "p90_ape_pct", "kendall_tau",
        "noise_floor_pct", "unseen_rows", "unseen_mape_pct", "ranked_by", "per_rate"}``;
        ``per_rate`` maps each configured rate (Gbit/s) to ``{"rows", "configs",
        "mape_pct", "p90_ape_pct", "kendall_tau", "fitted_rate"}``. ``unseen_*`` cover the
        rows whose configuration had no usable transition in the fit data (NaN if none);
        ``kendall_tau`` is NaN where fewer than two configurations were measured.
        Percentages in %, taus in ``[-1, 1]`` (:func:`scipy.stats.kendalltau`, tau-b).

    Raises:
        ValueError: no held-out row has a measured step time.
    """
    from scipy.stats import kendalltau

    df = df[df["step_time_s"].notna()]
    if df.empty:
        raise ValueError("no held-out transitions with a measured step time")
    y = df["step_time_s"].to_numpy(float)
    pred = model.predict_step_time(df)
    ape = np.abs(pred - y) / y * 100
    rates = link_rates(df)
    cfg = df["config"].astype(str).to_numpy()
    nvec = tuple(int(n) for n in model.menu.nvec)
    flat = np.ravel_multi_index(
        df[["a_compression", "a_bucket", "a_period"]].to_numpy(np.int64).T, nvec
    )
    unseen = ~np.isin(flat, sorted(model.seen_actions))

    def tau(mask: np.ndarray) -> tuple[float, int]:
        names = np.unique(cfg[mask])
        if len(names) < 2:
            return math.nan, len(names)
        meas = [y[mask & (cfg == n)].mean() for n in names]
        guess = [pred[mask & (cfg == n)].mean() for n in names]
        return float(kendalltau(meas, guess).statistic), len(names)

    per_rate: dict[float, dict[str, Any]] = {}
    for r in np.unique(rates):
        m = rates == r
        t, n = tau(m)
        per_rate[float(r)] = {
            "rows": int(m.sum()), "configs": n, "mape_pct": float(ape[m].mean()),
            "p90_ape_pct": float(np.percentile(ape[m], 90)), "kendall_tau": t,
            "fitted_rate": bool(np.isclose(r, model.link_rates_gbps).any()),
        }  # fmt: skip
    weights = [v["configs"] for v in per_rate.values() if math.isfinite(v["kendall_tau"])]
    taus = [v["kendall_tau"] for v in per_rate.values() if math.isfinite(v["kendall_tau"])]
    return {
        "rows": len(df),
        "configs": len(np.unique(cfg)),
        "mape_pct": float(ape.mean()),
        "p90_ape_pct": float(np.percentile(ape, 90)),
        "kendall_tau": float(np.average(taus, weights=weights)) if taus else math.nan,
        "noise_floor_pct": step_time_noise_floor(df),
        "unseen_rows": int(unseen.sum()),
        "unseen_mape_pct": float(ape[unseen].mean()) if unseen.any() else math.nan,
        "ranked_by": "mean step time per configuration, within each link rate",
        "per_rate": per_rate,
    }


def format_holdout_report(report: dict[str, Any]) -> str:
    """Human-readable lines of :func:`holdout_report` (CLI and benchmark output)."""
    lines = [
        f"held-out step time: MAPE {report['mape_pct']:.1f}%, p90 abs. error "
        f"{report['p90_ape_pct']:.1f}% over {report['rows']} decisions, {report['configs']} "
        f"configurations (noise floor {report['noise_floor_pct']:.1f}%); Kendall tau "
        f"{report['kendall_tau']:.2f} ({report['ranked_by']})",
        f"  configurations absent from the fit data: {report['unseen_rows']} decisions, "
        f"MAPE {report['unseen_mape_pct']:.1f}%",
    ]
    for rate, r in report["per_rate"].items():
        label = "unshaped" if rate >= UNSHAPED_LINK_GBPS else f"{rate:g} Gbit/s"
        seen = "fitted rate" if r["fitted_rate"] else "held-out rate"
        lines.append(
            f"  {label} ({seen}): MAPE {r['mape_pct']:.1f}%, p90 {r['p90_ape_pct']:.1f}%, "
            f"tau {r['kendall_tau']:.2f} over {r['configs']} configurations, {r['rows']} decisions"
        )
    return "\n".join(lines)
