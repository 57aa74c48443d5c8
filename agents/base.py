"""The :class:`Agent` interface, policy files and layout compatibility checks.

Every agent answers ``predict(obs, deterministic=True) -> (action, state)`` (the SB3
``BaseAlgorithm.predict`` surface), so evaluation, replay and logging never branch on
agent type.

**Policy files.** ``Agent.save(path)`` writes ONE zip file:

* agents of this package: a zip holding ``commgym_agent.json`` (class, hyperparameters,
  learned state as plain lists, layout). No pickle is involved.
* stable-baselines3 agents: SB3's own ``.zip`` with an extra ``commgym_agent.json``
  member appended (SB3 ignores unknown members).

.. warning::
   SB3 archives contain pickled objects (``data`` may hold cloudpickled schedules and
   spaces). Loading a policy file from an untrusted source can execute arbitrary code.
   Only load SB3 policy files you created or trust.

``commgym_agent.json`` also records the **layout** the policy was trained for: the
action menu (``ActionMenu.to_dict()``), the observation field names and the env id.
:func:`check_compatible` compares a layout with an env and names every difference.
"""

from __future__ import annotations

import copy
import json
import math
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from commgym.collectives.checks import check_int
from commgym.env.spaces import OBSERVATION_FIELDS, ActionMenu, ObservationBuilder

__all__ = [
    "ENV_ID",
    "POLICY_JSON",
    "Agent",
    "LayoutEnv",
    "LearnCallback",
    "Preparation",
    "Progress",
    "StepAgent",
    "as_observations",
    "check_compatible",
    "layout_of",
    "menu_of",
    "predict_each",
    "read_policy_json",
    "step_report",
    "zip_path",
]

#: The environment id recorded in policy files.
ENV_ID = "commgym/AllReduce-v1"
#: Name of the JSON member inside every policy zip.
POLICY_JSON = "commgym_agent.json"
#: Version of the JSON schema (bumped when its keys change meaning).
POLICY_FORMAT = 1

#: ``callback(step) -> bool``; ``step`` has keys ``obs, action, reward, terminated,
#: truncated, info, timestep`` (:func:`step_report`); returning ``False`` stops ``learn``
#: (``None`` continues).
LearnCallback = Callable[[dict[str, Any]], "bool | None"]


def step_report(
    obs: Any,
    action: Any,
    reward: float,
    terminated: bool,
    truncated: bool,
    info: dict[str, Any],
    timestep: int,
) -> dict[str, Any]:
    """What a :data:`LearnCallback` (and a rollout's ``on_step``) receives after a step.

    Args:
        obs: the observation after the step.
        action: the action taken (``MultiDiscrete`` menu indices).
        reward: the env's reward.
        terminated: the env's ``terminated``.
        truncated: the env's ``truncated``.
        info: the env's ``info``.
        timestep: steps so far (1 after the first).
    """
    return {
        "obs": obs,
        "action": action,
        "reward": float(reward),
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "info": info,
        "timestep": int(timestep),
    }


def menu_of(env: gym.Env) -> ActionMenu:
    """The :class:`ActionMenu` of ``env`` (looked up on ``env.unwrapped.menu``).

    Raises:
        TypeError: the env exposes no ``ActionMenu`` or its action space is not the
            menu's ``MultiDiscrete``.
    """
    menu = getattr(env.unwrapped, "menu", None)
    if not isinstance(menu, ActionMenu):
        raise TypeError(
            f"{type(env.unwrapped).__name__} has no ActionMenu at env.unwrapped.menu; "
            "commgym agents need a commgym environment (e.g. commgym/AllReduce-v1)"
        )
    space = env.action_space
    if not isinstance(space, spaces.MultiDiscrete) or not np.array_equal(space.nvec, menu.nvec):
        raise TypeError(
            f"env.action_space must be MultiDiscrete({menu.nvec.tolist()}) (the menu's), got "
            f"{space}; pass the env itself, not a FlattenAction-wrapped one"
        )
    return menu


