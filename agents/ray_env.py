"""Env instances as Ray actors, and :class:`RayVecEnv`: an SB3 ``VecEnv`` over them.

Beyond one machine every episode runs on Ray (DESIGN rule 11), as RLlib's ``EnvRunner``
actors and Tianshou's ``RayVectorEnv`` run theirs: one actor per env instance, which owns
one ``commgym/AllReduce-v1`` env and so launches (and keeps) its own torchrun ranks.

**Resources.** A Ray actor reserves no CPU unless told to, and the ranks it launches are
plain subprocesses Ray does not see. So each actor reserves its ranks' share explicitly
(:func:`actor_resources`: ``world_size x threads_per_rank`` CPUs, plus one GPU per rank
on CUDA) in a placement group of one bundle with strategy ``STRICT_PACK``: the ranks, and
on an emulated network their namespaces and veths, live on one host.

**Several actors on one node.** Nothing an actor's env creates is shared: the control
listener binds port 0 (the OS picks), ``torchrun --standalone`` rendezvous on port 0,
an emulated network's namespaces, veths and bridge are named ``cg<6 random hex>-*`` with
an owner record and its /24 is picked under a host-wide lock, and the c10d rendezvous of
emulated ranks listens inside rank 0's own namespace. :meth:`EnvRunner.describe` reports
them.

**Faults.** Actors are created with ``max_restarts=1``: Ray starts a dead actor again
(on another node if its node died) and its running task fails with ``RayActorError``, which
the callers turn into that episode's failure. Every rank an actor launches carries the
actor's tag (``COMMGYM_RAY_ACTOR``) in its environment, so the actor's next incarnation,
or :func:`cleanup_nodes` from the driver, kills what a dead incarnation left and removes
its emulated networks (their owner, the actor process, is gone).

Ray is the optional extra ``commgym[ray]``: this module imports it only inside functions.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from commgym.collectives.checks import check_int
from commgym.env import EnvConfig

__all__ = [
    "PLACE_TIMEOUT_S",
    "RESTART_TIMEOUT_S",
    "TAG_VARIABLE",
    "EnvActors",
    "EnvRunner",
    "RayEnv",
    "RayVecEnv",
    "actor_resources",
    "cleanup_nodes",
    "import_ray",
    "kill_tagged",
    "restarted_reset",
]

#: Environment variable every rank launched by an env actor carries (the actor's tag).
TAG_VARIABLE = "COMMGYM_RAY_ACTOR"

#: Seconds to wait for the env actors' placement groups before giving up.
PLACE_TIMEOUT_S = 120.0

#: Seconds a dead env actor gets to come back (Ray restarts it) before it is given up.
RESTART_TIMEOUT_S = 180.0


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ModuleNotFoundError: Ray is not installed (names the extra to install).
    """
    try:
        import ray
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "Ray is not installed: pip install 'commgym[ray]' for env actors on a Ray cluster"
        ) from None
    return ray


def actor_resources(config: EnvConfig) -> dict[str, float]:
    """What one env actor reserves for its ranks: ``{"CPU": W x threads[, "GPU": W]}``."""
    res = {"CPU": float(config.world_size * config.threads_per_rank)}
    if config.device == "cuda":
        res["GPU"] = float(config.world_size)
    return res


def kill_tagged(tags: Sequence[str]) -> list[int]:
    """SIGKILL every process of this host whose environment carries one of ``tags``.

    Those are the torchrun agents and ranks env actors launched (:data:`TAG_VARIABLE`);
    this process is spared. Processes of other users that cannot be read are skipped.

    Returns:
        The process ids killed.
    """
    wanted = {f"{TAG_VARIABLE}={t}".encode() for t in tags}
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted.intersection(environ):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def _remove_dead_networks() -> list[str]:
    """Emulated networks whose owner process is gone (no-op without root and iproute2)."""
    from commgym.env.net import cleanup_leftovers
    from commgym.env.net.host import check_privileges, check_tools

    if check_tools() or check_privileges():
        return []
    return cleanup_leftovers()


