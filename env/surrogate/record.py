"""Recording real decisions: :class:`TransitionRecorder` writes one row per decision."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.env.measure import DECISION_FIELDS, measurement_from_info
from commgym.env.net.plan import UNSHAPED_LINK_GBPS, link_rate_gbps
from commgym.env.spaces import OBSERVATION_FIELDS

#: ``info["measured"]`` keys copied into every transition row: the scalar fields of
#: :class:`~commgym.env.measure.DecisionMeasurement`.
MEASURED_KEYS: tuple[str, ...] = tuple(k for k in DECISION_FIELDS if k != "bucket_bytes")


class TransitionRecorder(gym.Wrapper):
    """Records every decision of a commgym env as one row; writes CSV or Parquet.

    A row holds the observation the decision was taken from (``obs_<field>``), the action
    (``a_compression``, ``a_bucket``, ``a_period`` and the decoded config), ``held`` (for
    how many decisions in a row this configuration has been chosen, 1 = just switched to
    it; switching restarts error feedback and PowerSGD's warm start), every measured
    statistic (``info["measured"]``), the previous held-out loss, reward, end flags and
    reason, and the workload, world size, steps per decision, time budget, the network
    spec in force for the decision (``network``, from ``info["network"]``) and its rate
    (``link_rate_gbps``, :func:`link_rate_gbps`). Dynamic values come from ``info`` only;
    static ones from the env's ``config``.

    Args:
        env: a ``commgym/AllReduce-v1`` env (or anything with the same ``info`` shape).
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
        self._network: Any = None
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
        network = info.get("network", self._network)
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
            "network": network,
            "link_rate_gbps": link_rate_gbps(network),
            "num_params": self._num_params,
            **self._static,
        }  # fmt: skip
        act = info.get("action") or {}
        row["compression"] = act.get("compression")
        row["bucket_mb"] = act.get("bucket_mb")
        row["sync_period"] = act.get("sync_period")
        measured = measurement_from_info(info)
        for k in MEASURED_KEYS:
            row[k] = None if measured is None else getattr(measured, k)
        if measured is not None and math.isfinite(float(measured.eval_loss)):
            self._prev_loss = float(measured.eval_loss)
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


def held_decisions(df: Any) -> np.ndarray:
    """``held`` column (decisions the configuration has been held); 1 where absent."""
    if "held" not in df:
        return np.ones(len(df))
    return df["held"].fillna(1).to_numpy(float)


def link_rates(df: Any) -> np.ndarray:
    """Configured link rate per row, Gbit/s: ``link_rate_gbps``, else parsed from ``network``.

    Files recorded before the rate column existed are read through their ``network``
    column (:func:`link_rate_gbps`); without either every row is unshaped.
    """
    if "link_rate_gbps" in df:
        rates = df["link_rate_gbps"].to_numpy(float)
        return np.where(np.isfinite(rates), rates, UNSHAPED_LINK_GBPS)
    if "network" in df:
        return np.array([link_rate_gbps(v) for v in df["network"]], dtype=np.float64)
    return np.full(len(df), UNSHAPED_LINK_GBPS)


def read_transitions(*paths: str | os.PathLike[str]) -> Any:
    """Load one or more recorded transition files (CSV or Parquet) as a pandas DataFrame."""
    import pandas as pd

    frames = [pd.read_parquet(p) if str(p).endswith(".parquet") else pd.read_csv(p) for p in paths]
    return pd.concat(frames, ignore_index=True)
