"""The emulated cluster network: a bridge plus one shaped network namespace per rank."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import sys
import time
import warnings
import weakref
from pathlib import Path

from commgym.env.net.host import (
    PREFIX_RE,
    STATE_DIR,
    check_privileges,
    check_tools,
    probe_host,
    run_tool,
    tbf_burst_bytes,
)
from commgym.env.net.plan import NetworkSpec
from commgym.env.net.records import pick_subnet, proc_start_time, state_lock

# ------------------------------------------------------------------------ the topology


def _teardown(name: str, world_size: int, owner_pid: int) -> None:
    """Deletes everything instance ``name`` may have created (idempotent, best effort)."""
    if os.getpid() != owner_pid:  # a forked child must not tear down its parent's network
        return
    for k in range(world_size):
        run_tool(["ip", "netns", "del", f"{name}-r{k}"], check=False)
    for k in range(world_size):
        if Path(f"/sys/class/net/{name}-v{k}").exists():
            run_tool(["ip", "link", "del", f"{name}-v{k}"], check=False)
        if Path(f"/sys/class/net/{name}-p{k}").exists():
            run_tool(["ip", "link", "del", f"{name}-p{k}"], check=False)
    if Path(f"/sys/class/net/{name}-br").exists():
        run_tool(["ip", "link", "del", f"{name}-br"], check=False)
    with contextlib.suppress(OSError):
        (STATE_DIR / f"{name}.json").unlink()


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
        if not PREFIX_RE.fullmatch(prefix):
            raise ValueError(
                f"name_prefix must be 1-3 lowercase letters/digits starting with a letter "
                f"(interface names are limited to 15 characters), got {prefix!r}"
            )
        if not 576 <= mtu <= 65535:
            raise ValueError(f"mtu must be in 576..65535, got {mtu}")
        spec = NetworkSpec.parse(spec)
        problem = check_tools()
        if problem:
            raise RuntimeError(problem)
        problem = check_privileges()
        if problem:
            raise PermissionError(problem)
        features = probe_host()
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
            with state_lock():
                self.subnet = pick_subnet()
                record = {
                    "pid": os.getpid(),
                    "start_time": proc_start_time(os.getpid()),
                    "subnet": str(self.subnet),
                    "world_size": world_size,
                    "created": time.time(),
                }
                (STATE_DIR / f"{self.name}.json").write_text(json.dumps(record))
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

    def torchrun_commands(
        self, worker: list[str], env: dict[str, str], *, rdzv_port: int = 29400
    ) -> list[tuple[list[str], dict[str, str]]]:
        """One torchrun agent per namespace: the multi-node launch on one machine.

        Args:
            worker: what torchrun runs, e.g. ``["-m", "commgym.env.worker", ...]``.
            env: the agents' environment (each gets ``GLOO_SOCKET_IFNAME`` added).
            rdzv_port: c10d rendezvous port on rank 0's namespace address.

        Returns:
            Per rank ``(argv, env)`` for ``subprocess.Popen``.
        """
        rdzv = f"{self.ns_address(0)}:{rdzv_port}"
        out = []
        for k in range(self.world_size):
            cmd = [
                *self.exec_prefix(k), sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(self.world_size), "--nproc-per-node", "1",
                "--node-rank", str(k), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv, "--rdzv-id", self.name,
                # rank 0's agent hosts the store (its address lives in a namespace,
                # which torch's local-address check cannot see)
                "--rdzv-conf", f"is_host={int(k == 0)}",
                "--local-addr", self.ns_address(k),
                "--max-restarts", "0", "--monitor-interval", "0.2", *worker,
            ]  # fmt: skip
            out.append((cmd, dict(env, GLOO_SOCKET_IFNAME=self.interfaces(k)[1])))
        return out

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
        bridge_side = run_tool(["tc", "qdisc", "show", "dev", v]).stdout
        ns_side = run_tool(["tc", "-n", self.namespaces[rank], "qdisc", "show", "dev", p]).stdout
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
        why = probe_host().netem_reason
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
        run_tool(
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
        run_tool(["ip", "addr", "add", f"{self.bridge_address}/24", "dev", br])
        run_tool(["ip", "link", "set", br, "up"])

    def _create_rank(self, k: int) -> None:
        ns = self.namespaces[k]
        v, p = self.interfaces(k)
        run_tool(["ip", "netns", "add", ns])
        run_tool(
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
        run_tool(["ip", "link", "set", v, "master", self.bridge_name])
        run_tool(["ip", "link", "set", v, "up"])
        run_tool(["ip", "-n", ns, "link", "set", "lo", "up"])
        run_tool(["ip", "-n", ns, "addr", "add", f"{self.ns_address(k)}/24", "dev", p])
        run_tool(["ip", "-n", ns, "link", "set", p, "up"])

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
                    run_tool(
                        [*tc, verb, "dev", dev, "root", "handle", "1:", *self._netem_args(spec)]
                    )
                    run_tool(
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
                    run_tool([*tc, verb, "dev", dev, "root", "handle", "1:", *self._tbf_args(spec)])
