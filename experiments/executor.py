"""Where real episodes run: embedded in this process, or on env actors of a Ray cluster.

``--executor local`` (the default) is the embedded path every command has always taken:
one env in this process, its ranks on this machine, one episode after another. With
``--executor ray [--ray-address ADDR]`` (:class:`RayExecutor`) the independent cells of a
command (an agent's episode on one seed, an oracle's menu entry on one seed, a baseline's
tuning, a stream of recorded decisions) run in parallel on env actors
(:class:`~commgym.agents.ray_env.EnvActors`: one ``commgym/AllReduce-v1`` env per actor,
its ranks' CPUs reserved, placed with ``STRICT_PACK``). Each episode cell runs THE rollout
(:func:`~commgym.agents.rollout.rollout`) and sends back its
:class:`~commgym.agents.rollout.Episode` with what the env reported at every step, so the
driver, the only writer, logs the same MLflow child runs, CSVs, tables and figures as the
local path, in the same order. Placement and queueing are Ray's (placement groups; the
actors pick up the next cell as they finish); nothing here schedules beyond keeping every
actor busy.

An agent travels to the actors as its policy file (``Agent.save``): every cell loads it
afresh, so each (agent, seed) cell plays from the agent's state as prepared, whichever
actor runs it. Agents whose state moves from episode to episode (``random``: its
generator continues in the local path) therefore play other draws on Ray; deterministic
agents (static presets, learned policies, tuned baselines) play the same episodes.

Faults: an actor (or its node) that dies inside an episode makes that episode a failure
(``reason == "failure"``, ``final_info["failure"]`` says why) and the sweep goes on, on
the actor Ray restarts (it first kills what its dead incarnation left, see
:class:`~commgym.agents.ray_env.EnvRunner`); an actor that cannot come back is dropped
and its node cleaned by the driver. Leaving the executor on Ctrl-C or SIGTERM kills every
actor at once and cleans every node it used (:func:`~commgym.agents.ray_env.cleanup_nodes`);
a local Ray instance started for the run is shut down.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commgym.agents.ray_env import (
    RESTART_TIMEOUT_S,
    EnvActors,
    actor_resources,
    cleanup_nodes,
    import_ray,
)
from commgym.agents.rollout import Episode, rollout

__all__ = [
    "PlayedEpisode",
    "RayExecutor",
    "bootstrap_address",
    "failed_episode",
    "load_policy",
    "on_loopback",
    "open_executor",
    "play_episode",
    "policy_bytes",
    "tune_agent",
    "unreachable",
]

#: Set to "0" for a Ray instance on loopback: it then binds and advertises 127.0.0.1 only,
#: and a driver connects to 127.0.0.1 as given (see :func:`on_loopback`).
LOOPBACK_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

#: Signals whose handlers survive ``ray.init`` (see :class:`RayExecutor`).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class PlayedEpisode:
    """One episode played by an env actor, with what the driver needs to log it.

    Attributes:
        episode: the rollout's record (``reason == "failure"`` when the actor died).
        transitions: per ``env.step``: ``(action, reward, terminated, truncated, info)``,
            what :class:`~commgym.experiments.tracking.TrackingWrapper` logs.
        node_id: the Ray node the episode ran on.
        actor: the env actor's tag.
        actor_s: wall seconds inside the actor (policy loaded, rollout played).
        wall_s: wall seconds from the driver's submission to the result.
    """

    episode: Episode
    transitions: list[tuple[Any, float, bool, bool, dict[str, Any]]] = field(repr=False)
    node_id: str
    actor: str
    actor_s: float
    wall_s: float = math.nan


def policy_bytes(agent: Any) -> bytes:
    """The agent's policy file (``agent.save``), as bytes to send to an actor."""
    with tempfile.TemporaryDirectory(prefix="commgym-policy-") as tmp:
        return Path(agent.save(Path(tmp) / "policy.zip")).read_bytes()


def load_policy(env: Any, policy: bytes) -> Any:
    """The agent of a policy file's bytes (:func:`policy_bytes`), acting in ``env``."""
    from commgym.agents import load_agent

    with tempfile.TemporaryDirectory(prefix="commgym-policy-") as tmp:
        path = Path(tmp) / "policy.zip"
        path.write_bytes(policy)
        return load_agent(path, env=env)


def _node_id() -> str:
    return import_ray().get_runtime_context().get_node_id()


