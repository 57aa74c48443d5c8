"""Network emulation for emulated multi-node clusters: namespaces, a bridge and tc shaping.

An :class:`EmulatedNetwork` builds a star topology on one Linux host::

            root namespace
      ┌──────── bridge <prefix><id>-br (10.a.b.1/24) ────────┐
      │ <prefix><id>-v0                    <prefix><id>-v1   │   <- bridge-side veths
      │                                                      │
      │ <prefix><id>-p0                    <prefix><id>-p1   │   <- namespace-side veths
    netns <prefix><id>-r0 (10.a.b.2)    netns <prefix><id>-r1 (10.a.b.3)  ...

Every rank's veth is shaped in **both directions** (the namespace-side egress carries
rank -> switch, the bridge-side egress carries switch -> rank), like a full-duplex NIC
plugged into a non-blocking switch. A :class:`NetworkSpec` describes the *end-to-end*
path between two ranks, so each of the two hops a rank-to-rank packet crosses gets half
of it:

* rate: every hop is shaped to ``rate_bit_s`` (a rank's uplink is shared by all its
  peers, as on a real NIC);
* delay / jitter: each hop gets ``delay_s / 2`` and ``jitter_s / 2``, so the one-way
  rank-to-rank latency is ``delay_s`` and the ping RTT between ranks is ``2 * delay_s``
  (traffic between a rank and the bridge address crosses one hop only: half of that);
* loss: each hop drops with ``1 - sqrt(1 - loss_frac)`` so the end-to-end loss is
  ``loss_frac``.

Shaping backends (chosen by probing the kernel once per process):

* ``"netem"`` (kernels with ``CONFIG_NET_SCH_NETEM``): ``root handle 1: netem delay D J
  loss L limit N`` with a child ``parent 1:1 handle 10: tbf rate R burst B latency 10ms``.
  netem's own ``rate`` option is not used: tbf is the well-understood token bucket and
  it segments GSO super-packets, which keeps 1 Gbit/s+ reachable on veths.
* ``"tbf"`` (kernels without sch_netem, e.g. minimal VM kernels): ``root handle 1: tbf``
  only. Delay, jitter and loss cannot be emulated in-kernel without netem, so a spec
  asking for them raises :class:`RuntimeError` unless the network was created with
  ``strict=False`` (then they are ignored with a warning and
  :attr:`EmulatedNetwork.effective_spec` shows what is really applied).

tbf burst sizing: ``burst = max(rate_bytes / HZ, 128 KiB, 10 * MTU)`` with HZ taken as
250 (the common ``CONFIG_HZ``; tbf uses high-resolution timers on current kernels, so
this is a conservative lower bound). The 128 KiB floor keeps a 64 KiB GSO super-packet
(and its successor) in one token refill, so tbf does not segment every packet in
software; over a 1 s measurement the burst contributes < 1 % rate error at 100 Mbit/s.
The tbf queue holds 10 ms at the configured rate (``latency 10ms``).

Naming (the pattern :func:`cleanup_leftovers` matches; all names are <= 15 characters):
``<prefix><id>-br`` (bridge), ``<prefix><id>-v<k>`` / ``<prefix><id>-p<k>`` (veths) and
``<prefix><id>-r<k>`` (namespaces), where ``<prefix>`` is 1-3 lowercase letters/digits
starting with a letter (default ``"cg"``), ``<id>`` is 6 lowercase hex digits and ``<k>``
is the rank. Probe namespaces are ``cg<id>-probe<pid>``. Every instance writes an owner
record ``/run/commgym-netem/<prefix><id>.json`` (pid and process start time) *before*
creating anything, so leftovers of dead processes can be told from live instances.

Requirements: root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 (``ip``, ``tc``), kernel
support for network namespaces, veth, bridge and tbf. :func:`netem_available` reports
whether the emulator can run here and :func:`delay_available` whether delay/jitter/loss
can be emulated.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import decimal
import fcntl
import functools
import ipaddress
import itertools
import json
import math
import os
import random
import re
import secrets
import shutil
import subprocess
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "PROFILES",
    "EmulatedNetwork",
    "NetworkSchedule",
    "NetworkSpec",
    "choose_profile",
    "cleanup_leftovers",
    "delay_available",
    "netem_available",
]

#: Named network profiles (values are spec strings; see :meth:`NetworkSpec.parse`).
#:
#: * ``datacenter-25g``: 25 GbE inside one rack: ~20 us one-way through one ToR switch.
#: * ``cloud-10g``: a typical cloud VM NIC (10 Gbit/s) where the virtual network adds
#:   ~100 us one-way with noticeable jitter.
#: * ``ethernet-1g``: commodity 1 GbE office/lab cluster, ~200 us one-way (host stacks +
#:   a store-and-forward switch).
#: * ``wan-100m``: cross-site / federated setting: 100 Mbit/s, 10 ms one-way, 1 ms
#:   jitter and 0.01 % loss.
PROFILES: dict[str, str] = {
    "datacenter-25g": "25gbit:20us",
    "cloud-10g": "10gbit:100us:jitter=20us",
    "ethernet-1g": "1gbit:200us",
    "wan-100m": "100mbit:10ms:jitter=1ms:loss=0.01%",
}

_SPEC_FORMS = (
    "valid forms: RATE[:DELAY][:jitter=DURATION][:loss=PERCENT%] with RATE in "
    "bit/kbit/mbit/gbit/tbit (decimal SI, e.g. 1gbit, 2.5gbit), DELAY/DURATION in s/ms/us "
    "(e.g. 5ms, 200us), loss as a percentage (e.g. loss=0.1%); or a profile name: "
    + ", ".join(sorted(PROFILES))
)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BYTE_RATE_UNITS = ("bps", "kbps", "mbps", "gbps", "tbps", "kibps", "mibps", "gibps")
_TIME_UNITS = {
    "s": decimal.Decimal(1),
    "ms": decimal.Decimal("1e-3"),
    "us": decimal.Decimal("1e-6"),
}
_NUM = r"(\d+(?:\.\d+)?|\.\d+)"


def _parse_rate(text: str, spec: str) -> int:
    m = re.fullmatch(_NUM + r"([a-z]+)", text.strip().lower())
    if m is None:
        raise ValueError(f"bad rate {text!r} in network spec {spec!r}; {_SPEC_FORMS}")
    value, unit = decimal.Decimal(m.group(1)), m.group(2)
    if unit in _BYTE_RATE_UNITS:
        raise ValueError(
            f"ambiguous rate unit {unit!r} in network spec {spec!r}: tc reads 'bps' as "
            f"bytes/s while people usually mean bits/s; write it in bits, e.g. "
            f"'{m.group(1)}{unit[:-3] or ''}bit' (or multiply by 8); {_SPEC_FORMS}"
        )
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {unit!r} in network spec {spec!r}; {_SPEC_FORMS}")
    rate = int((value * _RATE_UNITS[unit]).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    if rate <= 0:
        raise ValueError(f"rate must be positive in network spec {spec!r}; {_SPEC_FORMS}")
    return rate


def _parse_duration(text: str, spec: str, what: str) -> float:
    m = re.fullmatch(_NUM + r"(s|ms|us)", text.strip().lower())
    if m is None:
        raise ValueError(
            f"bad {what} {text!r} in network spec {spec!r} (a unit s/ms/us is required); "
            f"{_SPEC_FORMS}"
        )
    return float(decimal.Decimal(m.group(1)) * _TIME_UNITS[m.group(2)])


def _parse_loss(text: str, spec: str) -> float:
    m = re.fullmatch(_NUM + r"%", text.strip())
    if m is None:
        raise ValueError(
            f"bad loss {text!r} in network spec {spec!r} (a percentage like 0.1% is "
            f"required); {_SPEC_FORMS}"
        )
    return float(decimal.Decimal(m.group(1)) / 100)


def _fmt_rate(rate: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if rate % _RATE_UNITS[unit] == 0:
            return f"{rate // _RATE_UNITS[unit]}{unit}"
    return f"{rate}bit"


def _fmt_decimal(value: decimal.Decimal) -> str:
    text = format(value.normalize(), "f")
    return text


def _fmt_duration(seconds: float) -> str:
    value = decimal.Decimal(repr(seconds))
    for unit in ("s", "ms"):
        scaled = value / _TIME_UNITS[unit]
        if scaled >= 1 and scaled == scaled.to_integral_value():
            return f"{_fmt_decimal(scaled)}{unit}"
    return f"{_fmt_decimal(value / _TIME_UNITS['us'])}us"


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
    """What the network between two ranks looks like (end to end, one direction).

    Attributes:
        rate_bit_s: Link rate in bit/s (every rank's link, both directions).
        delay_s: One-way rank-to-rank latency added by the emulator, in seconds.
        jitter_s: Uniform jitter around ``delay_s`` (at most ``delay_s``), in seconds.
        loss_frac: End-to-end random packet loss probability in ``[0, 1)``.
    """

    rate_bit_s: int
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss_frac: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.rate_bit_s, int) or isinstance(self.rate_bit_s, bool):
            raise ValueError(f"rate_bit_s must be an int, got {self.rate_bit_s!r}")
        if self.rate_bit_s <= 0:
            raise ValueError(f"rate_bit_s must be positive, got {self.rate_bit_s}")
        for field in ("delay_s", "jitter_s", "loss_frac"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, field, float(value))
        if self.jitter_s > self.delay_s:
            raise ValueError(
                f"jitter ({_fmt_duration(self.jitter_s)}) must not exceed delay "
                f"({_fmt_duration(self.delay_s)}): netem would clamp negative delays"
            )
        if self.loss_frac >= 1:
            raise ValueError(f"loss_frac must be < 1 (100%), got {self.loss_frac}")

    @classmethod
    def parse(cls, text: str | NetworkSpec) -> NetworkSpec:
        """Parses a spec string or profile name.

        Args:
            text: ``RATE[:DELAY][:jitter=DUR][:loss=PCT%]`` (e.g. ``"1gbit"``,
                ``"100mbit:5ms"``, ``"10gbit:200us:jitter=50us:loss=0.1%"``), a name in
                :data:`PROFILES`, or a :class:`NetworkSpec` (returned unchanged).

        Returns:
            The parsed spec.

        Raises:
            ValueError: The text is malformed; the message names the spec and the valid
                forms.
        """
        if isinstance(text, NetworkSpec):
            return text
        if not isinstance(text, str):
            raise ValueError(f"network spec must be a string, got {text!r}; {_SPEC_FORMS}")
        spec = text.strip()
        if spec in PROFILES:
            return cls.parse(PROFILES[spec])
        parts = spec.split(":")
        if not spec or any(not p.strip() for p in parts):
            raise ValueError(f"empty field in network spec {text!r}; {_SPEC_FORMS}")
        rate = _parse_rate(parts[0], text)
        values: dict[str, float] = {}
        for i, part in enumerate(parts[1:]):
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep:
                if i != 0:
                    raise ValueError(
                        f"unexpected positional field {part!r} in network spec {text!r} "
                        f"(only the delay may follow the rate without a key); {_SPEC_FORMS}"
                    )
                key, value = "delay", part
            if key in values:
                raise ValueError(f"{key} given twice in network spec {text!r}; {_SPEC_FORMS}")
            if key in ("delay", "jitter"):
                values[key] = _parse_duration(value, text, key)
            elif key == "loss":
                values[key] = _parse_loss(value, text)
            else:
                raise ValueError(f"unknown key {key!r} in network spec {text!r}; {_SPEC_FORMS}")
        try:
            return cls(
                rate,
                values.get("delay", 0.0),
                values.get("jitter", 0.0),
                values.get("loss", 0.0),
            )
        except ValueError as exc:
            raise ValueError(f"invalid network spec {text!r}: {exc}; {_SPEC_FORMS}") from None

    def __str__(self) -> str:
        parts = [_fmt_rate(self.rate_bit_s)]
        if self.delay_s:
            parts.append(_fmt_duration(self.delay_s))
        if self.jitter_s:
            if not self.delay_s:  # unreachable (jitter <= delay) but keep the grammar valid
                parts.append("0s")
            parts.append(f"jitter={_fmt_duration(self.jitter_s)}")
        if self.loss_frac:
            pct = decimal.Decimal(repr(self.loss_frac)) * 100
            parts.append(f"loss={_fmt_decimal(pct)}%")
        return ":".join(parts)

    @property
    def rate_bytes_s(self) -> float:
        """The link rate in bytes per second."""
        return self.rate_bit_s / 8

    def without_impairments(self) -> NetworkSpec:
        """Returns this spec with delay, jitter and loss removed (rate only)."""
        return NetworkSpec(self.rate_bit_s)

    @property
    def has_impairments(self) -> bool:
        """Whether delay, jitter or loss are non-zero (these need sch_netem)."""
        return bool(self.delay_s or self.jitter_s or self.loss_frac)


@dataclasses.dataclass(frozen=True)
class NetworkSchedule:
    """A piecewise-constant network over elapsed training time.

    Attributes:
        entries: ``(start_seconds, spec)`` pairs, strictly increasing, the first at 0.
    """

    entries: tuple[tuple[float, NetworkSpec], ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a network schedule needs at least one (0, spec) entry")
        times = [t for t, _ in self.entries]
        if times[0] != 0:
            raise ValueError(f"a network schedule must start at 0 s, got {times[0]}")
        for prev, cur in itertools.pairwise(times):
            if not cur > prev:
                raise ValueError(f"network schedule times must strictly increase: {times}")

    @classmethod
    def parse(
        cls, items: Iterable[tuple[float, str | NetworkSpec]] | str | NetworkSpec
    ) -> NetworkSchedule:
        """Builds a schedule from ``(elapsed_training_seconds, spec)`` pairs.

        Args:
            items: Pairs like ``[(0, "1gbit"), (30, "100mbit"), (60, "1gbit")]``; a single
                spec string or :class:`NetworkSpec` means a constant network.

        Returns:
            The validated schedule.

        Raises:
            ValueError: Times are not finite numbers >= 0, not strictly increasing, the
                first is not 0, or a spec is malformed.
        """
        if isinstance(items, (str, NetworkSpec)):
            return cls(((0.0, NetworkSpec.parse(items)),))
        entries = []
        for item in items:
            try:
                t, spec = item
            except (TypeError, ValueError):
                raise ValueError(
                    f"network schedule entries must be (seconds, spec) pairs, got {item!r}"
                ) from None
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise ValueError(f"network schedule time must be a finite number, got {t!r}")
            if t < 0:
                raise ValueError(f"network schedule time must be >= 0, got {t!r}")
            entries.append((float(t), NetworkSpec.parse(spec)))
        return cls(tuple(entries))

    def spec_at(self, elapsed_s: float) -> NetworkSpec:
        """Returns the spec in force after ``elapsed_s`` seconds of training."""
        times = [t for t, _ in self.entries]
        i = bisect.bisect_right(times, max(0.0, elapsed_s)) - 1
        return self.entries[i][1]

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def choose_profile(profiles: Sequence[str | NetworkSpec], seed: int | None) -> NetworkSpec:
    """Picks one network per episode, reproducibly.

    Args:
        profiles: Profile names and/or spec strings (all are validated up front).
        seed: Episode seed; the same seed always picks the same entry.

    Returns:
        The chosen spec.

    Raises:
        ValueError: ``profiles`` is empty or an entry is malformed.
    """
    if isinstance(profiles, (str, NetworkSpec)):
        profiles = [profiles]
    specs = [NetworkSpec.parse(p) for p in profiles]
    if not specs:
        raise ValueError("choose_profile needs at least one profile or spec")
    return random.Random(seed).choice(specs)


# --------------------------------------------------------------------------- host checks

_STATE_DIR = Path("/run/commgym-netem")
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,2}")
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21
_CMD_TIMEOUT_S = 15.0
_HZ = 250


def tbf_burst_bytes(rate_bit_s: float, mtu: int = 1500) -> int:
    """Token-bucket depth of each shaped link, bytes (see the module docstring).

    A transfer shorter than this passes at the sender's own speed once the bucket has
    refilled (``burst * 8 / rate`` seconds idle), which is why a per-decision bandwidth
    can read above the configured rate; over a window of ``t`` seconds a link carries at
    most ``rate * t / 8 + burst`` bytes.
    """
    return int(max(rate_bit_s / 8 / _HZ, 128 * 1024, 10 * mtu))


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return -1 if os.geteuid() == 0 else 0


def _check_privileges() -> str | None:
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


def _check_tools() -> str | None:
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (
            "network emulation needs iproute2; not found on PATH: "
            + ", ".join(missing)
            + " (install the 'iproute2' package)"
        )
    return None


def _run(
    args: Sequence[str], *, check: bool = True, timeout: float = _CMD_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
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
class _Features:
    ok: bool
    reason: str
    netem: bool = False
    netem_reason: str = ""


@functools.cache
def _probe() -> _Features:
    problem = _check_tools() or _check_privileges()
    if problem:
        return _Features(False, problem, False, problem)
    ns = f"cg{secrets.token_hex(3)}-probe{os.getpid()}"
    try:
        proc = _run(["ip", "netns", "add", ns], check=False)
        if proc.returncode != 0:
            msg = f"cannot create a network namespace: {proc.stderr.strip()}"
            return _Features(False, msg, False, msg)
        proc = _run(
            ["ip", "-n", ns, "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"],
            check=False,
        )
        if proc.returncode != 0:
            msg = f"cannot create a veth pair (CONFIG_VETH?): {proc.stderr.strip()}"
            return _Features(False, msg, False, msg)
        proc = _run(["ip", "-n", ns, "link", "add", "name", "pbr", "type", "bridge"], check=False)
        if proc.returncode != 0:
            msg = f"cannot create a bridge (CONFIG_BRIDGE?): {proc.stderr.strip()}"
            return _Features(False, msg, False, msg)
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
        proc = _run(tbf, check=False)
        if proc.returncode != 0:
            msg = f"kernel lacks the tbf qdisc (CONFIG_NET_SCH_TBF): {proc.stderr.strip()}"
            return _Features(False, msg, False, msg)
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
        proc = _run(netem, check=False)
        if proc.returncode == 0:
            return _Features(True, "ok: rate, delay, jitter and loss (netem + tbf)", True, "ok")
        why = (
            "kernel lacks the netem qdisc (CONFIG_NET_SCH_NETEM; tc: "
            f"{proc.stderr.strip()}): delay, jitter and loss cannot be emulated"
        )
        return _Features(True, f"ok: rate shaping only (tbf); {why}", False, why)
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def netem_available() -> tuple[bool, str]:
    """Says whether :class:`EmulatedNetwork` can be created on this host.

    The result is probed once per process (in a throw-away namespace). ``True`` means
    namespaces, veths, a bridge and tbf rate shaping work; the message says whether
    delay/jitter/loss (sch_netem) are also available (see :func:`delay_available`).

    Returns:
        ``(available, message)``; the message says what is missing when unavailable.
    """
    features = _probe()
    return features.ok, features.reason


def delay_available() -> tuple[bool, str]:
    """Says whether delay, jitter and loss can be emulated (needs sch_netem).

    Returns:
        ``(available, message)``.
    """
    features = _probe()
    return features.netem, features.netem_reason


# ------------------------------------------------------------------- owner records/locks


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(record: dict) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and _proc_start_time(pid) == record.get("start_time")


@contextlib.contextmanager
def _state_lock():
    _STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(_STATE_DIR / "lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_records() -> dict[str, dict]:
    records = {}
    if not _STATE_DIR.is_dir():
        return records
    for path in _STATE_DIR.glob("*.json"):
        try:
            records[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            records[path.stem] = {}
    return records


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for args in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        out = _run(args, check=False).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", out):
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(token, strict=False))
    for record in _read_records().values():
        with contextlib.suppress(ValueError, TypeError):
            used.append(ipaddress.IPv4Network(record.get("subnet")))
    return used


def _pick_subnet() -> ipaddress.IPv4Network:
    used = [n for n in _used_networks() if n.prefixlen > 0 and not n.is_loopback]
    rng = random.SystemRandom()
    for _ in range(1000):
        net = ipaddress.IPv4Network(f"10.{rng.randint(64, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("could not find a free private 10.x.y.0/24 subnet for the emulated network")


# ------------------------------------------------------------------------ the topology


def _teardown(name: str, world_size: int, owner_pid: int) -> None:
    """Deletes everything instance ``name`` may have created (idempotent, best effort)."""
    if os.getpid() != owner_pid:  # a forked child must not tear down its parent's network
        return
    for k in range(world_size):
        _run(["ip", "netns", "del", f"{name}-r{k}"], check=False)
    for k in range(world_size):
        if Path(f"/sys/class/net/{name}-v{k}").exists():
            _run(["ip", "link", "del", f"{name}-v{k}"], check=False)
        if Path(f"/sys/class/net/{name}-p{k}").exists():
            _run(["ip", "link", "del", f"{name}-p{k}"], check=False)
    if Path(f"/sys/class/net/{name}-br").exists():
        _run(["ip", "link", "del", f"{name}-br"], check=False)
    with contextlib.suppress(OSError):
        (_STATE_DIR / f"{name}.json").unlink()


class EmulatedNetwork:
    """A bridge plus one shaped network namespace per rank (see the module docstring).

    Example::

        with EmulatedNetwork(2, NetworkSpec.parse("1gbit:100us")) as net:
            subprocess.run([*net.exec_prefix(0), "python", "server.py", net.ns_address(0)])
            net.apply(NetworkSpec.parse("100mbit:100us"))   # live, no teardown

    Cleanup: :meth:`close` (also run by ``with``, by garbage collection and at
    interpreter exit via ``weakref.finalize``, whose ``atexit`` hook is on) removes the
    namespaces, veths and the bridge. A forked child never tears down its parent's
    network. After SIGKILL (or a SIGTERM without a handler, which skips ``atexit``),
    :func:`cleanup_leftovers` removes what is left.

    Args:
        world_size: Number of ranks (1..253; rank ``k`` gets host ``.k+2`` of a /24).
        spec: Initial network (a :class:`NetworkSpec`, spec string or profile name).
        name_prefix: 1-3 lowercase letters/digits starting with a letter (default
            ``"cg"``); all names start with it.
        strict: Without sch_netem, a spec with delay/jitter/loss raises ``RuntimeError``
            when ``True``; when ``False`` those are ignored with a warning.
        mtu: MTU of the veths and bridge.

    Raises:
        PermissionError: Not root / lacking CAP_NET_ADMIN + CAP_SYS_ADMIN.
        RuntimeError: ``ip``/``tc`` missing, a kernel feature missing, or a command failed
            (anything half-created is removed first).
        ValueError: Bad arguments.
    """

    def __init__(
        self,
        world_size: int,
        spec: NetworkSpec | str,
        *,
        name_prefix: str | None = None,
        strict: bool = True,
        mtu: int = 1500,
    ) -> None:
        if not isinstance(world_size, int) or not 1 <= world_size <= 253:
            raise ValueError(f"world_size must be an int in 1..253, got {world_size!r}")
        prefix = "cg" if name_prefix is None else name_prefix
        if not _PREFIX_RE.fullmatch(prefix):
            raise ValueError(
                f"name_prefix must be 1-3 lowercase letters/digits starting with a letter "
                f"(interface names are limited to 15 characters), got {prefix!r}"
            )
        if not 576 <= mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {mtu}")
        spec = NetworkSpec.parse(spec)
        problem = _check_tools()
        if problem:
            raise RuntimeError(problem)
        problem = _check_privileges()
        if problem:
            raise PermissionError(problem)
        features = _probe()
        if not features.ok:
            raise RuntimeError(f"network emulation is unavailable: {features.reason}")
        self.world_size = world_size
        self.strict = strict
        self.mtu = mtu
        self.backend = "netem" if features.netem else "tbf"
        self.effective_spec = self._effective(spec)
        self.spec = spec
        self.id = secrets.token_hex(3)
        self.name = f"{prefix}{self.id}"
        self._closed = False
        self._finalizer = weakref.finalize(self, _teardown, self.name, world_size, os.getpid())
        try:
            with _state_lock():
                self.subnet = _pick_subnet()
                record = {
                    "pid": os.getpid(),
                    "start_time": _proc_start_time(os.getpid()),
                    "subnet": str(self.subnet),
                    "world_size": world_size,
                    "created": time.time(),
                }
                (_STATE_DIR / f"{self.name}.json").write_text(json.dumps(record))
                self._create_bridge()
            for k in range(world_size):
                self._create_rank(k)
            self._shape(self.effective_spec, "add")
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- public accessors
    @property
    def bridge_name(self) -> str:
        """The bridge interface in the root namespace."""
        return f"{self.name}-br"

    @property
    def bridge_address(self) -> str:
        """The bridge's IPv4 address (host ``.1``), reachable from every namespace."""
        return str(self.subnet.network_address + 1)

    @property
    def namespaces(self) -> list[str]:
        """Namespace names, index = rank."""
        return [f"{self.name}-r{k}" for k in range(self.world_size)]

    def ns_address(self, rank: int) -> str:
        """Returns rank ``rank``'s IPv4 address (host ``.rank+2``)."""
        self._check_rank(rank)
        return str(self.subnet.network_address + rank + 2)

    def exec_prefix(self, rank: int) -> list[str]:
        """Returns the argv prefix that runs a command inside rank ``rank``'s namespace."""
        self._check_rank(rank)
        return ["ip", "netns", "exec", self.namespaces[rank]]

    def interfaces(self, rank: int) -> tuple[str, str]:
        """Returns ``(bridge_side_veth, namespace_side_veth)`` names of rank ``rank``."""
        self._check_rank(rank)
        return f"{self.name}-v{rank}", f"{self.name}-p{rank}"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def describe(self) -> dict:
        """Returns a JSON-able summary (for logging)."""
        return {
            "name": self.name,
            "backend": self.backend,
            "world_size": self.world_size,
            "subnet": str(self.subnet),
            "spec": str(self.spec),
            "effective_spec": str(self.effective_spec),
            "namespaces": self.namespaces,
        }

    # ------------------------------------------------------------------------ shaping
    def apply(self, spec: NetworkSpec | str) -> NetworkSpec:
        """Changes the shaping of every link live (``tc qdisc change``, no teardown).

        Args:
            spec: The new network.

        Returns:
            The effective spec now applied (differs from ``spec`` only on the tbf
            backend with ``strict=False``).

        Raises:
            RuntimeError: The network is closed, or the spec needs netem on the tbf
                backend with ``strict=True``.
        """
        if self._closed:
            raise RuntimeError(f"emulated network {self.name} is closed")
        spec = NetworkSpec.parse(spec)
        effective = self._effective(spec)
        self._shape(effective, "change")
        self.spec, self.effective_spec = spec, effective
        return effective

    def qdiscs(self, rank: int) -> tuple[str, str]:
        """Returns ``tc qdisc show`` output of rank ``rank``'s two veths (for debugging)."""
        v, p = self.interfaces(rank)
        bridge_side = _run(["tc", "qdisc", "show", "dev", v]).stdout
        ns_side = _run(["tc", "-n", self.namespaces[rank], "qdisc", "show", "dev", p]).stdout
        return bridge_side, ns_side

    def close(self) -> None:
        """Removes the namespaces, veths, bridge and owner record (idempotent)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> EmulatedNetwork:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else str(self.subnet)
        return (
            f"EmulatedNetwork({self.world_size}, {str(self.effective_spec)!r}, "
            f"name={self.name!r}, backend={self.backend!r}, {state})"
        )

    # ---------------------------------------------------------------------- internals
    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank!r}")

    def _effective(self, spec: NetworkSpec) -> NetworkSpec:
        if self.backend == "netem" or not spec.has_impairments:
            return spec
        why = _probe().netem_reason
        if self.strict:
            raise RuntimeError(
                f"network spec {str(spec)!r} asks for delay/jitter/loss but {why}; use a "
                f"rate-only spec or EmulatedNetwork(..., strict=False) to ignore them"
            )
        warnings.warn(
            f"ignoring delay/jitter/loss of network spec {str(spec)!r}: {why}",
            RuntimeWarning,
            stacklevel=3,
        )
        return spec.without_impairments()

    def _create_bridge(self) -> None:
        br = self.bridge_name
        _run(
            [
                "ip",
                "link",
                "add",
                "name",
                br,
                "mtu",
                str(self.mtu),
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
            ]
        )
        _run(["ip", "addr", "add", f"{self.bridge_address}/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])

    def _create_rank(self, k: int) -> None:
        ns = self.namespaces[k]
        v, p = self.interfaces(k)
        _run(["ip", "netns", "add", ns])
        _run(
            [
                "ip",
                "link",
                "add",
                "name",
                v,
                "mtu",
                str(self.mtu),
                "type",
                "veth",
                "peer",
                "name",
                p,
                "mtu",
                str(self.mtu),
                "netns",
                ns,
            ]
        )
        _run(["ip", "link", "set", v, "master", self.bridge_name])
        _run(["ip", "link", "set", v, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.ns_address(k)}/24", "dev", p])
        _run(["ip", "-n", ns, "link", "set", p, "up"])

    def _tbf_args(self, spec: NetworkSpec) -> list[str]:
        burst = tbf_burst_bytes(spec.rate_bit_s, self.mtu)
        return ["tbf", "rate", f"{spec.rate_bit_s}bit", "burst", str(burst), "latency", "10ms"]

    def _netem_args(self, spec: NetworkSpec) -> list[str]:
        delay_us = spec.delay_s / 2 * 1e6
        jitter_us = spec.jitter_s / 2 * 1e6
        args = ["netem", "limit", "100000", "delay", f"{delay_us:.3f}us"]
        if jitter_us:
            args.append(f"{jitter_us:.3f}us")
        hop_loss = 1 - math.sqrt(1 - spec.loss_frac)
        args += ["loss", "random", f"{hop_loss * 100:.6f}%"]
        return args

    def _shape(self, spec: NetworkSpec, verb: str) -> None:
        for k, ns in enumerate(self.namespaces):
            v, p = self.interfaces(k)
            for tc in (["tc", "qdisc"], ["tc", "-n", ns, "qdisc"]):
                dev = v if len(tc) == 2 else p
                if self.backend == "netem":
                    _run([*tc, verb, "dev", dev, "root", "handle", "1:", *self._netem_args(spec)])
                    _run(
                        [
                            *tc,
                            verb,
                            "dev",
                            dev,
                            "parent",
                            "1:1",
                            "handle",
                            "10:",
                            *self._tbf_args(spec),
                        ]
                    )
                else:
                    _run([*tc, verb, "dev", dev, "root", "handle", "1:", *self._tbf_args(spec)])


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
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"bad prefix {prefix!r}: 1-3 lowercase letters/digits")
    problem = _check_tools() or _check_privileges()
    if problem:
        raise PermissionError(problem)
    group = re.escape(prefix) + r"[0-9a-f]{6}"
    ns_re = re.compile(rf"({group})-(?:r\d{{1,4}}|probe(\d+))")
    link_re = re.compile(rf"({group})-(?:br|v\d{{1,4}}|p\d{{1,4}})")
    found: dict[str, list[tuple[str, str]]] = {}
    removed: list[str] = []
    for line in _run(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = ns_re.fullmatch(name)
        if m and m.group(2):  # a probe namespace: its owner pid is in the name
            if include_live or _proc_start_time(int(m.group(2))) is None:
                if _run(["ip", "netns", "del", name], check=False).returncode == 0:
                    removed.append(name)
        elif m:
            found.setdefault(m.group(1), []).append(("netns", name))
    for line in _run(["ip", "-o", "link", "show"]).stdout.splitlines():
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
                proc = _run(["ip", "netns", "del", name], check=False)
            else:
                if not Path(f"/sys/class/net/{name}").exists():
                    removed.append(name)  # vanished with its namespace's peer
                    continue
                proc = _run(["ip", "link", "del", name], check=False)
            if proc.returncode == 0:
                removed.append(name)
        with contextlib.suppress(OSError):
            (_STATE_DIR / f"{group_name}.json").unlink()
    # owner records of dead processes with nothing left
    for group_name, record in records.items():
        if (
            re.fullmatch(group, group_name)
            and group_name not in found
            and (include_live or not _owner_alive(record))
        ):
            with contextlib.suppress(OSError):
                (_STATE_DIR / f"{group_name}.json").unlink()
    return removed
