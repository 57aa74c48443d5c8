"""``python -m commgym.experiments.bench <command>``: the ``commgym bench`` group."""

from commgym.experiments.cli import bench_app

bench_app(prog_name="python -m commgym.experiments.bench")