def _cleanup_node(tags: list[str]) -> dict[str, Any]:
    """One node's cleanup task (see :func:`cleanup_nodes`)."""
    killed = kill_tagged(tags)
    if killed:  # let the kernel reap them before their networks' owners are checked
        time.sleep(0.2)
    return {"host": socket.gethostname(), "killed": killed, "removed": _remove_dead_networks()}


def cleanup_nodes(tags: Sequence[str], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """On every alive node: kill what env actors ``tags`` launched, remove dead networks.

    Run by the driver after it killed its actors (or found one dead): a task pinned to
    each node (``NodeAffinitySchedulingStrategy``, no CPU reserved) kills the processes
    carrying a tag (:func:`kill_tagged`) and removes emulated networks whose owner
    process is gone.

    Returns:
        Per node that answered in time: ``{"host", "killed", "removed"}``.
    """
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_cleanup_node)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(list(tags))
        for node in ray.nodes()
        if node.get("Alive")
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out = []
    for ref in ready:
        with contextlib.suppress(Exception):
            out.append(ray.get(ref))
    return out


def restarted_reset(actor: Any, tag: str, timeout_s: float = RESTART_TIMEOUT_S) -> tuple:
    """``reset()`` of an env actor that died: waits for Ray to restart it, then resets it.

    Args:
        actor: the env actor's handle (created with ``max_restarts``).
        tag: its tag, for the message.
        timeout_s: how long Ray gets to bring it back.

    Returns:
        ``(obs, info)`` of the restarted env's first episode.

    Raises:
        RuntimeError: it is not back within ``timeout_s`` (no node has room for its
            placement group) or cannot be restarted any more (``max_restarts`` used up).
    """
    ray = import_ray()
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(actor.reset.remote(), timeout=max(0.0, deadline - time.monotonic()))
        except ActorUnavailableError as err:  # still restarting: ask again
            if time.monotonic() >= deadline:
                why = err
                break
            time.sleep(0.5)
        except (GetTimeoutError, RayActorError) as err:
            why = err
            break
    raise RuntimeError(
        f"env actor {tag} died and did not come back within {timeout_s:.0f} s "
        f"({type(why).__name__}); `ray status` shows whether the cluster has room for it"
    )


