"""Where a Ray cluster is, and whether anything answers there (no Ray import).

``ray.init`` retries an address where nothing listens forever, and rewrites 127.0.0.1 to
the host's routable address unless clusters are off: the Ray executor
(:class:`~commgym.experiments.executors.RayExecutor`) reads the address here first.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["LOOPBACK_VARIABLE", "bootstrap_address", "on_loopback", "unreachable"]

#: Set to "0" for a Ray instance on loopback: it then binds and advertises 127.0.0.1 only,
#: and a driver connects to 127.0.0.1 as given (see :func:`on_loopback`).
LOOPBACK_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def bootstrap_address(address: str) -> str | None:
    """``HOST:PORT`` of the Ray cluster ``address`` names (as ``ray.init`` takes it).

    ``"auto"`` is looked up as Ray does, without importing Ray: ``$RAY_ADDRESS``, else the
    address the last ``ray start --head`` of this host recorded (``ray_current_cluster`` in
    Ray's temp folder); ``None`` when neither exists (Ray's own search decides then).
    """
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or ""
        if address in ("", "auto"):
            tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
            try:
                address = (Path(tmp) / "ray" / "ray_current_cluster").read_text().strip()
            except OSError:
                return None
    return address.split("://", 1)[-1] or None


def on_loopback(address: str) -> bool:
    """Whether the Ray cluster at ``address`` listens on loopback (a one-host cluster)."""
    where = bootstrap_address(address)
    host = "" if where is None else where.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def unreachable(address: str, timeout_s: float = 10.0) -> str | None:
    """Why nothing answers at the Ray cluster ``address`` (``None``: something does).

    ``ray.init`` retries an address where nothing listens forever (and cannot be
    interrupted meanwhile), so the driver knocks once itself first.
    """
    where = bootstrap_address(address)
    if where is None:
        return None
    host, _, port = where.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None