def layout_of(env: gym.Env) -> dict[str, Any]:
    """The layout a policy trained on ``env`` depends on (stored in policy files)."""
    return {
        "action_menu": menu_of(env).to_dict(),
        "observation_fields": [f.name for f in OBSERVATION_FIELDS],
        "env_id": ENV_ID,
    }


def training_facts(env: gym.Env) -> dict[str, Any] | None:
    """What a policy learned on: the job ``env`` runs and its observation options.

    Model size, decision interval, training-time budget, probe size and whether the
    privileged fields were shown. Stored in policy files (``trained_on``) so replay can
    warn when a policy meets another job and runs the probe all-reduce the policy was
    trained with.

    Returns:
        ``{"num_params": int | None, "steps_per_decision": int | None, "time_budget_s":
        float | None, "probe_bytes": int, "probe_at": str, "privileged_obs": bool}`` (the
        budget is the one the observation's ``elapsed_frac`` was measured against, seconds
        of training), or ``None`` when ``env`` runs no job (e.g. a :class:`LayoutEnv`).
    """
    base = getattr(env, "unwrapped", env)
    cfg = getattr(base, "config", None)
    steps = getattr(cfg, "steps_per_decision", None) or getattr(base, "steps_per_decision", None)
    n = getattr(base, "_num_params", None) or getattr(base, "num_params", None)
    budget = getattr(cfg, "time_budget_s", None)
    if not isinstance(steps, int) and not isinstance(n, int):
        return None
    probe = getattr(cfg, "probe_bytes", 0)
    return {
        "num_params": n if isinstance(n, int) else None,
        "steps_per_decision": steps if isinstance(steps, int) else None,
        "time_budget_s": float(budget) if isinstance(budget, int | float) else None,
        "probe_bytes": probe if isinstance(probe, int) else 0,
        "probe_at": str(getattr(cfg, "probe_at", "decision")),
        "privileged_obs": getattr(cfg, "privileged_obs", False) is True,
    }


def check_compatible(layout: dict[str, Any], env: gym.Env) -> None:
    """Raise if a policy with ``layout`` cannot act in ``env``.

    Args:
        layout: the ``layout`` entry of a policy file (see :func:`layout_of`).
        env: the environment the policy should act in.

    Raises:
        ValueError: lists every difference: menu entries per list (``compression``,
            ``bucket_mb``, ``sync_period``, ``error_feedback``) and observation fields
            (saved vs current, with the first differing index).
    """
    current = layout_of(env)
    problems: list[str] = []
    saved_menu = layout.get("action_menu", {})
    for key, now in current["action_menu"].items():
        before = saved_menu.get(key)
        if before != now:
            problems.append(f"action menu '{key}': policy has {before!r}, env has {now!r}")
    saved_fields = list(layout.get("observation_fields", []))
    now_fields = current["observation_fields"]
    if saved_fields != now_fields:
        first = next(
            (i for i, (a, b) in enumerate(zip(saved_fields, now_fields, strict=False)) if a != b),
            min(len(saved_fields), len(now_fields)),
        )
        problems.append(
            f"observation fields differ from index {first}: policy has {saved_fields} "
            f"({len(saved_fields)} fields), env has {now_fields} ({len(now_fields)} fields)"
        )
    if problems:
        raise ValueError(
            "policy layout is incompatible with the environment: " + "; ".join(problems)
        )


