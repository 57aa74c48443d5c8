"""``python -m commgym.experiments.bench <command>``: the ``commgym bench`` group."""

from commgym.experiments.bench.commands import bench_app

bench_app(prog_name="python -m commgym.experiments.bench")
