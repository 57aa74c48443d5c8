"""Cross traffic: competing bulk TCP flows on the emulated links (contention).

In a shared cluster a rank's link also carries traffic that is not the training job's: a
checkpoint upload, a dataset fetch, another job's all-reduce. A bulk TCP flow takes its
share of the link and, costlier for a collective, keeps the bottleneck's queue filled: every
message of the all-reduce then waits behind that queue (up to the link's ``queue`` delay,
:class:`~commgym.env.net.NetworkSpec`) and some are dropped and sent again. The cost is paid
per message, so compressing the payload barely helps; a longer local-SGD period pays it less
often. A ring all-reduce runs at the pace of its slowest link, so one busy link slows every
rank.

The flows are real: ``n`` TCP connections from a rank's namespace to a sink on the bridge
(root namespace), through the same shaped egress (``tc tbf``) that the rank's collectives
leave by. A spec string: ``"off"``; ``"<n>flow"``/``"<n>flows"`` (``n`` flows on rank 0's
link); ``"<n>flows@<rank>"`` (on that rank's link) or ``"<n>flows@all"`` (on every rank's;
each flow costs some CPU, so on a small machine keep them few).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import select
import signal
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

from commgym.collectives.checks import check_int
from commgym.env.schedule import means_off

__all__ = ["CrossTrafficSpec", "CrossTraffic"]

_SPEC_RE = re.compile(r"^(?P<n>\d+)\s*flows?(?:\s*@\s*(?P<where>all|\d+))?$")
_FORMS = "'off', '<n>flows' (rank 0's link), '<n>flows@<rank>' or '<n>flows@all', n in 1..16"
_FLOW_SCRIPT = Path(__file__).with_name("flow.py")
_READY_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class CrossTrafficSpec:
    """Competing bulk TCP flows on some ranks' links.

    Attributes:
        flows: TCP connections per busy link (0: off).
        rank: the rank whose link carries them; ``None``: every rank's link.
    """

    flows: int = 0
    rank: int | None = 0

    def __post_init__(self) -> None:
        check_int("cross traffic flows", self.flows, 0, 16)
        if self.rank is not None:
            check_int("cross traffic rank", self.rank, 0, note=" or None")

    @property
    def active(self) -> bool:
        """Whether any flow runs."""
        return self.flows > 0

    @classmethod
    def parse(cls, text: str | bool | CrossTrafficSpec | None) -> CrossTrafficSpec:
        """Parses ``"off"``, ``"2flows"``, ``"1flow@3"`` or ``"1flow@all"``.

        ``None`` and ``False`` are ``"off"`` (:func:`commgym.env.schedule.means_off`).

        Raises:
            ValueError: anything else (the message gives the forms).
        """
        if isinstance(text, cls):
            return text
        if means_off(text):
            return cls()
        if not isinstance(text, str):
            raise ValueError(f"cross traffic spec must be a string ({_FORMS}), got {text!r}")
        m = _SPEC_RE.match(text.strip().lower())
        if m is None or not 1 <= int(m["n"]) <= 16:
            raise ValueError(f"cross traffic spec must be {_FORMS}, got {text!r}")
        where = m["where"]
        return cls(int(m["n"]), None if where == "all" else int(where or 0))

    def busy_ranks(self, world_size: int) -> list[int]:
        """The ranks whose links carry the flows.

        Raises:
            ValueError: ``rank`` is not below ``world_size``.
        """
        if not self.active:
            return []
        if self.rank is None:
            return list(range(world_size))
        if self.rank >= world_size:
            raise ValueError(
                f"cross traffic on rank {self.rank}'s link, but the world size is "
                f"{world_size} (ranks 0..{world_size - 1})"
            )
        return [self.rank]

    def __str__(self) -> str:
        if not self.active:
            return "off"
        flows = f"{self.flows}flow{'s' if self.flows > 1 else ''}"
        return f"{flows}@all" if self.rank is None else f"{flows}@{self.rank}"


class CrossTraffic:
    """Runs a :class:`CrossTrafficSpec` on an emulated network; :meth:`apply` switches it.

    A sink in the root namespace (on the bridge address) takes every flow; one sender
    process per busy rank runs inside that rank's namespace. :meth:`apply` returns once the
    new flows are connected. Stopping a sender resets its connections, so nothing it had
    buffered keeps the link busy. Every process dies with this one (``PR_SET_PDEATHSIG``);
    :meth:`close` (also run by the env's ``close``) stops them earlier.

    Args:
        network: the :class:`~commgym.env.net.EmulatedNetwork` whose links to load.

    Raises:
        RuntimeError: the sink or a sender did not start (the message quotes its error).
    """

    def __init__(self, network: Any) -> None:
        self._net = network
        self._sink: subprocess.Popen[str] | None = None
        self._port = 0
        self._senders: dict[int, subprocess.Popen[str]] = {}
        self._procs: list[subprocess.Popen[str]] = []  # every process started, for the finalizer
        self._finalizer = weakref.finalize(self, _kill_all, self._procs)
        self.spec = CrossTrafficSpec()

    def apply(self, spec: CrossTrafficSpec | str | None) -> None:
        """Run ``spec``'s flows from now on (no-op if it is already in force).

        Raises:
            ValueError: a bad spec, or a rank outside the network.
            RuntimeError: a flow could not start.
        """
        spec = CrossTrafficSpec.parse(spec)
        if spec == self.spec:
            return
        busy = spec.busy_ranks(self._net.world_size)
        self._stop_senders()
        self.spec = CrossTrafficSpec()
        if busy:
            self._ensure_sink()
            starting = {}
            for rank in busy:
                argv = [
                    *self._net.exec_prefix(rank), sys.executable, "-I", str(_FLOW_SCRIPT),
                    "send", self._net.bridge_address, str(self._port), str(spec.flows),
                    str(os.getpid()),
                ]  # fmt: skip
                starting[rank] = self._start(argv)
                self._senders[rank] = starting[rank]
            for rank, proc in starting.items():
                self._read_ready(proc, f"cross traffic sender on rank {rank}'s link")
        self.spec = spec

    def close(self) -> None:
        """Stop every flow and the sink (idempotent)."""
        self._stop_senders()
        if self._sink is not None:
            _kill(self._sink)
            self._sink = None
        self.spec = CrossTrafficSpec()

    @property
    def pids(self) -> list[int]:
        """Process ids of the running sink and senders (for tests and debugging)."""
        procs = [*self._senders.values(), *([self._sink] if self._sink else [])]
        return [p.pid for p in procs if p.poll() is None]

    def _ensure_sink(self) -> None:
        if self._sink is not None and self._sink.poll() is None:
            return
        argv = [
            sys.executable, "-I", str(_FLOW_SCRIPT), "sink", self._net.bridge_address,
            str(os.getpid()),
        ]  # fmt: skip
        self._sink = self._start(argv)
        self._port = int(self._read_ready(self._sink, "cross traffic sink"))

    def _start(self, argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._procs[:] = [p for p in self._procs if p.poll() is None] + [proc]
        return proc

    def _stop_senders(self) -> None:
        for proc in self._senders.values():
            _kill(proc)
        self._senders.clear()

    def _read_ready(self, proc: subprocess.Popen[str], what: str) -> str:
        """The first line ``proc`` prints; raises (after stopping every flow) if none comes."""
        ready, _, _ = select.select([proc.stdout], [], [], _READY_TIMEOUT_S)
        line = proc.stdout.readline().strip() if ready else ""  # type: ignore[union-attr]
        if line:
            return line
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=5)
        err = proc.stderr.read().strip() if proc.stderr else ""  # type: ignore[union-attr]
        self.close()
        why = err.splitlines()[-1] if err else f"nothing within {_READY_TIMEOUT_S:g} s"
        raise RuntimeError(f"{what} did not start: {why}")

    def __repr__(self) -> str:
        return f"CrossTraffic({str(self.spec)!r}, network={self._net.name!r})"


def _kill_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        _kill(proc)
    procs.clear()


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    # a process stuck in the kernel (uninterruptible sleep) can outlive SIGKILL for a
    # while: stop waiting rather than hang the env's close; the kernel reaps it later
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