class EnvRunner:
    """The body of one env actor: one ``commgym/AllReduce-v1`` env and its ranks.

    Created by :class:`EnvActors` (as ``ray.remote(EnvRunner)``). Its first act kills
    what an earlier incarnation with the same ``tag`` left on this host (a restarted
    actor) and removes emulated networks whose owner died; then every rank its env
    launches inherits ``tag`` (:data:`TAG_VARIABLE`).

    Args:
        config: the env's configuration.
        tag: this actor's identity, kept across Ray's restarts of it.
    """

    def __init__(self, config: EnvConfig, tag: str) -> None:
        kill_tagged([tag])
        _remove_dead_networks()
        os.environ[TAG_VARIABLE] = tag  # the ranks' environment is a copy of ours
        import commgym.env  # noqa: F401 - registers the env

        self.tag = tag
        self.env: gym.Env = gym.make("commgym/AllReduce-v1", config=config)
        # a restarted incarnation: the episode its predecessor was in is lost; a step the
        # caller sent before it learnt of the death answers that, not "reset needed"
        with warnings.catch_warnings():  # Ray 2.60's property reads its own deprecated field
            warnings.simplefilter("ignore", DeprecationWarning)
            context = import_ray().get_runtime_context()
            self._lost_episode = bool(context.was_current_actor_reconstructed)

    # -- where and what -------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Node id, host, pid, tag and what the env's ranks use (ports, namespaces)."""
        ray = import_ray()
        base = self.env.unwrapped
        cluster = getattr(base, "cluster", None)
        net = getattr(base, "network", None)
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "tag": self.tag,
            "control_address": None if cluster is None else list(cluster.control_address),
            "rank_pids": [] if cluster is None else cluster.pids,
            "network": None if net is None else net.describe(),
        }

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        """``(observation_space, action_space)``."""
        return self.env.observation_space, self.env.action_space

    # -- the VecEnv protocol (as SubprocVecEnv's worker answers it) -------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset(seed=seed, options=options)``."""
        self._lost_episode = False
        return self.env.reset(seed=seed, options=options)

    def _lost(self) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        """The step a restarted actor answers before its first reset: the episode is lost.

        Returns:
            ``(first observation of a new episode, failure info, that reset's info)``.
        """
        obs, reset_info = self.reset()
        why = f"env actor {self.tag} was restarted: its previous incarnation died in the episode"
        return obs, {"failure": why, "reason": "failure"}, reset_info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """``env.step(action)``: ``(obs, reward, terminated, truncated, info)``.

        On a restarted actor before its first reset: the lost episode's end, ``terminated``
        with ``info["failure"]``.
        """
        if self._lost_episode:
            obs, info, _ = self._lost()
            return obs, 0.0, True, False, info
        return self.env.step(action)

    def vec_step(self, action: Any) -> tuple[np.ndarray, float, bool, dict[str, Any], dict]:
        """One step with SB3's auto-reset: ``(obs, reward, done, info, reset_info)``.

        When the episode ends, ``info["terminal_observation"]`` holds its last observation
        and ``obs`` is the next episode's first (``reset_info`` its ``info``). On a
        restarted actor before its first reset: the lost episode's end, ``done`` with
        ``info["failure"]``.
        """
        if self._lost_episode:
            obs, info, reset_info = self._lost()
            info["TimeLimit.truncated"] = False  # terminal_observation: the driver's last
            return obs, 0.0, True, info, reset_info
        obs, reward, terminated, truncated, info = self.env.step(action)
        done = bool(terminated or truncated)
        info["TimeLimit.truncated"] = bool(truncated and not terminated)
        reset_info: dict[str, Any] = {}
        if done:
            info["terminal_observation"] = obs
            obs, reset_info = self.env.reset()
        return obs, float(reward), done, info, reset_info

    def get_attr(self, name: str) -> Any:
        """An attribute of the env (``env.get_wrapper_attr``)."""
        return self.env.get_wrapper_attr(name)

    def set_attr(self, name: str, value: Any) -> None:
        """Set an attribute on the unwrapped env."""
        setattr(self.env.unwrapped, name, value)

    def env_method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call a method of the env."""
        return self.env.get_wrapper_attr(name)(*args, **kwargs)

    def is_wrapped(self, wrapper_class: type) -> bool:
        """Whether the env is wrapped in ``wrapper_class``."""
        from stable_baselines3.common.env_util import is_wrapped

        return is_wrapped(self.env, wrapper_class)

    # -- anything else -------------------------------------------------------------------
    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(env, *args, **kwargs)`` on this actor's env (an executor's cell)."""
        return fn(self.env, *args, **kwargs)

    def close(self) -> None:
        """Close the env: its ranks exit and its emulated network is removed."""
        self.env.close()


