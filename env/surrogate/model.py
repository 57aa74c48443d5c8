"""The learned surrogate model: prior times a learned correction, plus calibrated noise."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from commgym.env.spaces import (
    ActionMenu,
)
from commgym.env.surrogate.prior import AlphaBeta, _summable
from commgym.env.surrogate.record import _streak

#: Version of the saved model layout (:meth:`SurrogateModel.save`); others are refused.
MODEL_VERSION = 2

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

    def _prior_s(self, flat: np.ndarray) -> np.ndarray:
        """Prior iteration time of each flat action: compute + amortised collective."""
        out = np.empty(len(flat))
        for i, k in enumerate(flat):
            c, _, h = np.unravel_index(int(k), tuple(int(n) for n in self.menu.nvec))
            spec = self.menu.compression[c]
            n = self.bytes_table[int(k)]
            comm = (
                self.alpha_beta.allreduce_s(n, self.world_size)
                if _summable(spec)
                else self.alpha_beta.allgather_s(n * self.world_size, self.world_size)
            )
            out[i] = self.compute_s + comm / self.menu.sync_period[h]
        return out

    def _features(
        self, flat: np.ndarray, log_loss: np.ndarray, streak: np.ndarray | int = 1
    ) -> np.ndarray:
        nvec = tuple(int(n) for n in self.menu.nvec)
        c, b, h = np.unravel_index(flat.astype(np.int64), nvec)
        onehot = np.eye(nvec[0])[c]
        bucket = np.log2(np.asarray(self.menu.bucket_mb)[b])
        period = np.asarray(self.menu.sync_period, dtype=np.float64)[h]
        prior = np.log(self._prior_s(flat))
        wl = np.tile([float(self.world_size), math.log10(max(self.num_params, 1))], (len(flat), 1))
        held = np.minimum(
            np.broadcast_to(np.asarray(streak, dtype=np.float64), flat.shape), MAX_STREAK
        )
        return np.column_stack([onehot, bucket, period, prior, log_loss, held, wl])

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
        from sklearn.ensemble import HistGradientBoostingRegressor
        from sklearn.model_selection import KFold

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
        x = self._features(flat, np.log(np.maximum(prev, 1e-8)), _streak(df))
        y = self._targets(df, self._prior_s(flat))
        self.regressors = []
        oof = np.zeros_like(y)
        n_folds = min(folds, len(df))
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
        resid = y - oof
        self.residual_std = dict(zip(TARGETS, resid.std(axis=0).tolist(), strict=True))
        lo = np.log(max(float(np.nanmin(prev)) * 0.25, 1e-4))
        hi = np.log(float(np.nanmax(prev)) * 1.5)
        self.loss_edges = np.linspace(lo, hi, self.loss_bins + 1)
        self._fit_noise(resid, acts[ok][:, 2], np.log(np.maximum(prev, 1e-8)), nvec[2])
        self._build_table()
        self.fitted = True
        return self

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

    def _build_table(self) -> None:
        centers = 0.5 * (self.loss_edges[1:] + self.loss_edges[:-1])
        flat = np.tile(np.arange(self.menu.size), len(centers))
        ll = np.repeat(centers, self.menu.size)
        tables = []
        for held in range(1, MAX_STREAK + 1):
            x = self._features(flat, ll, held)
            pred = np.column_stack([r.predict(x) for r in self.regressors])
            tables.append(pred.reshape(len(centers), self.menu.size, len(TARGETS)))
        #: ``table[held - 1, loss bucket, flat action, target]``
        self.table = np.stack(tables)
        self.prior_table = self._prior_s(np.arange(self.menu.size))

    def predict_step_time(self, df: Any) -> np.ndarray:
        """Noise-free (median) step-time prediction for recorded transitions, seconds."""
        nvec = tuple(int(n) for n in self.menu.nvec)
        acts = df[["a_compression", "a_bucket", "a_period"]].to_numpy(np.int64)
        flat = np.ravel_multi_index(acts.T, nvec)
        prev = df["prev_eval_loss"].to_numpy(float)
        x = self._features(flat, np.log(np.maximum(prev, 1e-8)), _streak(df))
        return self._prior_s(flat) * np.exp(self.regressors[0].predict(x))

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
    constant) of all transitions of the same configuration *in ``df`` itself*. No model
    that sees only the configuration can do better on ``df``: the figure is the
    run-to-run noise of the measurement, the floor for :func:`step_time_mape`.
    """
    df = df[df["step_time_s"].notna()]
    err = []
    for _, g in df.groupby("config"):
        t = np.sort(g["step_time_s"].to_numpy(float))
        w = np.cumsum(1.0 / t)
        best = t[int(np.searchsorted(w, w[-1] / 2))]
        err.extend(np.abs(best - t) / t)
    return float(np.mean(err) * 100)
