"""``commgym/Surrogate-v0``: a fast learned model of ``commgym/AllReduce-v0``.

Real decisions cost tens of milliseconds plus process launches; RL agents need many
thousands. This module turns real decisions into a simulator:

1. :class:`TransitionRecorder` (a gymnasium wrapper reading only ``info``, the action and
   the observation) writes every real decision to CSV or Parquet.
2. :class:`AlphaBeta` is the analytical prior: the latency-bandwidth (alpha-beta) model of
   Hockney (1994) for ring all-reduce, ``2(W-1) alpha + 2(W-1)/W n beta``, and ring
   all-gather, ``(W-1) alpha + (W-1)/W n_total beta`` (Thakur, Rabenseifner & Gropp 2005),
   fitted per cluster by least squares from ``allreduce_bench`` / ``allgather_bench``
   timings (:func:`bench_collectives`).
3. :class:`SurrogateModel` adds a learned correction (scikit-learn
   ``HistGradientBoostingRegressor``) on top of ``prior = compute + comm(bytes)``: the log
   ratio of measured to prior step time, decision time, bytes per step, log-loss decrease
   and the other measured quantities, from configuration features, workload features and
   the current held-out loss (observation index 6); the step time is fitted as the
   1/t-weighted median, the point prediction that minimises MAPE. Run-to-run noise is
   calibrated by bootstrapping out-of-fold residuals: timing residual rows pooled per sync
   period, learning-progress residual rows from the transitions nearest in held-out loss
   (their spread shrinks by orders of magnitude as training converges).
4. :class:`SurrogateEnv` has the observation/action spaces, reward functions,
   time-budget truncation and divergence semantics of :class:`~commgym.env.AllReduceEnv`
   (shared code from :mod:`commgym.env.spaces`). Predictions are precomputed for every
   menu entry on a grid of held-out-loss buckets, so a step is a table look-up plus one
   pair of bootstrap draws (> 10,000 steps/s on one core).

.. warning:: Surrogate model files are joblib pickles: loading one from an untrusted
   source can execute arbitrary code. Only load files you produced yourself.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.collectives.spec import COMPRESSORS, CompressionSpec
from commgym.env.spaces import (
    OBSERVATION_FIELDS,
    REWARDS,
    ActionMenu,
    ObservationBuilder,
    decision_outcome,
)

__all__ = [
    "TARGETS",
    "AlphaBeta",
    "SurrogateEnv",
    "SurrogateModel",
    "TransitionRecorder",
    "bench_collectives",
    "read_transitions",
    "step_time_mape",
    "step_time_noise_floor",
]

#: ``info["measured"]`` keys copied into every transition row.
MEASURED_KEYS = (
    "train_time_s", "step_time_s", "iter_mean_s", "compute_s", "comm_wait_s", "compress_s",
    "comm_s", "bytes_per_step", "bytes_total", "train_loss", "eval_loss", "eval_acc",
    "eval_s", "grad_norm", "compression_error", "nonfinite", "samples", "steps",
)  # fmt: skip

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


class TransitionRecorder(gym.Wrapper):
    """Records every decision of a commgym env as one row; writes CSV or Parquet.

    A row holds the observation the decision was taken from (``obs_<field>``), the action
    (``a_compression``, ``a_bucket``, ``a_period`` and the decoded config), ``held`` (for
    how many decisions in a row this configuration has been chosen, 1 = just switched to
    it; switching restarts error feedback and PowerSGD's warm start), every measured
    statistic (``info["measured"]``), the previous held-out loss, reward, end flags and
    reason, and the workload, world size, steps per decision, time budget and network
    spec. Dynamic values come from ``info`` only; static ones from the env's ``config``.

    Args:
        env: a ``commgym/AllReduce-v0`` env (or anything with the same ``info`` shape).
        path: output file; ``.parquet`` writes Parquet (pandas + pyarrow), else CSV.
        flush_every: rewrite the file every this many decisions (0: only on close/flush).
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike[str], flush_every: int = 0) -> None:
        super().__init__(env)
        self.path = Path(path)
        self.flush_every = int(flush_every)
        self.rows: list[dict[str, Any]] = []
        self.episode = -1
        cfg = getattr(env.unwrapped, "config", None)
        self._static = {
            "workload": getattr(cfg, "workload", None),
            "world_size": getattr(cfg, "world_size", None),
            "steps_per_decision": getattr(cfg, "steps_per_decision", None),
            "time_budget_s": getattr(cfg, "time_budget_s", None),
        }
        self._obs: np.ndarray | None = None
        self._prev_loss = math.nan
        self._seed: int | None = None
        self._num_params: int | None = None
        self._closed = False
        self._prev_action: tuple[int, ...] | None = None
        self._held = 0

    def reset(self, **kwargs: Any):  # noqa: D102
        obs, info = self.env.reset(**kwargs)
        self.episode += 1
        self._obs = np.asarray(obs, dtype=np.float64)
        self._prev_loss = float(info.get("eval_loss", math.nan))
        self._prev_action = None
        self._held = 0
        self._seed = info.get("episode_seed")
        self._num_params = info.get("num_params", self._num_params)
        self._network = info.get("network")
        return obs, info

    def step(self, action: Any):  # noqa: D102
        obs, reward, terminated, truncated, info = self.env.step(action)
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        key = tuple(int(v) for v in a)
        self._held = self._held + 1 if key == self._prev_action else 1
        self._prev_action = key
        row: dict[str, Any] = {
            "episode": self.episode,
            "episode_seed": self._seed,
            "decision": info.get("decision"),
            **{
                f"obs_{f.name}": float(v)
                for f, v in zip(OBSERVATION_FIELDS, self._obs, strict=True)
            },
            "a_compression": int(a[0]),
            "a_bucket": int(a[1]),
            "a_period": int(a[2]),
            "held": self._held,
            "config": info.get("config"),
            "prev_eval_loss": self._prev_loss,
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "reason": info.get("reason"),
            "diverged": bool(info.get("diverged", False)),
            "network": info.get("network", self._network),
            "num_params": self._num_params,
            **self._static,
        }  # fmt: skip
        act = info.get("action") or {}
        row["compression"] = act.get("compression")
        row["bucket_mb"] = act.get("bucket_mb")
        row["sync_period"] = act.get("sync_period")
        m = info.get("measured")
        for k in MEASURED_KEYS:
            v = None if m is None else m.get(k)
            row[k] = v
        if m is not None and math.isfinite(float(m["eval_loss"])):
            self._prev_loss = float(m["eval_loss"])
        self._obs = np.asarray(obs, dtype=np.float64)
        self.rows.append(row)
        if self.flush_every and len(self.rows) % self.flush_every == 0:
            self.flush()
        return obs, reward, terminated, truncated, info

    def flush(self) -> Path:
        """Write all rows so far to :attr:`path` (overwrites). Returns the path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.suffix == ".parquet":
            import pandas as pd

            pd.DataFrame(self.rows).to_parquet(self.path, index=False)
        else:
            keys: list[str] = []
            for r in self.rows:
                keys.extend(k for k in r if k not in keys)
            with self.path.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=keys)
                w.writeheader()
                w.writerows(self.rows)
        return self.path

    def close(self) -> None:  # noqa: D102
        if not self._closed:
            self._closed = True
            if self.rows:
                self.flush()
        super().close()


def _streak(df: Any) -> np.ndarray:
    """``held`` column (decisions the configuration has been held); 1 where absent."""
    if "held" not in df:
        return np.ones(len(df))
    return df["held"].fillna(1).to_numpy(float)


def read_transitions(*paths: str | os.PathLike[str]) -> Any:
    """Load one or more recorded transition files (CSV or Parquet) as a pandas DataFrame."""
    import pandas as pd

    frames = [pd.read_parquet(p) if str(p).endswith(".parquet") else pd.read_csv(p) for p in paths]
    return pd.concat(frames, ignore_index=True)


# -- analytical prior -----------------------------------------------------------------
@dataclass(frozen=True)
class AlphaBeta:
    """Alpha-beta (latency-bandwidth) cost model of ring collectives (Hockney 1994).

    Attributes:
        alpha_s: per-message latency, seconds.
        beta_s_per_byte: inverse bandwidth, seconds per byte.
    """

    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0

    def allreduce_s(self, n_bytes: float, world_size: int) -> float:
        """Ring all-reduce: ``2(W-1) alpha + 2(W-1)/W n beta`` (Thakur et al. 2005)."""
        w = world_size
        return 2 * (w - 1) * self.alpha_s + 2 * (w - 1) / w * n_bytes * self.beta_s_per_byte

    def allgather_s(self, n_total_bytes: float, world_size: int) -> float:
        """Ring all-gather: ``(W-1) alpha + (W-1)/W n_total beta`` (Thakur et al. 2005)."""
        w = world_size
        return (w - 1) * self.alpha_s + (w - 1) / w * n_total_bytes * self.beta_s_per_byte

    @classmethod
    def fit(cls, samples: list[tuple[str, int, float, float]]) -> AlphaBeta:
        """Least-squares fit (non-negative) from ``(kind, world_size, bytes, seconds)``.

        Args:
            samples: ``kind`` is ``"allreduce"`` or ``"allgather"`` (bytes = gathered total).

        Raises:
            ValueError: no samples, or an unknown kind.
        """
        if not samples:
            raise ValueError("AlphaBeta.fit needs at least one timing sample")
        rows, ys = [], []
        for kind, w, n, t in samples:
            if kind == "allreduce":
                rows.append([2 * (w - 1), 2 * (w - 1) / w * n])
            elif kind == "allgather":
                rows.append([w - 1, (w - 1) / w * n])
            else:
                raise ValueError(f"unknown collective {kind!r}; valid: allreduce, allgather")
            ys.append(t)
        from scipy.optimize import nnls

        a = np.asarray(rows, dtype=np.float64)
        scale = a.max(axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(a / scale, np.asarray(ys, dtype=np.float64))
        coef = coef / scale
        return cls(float(coef[0]), float(coef[1]))


def bench_collectives(
    cluster: Any, sizes_bytes: list[int] | None = None, repeats: int = 5
) -> list[tuple[str, int, float, float]]:
    """Time all-reduce and all-gather on a running :class:`~commgym.env.Cluster`.

    Returns:
        ``(kind, world_size, bytes, median seconds)`` samples for :meth:`AlphaBeta.fit`.
    """
    sizes = sizes_bytes or [4 * 1024, 64 * 1024, 512 * 1024, 4 * 1024 * 1024]
    out = []
    for kind in ("allreduce", "allgather"):
        secs = cluster.command({"cmd": f"{kind}_bench", "sizes_bytes": sizes, "repeats": repeats})[
            0
        ]["seconds"]
        out.extend((kind, cluster.world_size, float(s), float(secs[str(int(s))])) for s in sizes)
    return out


def _summable(spec: str) -> bool:
    # the compressor class declares whether its payloads are all-reduced or all-gathered
    return COMPRESSORS[CompressionSpec.parse(spec).method].summable


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


# -- environment ----------------------------------------------------------------------
_TIMING_SET = frozenset(TIMING)


class SurrogateEnv(gym.Env):
    """``commgym/Surrogate-v0``: AllReduce-v0's interface, dynamics from a fitted model.

    Observation and action spaces, observation construction (:class:`ObservationBuilder`
    from measurement dicts shaped like ``aggregate_measurements``'s output), reward
    functions (``REWARDS``), ``info`` keys, time-budget / ``max_decisions`` truncation,
    target-reached and divergence termination are those of
    :class:`~commgym.env.AllReduceEnv`; see its docstring for the tables and formulas.

    Dynamics per decision, for flat action ``k`` held for ``h`` decisions in a row and
    held-out-loss bucket ``b`` of the current loss: ``y = table[min(h, 4) - 1, b, k] +
    noise * r`` where ``r`` takes its timing columns
    from one bootstrapped out-of-fold residual row of the action's sync period and its
    learning columns from one row of loss bucket ``b`` (:class:`SurrogateModel`); step
    time ``= prior[k] * exp(y_step)``, decision time ``= steps * prior[k] *
    exp(y_train)``, ``L_new = L * exp(-y_loss)``; divergence with the per-action
    frequency observed in the data. Deterministic given the seed.

    **Version history** — v0: first release.

    Args:
        model_path: file written by :meth:`SurrogateModel.save` (a joblib pickle: only
            load trusted files), or a :class:`SurrogateModel`.
        config: an ``EnvConfig``; or its fields as keyword arguments (``workload``,
            ``world_size`` and ``steps_per_decision`` default to the model's data;
            ``network`` and launch settings are ignored).
        noise: scale of the bootstrapped noise (0: noise-free medians).
        render_mode: unsupported; warns and is ignored.

    Raises:
        ValueError: the action menu differs from the model's.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        model_path: str | os.PathLike[str] | SurrogateModel,
        config: Any = None,
        noise: float = 1.0,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        from commgym.env.allreduce_env import EnvConfig

        if render_mode is not None:
            warnings.warn(f"render_mode {render_mode!r} is not supported; ignored", stacklevel=2)
        model = (
            model_path
            if isinstance(model_path, SurrogateModel)
            else SurrogateModel.load(model_path)
        )
        self.model = model
        if config is None:
            kwargs.setdefault("workload", model.workload)
            kwargs.setdefault("world_size", model.world_size)
            kwargs.setdefault("steps_per_decision", model.steps_per_decision)
            kwargs.setdefault("action_menu", model.menu)
            config = EnvConfig(**kwargs)
        elif kwargs:
            raise TypeError("pass either an EnvConfig or keyword arguments, not both")
        self.config = config
        if config.menu.to_dict() != model.menu.to_dict():
            raise ValueError(
                f"action menu {config.menu.to_dict()} differs from the surrogate's "
                f"{model.menu.to_dict()}"
            )
        self.menu = config.menu
        self.noise = float(noise)
        self.action_space = spaces.MultiDiscrete(self.menu.nvec)
        self._obs = ObservationBuilder(self.menu, config.world_size, model.num_params)
        self.observation_space = self._obs.space
        self._reward = REWARDS[config.reward]
        nvec = tuple(int(n) for n in self.menu.nvec)
        self._nvec = nvec
        self._configs = [str(self.menu.decode(np.array(a))) for a in np.ndindex(*nvec)]
        self._actions = [self.menu.decode(np.array(a)).to_dict() for a in np.ndindex(*nvec)]
        self._table = model.table.tolist()
        self._prior = model.prior_table.tolist()
        self._p_div = model.p_diverge.tolist()
        self._edges_lo = float(model.loss_edges[0])
        self._edges_w = float(model.loss_edges[1] - model.loss_edges[0])
        self._nbins = len(model.loss_edges) - 1
        self._resid = [r.tolist() for r in model.residuals]
        self._learn_resid = [r.tolist() for r in model.learning_residuals]
        # data were recorded with the model's K; scale time with the configured K
        self._steps = config.steps_per_decision
        self._samples = model.samples * config.steps_per_decision / max(model.steps_per_decision, 1)
        self._needs_reset = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: D102
        super().reset(seed=seed)
        if seed is None and not hasattr(self, "_seeded"):
            super().reset(seed=self.config.seed)
        self._seeded = True
        rng = self.np_random
        episode_seed = int(rng.integers(0, 2**31 - 1))
        # per-episode stream: the same seed and actions give the same episode
        self._rng = np.random.default_rng(episode_seed)
        init = self.model.initial_losses
        self._eval_loss = float(init[int(self._rng.integers(len(init)))])
        self._action = self.menu.default_action()
        self._prev_k = -1
        self._held = 0
        self._train_time_s = 0.0
        self._decisions = 0
        self._needs_reset = False
        obs = self._obs.reset(self._eval_loss, self._action)
        self._last_obs = obs
        return obs, {
            "episode_seed": episode_seed,
            "eval_loss": self._eval_loss,
            "eval_acc": float("nan"),
            "num_params": self.model.num_params,
            "reset_s": 0.0,
            "config": str(self.menu.decode(self._action)),
            "network": None,
            "surrogate": True,
        }

    def step(self, action):  # noqa: D102
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (the episode ended or never started)")
        a = np.asarray(action, dtype=np.int64)
        n0, n1, n2 = self._nvec
        if a.shape != (3,) or not (0 <= a[0] < n0 and 0 <= a[1] < n1 and 0 <= a[2] < n2):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        i0, i1, i2 = int(a[0]), int(a[1]), int(a[2])
        k = (i0 * n1 + i1) * n2 + i2
        cfg = self.config
        prev = self._eval_loss
        b = int((math.log(max(prev, 1e-8)) - self._edges_lo) / self._edges_w)
        b = 0 if b < 0 else (self._nbins - 1 if b >= self._nbins else b)
        self._held = self._held + 1 if k == self._prev_k else 1
        self._prev_k = k
        p = self._table[min(self._held, MAX_STREAK) - 1][b][k]
        pool = self._resid[i2]
        r = pool[int(self._rng.random() * len(pool))]  # timing noise (per sync period)
        pool = self._learn_resid[b]
        r_learn = pool[int(self._rng.random() * len(pool))]  # learning noise (per loss bucket)
        s = self.noise
        y = [
            pv + s * (rv if j in _TIMING_SET else rl)
            for j, (pv, rv, rl) in enumerate(zip(p, r, r_learn, strict=True))
        ]
        prior = self._prior[k]
        step_t = prior * math.exp(y[0])
        train_t = self._steps * prior * math.exp(y[1])
        bytes_ps = max(math.expm1(y[2]), 0.0)
        diverged = self._rng.random() < self._p_div[k]
        eval_loss = float("nan") if diverged else max(prev * math.exp(-y[3]), 1e-8)
        comm_s = min(max(y[8], 0.0), 1.0) * train_t
        m = {
            "train_time_s": train_t,
            "step_time_s": step_t,
            "iter_mean_s": train_t / self._steps,
            "compute_s": self.model.compute_s,
            "comm_wait_s": min(max(y[6], 0.0), 1.0) * step_t,
            "compress_s": max(y[7], 0.0) * step_t,
            "comm_s": comm_s,
            "bytes_per_step": bytes_ps,
            "bytes_total": bytes_ps * self._steps,
            "train_loss": prev * math.exp(y[4]),
            "eval_loss": eval_loss,
            "eval_acc": min(max(y[10], 0.0), 1.0),
            "eval_s": 0.0,
            "grad_norm": 10.0 ** y[5],
            "compression_error": max(y[9], 0.0),
            "nonfinite": diverged,
            "samples": int(self._samples),
            "steps": self._steps,
            "bucket_bytes": [],
            "env_step_s": 0.0,
        }
        self._decisions += 1
        self._train_time_s += train_t
        elapsed = min(1.0, self._train_time_s / cfg.time_budget_s)
        obs = self._obs.build(m, a, elapsed)
        self._action = a
        reward, terminated, truncated, reason = decision_outcome(
            cfg,
            self._reward,
            prev_eval_loss=prev,
            eval_loss=eval_loss,
            dt_s=train_t,
            samples=int(self._samples),
            diverged=diverged,
            train_time_s=self._train_time_s,
            decisions=self._decisions,
        )
        if not diverged:
            self._eval_loss = eval_loss
        if terminated or truncated:
            self._needs_reset = True
        self._last_obs = obs
        info = {
            "config": self._configs[k],
            "action": dict(self._actions[k]),
            "measured": m,
            "reason": reason,
            "train_time_s": self._train_time_s,
            "elapsed_frac": elapsed,
            "decision": self._decisions,
            "diverged": diverged,
        }
        return obs, float(reward), terminated, truncated, info

    def close(self) -> None:  # noqa: D102
        self._needs_reset = True


def benchmark_steps(env: gym.Env, steps: int = 20000, seed: int = 0) -> float:
    """Env steps per second with uniformly random actions (resets included)."""
    import time

    rng = np.random.default_rng(seed)
    nvec = np.asarray(env.action_space.nvec)
    actions = rng.integers(0, nvec, size=(steps, len(nvec)))
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for i in range(steps):
        _, _, te, tr, _ = env.step(actions[i])
        if te or tr:
            env.reset()
    return steps / (time.perf_counter() - t0)
