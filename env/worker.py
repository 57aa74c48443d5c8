"""One training rank of the environment, launched by torchrun.

``python -m commgym.env.worker --control HOST:PORT`` (with ``COMMGYM_AUTHKEY`` set)
connects to the environment's control listener and says hello (rank, world size, pid,
host, whether its agent forked it; rank and world size are torchrun's). The first command
is ``launch``, which holds the cluster's :class:`~commgym.env.cluster.LaunchConfig`: the
rank imports the workload modules, sets its threads and device, initialises
``torch.distributed`` (rendezvous from torchrun's variables, backend and timeout from the
config) and replies ``ready``. No setting is read from the environment except the key, which
the rank needs to connect at all. It then executes commands until ``close`` or until the
connection drops (the environment died: the rank exits, it never lingers).

Commands (dicts with ``"cmd"``), each answered by exactly one reply dict:

``launch`` (first, exactly once) apply the :class:`~commgym.env.cluster.LaunchConfig`;
           reply ``ready`` with what was applied: ``backend`` (the process group's),
           ``device``, ``threads`` (``torch.get_num_threads()``), ``timeout_s`` and
           ``workload_modules`` (as passed to ``init_process_group`` / imported).
``reset``  rebuild model, optimizer, data order and synchronizer from ``seed`` (the
           workload, batch size and learning rate are the launch config's); reply with
           the initial held-out loss/accuracy and the reset time.
``step``   apply ``config`` (a ``CommConfig`` dict) and run ``steps`` real training
           iterations; reply with the measured statistics (see :class:`RankRunner.step`).
``snapshot`` keep a copy of everything ``step`` changes (model, optimizer, synchronizer,
           data order, straggler draws) in memory under ``key``; ``restore`` puts it back,
           ``drop`` frees it. Forking an episode from a snapshot continues exactly as the
           original would have (the oracle-adaptive search branches at phase boundaries).
``allreduce_bench``  time plain fp32 all-reduces of given sizes (network benchmark).
``allgather_bench``  time fp32 all-gathers of given total sizes (surrogate prior fit).
``sync_bench``  torch DDP against the synchronizer, side by side (``commgym bench sync``).
``close``  reply and exit.

The benchmark commands (:mod:`commgym.env.rank_bench`) are the worker's benchmark mode:
every benchmark that needs ranks starts them through :class:`~commgym.env.cluster.Cluster`
and this module, as the env does.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import importlib
import os
import socket
import sys
import time
import traceback
from multiprocessing.connection import Client
from typing import Any

import torch
import torch.distributed as dist

from commgym.collectives import CommConfig, GradientSynchronizer
from commgym.env.cluster import LaunchConfig
from commgym.env.measure import DecisionRecorder
from commgym.env.rank_bench import LinkProbe, bench_allgather, bench_allreduce, bench_sync
from commgym.env.stragglers import StragglerDraw, StragglerSpec
from commgym.env.workloads.shards import shard_indices

__all__ = ["RankRunner", "main"]

#: Whether this rank was forked by its torchrun agent (:mod:`commgym.env.launcher`) rather
#: than started as ``python -u -m commgym.env.worker``; said in the hello.
FORKED = False

#: Samples of the held-out split used for the per-decision evaluation (fixed batch,
#: split across ranks). Small enough to cost well under a training iteration per rank.
EVAL_SAMPLES = 256


class RankRunner:
    """Executes environment commands on one rank (model, data shard, synchronizer).

    Args:
        rank: this rank.
        world_size: number of ranks.
        device: torch device of the model.
        config: the cluster's launch config (workload, batch size, learning rate).
    """

    def __init__(
        self, rank: int, world_size: int, device: torch.device, config: LaunchConfig
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._probe = LinkProbe(device)
        self.config = config
        self.sync: GradientSynchronizer | None = None
        self.model: torch.nn.Module | None = None
        self.recorder = DecisionRecorder()
        self._snapshots: dict[str, dict[str, Any]] = {}

    # -- commands -------------------------------------------------------------------
    def reset(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Rebuild everything from ``msg["seed"]`` (no process is restarted).

        Raises:
            RuntimeError: the launch config names no workload (a benchmark-only cluster).
        """
        from commgym.env.workloads import get_workload

        if self.config.workload is None:
            raise RuntimeError("reset on a cluster launched without a workload")
        t0 = time.perf_counter()
        seed = int(msg["seed"])
        wl = get_workload(self.config.workload)
        self.workload = wl
        torch.manual_seed(seed)
        if self.sync is not None:
            self.sync.remove_hooks()
        model = wl.build_model().to(self.device)
        # identical replicas on every rank, whatever the local RNG did
        with torch.no_grad():
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        self.model = model
        lr = float(self.config.lr or wl.default_lr)
        if wl.optimizer == "adam":
            self.opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.sync = GradientSynchronizer(
            model,
            CommConfig(**msg["config"]),
            seed=seed,
            error_every=0,
            grad_norm_every=0,  # the observation reads the last step's: asked for there
            optimizer=self.opt,
        )
        data = wl.load_data()
        self.batch_size = int(self.config.batch_size or wl.default_batch_size)
        shard = shard_indices(
            data.train_y if data.train_y.dim() == 1 else data.train_y[:, 0],
            self.rank,
            self.world_size,
            seed,
            self.config.shards,
        )
        self.train_x = data.train_x[shard].to(self.device)
        self.train_y = data.train_y[shard].to(self.device)
        n_eval = min(EVAL_SAMPLES, len(data.eval_x))
        # each rank evaluates its share of the fixed held-out batch (see _evaluate)
        self.eval_x = data.eval_x[self.rank : n_eval : self.world_size].to(self.device)
        self.eval_y = data.eval_y[self.rank : n_eval : self.world_size].to(self.device)
        self.gen = torch.Generator().manual_seed(seed * 1000 + self.rank + 1)
        self.order = torch.randperm(len(self.train_x), generator=self.gen)
        self.cursor = 0
        self.samples = 0
        self.stragglers = StragglerDraw(seed, self.world_size)
        self._snapshots.clear()  # a new episode: forks of the last one are void
        eval_loss, eval_acc, eval_n = self._evaluate()
        return {
            "type": "reset",
            "eval_loss": eval_loss,
            "eval_acc": eval_acc,
            "eval_n": eval_n,
            "num_params": sum(p.numel() for p in model.parameters()),
            "shard_size": len(self.train_x),
            "batch_size": self.batch_size,
            "lr": lr,
            "reset_s": time.perf_counter() - t0,
        }

    def _evaluate(self) -> tuple[float, float, int]:
        """Held-out loss and accuracy of the (consensus) model on this rank's share.

        Every rank evaluates a strided share of the fixed held-out batch, in parallel and
        without a collective; the environment combines the replies weighted by count.

        Returns:
            ``(mean loss, accuracy, number of samples)`` on this rank's share.
        """
        n = len(self.eval_x)
        if n == 0:
            return 0.0, 0.0, 0
        with torch.inference_mode():
            loss, acc = self.workload.evaluate(self.model, self.eval_x, self.eval_y)
        return loss, acc, n

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.batch_size > len(self.order):
            self.order = torch.randperm(len(self.train_x), generator=self.gen)
            self.cursor = 0
        idx = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return self.train_x[idx], self.train_y[idx]

    def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run ``msg["steps"]`` training iterations under ``msg["config"]``.

        The reply holds this rank's measurements: ``train_time_s`` (wall time of the
        iterations plus the decision-boundary consensus averaging), per-iteration medians
        and means of the ``StepStats`` fields, mean training loss, the held-out loss and
        accuracy of the consensus model, and whether anything was non-finite; beside them
        the handler's own timings, seconds: ``reconfigure_s`` (part of ``train_time_s``),
        ``instrumentation_s`` (the synchronizer's statistics summed over the iterations,
        e.g. the reference all-reduce behind ``compression_error``: wall time that is not
        training time) and ``handler_s`` (the whole command on this rank).
        """
        if self.sync is None or self.model is None:
            raise RuntimeError("step before reset")
        t_handler = time.perf_counter()
        sync, model, opt, wl = self.sync, self.model, self.opt, self.workload
        t_cfg = time.perf_counter()
        sync.reconfigure(CommConfig(**msg["config"]))
        reconfigure_s = time.perf_counter() - t_cfg
        steps = int(msg["steps"])
        straggler = StragglerSpec(**msg.get("straggler", {}))
        rec = self.recorder
        rec.reset()
        instrumentation_s = 0.0
        for i in range(steps):
            if i == steps - 1:
                sync.request_error_measurement()
                sync.request_grad_norm()
            t0 = time.perf_counter()
            delay = self.stragglers.delay_s(self.rank, straggler)
            if delay:  # a late rank: it sleeps inside the timed iteration, costing no CPU
                time.sleep(delay)
            x, y = self._next_batch()  # data loading is part of a training iteration
            opt.zero_grad(set_to_none=True)
            loss = wl.loss_fn(model(x), y)
            loss.backward()
            st = sync.synchronize()
            opt.step()
            avg = sync.after_optimizer_step()
            # commgym's own statistics (e.g. the reference all-reduce behind
            # compression_error) are not training time: a real job would not pay them
            rec.record_step(
                time.perf_counter() - t0 - st.instrumentation_s, loss.detach(), st, avg.bytes_sent
            )
            instrumentation_s += st.instrumentation_s
        # one consensus model at every decision boundary (cost counted)
        c0 = time.perf_counter()
        cons = sync.consensus(optimizer_state=False)
        consensus_s = time.perf_counter() - c0
        probe_bytes = int(msg.get("probe_bytes", 0))
        probe_s = self._probe(probe_bytes)
        self.samples += steps * self.batch_size
        train_loss = rec.train_loss()
        e0 = time.perf_counter()
        eval_loss, eval_acc, eval_n = self._evaluate()
        eval_s = time.perf_counter() - e0
        measured = rec.finish(
            overhead_s=consensus_s + reconfigure_s + probe_s,
            consensus_comm_s=cons.comm_s,
            consensus_bytes=cons.bytes_sent,
            eval_loss=eval_loss,
            eval_acc=eval_acc,
            eval_n=eval_n,
            eval_s=eval_s,
            samples=steps * self.batch_size,
            train_loss=train_loss,
            probe_s=probe_s,
            probe_bytes=probe_bytes,
        )
        return {
            "type": "step",
            **measured.to_dict(),
            "reconfigure_s": reconfigure_s,
            # where the handler's time outside train_time_s goes (``commgym bench env``)
            "instrumentation_s": instrumentation_s,
            "handler_s": time.perf_counter() - t_handler,
        }

    def probe(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time one probe all-reduce of ``msg["probe_bytes"]`` B (``probe_at="reset"``).

        Returns:
            ``{"type": "probe", "probe_s": this rank's wall time of it, s}``.
        """
        return {"type": "probe", "probe_s": self._probe(int(msg["probe_bytes"]))}

    def snapshot(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Copy the episode's state under ``msg["key"]`` (in memory, on this rank).

        Raises:
            RuntimeError: before the first ``reset``.
        """
        if self.sync is None or self.model is None:
            raise RuntimeError("snapshot before reset")
        self._snapshots[str(msg["key"])] = copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "sync": self.sync.state_dict(),
                "gen": self.gen.get_state(),
                "order": self.order,
                "cursor": self.cursor,
                "samples": self.samples,
                "stragglers": self.stragglers.getstate(),
            }
        )
        return {"type": "snapshot", "snapshots": len(self._snapshots)}

    def restore(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Put back the state saved under ``msg["key"]`` (a collective: every rank at once).

        Raises:
            KeyError: no snapshot of that key on this rank.
        """
        snap = copy.deepcopy(self._snapshots[str(msg["key"])])
        assert self.sync is not None and self.model is not None
        # the synchronizer first: switching back to the saved configuration may average
        # (a collective every rank makes), and the model and optimizer are overwritten next
        self.sync.load_state_dict(snap["sync"])
        self.model.load_state_dict(snap["model"])
        self.opt.load_state_dict(snap["optimizer"])
        self.gen.set_state(snap["gen"])
        self.order, self.cursor, self.samples = snap["order"], snap["cursor"], snap["samples"]
        self.stragglers.setstate(snap["stragglers"])
        return {"type": "restore"}

    def drop(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Free the snapshots named in ``msg["keys"]`` (all with ``None``)."""
        keys = msg.get("keys")
        if keys is None:
            self._snapshots.clear()
        for k in keys or ():
            self._snapshots.pop(str(k), None)
        return {"type": "drop", "snapshots": len(self._snapshots)}


def _apply_launch(config: LaunchConfig) -> torch.device:
    """Import the workload modules, set threads and device, join the process group.

    Returns:
        The device this rank's model lives on.
    """
    for mod in config.workload_modules:
        importlib.import_module(mod)
    torch.set_num_threads(config.threads_per_rank)
    if config.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))  # torchrun's, not a setting
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(config.backend, timeout=datetime.timedelta(seconds=config.timeout_s))
    return device


def main(argv: list[str] | None = None) -> int:
    """Entry point of a rank (run by torchrun). Returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", required=True, help="HOST:PORT of the environment's listener")
    args = parser.parse_args(argv)
    host, _, port = args.control.rpartition(":")
    key = os.environ.get("COMMGYM_AUTHKEY")
    if not key:
        print("commgym.env.worker: COMMGYM_AUTHKEY is not set", file=sys.stderr)
        return 2
    # rendezvous facts torchrun sets for every rank (not commgym settings)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    conn = Client((host, int(port)), authkey=bytes.fromhex(key))
    conn.send(
        {
            "type": "hello",
            "rank": rank,
            "world_size": world,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "forked": FORKED,
        }
    )
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        conn.close()
        return 1  # the environment went away before sending the config
    try:
        config = LaunchConfig.from_message(msg)
        device = _apply_launch(config)
    except Exception:
        with contextlib.suppress(OSError):
            conn.send({"type": "error", "traceback": traceback.format_exc()})
        conn.close()
        return 1
    conn.send(
        {
            "type": "ready",
            "backend": dist.get_backend(),
            "device": str(device),
            "threads": torch.get_num_threads(),
            "timeout_s": config.timeout_s,
            "workload_modules": list(config.workload_modules),
        }
    )
    runner = RankRunner(rank, world, device, config)
    handlers = {
        "reset": runner.reset,
        "step": runner.step,
        "probe": runner.probe,
        "snapshot": runner.snapshot,
        "restore": runner.restore,
        "drop": runner.drop,
        "allreduce_bench": lambda msg: bench_allreduce(msg, device),
        "allgather_bench": lambda msg: bench_allgather(msg, device),
        "sync_bench": lambda msg: bench_sync(msg, device),
    }
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return 1  # the environment went away: never linger
            cmd = msg.get("cmd")
            if cmd == "close":
                break
            try:
                handler = handlers[cmd]
            except KeyError:
                conn.send({"type": "error", "traceback": f"unknown command {cmd!r}"})
                continue
            try:
                reply = handler(msg)
            except Exception:
                conn.send({"type": "error", "traceback": traceback.format_exc()})
                continue
            conn.send(reply)
        # every rank got "close": meet before tearing gloo down (a rank that destroys the
        # group while a peer is still in its last reply can abort in gloo's thread teardown)
        runner = handlers = None  # free model, synchronizer and buffers while gloo is alive
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
        # the last word, once nothing of this rank is left to tear down gracefully: the
        # environment then ends the process tree instead of waiting for it (Cluster.close)
        with contextlib.suppress(OSError):
            conn.send({"type": "close"})
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is torn down by now (gloo group destroyed, control connection closed, no
    # file left open for writing), and the interpreter's own finalisation spends ~5 s in
    # native destructors once torch, its inductor and triton are loaded (measured: a 4-rank
    # close took 7.2 s, 1.4 s without it). Ending like multiprocessing's children do skips
    # that.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
