"""Input checks of the ``commgym`` commands: run before anything is created.

Bad input (a missing or garbage policy file, an output folder that cannot be written, an
unreachable tracking server, a network this host cannot emulate) raises ``ValueError`` /
``FileNotFoundError`` with one sentence naming the option; the command turns it into its
one ``error: ...`` line (:mod:`commgym.experiments.cli`). Nothing here creates a file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "check_outputs",
    "check_policy",
    "check_policy_file",
    "check_tracking",
    "check_writable_dir",
]


def check_writable_dir(path: str | os.PathLike[str], what: str) -> None:
    """Fail unless ``path`` is, or can be created as, a writable folder (leaves nothing).

    Raises:
        ValueError: a component is a file, or the nearest existing folder is not writable.
    """
    p = Path(path).expanduser().absolute()
    probe = p
    try:
        while not probe.exists():
            probe = probe.parent
    except OSError as err:  # an ancestor cannot be searched
        raise ValueError(f"{what} {str(path)!r} is not writable ({err.strerror})") from None
    if not probe.is_dir():
        raise ValueError(f"{what} {str(path)!r} cannot be created: {probe} is a file, not a folder")
    # a real probe, created and removed at once: permission bits say nothing for root,
    # and pseudo file systems (/proc) refuse folders whatever they say
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".commgym-probe-", dir=probe))
    except OSError as err:
        mount, kind = _mount_of(probe)
        if kind in _PSEUDO_FILE_SYSTEMS:  # their errno (ENOENT for /proc) misleads
            raise ValueError(
                f"{what} {str(path)!r} is not writable: {mount} is the {kind} pseudo file "
                "system, where no folder can be created; choose a folder on a disk"
            ) from None
        raise ValueError(
            f"{what} {str(path)!r} is not writable ({probe}: {err.strerror or err})"
        ) from None


#: File systems of kernel interfaces: they hold no user folders, whatever the mode bits say.
_PSEUDO_FILE_SYSTEMS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
     "pstore", "bpf", "efivarfs", "fusectl", "binfmt_misc", "devpts", "mqueue"}
)  # fmt: skip


def _mount_of(path: Path) -> tuple[str, str | None]:
    """``(mount point, file system type)`` holding ``path`` (from /proc/self/mounts)."""
    real = os.path.realpath(path)
    best, kind = "/", None
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best, kind
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return best, kind


def check_tracking(uri: str | None) -> None:
    """Fail when the tracking store named by ``uri`` (or the default) cannot be used.

    An ``http(s)://`` server must answer its health probe within 3 s; a SQLite store's
    folder must be writable. Nothing is created. (Library users of ``Tracker`` keep its
    degrade-to-no-op behaviour; on the command line the user asked for that store.)
    """
    from commgym.experiments.tracking.store import (
        default_tracking_uri,
        is_remote,
        probe_server,
    )

    uri = uri or default_tracking_uri()
    if is_remote(uri):
        err = probe_server(uri, 3.0)
        if err is not None:
            raise ValueError(
                f"MLflow tracking server {uri} is unreachable ({err}); start it, or omit "
                "--tracking-uri / MLFLOW_TRACKING_URI to log to ./mlflow.db"
            )
    elif uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :].split("?", 1)[0])
        if db.exists() and not os.access(db, os.W_OK):
            raise ValueError(f"MLflow store {db} is not writable")
        check_writable_dir(db.parent, "folder of the MLflow store")


def check_policy_file(policy: str) -> None:
    """Fail unless ``policy`` is a commgym policy zip (reads only its JSON member)."""
    from commgym.agents.base import read_policy_json

    read_policy_json(policy)


def check_policy(policy: str, cfg: Any) -> None:
    """Fail unless ``policy`` is a policy zip or a static preset on ``cfg``'s menu.

    Raises:
        ValueError, FileNotFoundError: what is wrong with it, ``--policy`` named.
    """
    from commgym.agents.baselines import resolve_preset

    try:
        if policy.startswith("static:"):
            resolve_preset(cfg.env_config.menu, policy.partition(":")[2])
        else:
            check_policy_file(policy)
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"{err} (--policy)") from err


def check_outputs(cfg: Any) -> None:
    """Validate the network and where a train/evaluate run will write, before it writes."""
    from commgym.experiments.session import check_network

    check_network(cfg.env_config.network_plan, cfg.env_config.network_strict)
    check_writable_dir(cfg.output_dir, "--output-dir")
    check_tracking(cfg.tracking_uri)
