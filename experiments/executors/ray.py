"""``--executor ray``: the cells of a command on env actors of a Ray cluster.

With ``--executor ray [--ray-address ADDR]`` (:class:`RayExecutor`, an
:class:`~commgym.experiments.executors.Executor` as the local one is) the independent cells of a
command (an agent's episode on one seed, an oracle's menu entry on one seed, a baseline's
tuning, a stream of recorded decisions) run in parallel on env actors
(:class:`~commgym.agents.ray_env.EnvActors`: one ``commgym/AllReduce-v1`` env per actor,
its ranks' CPUs reserved, placed with ``STRICT_PACK``). Each episode cell runs THE rollout
(:func:`~commgym.agents.rollout.rollout`) and sends back its
:class:`~commgym.agents.rollout.Episode` with what the env reported at every step, so the
driver, the only writer, logs the same MLflow child runs, CSVs, tables and figures as the
local executor, in the same order. Placement and queueing are Ray's (placement groups; the
actors pick up the next cell as they finish); nothing here schedules beyond keeping every
actor busy.

An agent travels to the actors as its policy file (``Agent.save``): every cell loads it
afresh, so each (agent, seed) cell plays from the agent's state as prepared, whichever
actor runs it. Agents whose state moves from episode to episode (``random``: its
generator continues in the local executor) therefore play other draws on Ray; deterministic
agents (static presets, learned policies, tuned baselines) play the same episodes.

What cannot travel as a policy file runs on the driver's env (:meth:`RayExecutor.play`:
a schedule found per seed in hindsight; :meth:`RayExecutor.search`: an oracle that forks
episodes).

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
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from commgym.agents.ray_env import (
    RESTART_TIMEOUT_S,
    EnvActors,
    actor_resources,
    cleanup_nodes,
    import_ray,
)
from commgym.experiments.executors.base import (
    PlayedEpisode,
    failed_episode,
    load_policy,
    play_episode,
    play_here,
    policy_bytes,
    tune_agent,
)
from commgym.experiments.executors.local import search_here
from commgym.experiments.executors.ray_address import (
    LOOPBACK_VARIABLE,
    bootstrap_address,
    on_loopback,
    unreachable,
)
from commgym.experiments.progress import console

__all__ = [
    "LOOPBACK_VARIABLE",
    "RayExecutor",
    "bootstrap_address",
    "on_loopback",
    "unreachable",
]

#: Signals whose handlers survive ``ray.init`` (see :class:`RayExecutor`).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
                    # "local": a new instance even while another cluster runs on this host
                    # (without it ray.init joins whatever Ray's current-cluster file names,
                    # e.g. another user's `ray start --head` or a test's cluster)
                    address="local",
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

    # -- the Executor protocol ------------------------------------------------------
    where = "on a Ray env actor"

    def start(self, env: Any, config: Any, seed: int) -> None:
        """Say where the env actors run (no rank starts on the driver).

        Each env actor launches its own ranks when first used.
        """
        console.print(self.summary(config))

    def play(
        self,
        env: Any,
        config: Any,
        cells: Sequence[tuple[str, int]],
        players: dict[str, Any],
        target_loss: float | None,
        on_step: Callable[[dict[str, Any]], Any] | None = None,
    ) -> Iterator[tuple[int, PlayedEpisode]]:
        """Episode cells on the env actors (in cell order), then those that stay here.

        A player travels as its policy file (:func:`policy_bytes`); a schedule found per
        seed in hindsight (a player with ``for_seed``) is no policy file an actor could
        load: its cells play on the driver's ``env`` after the actors' (``on_step`` sees
        their steps). A cell whose actor died comes back as a failure.
        """
        here = [i for i, (name, _) in enumerate(cells) if hasattr(players[name], "for_seed")]
        away = [i for i in range(len(cells)) if i not in set(here)]
        if away:
            sent = [cells[i] for i in away]
            policies = {n: policy_bytes(players[n]) for n in dict.fromkeys(n for n, _ in sent)}
            nodes: Counter[str] = Counter()
            for j, done in self.episodes(config, sent, policies, target_loss):
                nodes[done.node_id] += 1
                yield away[j], done
            where = ", ".join(f"{node[:12]} x{n}" for node, n in sorted(nodes.items()))
            console.print(f"{len(sent)} episodes ran on {len(nodes)} Ray node(s): {where}")
        for i in here:
            name, seed = cells[i]
            yield i, play_here(env, players[name], seed, target_loss, on_step)

    def search(self, agent: Any, on_episode: Callable[[float], Any] | None = None) -> None:
        """``oracle-static``'s (entry, seed) episodes in parallel on the env actors.

        They are ranked here (:meth:`~commgym.agents.OracleStaticAgent.rank`); an oracle
        that forks episodes (``oracle-adaptive``) searches on the driver's ranks.
        """
        from commgym.agents import OracleStaticAgent
        from commgym.agents.baselines import StaticAgent

        if not isinstance(agent, OracleStaticAgent):
            search_here(agent, on_episode)
            return
        env = agent.env
        config = env.unwrapped.config
        t0 = time.perf_counter()
        players = {e: StaticAgent(env, preset=e) for e in agent.entries}
        for player in players.values():  # with the probe where the search runs it
            player.reads_probe = agent.probe
        cells = [(e, s) for e in agent.entries for s in agent.seeds]
        episodes: dict[str, list[Any]] = {e: [] for e in agent.entries}
        for i, played in self.play(env, config, cells, players, config.target_loss):
            episodes[cells[i][0]].append(played.episode)
            if on_episode is not None:
                on_episode(1)
        agent.rank(episodes, search_cost_s=time.perf_counter() - t0)

    def tune(
        self,
        name: str,
        agent: Any,
        kwargs: dict[str, Any],
        decisions: int,
        on_decision: Callable[[float], Any] | None = None,
    ) -> tuple[Any, float]:
        """Tune ``name`` on an env actor; the driver gets the tuned agent's policy file."""
        config = agent.env.unwrapped.config
        [(_, (blob, secs))] = self.run(config, tune_agent, [(name, kwargs, decisions)])
        if on_decision is not None:
            on_decision(decisions)
        return load_policy(agent.env, blob), secs

    def record(
        self,
        env: Any,
        config: Any,
        out: str | Path,
        decisions: int,
        policy: str,
        seed: int,
        bench: bool = True,
        run: Any = None,
        on_decisions: Callable[[float], Any] | None = None,
    ) -> tuple[Path, Path | None, float]:
        """The recording in parallel streams, one per env actor.

        One stream per env actor (``envs``, or as many as the cluster holds, at most
        ``decisions``): stream ``k`` records its share of ``decisions`` from seed
        ``seed + k`` (one stream: the very recording the local executor makes); the first
        also times the collectives. The streams land in ``out`` (CSV) one after another,
        episodes renumbered (:func:`~commgym.experiments.collect.concat_streams`);
        ``on_decisions`` gets a stream's decisions when it is in.
        """
        from commgym.experiments.recording import concat_streams, log_collection, record_stream

        out = Path(out)
        if out.suffix == ".parquet":
            raise ValueError("parallel recording writes CSV; give --out a .csv file")
        wanted = self.envs if self.envs is not None else self.capacity(config)
        k = max(1, min(wanted, decisions))
        shares = [decisions // k + (i < decisions % k) for i in range(k)]
        jobs = [(n, policy, seed + i, bench and i == 0) for i, n in enumerate(shares)]
        t0 = time.perf_counter()
        texts, bench_text = [], None
        for i, (text, timings, _) in self.run(config, record_stream, jobs):
            texts.append(text)
            bench_text = timings if i == 0 else bench_text
            if on_decisions is not None:
                on_decisions(shares[i])
        secs = time.perf_counter() - t0
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(concat_streams(texts))
        bench_path = None
        if bench_text is not None:
            bench_path = out.with_suffix(".bench.json")
            bench_path.write_text(bench_text)
        log_collection(run, out, bench_path, decisions, secs)
        return out, bench_path, secs

    def learning_env(self, env: Any, config: Any, agent_cls: Any) -> tuple[Any, Any]:
        """Where an agent learns on real ranks under Ray: ``(vec_env or None, env)``.

        SB3 agents learn from a :class:`~commgym.agents.ray_env.RayVecEnv` over ``envs``
        of the env actors (1 by default; PPO then collects ``n_steps`` per actor per
        update) and are built on a layout-only env (menu, spaces, config; no ranks); the
        others step one actor through a :class:`~commgym.agents.ray_env.RayEnv`.
        """
        from commgym.agents.base import LayoutEnv
        from commgym.agents.ray_env import RayVecEnv
        from commgym.agents.sb3 import SB3Agent

        if agent_cls is not None and issubclass(agent_cls, SB3Agent):
            n = self.envs or 1
            actors = self.actors(config, n)[:n]
            vec = RayVecEnv(config, flatten_actions=agent_cls.flat_actions, actors=actors)
            layout = LayoutEnv(config.menu)
            layout.config = config  # type: ignore[attr-defined]
            return vec, layout
        return None, self.real_env(env, config)

    def real_env(self, env: Any, config: Any) -> Any:
        """One of the env actors as a gymnasium env (no actor of its own)."""
        from commgym.agents.ray_env import RayEnv

        return RayEnv(config, actor=self.actors(config, 1)[0])

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
