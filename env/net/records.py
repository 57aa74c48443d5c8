"""Owner records of emulated networks (who created what) and removal of leftovers.

Every :class:`~commgym.env.net.emulated.EmulatedNetwork` writes a record before creating
anything, so leftovers of dead processes can be told from live instances.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import random
import re
from pathlib import Path

from commgym.env.net.host import PREFIX_RE, STATE_DIR, check_privileges, check_tools, run_tool

# ------------------------------------------------------------------- owner records/locks


def proc_start_time(pid: int) -> str | None:
    """Start time of process ``pid`` (``/proc/<pid>/stat``), ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(record: dict) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and proc_start_time(pid) == record.get("start_time")


@contextlib.contextmanager
def state_lock():
    """Exclusive lock of the owner records' folder (a ``with`` block)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_records() -> dict[str, dict]:
    records = {}
    if not STATE_DIR.is_dir():
        return records
    for path in STATE_DIR.glob("*.json"):
        try:
            records[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            records[path.stem] = {}
    return records


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for args in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        out = run_tool(args, check=False).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", out):
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(token, strict=False))
    for record in _read_records().values():
        with contextlib.suppress(ValueError, TypeError):
            used.append(ipaddress.IPv4Network(record.get("subnet")))
    return used


def pick_subnet() -> ipaddress.IPv4Network:
    """A free private /24 for a new network's bridge (none in use on this host)."""
    used = [n for n in _used_networks() if n.prefixlen > 0 and not n.is_loopback]
    rng = random.SystemRandom()
    for _ in range(1000):
        net = ipaddress.IPv4Network(f"10.{rng.randint(64, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("could not find a free private 10.x.y.0/24 subnet for the emulated network")


# -------------------------------------------------------------------- leftover cleanup


def cleanup_leftovers(prefix: str = "cg", *, include_live: bool = False) -> list[str]:
    """Removes leftovers of emulated networks whose owner process is gone.

    Only names matching this module's pattern are considered: namespaces
    ``<prefix><6 hex>-r<N>`` / ``<prefix><6 hex>-probe<pid>`` and root-namespace links
    ``<prefix><6 hex>-br`` / ``-v<N>`` / ``-p<N>``. A group (one ``<prefix><6 hex>``) is
    removed only when its owner record is missing or names a dead process, so networks of
    running processes are left alone unless ``include_live`` is set. Interfaces with any
    other name are never touched.

    Args:
        prefix: The ``name_prefix`` the networks were created with.
        include_live: Also remove networks whose owner process is still running.

    Returns:
        Names removed (namespaces and links; ns-side veths vanish with their namespace).
    """
    if not PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"bad prefix {prefix!r}: 1-3 lowercase letters/digits")
    problem = check_tools() or check_privileges()
    if problem:
        raise PermissionError(problem)
    group = re.escape(prefix) + r"[0-9a-f]{6}"
    ns_re = re.compile(rf"({group})-(?:r\d{{1,4}}|probe(\d+))")
    link_re = re.compile(rf"({group})-(?:br|v\d{{1,4}}|p\d{{1,4}})")
    found: dict[str, list[tuple[str, str]]] = {}
    removed: list[str] = []
    for line in run_tool(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = ns_re.fullmatch(name)
        if m and m.group(2):  # a probe namespace: its owner pid is in the name
            if include_live or proc_start_time(int(m.group(2))) is None:
                if run_tool(["ip", "netns", "del", name], check=False).returncode == 0:
                    removed.append(name)
        elif m:
            found.setdefault(m.group(1), []).append(("netns", name))
    for line in run_tool(["ip", "-o", "link", "show"]).stdout.splitlines():
        m = re.match(r"\d+:\s+([^:@\s]+)", line)
        if m and link_re.fullmatch(m.group(1)):
            found.setdefault(link_re.fullmatch(m.group(1)).group(1), []).append(
                ("link", m.group(1))
            )
    records = _read_records()
    for group_name, items in sorted(found.items()):
        record = records.get(group_name)
        if record and _owner_alive(record) and not include_live:
            continue
        # namespaces first (their veths go with them), then bridge-side veths, then bridge
        order = {"netns": 0, "link": 1}
        for kind, name in sorted(items, key=lambda i: (order[i[0]], i[1].endswith("-br"))):
            if kind == "netns":
                proc = run_tool(["ip", "netns", "del", name], check=False)
            else:
                if not Path(f"/sys/class/net/{name}").exists():
                    removed.append(name)  # vanished with its namespace's peer
                    continue
                proc = run_tool(["ip", "link", "del", name], check=False)
            if proc.returncode == 0:
                removed.append(name)
        with contextlib.suppress(OSError):
            (STATE_DIR / f"{group_name}.json").unlink()
    # owner records of dead processes with nothing left
    for group_name, record in records.items():
        if (
            re.fullmatch(group, group_name)
            and group_name not in found
            and (include_live or not _owner_alive(record))
        ):
            with contextlib.suppress(OSError):
                (STATE_DIR / f"{group_name}.json").unlink()
    return removed