def play_episode(
    env: Any, policy: bytes, seed: int, target_loss: float | None, tag: str = ""
) -> PlayedEpisode:
    """An episode cell (runs in an env actor): load the policy, play THE rollout.

    Args:
        env: the actor's env.
        policy: the agent's policy file (:func:`policy_bytes`).
        seed: the episode's seed.
        target_loss: passed to the rollout.
        tag: the actor's tag, echoed in the result.
    """
    t0 = time.perf_counter()
    agent = load_policy(env, policy)
    steps: list[tuple[Any, float, bool, bool, dict[str, Any]]] = []

    def keep(step: dict[str, Any]) -> None:
        steps.append(
            (step["action"], step["reward"], step["terminated"], step["truncated"], step["info"])
        )

    episode = rollout(env, agent, seed, target_loss=target_loss, on_step=keep)
    return PlayedEpisode(episode, steps, _node_id(), tag, time.perf_counter() - t0)


def failed_episode(seed: int | None, why: str) -> Episode:
    """The record of an episode lost with its actor or node: ``reason == "failure"``."""
    return Episode(
        seed=seed,
        decisions=0,
        train_time_s=0.0,
        time_to_target_s=None,
        final_eval_loss=math.nan,
        final_eval_acc=math.nan,
        bytes_per_step=0.0,
        episode_return=0.0,
        reason="failure",
        final_info={"failure": why, "reason": "failure"},
    )


def tune_agent(env: Any, name: str, kwargs: dict[str, Any], decisions: int) -> tuple[bytes, float]:
    """A tuning cell (runs in an env actor): build ``name``, learn ``decisions`` real decisions.

    Returns:
        ``(policy file bytes, tuning wall seconds)``.
    """
    from commgym.agents import make_agent

    agent = make_agent(name, env, **kwargs)
    t0 = time.perf_counter()
    agent.learn(decisions)
    return policy_bytes(agent), time.perf_counter() - t0


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


def _config_key(config: Any) -> str:
    return json.dumps(config.to_dict(), sort_keys=True, default=str)


