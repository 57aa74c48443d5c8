"""What a fresh MLflow SQLite store costs (``python mlflow_store.py DIR``).

Creates ``DIR/mlflow.db`` (MLflow runs every schema migration), then opens the existing store
from a new process, as the next test or command would; each timed after ``import mlflow``.
"""
import subprocess
import sys
import time

OPEN = """
import sys, time
import mlflow
t = time.perf_counter()
mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_experiment("x")
print(f"{time.perf_counter() - t:.2f}")
"""
uri = f"sqlite:///{sys.argv[1]}/mlflow.db"
t = time.perf_counter()
import mlflow  # noqa: E402

t1 = time.perf_counter()
mlflow.set_tracking_uri(uri)
mlflow.set_experiment("x")
t2 = time.perf_counter()
reopen = subprocess.run(
    [sys.executable, "-c", OPEN, uri], capture_output=True, text=True, check=True
).stdout.strip()
print(f"import mlflow {t1 - t:.2f} s; create a store {t2 - t1:.2f} s; open it again (new process) {reopen} s")