class EnvActors:
    """``n`` env actors of one configuration, each in its own ``STRICT_PACK`` placement group.

    Needs a connected Ray (``ray.init``). Creation waits until every placement group is
    placed; a cluster that cannot hold them fails at once (not enough CPUs in total) or
    after ``place_timeout_s`` (not enough free now), with what was asked and what exists.

    Args:
        config: the env configuration of every actor.
        n: number of actors (>= 1).
        resources: what each reserves (default :func:`actor_resources`); ``{"CPU": 1}``
            oversubscribes the host on purpose (tests, benchmarks on small machines).
        place_timeout_s: deadline for the placement groups.

    Raises:
        ValueError: bad ``n``, or more than the whole cluster holds.
        RuntimeError: the actors could not be placed in time.
    """

    def __init__(
        self,
        config: EnvConfig,
        n: int,
        *,
        resources: dict[str, float] | None = None,
        place_timeout_s: float = PLACE_TIMEOUT_S,
    ) -> None:
        check_int("n", n, 1)
        ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.config = config
        self.resources = dict(actor_resources(config) if resources is None else resources)
        total = ray.cluster_resources()
        for key, need in self.resources.items():
            if need * n > total.get(key, 0.0) + 1e-9:
                raise ValueError(
                    f"{n} env actor(s) of {self.resources} each need {need * n:g} {key}; the "
                    f"Ray cluster has {total.get(key, 0.0):g} in total (`ray status`); ask for "
                    "fewer env actors (--ray-envs) or add nodes"
                )
        self.tags = [f"{secrets.token_hex(4)}" for _ in range(n)]
        self.groups = [placement_group([self.resources], strategy="STRICT_PACK") for _ in range(n)]
        ready, _ = ray.wait(
            [g.ready() for g in self.groups], num_returns=n, timeout=place_timeout_s
        )
        if len(ready) < n:
            for g in self.groups:
                remove_placement_group(g)
            raise RuntimeError(
                f"only {len(ready)} of {n} env actors of {self.resources} each could be placed "
                f"within {place_timeout_s:.0f} s; free now: {ray.available_resources()}"
            )
        runner = ray.remote(EnvRunner)
        extra = {"num_gpus": self.resources["GPU"]} if "GPU" in self.resources else {}
        self.actors = [
            runner.options(
                num_cpus=self.resources.get("CPU", 0.0),
                max_restarts=1,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=g, placement_group_bundle_index=0
                ),
                **extra,
            ).remote(config, tag)
            for g, tag in zip(self.groups, self.tags, strict=True)
        ]
        self._closed = False

    def __len__(self) -> int:
        return len(self.actors)

    def describe(self) -> list[dict[str, Any]]:
        """:meth:`EnvRunner.describe` of every actor (waits for them to be up)."""
        ray = import_ray()
        return ray.get([a.describe.remote() for a in self.actors])

    def close(self, timeout_s: float = 30.0) -> None:
        """Close the envs, kill the actors, clean their nodes, remove the groups (idempotent).

        Each env is asked to close (ranks told to exit, network removed) for up to
        ``timeout_s``; actors still busy (a running episode) are killed, and
        :func:`cleanup_nodes` removes what they left.
        """
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        from ray.util.placement_group import remove_placement_group

        refs = [a.close.remote() for a in self.actors]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        self.kill()
        for g in self.groups:
            with contextlib.suppress(Exception):
                remove_placement_group(g)

    def kill(self) -> None:
        """Kill every actor at once, then clean their nodes (the interrupted driver's path)."""
        ray = import_ray()
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        cleanup_nodes(self.tags)


