"""``commgym/Surrogate-v1``: a fast learned model of ``commgym/AllReduce-v1``.

Real decisions cost tens of milliseconds plus process launches; RL agents need many
thousands. This package turns real decisions into a simulator (one module per step below):

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

from commgym.env.net.plan import UNSHAPED_LINK_GBPS, link_rate_gbps
from commgym.env.surrogate.env import SurrogateEnv, benchmark_steps
from commgym.env.surrogate.model import (
    MAX_STREAK,
    MODEL_VERSION,
    TARGETS,
    TIMING,
    SurrogateModel,
    format_holdout_report,
    holdout_report,
    step_time_mape,
    step_time_noise_floor,
)
from commgym.env.surrogate.prior import AlphaBeta, bench_collectives
from commgym.env.surrogate.record import (
    MEASURED_KEYS,
    TransitionRecorder,
    held_decisions,
    link_rates,
    read_transitions,
)

__all__ = [
    "MAX_STREAK",
    "MEASURED_KEYS",
    "MODEL_VERSION",
    "TARGETS",
    "TIMING",
    "UNSHAPED_LINK_GBPS",
    "AlphaBeta",
    "SurrogateEnv",
    "SurrogateModel",
    "TransitionRecorder",
    "bench_collectives",
    "benchmark_steps",
    "format_holdout_report",
    "held_decisions",
    "holdout_report",
    "link_rate_gbps",
    "link_rates",
    "read_transitions",
    "step_time_mape",
    "step_time_noise_floor",
]
