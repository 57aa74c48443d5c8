"""Bulk TCP flow endpoints for cross traffic, run as a script (standard library only).

:class:`~commgym.env.net.cross_traffic.CrossTraffic` starts ``python -I flow.py sink ...``
in the root namespace and ``python -I flow.py send ...`` inside a rank's namespace
(``ip netns exec``). The script imports nothing of commgym (no torch: it starts in tens of
milliseconds) and dies with the process that started it (``PR_SET_PDEATHSIG``), so a
killed env leaves no flow behind.

Usage::

    python -I flow.py sink HOST PARENT_PID          # prints the port it listens on
    python -I flow.py send HOST PORT FLOWS PARENT_PID  # prints "connected" once all are up
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
import sys
import threading

_CHUNK_B = 1 << 20  # large writes: few syscalls, so a flow costs little CPU
_PR_SET_PDEATHSIG = 1


def _die_with(parent_pid: int) -> None:
    """Get SIGKILL when the starting process dies (it may already have)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)


def sink(host: str) -> None:
    """Accept flows on ``host`` (an ephemeral port, printed) and discard what they send."""
    server = socket.create_server((host, 0), backlog=64)
    print(server.getsockname()[1], flush=True)
    buf = bytearray(_CHUNK_B)  # shared: the bytes are thrown away

    def drain(conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv_into(buf):
                    pass
            except OSError:  # the sender was killed: its socket resets
                pass

    while True:
        conn, _ = server.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def send(host: str, port: int, flows: int) -> None:
    """Open ``flows`` TCP connections to the sink and write to each as fast as it drains."""
    conns = []
    for _ in range(flows):
        conn = socket.create_connection((host, port), timeout=10)
        conn.settimeout(None)
        # on kill the kernel resets the connection instead of draining the unsent
        # buffer: the link is free the moment the flow is stopped
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conns.append(conn)
    data = memoryview(bytes(_CHUNK_B))

    def blast(conn: socket.socket) -> None:
        try:
            while True:
                conn.sendall(data)
        except OSError:
            os._exit(0)

    threads = [threading.Thread(target=blast, args=(c,), daemon=True) for c in conns]
    for t in threads:
        t.start()
    print("connected", flush=True)
    for t in threads:
        t.join()


def main(argv: list[str]) -> None:
    """Entry point: ``sink HOST PARENT_PID`` or ``send HOST PORT FLOWS PARENT_PID``."""
    if len(argv) == 3 and argv[0] == "sink":
        _die_with(int(argv[2]))
        sink(argv[1])
    elif len(argv) == 5 and argv[0] == "send":
        _die_with(int(argv[4]))
        send(argv[1], int(argv[2]), int(argv[3]))
    else:
        sys.exit(
            f"usage: flow.py sink HOST PARENT_PID | send HOST PORT FLOWS PARENT_PID; got {argv}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