def read_policy_json(path: str | Path) -> dict[str, Any]:
    """Read ``commgym_agent.json`` from a policy zip (no pickle is touched).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: not a zip, or the zip has no ``commgym_agent.json``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"policy file {path} does not exist: `commgym train` saves one as "
            "<output-dir>/policy.zip (commgym-out/policy.zip by default); a static preset "
            "such as 'static:ddp-default' or 'static:int8/4MB/H1' needs no file"
        )
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a zip file (commgym policy files are zips)")
    with zipfile.ZipFile(path) as zf:
        if POLICY_JSON not in zf.namelist():
            raise ValueError(f"{path} has no {POLICY_JSON} member: not saved by a commgym agent")
        return json.loads(zf.read(POLICY_JSON).decode("utf-8"))


def zip_path(path: str | Path) -> Path:
    """``path`` with ``.zip`` appended unless it already ends so (policy file names)."""
    path = Path(path)
    return path if path.suffix == ".zip" else path.with_name(path.name + ".zip")


class LayoutEnv(gym.Env):
    """Spaces and menu of a saved policy, for agents loaded without an env.

    ``predict`` works; ``reset``/``step`` raise (pass ``env=`` to ``load`` to learn).
    """

    def __init__(self, menu: ActionMenu) -> None:
        self.menu = menu
        self.action_space = spaces.MultiDiscrete(menu.nvec)
        self.observation_space = ObservationBuilder(menu, 1, 1).space

    def reset(self, *, seed=None, options=None):  # noqa: D102 - it raises
        raise RuntimeError("agent was loaded without an env: load(path, env=...) to learn")

    def step(self, action):  # noqa: D102 - it raises
        raise RuntimeError("agent was loaded without an env: load(path, env=...) to learn")


def as_observations(observation: Any, dim: int) -> tuple[np.ndarray, bool]:
    """An observation ``(dim,)`` or a batch ``(n, dim)`` as float32, and whether it is a batch.

    Raises:
        ValueError: any other shape (the message gives both valid ones).
    """
    obs = np.asarray(observation, dtype=np.float32)
    if obs.shape == (dim,):
        return obs, False
    if obs.ndim == 2 and obs.shape[1] == dim:
        return obs, True
    raise ValueError(f"observation must have shape ({dim},) or (n, {dim}), got {obs.shape}")


#: ``act(obs, state, episode_start) -> (action, next state)`` for ONE observation ``(dim,)``.
RowPolicy = Callable[[np.ndarray, Any, bool], tuple[np.ndarray, Any]]


def predict_each(
    observation: Any,
    dim: int,
    state: Any,
    episode_start: np.ndarray | None,
    act: RowPolicy,
) -> tuple[np.ndarray, Any]:
    """``Agent.predict`` for an agent that decides one observation at a time (``act``).

    A single observation ``(dim,)`` gets ``act(obs, state, start)``'s answer as it is. A
    batch ``(n, dim)`` is decided row by row: ``state`` is one entry per row (``None``:
    all ``None``), ``episode_start`` one flag per row; the actions come back as ``(n, 3)``
    int64 and the states as a list (``None`` when every row's is ``None``).

    Raises:
        ValueError: a wrong observation shape, or ``state`` not one entry per row.
    """
    obs, batched = as_observations(observation, dim)
    if not batched:
        start = episode_start is not None and bool(np.asarray(episode_start).reshape(-1)[0])
        return act(obs, state, start)
    n = obs.shape[0]
    states: Sequence[Any] = [None] * n if state is None else list(state)
    if len(states) != n:
        raise ValueError(f"state has {len(states)} entries for a batch of {n}")
    starts = (
        np.zeros(n, dtype=bool)
        if episode_start is None
        else np.asarray(episode_start, dtype=bool).reshape(n)
    )
    actions = np.empty((n, 3), dtype=np.int64)
    new_states: list[Any] = []
    for i in range(n):
        actions[i], s = act(obs[i], states[i], bool(starts[i]))
        new_states.append(s)
    return actions, (None if all(s is None for s in new_states) else new_states)


@dataclass(frozen=True)
class Preparation:
    """What preparing an agent cost before it plays: one record on every agent.

    An oracle's search, a rollout table's learning: wall time and the real decisions its
    episodes took (an agent that prepares nothing itself reports ``seconds=None``, 0).

    Attributes:
        seconds: wall time of the preparation, s (``None``: none ran, or not known).
        decisions: decisions its episodes took.
    """

    seconds: float | None = None
    decisions: int = 0


class Agent(ABC):
    """Chooses communication configurations for a commgym environment.

    Args:
        env: a commgym env with a ``MultiDiscrete`` action space over
            ``env.unwrapped.menu`` (an :class:`~commgym.env.ActionMenu`).
        seed: seed of the agent's own randomness (and of the first ``env.reset``).
        **hyperparams: agent-specific settings (see each subclass).

    Raises:
        TypeError: ``env`` is not a commgym env (no menu / wrong action space).
        ValueError: invalid hyperparameters (subclasses name the value).
    """

    #: Registry name (``make_agent(name, env)``).
    name: ClassVar[str] = ""
    #: Adapts inside every episode from its observations (heuristics, in-episode
    #: autotuners): evaluation gives it no tuning phase beforehand, and whatever it
    #: spends adapting counts in the episode's measured time.
    online: ClassVar[bool] = False
    #: Knows the answer in hindsight (``oracle-static``: every entry run on the
    #: evaluation seeds); reported as an upper bound, not as a method, with its search
    #: cost apart.
    oracle: ClassVar[bool] = False
    #: Learns a policy before evaluation (reinforcement learning, rollout tables):
    #: tables report it as the learned agent, with its training cost.
    learned: ClassVar[bool] = False
    #: Learns by forking real episodes (``AllReduceEnv.snapshot``): never on the surrogate.
    needs_real_env: ClassVar[bool] = False
    #: ``learn`` runs searches of a size of their own (``total_timesteps`` unused), each
    #: with its own progress bar (``progress_bar=True``): a bar over ``total_timesteps``
    #: would show nothing of them (``rollout-table``: ~800-1,700 s of real episodes).
    searches_when_learning: ClassVar[bool] = False
    #: Answers ``predict`` from an observation. False for bounds found per evaluation seed
    #: (``oracle-adaptive``): nothing to steer a job with, so ``CommScheduler`` refuses it.
    acts: ClassVar[bool] = True
    #: Reads the observation's probe field (``log10_probe_gbps``). The rollout resets its
    #: episodes with ``options={"probe": reads_probe}``, so a player that never reads it
    #: (static entries, the oracles, heuristics keyed on loss or timing) does not pay for
    #: the probe all-reduce: its time counts as training time. True unless a class
    #: declares otherwise (a policy over the whole observation reads it).
    reads_probe: ClassVar[bool] = True

    def __init__(self, env: gym.Env, *, seed: int | None = None, **hyperparams: Any) -> None:
        self.env = env
        self.menu = menu_of(env)
        self.action_space: spaces.MultiDiscrete = env.action_space  # type: ignore[assignment]
        self.observation_space = env.observation_space
        self.seed = seed
        self.layout = layout_of(env)
        #: the job the policy was trained on (model size, decision interval), if known
        self.trained_on: dict[str, Any] | None = training_facts(env)
        self._hyperparams = dict(hyperparams)

    # -- interface -----------------------------------------------------------------------
    @property
    def display_name(self) -> str:
        """Label for tables and plots: the registry name (oracles say they are one)."""
        return self.name

    @property
    def hyperparams(self) -> dict[str, Any]:
        """Hyperparameters as plain values (JSON-serialisable; for logging and saving)."""
        return dict(self._hyperparams)

    @property
    def preparation(self) -> Preparation:
        """What preparing this agent cost (:class:`Preparation`; none by default)."""
        return Preparation()

    @abstractmethod
    def predict(
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        """Choose menu indices for an observation.

        Args:
            observation: float32 array of shape ``(20,)`` (``len(OBSERVATION_FIELDS)``) or a
                batch ``(n, 20)``.
            state: the state returned by the previous call (agents that track episode
                history), or None.
            episode_start: bool array ``(n,)``; True resets that row's state.
            deterministic: the agent's best choice (True) or its exploring choice.

        Returns:
            ``(action, state)``: int64 action of shape ``(3,)`` (``(n, 3)`` for a batch)
            inside the env's original ``MultiDiscrete`` space, and the next state.

        Raises:
            ValueError: the observation has the wrong shape.
        """

    @abstractmethod
    def learn(
        self,
        total_timesteps: int,
        progress_bar: bool = False,
        callback: LearnCallback | Any = None,
    ) -> Agent:
        """Interact with ``self.env`` for ``total_timesteps`` decisions and learn.

        Args:
            total_timesteps: number of ``env.step`` calls (decisions), >= 0.
            progress_bar: show a progress bar.
            callback: ``callback(step: dict) -> bool`` called after every step (keys
                ``obs, action, reward, terminated, truncated, info, timestep``);
                returning ``False`` stops. SB3 agents also take SB3 callbacks.

        Returns:
            self.
        """

    @abstractmethod
    def save(self, path: str | Path) -> Path:
        """Write the policy to ONE zip file; ``.zip`` is appended if missing.

        Returns:
            The path written.
        """

    @classmethod
    @abstractmethod
    def load(cls, path: str | Path, env: gym.Env | None = None) -> Agent:
        """Load a policy written by :meth:`save`.

        Args:
            path: the policy zip.
            env: env to act/learn in; its layout is checked against the file's.
                Without one, ``predict`` works and ``learn`` raises.

        Raises:
            ValueError: the file is of another agent class, or the layout is
                incompatible with ``env`` (the message names the differences).
        """

    def get_state(self) -> dict[str, Any]:
        """Everything :meth:`predict` depends on besides its arguments (a copy).

        Random generators, decision counters, bandit statistics, search state: whatever
        makes this agent's next answer differ from a freshly built one's. The observation
        and the ``state`` argument are the caller's to keep.
        :meth:`~commgym.agents.scheduler.CommScheduler.state_dict` saves it, so a job
        resumed from a checkpoint decides exactly as if it had not stopped.

        Returns:
            Plain values (dicts, lists, numbers, strings, booleans, None), restorable
            with :meth:`set_state` into an agent built the same way (same class,
            hyperparameters, seed and policy file).

        Raises:
            NotImplementedError: the agent does not declare what its predictions depend
                on (the default), so it cannot be checkpointed.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not declare what its predictions depend on, so "
            "its state cannot be checkpointed (a resumed job would decide differently): "
            "implement get_state() and set_state() (StepAgent subclasses: _get_state() "
            "and _set_state())"
        )

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output (the agent continues where it was).

        Args:
            state: what :meth:`get_state` returned, possibly after a round trip through
                ``torch.save`` / ``torch.load`` or JSON.

        Raises:
            NotImplementedError: the agent does not declare its state (see
                :meth:`get_state`).
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not declare its state: implement get_state() "
            "and set_state()"
        )

    # -- helpers for subclasses ----------------------------------------------------------
    def _policy_json(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "format": POLICY_FORMAT,
            "class": type(self).__name__,
            "name": self.name,
            "seed": self.seed,
            "hyperparams": self.hyperparams,
            "state": state if state is not None else {},
            "layout": self.layout,
            "trained_on": self.trained_on,
        }

    @classmethod
    def _check_file(cls, meta: dict[str, Any], path: Path, env: gym.Env | None) -> gym.Env:
        if meta.get("class") != cls.__name__:
            raise ValueError(
                f"{path} holds a {meta.get('class')!r} policy, not {cls.__name__}; "
                "use commgym.agents.load_agent to pick the class from the file"
            )
        if env is None:
            return LayoutEnv(ActionMenu.from_any(meta["layout"]["action_menu"]))
        check_compatible(meta["layout"], env)
        return env

    def _require_env(self) -> gym.Env:
        if isinstance(self.env, LayoutEnv):
            raise RuntimeError(
                f"{type(self).__name__} was loaded without an env; load(path, env=...) to learn"
            )
        return self.env

    def _flat(self, action: np.ndarray) -> int:
        return int(np.ravel_multi_index(tuple(int(x) for x in action), tuple(self.menu.nvec)))

    def _unflat(self, index: int) -> np.ndarray:
        return np.array(np.unravel_index(int(index), tuple(self.menu.nvec)), dtype=np.int64)

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={v!r}" for k, v in self.hyperparams.items())
        return f"{type(self).__name__}({hp}{', ' if hp else ''}seed={self.seed!r})"


