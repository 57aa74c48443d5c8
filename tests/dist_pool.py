"""Persistent gloo process groups for tests: real ranks, spawned once per world size.

Each rank is a ``spawn``-started process with ``torch.distributed`` initialised on gloo
(CPU). Tests submit module-level functions ``fn(rank, world_size, *args)``; every rank
runs it and the results come back as a list indexed by rank. A rank that raises makes
``run`` raise with its traceback; a hang past ``timeout_s`` kills the pool (the next
``run`` starts a fresh one), so a broken test never hangs the suite.

:func:`shared_pool` keeps one pool per world size for the whole session (the fixtures in
``conftest.py`` and tests that draw the world size, such as the training-loop fuzzer).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import tempfile
import traceback
from typing import Any


def _worker(rank: int, world: int, init_file: str, inbox, outbox) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=90),
    )
    while True:
        job = inbox.get()
        if job is None:
            break
        fn, args, kwargs = job
        try:
            outbox.put((rank, True, fn(rank, world, *args, **kwargs)))
        except BaseException:
            outbox.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class DistPool:
    """A persistent set of ``world_size`` gloo ranks."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._procs: list[Any] = []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        fd, init_file = tempfile.mkstemp(prefix="commgym-test-pg-")
        os.close(fd)
        os.unlink(init_file)
        self._init_file = init_file
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, self.world_size, init_file, self._inboxes[r], self._outbox),
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn, *args, timeout_s: float = 120.0, **kwargs) -> list[Any]:
        """Run ``fn(rank, world_size, *args, **kwargs)`` on every rank; results by rank."""
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close()
            self._start()
        for q in self._inboxes:
            q.put((fn, args, kwargs))
        results: dict[int, Any] = {}
        errors: list[str] = []
        try:
            while len(results) + len(errors) < self.world_size:
                rank, ok, value = self._outbox.get(timeout=timeout_s)
                if ok:
                    results[rank] = value
                else:
                    errors.append(f"rank {rank}:\n{value}")
                    # other ranks may now be stuck in a collective: restart the pool
                    break
        except queue.Empty:
            self.close()
            raise TimeoutError(
                f"{fn.__name__} did not finish on {self.world_size} ranks in {timeout_s}s"
            ) from None
        if errors:
            self.close()
            raise AssertionError("\n".join(errors))
        return [results[r] for r in range(self.world_size)]

    def close(self) -> None:
        """Stop all ranks (kill if they do not exit promptly)."""
        for q in getattr(self, "_inboxes", []):
            try:
                q.put(None)
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []
        init_file = getattr(self, "_init_file", None)
        if init_file and os.path.exists(init_file):  # gloo's FileStore re-creates it
            os.unlink(init_file)


_SHARED: dict[int, DistPool] = {}


def shared_pool(world_size: int) -> DistPool:
    """The session's persistent pool of ``world_size`` ranks (started on first use)."""
    if world_size not in _SHARED:
        _SHARED[world_size] = DistPool(world_size)
    return _SHARED[world_size]


def close_shared_pools() -> None:
    """Stop every pool :func:`shared_pool` started."""
    for pool in _SHARED.values():
        pool.close()