class RayExecutor:
    """Cells of a command on env actors of a Ray cluster (``--executor ray``).

    Connects on construction, as ``ray.init`` does: ``address`` (``"auto"``,
    ``HOST:PORT``, ``ray://...``), else ``$RAY_ADDRESS``, else a local Ray instance for
    this run, bound to 127.0.0.1 without the dashboard. Use it as a context manager:
    leaving it closes every env actor (killing them at once when an exception, Ctrl-C or
    SIGTERM, is on its way) and shuts down a local instance it started.

    Args:
        address: the Ray cluster (see above).
        envs: env actors per env configuration (``None``: as many as the cluster's CPUs
            hold, at most one per cell).
        resources: what each env actor reserves (default: its ranks' CPUs,
            :func:`~commgym.agents.ray_env.actor_resources`).
        num_cpus: logical CPUs of a local instance started here (``None``: the machine's).

    Raises:
        ModuleNotFoundError: Ray is not installed.
    """

    def __init__(
        self,
        address: str | None = None,
        envs: int | None = None,
        *,
        resources: dict[str, float] | None = None,
        num_cpus: int | None = None,
    ) -> None:
        address = address or os.environ.get("RAY_ADDRESS") or None
        if (address is None or on_loopback(address)) and "ray" not in sys.modules:
            # Ray rewrites 127.0.0.1 to the host's routable address (and a local instance
            # listens on every interface) unless clusters are off: a local instance needs
            # neither, and a driver joining a cluster that listens on loopback only would
            # knock on the routable address forever
            os.environ.setdefault(LOOPBACK_VARIABLE, "0")
        ray = import_ray()
        self.started = False
        # Ray's core worker installs its own SIGTERM handler (it aborts the process): the
        # command's handlers (Ctrl-C's cleanup for SIGTERM/SIGHUP) are put back after init
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        if not ray.is_initialized():
            if address is None:
                ray.init(
                    _node_ip_address="127.0.0.1",
                    include_dashboard=False,
                    num_cpus=num_cpus,
                    logging_level="WARNING",
                )
                self.started = True
            else:
                try:
                    why = unreachable(address)
                    if why is not None:
                        raise ConnectionError(
                            f"nothing answers at {bootstrap_address(address)}: {why}"
                        )
                    ray.init(address=address, logging_level="WARNING")
                except ConnectionError as err:
                    raise ValueError(
                        f"cannot connect to the Ray cluster at {address!r} ({err}); start one "
                        "with `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head "
                        "--node-ip-address 127.0.0.1`, or omit --ray-address for a local Ray "
                        "instance"
                    ) from None
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        self.envs = envs
        self.resources = resources
        self._pools: dict[str, list[EnvActors]] = {}
        #: actor tag -> node id, filled as actors come up
        self.nodes: dict[str, str] = {}
        #: actor tag -> why it could not come back (dropped actors)
        self.lost: dict[str, str] = {}
        #: actor tag -> (restart probe, handle, deadline) of actors Ray is restarting
        self._restarting: dict[str, tuple[Any, Any, float]] = {}

    # -- actors ---------------------------------------------------------------------
    def summary(self, config: Any) -> str:
        """One line: the cluster, and the env actors ``config`` gets there."""
        ray = import_ray()
        total = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        need = self.resources or actor_resources(config)
        n = self.envs if self.envs is not None else self.capacity(config)
        where = "a local Ray instance" if self.started else "the Ray cluster"
        net = "an emulated network each" if config.network_plan.emulated else "loopback"
        return (
            f"executor: ray, {where} ({nodes} node(s), {total.get('CPU', 0):g} CPUs); up to "
            f"{n} env actor(s) of {config.world_size} ranks on {net}, each reserving {need}"
        )

    def capacity(self, config: Any) -> int:
        """Env actors of ``config`` the whole cluster holds (at least 1)."""
        ray = import_ray()
        need = self.resources or actor_resources(config)
        total = ray.cluster_resources()
        fits = min(int(total.get(k, 0.0) // v) for k, v in need.items() if v > 0)
        return max(1, fits)

    def actors(self, config: Any, wanted: int) -> list[tuple[Any, str]]:
        """``(handle, tag)`` of the usable env actors of ``config``, grown up to ``wanted``.

        At most ``envs`` (or the cluster's :meth:`capacity`) exist per configuration;
        they live until :meth:`release` or :meth:`close`. Actors that died and are being
        restarted by Ray are left out until they answer again; actors that could not come
        back (:attr:`lost`) are left out for good.
        """
        ray = import_ray()
        self._settle_restarts()
        pools = self._pools.setdefault(_config_key(config), [])
        have = sum(1 for p in pools for t in p.tags if t not in self.lost)
        limit = self.envs if self.envs is not None else self.capacity(config)
        if have < min(wanted, limit):
            group = EnvActors(config, min(wanted, limit) - have, resources=self.resources)
            pools.append(group)
            try:
                where = ray.get([a.describe.remote() for a in group.actors])
            except BaseException:
                group.kill()
                raise
            self.nodes.update({d["tag"]: d["node_id"] for d in where})
        return [
            (a, t)
            for p in pools
            for a, t in zip(p.actors, p.tags, strict=True)
            if t not in self.lost and t not in self._restarting
        ]

    def release(self, config: Any) -> None:
        """Close the env actors of ``config`` (their ranks and networks go with them)."""
        for group in self._pools.pop(_config_key(config), []):
            for tag in group.tags:
                self._restarting.pop(tag, None)
            group.close()

    # -- actors that died -------------------------------------------------------------
    def _await_restart(self, actor: Any, tag: str) -> None:
        """Watch a dead actor: Ray restarts it (``max_restarts``); a probe says when it is up.

        The probe (:meth:`EnvRunner.describe`) waits in Ray's queue while the actor
        restarts, so no cell waits for it: the other actors go on with the sweep. An actor
        not back within :data:`RESTART_TIMEOUT_S` (say, no node has room for its placement
        group) is dropped.
        """
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        self._restarting[tag] = (actor.describe.remote(), actor, deadline)

    def _drop(self, tag: str, why: str) -> None:
        """Give up on a dead actor: no more restarts, and the driver cleans every node."""
        ray = import_ray()
        _, actor, _ = self._restarting.pop(tag)
        self.lost[tag] = why
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        cleanup_nodes([tag])

    def _settle_restarts(self) -> list[tuple[Any, str]]:
        """Resolve the restart probes that answered, drop actors past their deadline.

        Returns:
            ``(handle, tag)`` of the actors that are back.
        """
        ray = import_ray()
        from ray.exceptions import ActorUnavailableError

        back = []
        for tag, (probe, actor, deadline) in list(self._restarting.items()):
            if not ray.wait([probe], num_returns=1, timeout=0)[0]:
                if time.monotonic() > deadline:
                    self._drop(tag, f"not back within {RESTART_TIMEOUT_S:.0f} s")
                continue
            try:
                where = ray.get(probe)
            except ActorUnavailableError:  # still restarting: ask again
                time.sleep(0.2)
                self._restarting[tag] = (actor.describe.remote(), actor, deadline)
                continue
            except Exception as err:
                self._drop(tag, f"{type(err).__name__}: {' '.join(str(err).split())[:300]}")
                continue
            del self._restarting[tag]
            self.nodes[tag] = where["node_id"]
            back.append((actor, tag))
        return back

    # -- cells ----------------------------------------------------------------------
    def run(
        self,
        config: Any,
        fn: Callable[..., Any],
        jobs: Sequence[tuple[Any, ...]],
        *,
        on_lost: Callable[[int, str, str], Any] | None = None,
        with_tag: bool = False,
    ) -> Iterator[tuple[int, Any]]:
        """Run ``fn(env, *job)`` for every job on the env actors of ``config``.

        Every actor takes the next job as soon as it is free; results are yielded in job
        order as soon as all earlier ones are in, so the caller logs them in the order
        the local path does. An actor that dies inside a job is restarted by Ray and takes
        jobs again once it answers; meanwhile the other actors go on.

        Args:
            config: the env configuration (its actors are created on first use).
            fn: a module-level function (sent by reference) taking the env first.
            jobs: argument tuples.
            on_lost: ``on_lost(index, why, tag)`` gives the result of a job whose actor
                (tag ``tag``) died (an episode's failure); ``None``: such a loss raises
                ``RuntimeError``.
            with_tag: pass the actor's tag as ``fn``'s last argument.

        Yields:
            ``(job index, result)`` in job order.

        Raises:
            RuntimeError: an actor died and ``on_lost`` is None, or every actor is gone.
            Exception: what ``fn`` raised in the actor (Ray's error, also an instance
                of the original exception's class).
        """
        ray = import_ray()
        from ray.exceptions import RayActorError

        if not jobs:
            return
        idle = self.actors(config, len(jobs))
        ours = {t for p in self._pools[_config_key(config)] for t in p.tags}
        todo = deque(enumerate(jobs))
        pending: dict[Any, tuple[int, tuple[Any, str], float]] = {}
        done: dict[int, Any] = {}
        next_out = 0
        while todo or pending:
            while idle and todo:
                i, args = todo.popleft()
                actor, tag = idle.pop(0)
                extra = (tag,) if with_tag else ()
                ref = actor.call.remote(fn, *args, *extra)
                pending[ref] = (i, (actor, tag), time.perf_counter())
            probes = {p: t for t, (p, _, _) in self._restarting.items() if t in ours}
            if not pending and not probes:
                raise RuntimeError(
                    "every env actor is gone; the remaining cells cannot run ("
                    + "; ".join(f"{t}: {why}" for t, why in self.lost.items())
                    + ")"
                )
            # a timeout, so that Ctrl-C / SIGTERM reach the interpreter while cells run
            ready, _ = ray.wait([*pending, *probes], num_returns=1, timeout=1.0)
            for ref in (r for r in ready if r in pending):
                i, (actor, tag), t0 = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except RayActorError as err:
                    why = (
                        f"env actor {tag} on node {self.nodes.get(tag, '?')} died during the "
                        f"cell: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
                    )
                    if on_lost is None:
                        raise RuntimeError(why) from None
                    result = on_lost(i, why, tag)
                    self._await_restart(actor, tag)
                else:
                    idle.append((actor, tag))
                    if isinstance(result, PlayedEpisode):
                        result = PlayedEpisode(
                            result.episode, result.transitions, result.node_id,
                            result.actor, result.actor_s, time.perf_counter() - t0,
                        )  # fmt: skip
                done[i] = result
            idle.extend((a, t) for a, t in self._settle_restarts() if t in ours)
            while next_out in done:
                yield next_out, done.pop(next_out)
                next_out += 1

    def episodes(
        self,
        config: Any,
        cells: Sequence[tuple[str, int]],
        policies: dict[str, bytes],
        target_loss: float | None,
    ) -> Iterator[tuple[int, PlayedEpisode]]:
        """Episode cells ``(agent name, seed)`` played with ``policies[name]``, in order.

        A cell whose actor died comes back as a failure (:func:`failed_episode`).
        """

        def lost(i: int, why: str, tag: str) -> PlayedEpisode:
            seed = cells[i][1]
            node = self.nodes.get(tag, "?")
            return PlayedEpisode(failed_episode(seed, why), [], node, tag, math.nan)

        jobs = [(policies[name], seed, target_loss) for name, seed in cells]
        yield from self.run(config, play_episode, jobs, on_lost=lost, with_tag=True)

    # -- lifecycle ------------------------------------------------------------------
    def close(self, *, interrupted: bool = False) -> None:
        """Close (or, ``interrupted``, kill) every env actor; shut down our local Ray."""
        ray = import_ray()
        pools, self._pools = self._pools, {}
        restarting, self._restarting = self._restarting, {}
        for _, actor, _ in restarting.values():  # not back yet: nothing to close politely
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        try:
            for groups in pools.values():
                for group in groups:
                    with contextlib.suppress(Exception):
                        group.kill() if interrupted else group.close()
        finally:
            if self.started and ray.is_initialized():
                ray.shutdown()
                self.started = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(interrupted=exc_type is not None)


@contextlib.contextmanager
def open_executor(cfg: Any) -> Iterator[RayExecutor | None]:
    """The executor ``cfg.executor`` names: ``None`` (local) or a :class:`RayExecutor`."""
    if cfg.executor != "ray":
        yield None
        return
    with RayExecutor(cfg.ray_address, cfg.ray_envs) as executor:
        yield executor