class StepAgent(Agent):
    """Base of the agents of this package: a per-observation rule plus an env loop.

    Subclasses implement :meth:`_act` (one observation -> action) and optionally
    :meth:`_observe` (learn from one transition), :meth:`_get_state` /
    :meth:`_set_state` and :meth:`_episode_start`. :meth:`_get_state` must hold
    everything :meth:`_act` depends on besides its arguments (learned statistics, random
    generators, counters) as plain JSON values: policy files and
    :meth:`~Agent.get_state` (scheduler checkpoints) both carry it.
    ``learn`` runs the env itself: ``reset(seed=seed)`` first, then one ``step`` per
    timestep with the exploring action (``deterministic=False``), resetting when an
    episode ends.
    """

    def __init__(self, env: gym.Env, *, seed: int | None = None, **hyperparams: Any) -> None:
        super().__init__(env, seed=seed, **hyperparams)
        self._obs_dim = int(np.prod(self.observation_space.shape))
        self._learned_once = False

    # -- to implement -------------------------------------------------------------------
    @abstractmethod
    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        """One float32 observation ``(20,)`` -> (int64 action ``(3,)``, next state)."""

    def _observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> None:
        """Learn from one transition (default: nothing to learn)."""

    def _episode_start(self, obs: np.ndarray) -> None:
        """Called by ``learn`` after every ``env.reset`` (default: nothing)."""

    def _get_state(self) -> dict[str, Any]:
        """Learned and decision state as plain JSON values (default: none)."""
        return {}

    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`_get_state`'s output (default: nothing)."""

    def get_state(self) -> dict[str, Any]:  # noqa: D102 - documented on Agent
        return copy.deepcopy(self._get_state())

    def set_state(self, state: dict[str, Any]) -> None:  # noqa: D102 - documented on Agent
        self._set_state(copy.deepcopy(state))

    # -- Agent API ------------------------------------------------------------------------
    def predict(  # noqa: D102 - documented on Agent
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        def act(obs: np.ndarray, row_state: Any, start: bool) -> tuple[np.ndarray, Any]:
            return self._act(obs, None if start else row_state, deterministic)

        return predict_each(observation, self._obs_dim, state, episode_start, act)

    def learn(  # noqa: D102 - documented on Agent
        self,
        total_timesteps: int,
        progress_bar: bool = False,
        callback: LearnCallback | None = None,
    ) -> StepAgent:
        check_int("total_timesteps", total_timesteps, 0)
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable(dict) -> bool, got {callback!r}")
        env = self._require_env()
        seed = self.seed if not self._learned_once else None
        self._learned_once = True
        obs, _ = env.reset(seed=seed)
        self._episode_start(obs)
        state: Any = None
        progress = Progress(total_timesteps, type(self).__name__) if progress_bar else None
        try:
            for t in range(int(total_timesteps)):
                action, state = self.predict(obs, state, deterministic=False)
                next_obs, reward, terminated, truncated, info = env.step(action)
                reward = float(reward)
                self._observe(obs, action, reward, next_obs, terminated, truncated, info)
                if progress is not None:
                    progress.advance()
                if callback is not None:
                    step = step_report(next_obs, action, reward, terminated, truncated, info, t + 1)
                    if callback(step) is False:
                        break
                obs = next_obs
                if terminated or truncated:
                    obs, _ = env.reset()
                    state = None
                    self._episode_start(obs)
        finally:
            if progress is not None:
                progress.close()
        return self

    def save(self, path: str | Path) -> Path:  # noqa: D102 - documented on Agent
        path = zip_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = self._policy_json(self._get_state())
        text = json.dumps(meta, indent=1, allow_nan=False)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(POLICY_JSON, text)
        return path

    @classmethod
    def load(cls, path: str | Path, env: gym.Env | None = None) -> StepAgent:  # noqa: D102
        path = Path(path)
        meta = read_policy_json(path)
        env = cls._check_file(meta, path, env)
        agent = cls(env, seed=meta.get("seed"), **meta.get("hyperparams", {}))
        agent._set_state(meta.get("state", {}))
        return agent


class Progress:
    """A rich progress bar over decisions (imported lazily)."""

    def __init__(self, total: int, label: str) -> None:
        from rich.progress import Progress

        self._progress = Progress()
        self._progress.start()
        self._task = self._progress.add_task(f"{label} learn", total=total)

    def advance(self) -> None:
        """One more decision done."""
        self._progress.advance(self._task)

    def close(self) -> None:
        """Stop the bar."""
        self._progress.stop()


def _finite(x: float, default: float = 0.0) -> float:
    """``x`` if finite else ``default`` (JSON has no NaN)."""
    return x if math.isfinite(x) else default