class RayVecEnv(VecEnv):
    """An SB3 ``VecEnv`` whose environments are Ray actors, one per env instance.

    SB3's algorithms learn from it as from ``SubprocVecEnv``: ``step_async`` sends every
    env its action at once, so the envs' ranks train in parallel on the cluster, and
    ``step_wait`` gathers them, each env auto-resetting as SB3 expects
    (``info["terminal_observation"]``, ``info["TimeLimit.truncated"]``). The sketch of
    SB3 issue #1345, with the actors of :class:`EnvActors` (explicit resources,
    ``STRICT_PACK`` placement, per-actor ranks and networks).

    An actor that dies inside a step (its node lost, the process killed) ends that env's
    episode as a failure, as a failed rank does: ``done``, reward 0,
    ``info["failure"]``, ``info["reason"] == "failure"``; Ray restarts the actor and the
    env continues from a reset.

    Needs a connected Ray (``ray.init``).

    Args:
        config: the env configuration of every actor.
        n_envs: number of env actors.
        resources: what each actor reserves (default: its ranks' CPUs, see
            :func:`actor_resources`).
        flatten_actions: ``Discrete`` actions over the menu's flattening (row-major, as
            :class:`~commgym.env.FlattenAction`; for DQN), unflattened before they are sent.
        place_timeout_s: deadline for placing the actors.
        actors: ``(handle, tag)`` of env actors that exist already (an executor's): used
            instead of creating ``n_envs`` new ones, and left running by :meth:`close`.
        restart_timeout_s: how long a step waits for a dead actor to come back.

    Raises:
        ModuleNotFoundError: Ray is not installed.
        ValueError: the cluster cannot hold ``n_envs`` actors.
        RuntimeError: they could not be placed in time; in ``step_wait``: a dead actor
            did not come back within ``restart_timeout_s``.
    """

    def __init__(
        self,
        config: EnvConfig,
        n_envs: int = 1,
        *,
        resources: dict[str, float] | None = None,
        flatten_actions: bool = False,
        place_timeout_s: float = PLACE_TIMEOUT_S,
        actors: Sequence[tuple[Any, str]] | None = None,
        restart_timeout_s: float = RESTART_TIMEOUT_S,
    ) -> None:
        ray = import_ray()
        self.restart_timeout_s = restart_timeout_s
        self.group: EnvActors | None = None
        if actors is None:
            self.group = EnvActors(
                config, n_envs, resources=resources, place_timeout_s=place_timeout_s
            )
            actors = list(zip(self.group.actors, self.group.tags, strict=True))
        self._handles = [a for a, _ in actors]
        self.tags = [t for _, t in actors]
        try:
            obs_space, act_space = ray.get(self._handles[0].spaces.remote())
        except BaseException:
            self.close()
            raise
        self._nvec: np.ndarray | None = None
        if flatten_actions:
            self._nvec = np.asarray(act_space.nvec, dtype=np.int64)
            act_space = gym.spaces.Discrete(int(np.prod(self._nvec)))
        super().__init__(len(self._handles), obs_space, act_space)
        self._pending: list[Any] | None = None
        self._last_obs: list[np.ndarray] = [
            np.zeros(obs_space.shape, dtype=obs_space.dtype) for _ in range(self.num_envs)
        ]

    @property
    def actors(self) -> list[Any]:
        """The env actors' handles."""
        return self._handles

    def _menu_action(self, action: Any) -> Any:
        if self._nvec is None:
            return action
        return np.array(np.unravel_index(int(action), tuple(self._nvec)), dtype=np.int64)

    def reset(self) -> np.ndarray:  # noqa: D102 - VecEnv's
        ray = import_ray()
        refs = [
            a.reset.remote(seed=self._seeds[i], options=self._options[i])
            for i, a in enumerate(self.actors)
        ]
        results = ray.get(refs)
        self.reset_infos = [dict(info) for _, info in results]
        self._last_obs = [np.asarray(obs) for obs, _ in results]
        self._reset_seeds()
        self._reset_options()
        return np.stack(self._last_obs)

    def step_async(self, actions: np.ndarray) -> None:  # noqa: D102 - VecEnv's
        self._pending = [
            a.vec_step.remote(self._menu_action(act))
            for a, act in zip(self.actors, actions, strict=True)
        ]

    def step_wait(self):  # noqa: D102 - VecEnv's
        ray = import_ray()
        from ray.exceptions import RayActorError

        refs, self._pending = self._pending or [], None
        obs, rewards, dones, infos = [], [], [], []
        for i, ref in enumerate(refs):
            try:
                o, r, d, info, reset_info = ray.get(ref)
            except RayActorError as err:
                info = {
                    "failure": f"env actor {self.tags[i]} died during the step: {err}",
                    "reason": "failure",
                    "TimeLimit.truncated": False,
                    "terminal_observation": self._last_obs[i],
                }
                # Ray restarts the actor (max_restarts); the env goes on from a reset
                o, reset_info = restarted_reset(
                    self.actors[i], self.tags[i], self.restart_timeout_s
                )
                r, d = 0.0, True
            if d:
                self.reset_infos[i] = dict(reset_info)
                info.setdefault("terminal_observation", self._last_obs[i])
            o = np.asarray(o)
            self._last_obs[i] = o
            obs.append(o)
            rewards.append(r)
            dones.append(d)
            infos.append(info)
        return (
            np.stack(obs),
            np.asarray(rewards, dtype=np.float32),
            np.asarray(dones, dtype=bool),
            infos,
        )

    def close(self) -> None:  # noqa: D102 - VecEnv's
        if self.group is not None:  # actors given to it stay with their owner
            self.group.close()

    def _targets(self, indices: VecEnvIndices) -> list[Any]:
        return [self.actors[i] for i in self._get_indices(indices)]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:  # noqa: D102
        ray = import_ray()
        return ray.get([a.get_attr.remote(attr_name) for a in self._targets(indices)])

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:  # noqa: D102
        ray = import_ray()
        ray.get([a.set_attr.remote(attr_name, value) for a in self._targets(indices)])

    def env_method(  # noqa: D102 - VecEnv's
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        ray = import_ray()
        return ray.get(
            [
                a.env_method.remote(method_name, *method_args, **method_kwargs)
                for a in self._targets(indices)
            ]
        )

    def env_is_wrapped(  # noqa: D102 - VecEnv's
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        ray = import_ray()
        return ray.get([a.is_wrapped.remote(wrapper_class) for a in self._targets(indices)])


class RayEnv(gym.Env):
    """One env actor as a gymnasium env: ``reset`` and ``step`` run on the Ray cluster.

    For the sequential phases of a command (an agent learning on real ranks, a policy
    fine-tuned on them) under ``--executor ray``: the loop stays in the driver, the ranks
    run in the actor. ``unwrapped.menu`` and ``unwrapped.config`` answer as
    ``AllReduceEnv``'s do, so agents and wrappers take it as the real env. An actor that
    dies inside a step ends the episode as a failure (``terminated``,
    ``info["failure"]``); Ray restarts it for the next ``reset``.

    Args:
        config: the env's configuration.
        resources: what the actor reserves (default: its ranks' CPUs).
        place_timeout_s: deadline for placing the actor.
        actor: ``(handle, tag)`` of an env actor that exists already (an executor's):
            used instead of a new one, and left running by :meth:`close`.
        restart_timeout_s: how long ``reset`` waits for a dead actor to come back
            (``RuntimeError`` after that).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        config: EnvConfig,
        *,
        resources: dict[str, float] | None = None,
        place_timeout_s: float = PLACE_TIMEOUT_S,
        actor: tuple[Any, str] | None = None,
        restart_timeout_s: float = RESTART_TIMEOUT_S,
    ) -> None:
        ray = import_ray()
        self.restart_timeout_s = restart_timeout_s
        self._died = False
        self.config = config
        self.menu = config.menu
        self.group: EnvActors | None = None
        if actor is None:
            self.group = EnvActors(config, 1, resources=resources, place_timeout_s=place_timeout_s)
            actor = (self.group.actors[0], self.group.tags[0])
        self.actor, self.tag = actor
        try:
            self.observation_space, self.action_space = ray.get(self.actor.spaces.remote())
        except BaseException:
            self.close()
            raise
        self._last_obs = np.zeros(self.observation_space.shape, dtype=np.float32)

    @property
    def network(self) -> None:
        """No emulated network in this process (it lives with the actor's ranks)."""
        return None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # noqa: D102
        ray = import_ray()
        super().reset(seed=seed)
        if self._died:  # Ray restarts the actor: wait for it, within limits
            restarted_reset(self.actor, self.tag, self.restart_timeout_s)
            self._died = False
        obs, info = ray.get(self.actor.reset.remote(seed=seed, options=options))
        self._last_obs = np.asarray(obs)
        return obs, info

    def step(self, action: Any):  # noqa: D102
        ray = import_ray()
        from ray.exceptions import RayActorError

        try:
            obs, reward, terminated, truncated, info = ray.get(self.actor.step.remote(action))
        except RayActorError as err:
            self._died = True
            why = f"env actor {self.tag} died during the step: {err}"
            return self._last_obs, 0.0, True, False, {"failure": why, "reason": "failure"}
        self._last_obs = np.asarray(obs)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:  # noqa: D102
        if self.group is not None:  # an actor given to it stays with its owner
            self.group.close()
