"""Host checks for network emulation: privileges, iproute2, and which qdiscs the kernel has."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- host checks

STATE_DIR = Path("/run/commgym-netem")
PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,2}")
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_CMD_TIMEOUT_S = 15.0
_HZ = 250


def tbf_burst_bytes(rate_bit_s: float, mtu: int = 1500) -> int:
    """Token-bucket depth of each shaped link, bytes (see the package docstring).

    ``max(rate_bytes / HZ, 10 * MTU)``: one timer tick at the rate, at least ten frames.
    A transfer shorter than this passes at the sender's own speed once the bucket has
    refilled (``burst * 8 / rate`` seconds idle), which is why a per-decision bandwidth
    can read above the configured rate; over a window of ``t`` seconds a link carries at
    most ``rate * t / 8 + burst`` bytes. Keeping it this small is what makes a slow link
    charge small messages (a probe, PowerSGD's factors) their serialisation delay, as a
    real one does; tbf segments the GSO super-packets larger than the burst.
    """
    return int(max(rate_bit_s / 8 / _HZ, 10 * mtu))


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return -1 if os.geteuid() == 0 else 0


def check_privileges() -> str | None:
    """What privilege is missing for network emulation (``None``: root or the capabilities)."""
    caps = _effective_caps()
    missing = [
        name
        for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
        if caps != -1 and not caps & (1 << bit)
    ]
    if missing:
        return (
            "network emulation needs root (or " + " + ".join(missing) + ") to create "
            "network namespaces, veths, a bridge and tc qdiscs; run as root or grant the "
            "capabilities"
        )
    return None


def check_tools() -> str | None:
    """What tool is missing for network emulation (``None``: ``ip`` and ``tc`` are on PATH)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (
            "network emulation needs iproute2; not found on PATH: "
            + ", ".join(missing)
            + " (install the 'iproute2' package)"
        )
    return None


def run_tool(
    args: Sequence[str], *, check: bool = True, timeout: float = _CMD_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run an ``ip`` / ``tc`` command line (captured text output).

    Raises:
        RuntimeError: it timed out, or (``check``) exited non-zero; the message quotes it.
    """
    try:
        proc = subprocess.run(
            list(args), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(args)!r} timed out after {timeout} s") from None
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)!r} failed (exit {proc.returncode}): {proc.stderr.strip()}"
        )
    return proc


@dataclasses.dataclass(frozen=True)
class HostFeatures:
    """What :func:`probe_host` found: emulation possible (``ok``), netem there (``netem``)."""

    ok: bool
    reason: str
    netem: bool = False
    netem_reason: str = ""


@functools.cache
def probe_host() -> HostFeatures:
    """Probe this host once per process: namespaces, veths, a bridge, tbf, netem."""
    problem = check_tools() or check_privileges()
    if problem:
        return HostFeatures(False, problem, False, problem)
    ns = f"cg{secrets.token_hex(3)}-probe{os.getpid()}"
    try:
        proc = run_tool(["ip", "netns", "add", ns], check=False)
        if proc.returncode != 0:
            msg = f"cannot create a network namespace: {proc.stderr.strip()}"
            return HostFeatures(False, msg, False, msg)
        proc = run_tool(
            ["ip", "-n", ns, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"],
            check=False,
        )
        if proc.returncode != 0:
            msg = f"cannot create a veth pair (CONFIG_VETH?): {proc.stderr.strip()}"
            return HostFeatures(False, msg, False, msg)
        proc = run_tool(
            ["ip", "-n", ns, "link", "add", "name", "pbr", "type", "bridge"], check=False
        )
        if proc.returncode != 0:
            msg = f"cannot create a bridge (CONFIG_BRIDGE?): {proc.stderr.strip()}"
            return HostFeatures(False, msg, False, msg)
        tbf = [
            "tc",
            "-n",
            ns,
            "qdisc",
            "add",
            "dev",
            "pa",
            "root",
            "handle",
            "1:",
            "tbf",
            "rate",
            "1mbit",
            "burst",
            "32kb",
            "latency",
            "10ms",
        ]
        proc = run_tool(tbf, check=False)
        if proc.returncode != 0:
            msg = f"kernel lacks the tbf qdisc (CONFIG_NET_SCH_TBF): {proc.stderr.strip()}"
            return HostFeatures(False, msg, False, msg)
        netem = [
            "tc",
            "-n",
            ns,
            "qdisc",
            "add",
            "dev",
            "pb",
            "root",
            "handle",
            "1:",
            "netem",
            "delay",
            "1ms",
        ]
        proc = run_tool(netem, check=False)
        if proc.returncode == 0:
            return HostFeatures(True, "ok: rate, delay, jitter and loss (netem + tbf)", True, "ok")
        why = (
            "kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM; tc: "
            f"{proc.stderr.strip()}): delay, jitter and loss cannot be emulated"
        )
        return HostFeatures(True, f"ok: rate shaping only (tbf); {why}", False, why)
    finally:
        run_tool(["ip", "netns", "del", ns], check=False)


def netem_available() -> tuple[bool, str]:
    """Says whether :class:`EmulatedNetwork` can be created on this host.

    The result is probed once per process (in a throw-away namespace). ``True`` means
    namespaces, veths, a bridge and tbf rate shaping work; the message says whether
    delay/jitter/loss (sch_netem) are also available (see :func:`delay_available`).

    Returns:
        ``(available, message)``; the message says what is missing when unavailable.
    """
    features = probe_host()
    return features.ok, features.reason


def delay_available() -> tuple[bool, str]:
    """Says whether delay, jitter and loss can be emulated (needs sch_netem).

    Returns:
        ``(available, message)``.
    """
    features = probe_host()
    return features.netem, features.netem_reason


def emulation_problem(specs: Iterable[Any], *, strict: bool = True) -> str | None:
    """Why the links ``specs`` cannot be emulated on this host as asked (``None``: they can).

    Args:
        specs: the :class:`~commgym.env.net.plan.NetworkSpec` links a network may put in
            force (a plan's ``specs``).
        strict: delay, jitter or loss that this kernel cannot emulate (no sch_netem) is a
            problem; ``False``: they are dropped later with a warning, so only missing
            privileges, tools or kernel features are.

    Returns:
        One sentence naming what is missing, or ``None``.
    """
    features = probe_host()
    if not features.ok:
        return f"network emulation is unavailable here: {features.reason}"
    asked = [str(s) for s in specs if s.has_impairments]
    if strict and asked and not features.netem:
        return (
            f"network spec {', '.join(asked)} asks for delay/jitter/loss but "
            f"{features.netem_reason}"
        )
    return None


def host_check(specs: Iterable[Any], strict: bool = True) -> tuple[str, str] | None:
    """The one check a network plan passes before anything runs: ``(kind, why)`` or ``None``.

    ``kind`` is ``"host"`` when this host cannot emulate the links at all (privileges,
    tools, kernel features) and ``"impairments"`` when only their delay, jitter or loss
    cannot be emulated (no sch_netem; checked only when ``strict``). Callers word the fix
    for their own users (the env: ``network_strict``; the CLI: ``--drop-impairments``).

    Args:
        specs: the links a network may put in force (a plan's ``specs``).
        strict: delay/jitter/loss without sch_netem is a problem.
    """
    problem = emulation_problem(specs, strict=False)
    if problem:
        return "host", problem
    problem = emulation_problem(specs) if strict else None
    return ("impairments", problem) if problem else None
