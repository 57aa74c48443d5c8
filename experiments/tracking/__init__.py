"""MLflow tracking for commgym runs: a failure-tolerant run logger and a gymnasium wrapper.

Everything here talks to MLflow through an explicit :class:`mlflow.MlflowClient`, never
through the fluent API (``mlflow.start_run`` / ``mlflow.log_metric``) and its
process-global active run, so several processes and threads can log to one store, and an
inherited ``MLFLOW_RUN_ID`` never redirects logging to somebody else's run.

Logging is a side concern: **no logging failure ever propagates into training**. An
unreachable tracking server, a locked SQLite file or a rejected value is reported with
``warnings.warn`` (once per kind of failure) and the run continues; a :class:`Tracker`
whose store cannot be reached at start-up degrades to a no-op.

Typical use::

    tracker = Tracker()  # sqlite:///<cwd>/mlflow.db unless MLFLOW_TRACKING_URI is set
    with tracker.start_run("ppo-mlp", params=cfg) as parent:
        parent.log_params(reproducibility_params())
        with tracker.start_run("seed-0", parent_run_id=parent.run_id) as run:
            env = TrackingWrapper(gymnasium.make("commgym/AllReduce-v1"), run)
            ...
            env.close()  # logs decisions.csv
    print(ui_command(tracker.tracking_uri))

Metrics always carry a ``step`` and are sent in batches (``client.log_batch``), so
10,000 points cost ~20 calls, not 10,000.
"""

from commgym.experiments.tracking.run import RunLogger
from commgym.experiments.tracking.store import (
    Tracker,
    default_tracking_uri,
    reproducibility_params,
    ui_command,
)
from commgym.experiments.tracking.wrapper import TrackingWrapper

__all__ = [
    "RunLogger",
    "Tracker",
    "TrackingWrapper",
    "default_tracking_uri",
    "reproducibility_params",
    "ui_command",
]
