"""stable-baselines3 agents: PPO, RecurrentPPO and A2C on the menu, DQN on its flattening.

PPO, sb3-contrib's RecurrentPPO and A2C act on the ``MultiDiscrete`` menu directly.

SB3 (Raffin et al., "Stable-Baselines3: Reliable Reinforcement Learning
Implementations", JMLR 2021) runs the env loop itself. Defaults are sized for the real
environment, where one decision costs seconds: short rollouts and small batches so the
policy updates after tens of decisions, not thousands.

.. warning::
   SB3 policy files contain pickles (in the ``data`` member). Loading a policy file from
   an untrusted source can execute arbitrary code.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import warnings
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3 import A2C, DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback

from commgym.agents.base import (
    POLICY_JSON,
    Agent,
    LayoutEnv,
    LearnCallback,
    Progress,
    as_observations,
    read_policy_json,
    step_report,
    zip_path,
)
from commgym.collectives.checks import check_float, check_int
from commgym.env import FlattenAction

__all__ = ["A2CAgent", "DQNAgent", "PPOAgent", "RecurrentPPOAgent", "SB3Agent"]


def _plain(value: Any) -> Any:
    """JSON-safe copy of a hyperparameter (classes and callables become their names)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def _quiet_logger(model: Any) -> None:
    """A silent SB3 logger for ``verbose=0`` models.

    SB3's default logger set-up creates an empty ``SB3-<date>`` folder in the temp
    directory on every ``learn()`` when nothing is logged; commgym logs to MLflow instead.
    """
    if getattr(model, "verbose", 0) == 0:
        from stable_baselines3.common.logger import Logger

        model.set_logger(Logger(folder=None, output_formats=[]))


class _FunctionCallback(BaseCallback):
    """Adapts ``callback(step: dict) -> bool`` to SB3's callback protocol.

    Called once per env of the algorithm's ``VecEnv`` and step (a ``RayVecEnv`` has
    several); the step dict then also says which env (``"env"``, 0-based).
    """

    def __init__(self, fn: LearnCallback, to_multi: Any) -> None:
        super().__init__()
        self._fn = fn
        self._to_multi = to_multi

    def _on_step(self) -> bool:
        loc = self.locals
        keep = True
        for i in range(len(loc["dones"])):
            info = dict(loc["infos"][i])
            done = bool(loc["dones"][i])
            truncated = done and bool(info.get("TimeLimit.truncated", False))
            obs = info.get("terminal_observation") if done else None
            if obs is None:
                obs = np.asarray(loc["new_obs"])[i]
            action = self._to_multi(np.asarray(loc["actions"])[i])
            reward = float(np.asarray(loc["rewards"])[i])
            step = step_report(
                obs, action, reward, done and not truncated, truncated, info, self.num_timesteps
            )
            if len(loc["dones"]) > 1:
                step["env"] = i
            keep = self._fn(step) is not False and keep
        return keep


class _RichProgressCallback(BaseCallback):
    """A rich progress bar over SB3 timesteps (fallback when tqdm is missing)."""

    def __init__(self, total: int, label: str) -> None:
        super().__init__()
        self._total, self._label = total, label
        self._bar: Progress | None = None

    def _on_training_start(self) -> None:
        self._bar = Progress(self._total, self._label)

    def _on_step(self) -> bool:
        if self._bar is not None:
            self._bar.advance()
        return True

    def _on_training_end(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class SB3Agent(Agent):
    """An SB3 algorithm behind the :class:`Agent` interface.

    ``predict(deterministic=True)`` is a function of the observation (and of SB3's
    ``state`` for recurrent policies, which the caller threads through). Exploring
    predictions (``deterministic=False``: PPO/A2C sample their action distribution, DQN
    is epsilon-greedy) draw from the agent's own generator, seeded from ``seed``, never
    from the process's global torch / numpy generators: the caller's random streams are
    left as they were, and :meth:`get_state` captures the agent's, so a checkpointed job
    explores on exactly as if it had not stopped. ``learn`` is SB3's own loop with SB3's
    seeding.

    Args:
        env: commgym env (``MultiDiscrete`` action space).
        seed: SB3 seed (torch, numpy, action space).
        vec_env: the ``VecEnv`` the algorithm learns from instead of ``env`` (e.g. a
            :class:`~commgym.agents.ray_env.RayVecEnv`, actions as the algorithm takes
            them: flattened for DQN, see :attr:`flat_actions`); ``env`` then only gives
            the menu and spaces. Not a hyperparameter: not saved.
        history: observations the policy sees, the newest last (1: the current one only).
            Above 1 the algorithm learns on SB3's ``VecFrameStack`` (the last ``history``
            observations concatenated, zeros before an episode's first), an
            action-independent memory of how the link and the loss moved (Aurora's
            history of the last intervals); ``predict`` keeps the same stack in its
            ``state``, so callers thread ``state`` and ``episode_start`` as for a
            recurrent policy.
        normalize: observation (and reward) normalisation while learning, RL Zoo's
            ``normalize`` hyperparameter: ``True`` or a dict of SB3's ``VecNormalize``
            keyword arguments (``norm_obs``, ``norm_reward``, ``clip_obs``,
            ``clip_reward``, ``epsilon``; ``gamma`` is the algorithm's). The observation
            fields span seven decades (a step time in ms, an effective bandwidth in
            Gbit/s, a loss in nats), which an unnormalised MLP policy learns poorly. The
            running mean and variance (of the stacked observation) are saved in the policy
            file as JSON and applied by ``predict``; they are frozen while fine-tuning on
            another env (what the policy learned is relative to them).
        probe: whether the policy reads the probe all-reduce's bandwidth
            (``log10_probe_gbps``). ``False``: every episode it learns or acts in runs
            without the probe (``reset(options={"probe": False})``, :attr:`reads_probe`),
            so its time is not charged for an observation it does not make; the link is
            then seen only through the timing of the entry the policy itself played
            (``step_time_s``, ``comm_wait_frac``, ``bandwidth_gbps`` with the entry's
            indices), which on a shaped link separates the rates for every entry.
        obs_fields: the observation fields the policy reads (names of
            :data:`~commgym.env.spaces.OBSERVATION_FIELDS`); the others read 0 while it
            learns and acts (the layout and its size are unchanged, so a file's
            normaliser and a replay's observations keep their shape). ``None``: all.
            A policy learned in the simulator should read only what the simulator
            models decision by decision: measured on link-lottery's ranks (2026-12-05),
            the gradient-norm fields, constant per entry in the simulator, moved by up
            to 320 of its standard deviations between real decisions and turned a clone
            that had identified the link back to the fast link's entries.
        link_clock: append :class:`~commgym.agents.features.LinkClock`'s features to every
            observation (how long the probe's link has held, how long it held the last time,
            how many changes so far: :data:`~commgym.agents.features.LINK_CLOCK_FIELDS`),
            the action-independent memory that anticipating a link change needs and a frame
            stack cannot give. ``True``: learning in the simulator, each reading belongs to
            the nearest of the probe's modelled readings on the scenario's links
            (:func:`~commgym.agents.features.probe_levels`), elsewhere a change is a move of
            0.5 decades from the phase's median reading; ``{"levels": [...]}`` (log10
            Gbit/s) or ``{"change_decades": x}`` choose. The resolved rule is saved with the
            policy, so it reads real ranks' probes as it read the simulator's. Needs the
            probe (``probe=True``) and the ``log10_probe_gbps`` and ``elapsed_frac`` fields.
            ``{"reader": "mpc", "calibration": path, "learn_decisions": 300}``: the same
            features from the link history of the model-predictive agent reading its own
            timing (:class:`~commgym.agents.features.FilterClock`), probe-free; the filter
            learns the dwells in the simulator (``learn_decisions`` decisions) and is saved
            with the policy, the job's config with it, so the policy loads without an env
            too (``commgym train`` gives it the run's calibration). ``belief: true`` adds the
            filter's own view (its link rate, that link's probability, the probability of a
            change by the next decision: :data:`~commgym.agents.features.FILTER_CLOCK_FIELDS`),
            what mpc plans on and its most probable link alone does not show;
            ``timing_sigma`` sets the filter's reading width (mpc's ``timing_sigma``). The
            clock reads the whole observation; ``obs_fields`` masks what the policy reads.
        shield_regret_s: a model-based shield over the policy's choices (needs
            ``link_clock: {reader: mpc}``): where the clock's filter prices the policy's
            entry more than this many seconds of expected time to target above its own
            best (:attr:`FilterClock.plan_times <commgym.agents.features.FilterClock>`:
            mpc's plan, the chance that the link changes before the next decision
            weighed in), the filter's best entry is played instead. Shielding after
            Alshiekh et al., "Safe Reinforcement Learning via Shielding" (AAAI 2018), with
            the fallback to a model's choice of Mao et al., "Towards Safe Online
            Reinforcement Learning in Computer Systems" (NeurIPS workshop 2019): the
            policy decides where the model sees little at stake, the model vetoes the
            choices it prices as costly (on flaky-link's variant, a dense entry played
            into a slow phase costs 12-29 s a decision). Acting only, never learning; the
            overrides are counted in :attr:`shield_counts`. ``None``: no shield.
        **hyperparams: keyword arguments of the SB3 algorithm (``policy`` defaults to
            ``"MlpPolicy"``, ``device`` to ``"cpu"``); they override :attr:`defaults`.

    Raises:
        TypeError: unknown SB3 keyword arguments (from SB3).
        ValueError: ``history`` is not an integer >= 1; ``normalize`` is not a bool or a dict
            of ``VecNormalize`` keyword arguments; ``obs_fields`` names a field that does
            not exist (the message lists them), or is given with a ``vec_env``;
            ``link_clock`` is not a bool, ``{"levels": [...]}``, ``{"change_decades": x}``
            (or both) or ``{"reader": "mpc", ...}`` with a calibration path, or a probe
            clock is given without the probe; a link clock with a ``vec_env``.
    """

    learned = True

    algo: ClassVar[type[BaseAlgorithm]]
    #: Defaults for the slow real env (overridable by keyword).
    defaults: ClassVar[dict[str, Any]] = {}
    #: The algorithm acts on the menu's flattening (``Discrete``), not on it.
    flat_actions: ClassVar[bool] = False

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        vec_env: Any = None,
        **hyperparams: Any,
    ) -> None:
        merged = {"policy": "MlpPolicy", "device": "cpu", **self.defaults, **hyperparams}
        super().__init__(env, seed=seed, **merged)
        kwargs = dict(merged)
        policy = kwargs.pop("policy")
        self.history = _check_history(kwargs.pop("history", 1))
        self.normalize = _check_normalize(kwargs.pop("normalize", False))
        self.reads_probe = _check_probe(kwargs.pop("probe", True))
        self._mask = _field_mask(kwargs.pop("obs_fields", None))
        self.link_clock = _resolve_link_clock(kwargs.pop("link_clock", False), env)
        _check_clock_inputs(self.link_clock, self.reads_probe)
        if self.link_clock is not None:  # saved as resolved: the file reads probes as learned
            self._hyperparams["link_clock"] = dict(self.link_clock)
        self._clock_filter = _clock_filter(self.link_clock, env)
        self.shield_regret_s = _check_shield(kwargs.pop("shield_regret_s", None), self.link_clock)
        #: decisions the shield priced and the ones it replaced (this process's ``predict``
        #: calls; an env actor's policy copy counts its own)
        self.shield_counts = {"decisions": 0, "overrides": 0}
        self._gamma = float(kwargs.get("gamma", 0.99))
        self._norm: Any = None
        if vec_env is not None and not self.reads_probe:
            # the env actors reset with SB3's VecEnv options, which a step's auto-reset drops
            raise ValueError(
                "probe=False learns on envs this process wraps; it cannot be used with a "
                "vec_env of env actors (learn in the simulator, or keep probe=True)"
            )
        if vec_env is not None and self._mask is not None:
            raise ValueError(
                "obs_fields masks the observations of envs this process wraps; it cannot be "
                "used with a vec_env of env actors (learn in the simulator, or drop obs_fields)"
            )
        if vec_env is not None and self.link_clock is not None:
            raise ValueError(
                "link_clock wraps the envs this process steps; it cannot be used with a "
                "vec_env of env actors (learn in the simulator, or drop link_clock)"
            )
        algo_env = self._learning_env(env) if vec_env is None else self._stacked(vec_env)
        self.model = self.algo(policy, algo_env, seed=seed, **kwargs)
        _quiet_logger(self.model)
        self._learned_once = False
        self._rng = np.random.default_rng(seed)

    @property
    def hyperparams(self) -> dict[str, Any]:  # noqa: D102 - see Agent
        return {k: _plain(v) for k, v in self._hyperparams.items()}

    def _algo_env(self, env: gym.Env) -> gym.Env:
        """The env as the SB3 algorithm sees it.

        Probe-free unless it reads the probe, unread fields 0, the link clock's features
        appended when it has one.
        """
        env = env if self.reads_probe else _ProbeOff(env)
        if self.link_clock is not None:  # the clock reads the whole observation
            from commgym.agents.features import LinkClockWrapper

            env = LinkClockWrapper(env, clock=self._new_clock)
        return env if self._mask is None else _FieldMask(env, self._padded_mask())

    def _padded_mask(self) -> np.ndarray:
        """:attr:`_mask` over the observation the policy reads (the clock's fields read)."""
        assert self._mask is not None
        if self.link_clock is None:
            return self._mask
        from commgym.agents.features import clock_fields

        ones = np.ones(len(clock_fields(self.link_clock)), dtype=np.float32)
        return np.concatenate([self._mask, ones])

    def _new_clock(self) -> Any:
        """A new episode's link clock: the probe's, or mpc's filter's (``reader: mpc``)."""
        from commgym.agents.features import FilterClock, LinkClock

        assert self.link_clock is not None
        if self.link_clock.get("reader") == "mpc":
            return FilterClock(
                self._clock_filter,
                self._clock_filter.budget_s,
                belief=bool(self.link_clock.get("belief")),
            )
        return LinkClock(**self.link_clock)

    def _stacked(self, venv: Any, frozen: bool = False) -> Any:
        """``venv`` with the last :attr:`history` observations stacked, then normalised.

        Both as configured (``history`` 1 and no ``normalize``: ``venv`` itself). A new
        normaliser starts from the agent's statistics; unless ``frozen`` (fine-tuning on
        another env keeps them) it becomes the agent's (:attr:`_norm`, which ``predict``
        applies).
        """
        if self.history > 1:
            from stable_baselines3.common.vec_env import VecFrameStack

            venv = VecFrameStack(venv, self.history)
        if self.normalize is None:
            return venv
        from stable_baselines3.common.vec_env import VecNormalize

        norm = VecNormalize(venv, gamma=self._gamma, **self.normalize)
        if self._norm is not None:
            norm.obs_rms, norm.ret_rms = copy.deepcopy((self._norm.obs_rms, self._norm.ret_rms))
        if frozen:
            norm.training = False
        else:  # the normaliser the algorithm learns with is the one predict applies
            self._norm = norm
        return norm

    def _learning_env(self, env: gym.Env, frozen: bool = False) -> Any:
        """What the algorithm learns on: the env, or a stacked / normalised ``VecEnv`` of it."""
        if self.history == 1 and self.normalize is None:
            return self._algo_env(env)
        from stable_baselines3.common.vec_env import DummyVecEnv

        return self._stacked(DummyVecEnv([lambda: self._algo_env(env)]), frozen)

    def _normalized(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` (stacked) scaled by the learned running statistics, as VecNormalize does."""
        if self._norm is None or not self._norm.norm_obs:
            return obs
        return self._norm.normalize_obs(obs)

    def _to_multi(self, action: np.ndarray) -> np.ndarray:
        """SB3 action -> int64 menu indices ``(3,)`` or ``(n, 3)``."""
        return np.asarray(action, dtype=np.int64)

    def predict(  # noqa: D102 - documented on Agent
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        obs, batch = as_observations(observation, int(np.prod(self.observation_space.shape)))
        clocks = None
        if self.link_clock is not None:  # the clocks ride in the state, outermost
            clocks, state = state if state is not None else (None, None)
            clocks, obs = self._clocked(clocks, obs, episode_start)
        if self._mask is not None:
            obs = obs * self._padded_mask()
        stack = None
        if self.history > 1:  # the observation stack rides in the state, as VecFrameStack's
            stack, state = state if state is not None else (None, None)
            stack = _push(stack, obs.reshape(-1, obs.shape[-1]), self.history, episode_start)
            obs = stack if batch else stack[0]
        obs = self._normalized(obs)
        if deterministic:
            action, state = self.model.predict(obs, state, episode_start, True)
        else:
            action, state = self._explore(obs, state, episode_start)
        state = state if stack is None else (stack, state)
        action = self._to_multi(action)
        if self.shield_regret_s is not None and clocks is not None:
            action = self._shielded(action, clocks)
        return action, state if clocks is None else (clocks, state)

    def _shielded(self, action: np.ndarray, clocks: list[Any]) -> np.ndarray:
        """``action`` (``(3,)`` or ``(n, 3)``) with the shield's vetoes applied per row.

        A row whose clock's filter has a plan (after its first reading of the link) and
        prices the row's entry more than :attr:`shield_regret_s` above its best gets the
        best entry instead.
        """
        assert self.shield_regret_s is not None
        out = np.array(action, dtype=np.int64, copy=True)
        for row, clock in zip(out.reshape(-1, out.shape[-1]), clocks, strict=True):
            times = clock.plan_times  # a FilterClock's (the shield needs the mpc clock)
            if times is None:
                continue
            self.shield_counts["decisions"] += 1
            best = int(np.argmin(times))
            if times[self._flat(row)] - times[best] > self.shield_regret_s:
                row[:] = self._unflat(best)
                self.shield_counts["overrides"] += 1
        return out

    def _clocked(
        self, clocks: list[Any] | None, obs: np.ndarray, episode_start: Any
    ) -> tuple[list[Any], np.ndarray]:
        """Each row's link clock advanced by ``obs``, and ``obs`` with its features.

        ``obs`` is ``(d,)`` or ``(n, d)``; a row whose episode starts gets a new
        :class:`~commgym.agents.features.LinkClock`; the observations come back with the
        same shape but ``d + 3`` wide.
        """
        rows = obs.reshape(-1, obs.shape[-1])
        n = len(rows)
        starts = (
            np.zeros(n, dtype=bool)
            if episode_start is None
            else np.asarray(episode_start, dtype=bool).reshape(-1)
        )
        if clocks is None or len(clocks) != n:
            clocks = [None] * n
        clocks = [
            self._new_clock() if c is None or (i < len(starts) and starts[i]) else c
            for i, c in enumerate(clocks)
        ]
        extra = np.stack([c.update(r) for c, r in zip(clocks, rows, strict=True)])
        out = np.concatenate([rows.astype(np.float32), extra], axis=1)
        return clocks, out.reshape(*obs.shape[:-1], out.shape[-1])

    def _explore(self, obs: np.ndarray, state: Any, episode_start: Any) -> tuple[Any, Any]:
        """An exploring ``model.predict`` on a seed drawn from the agent's generator.

        SB3 samples from torch's global generator (of the policy's device) and DQN's
        epsilon-greedy from numpy's: both are seeded from the agent's own stream for the
        call and restored afterwards.
        """
        seed = int(self._rng.integers(2**63))
        device = self.model.device
        cuda = []
        if device.type == "cuda":
            cuda = [device.index if device.index is not None else torch.cuda.current_device()]
        np_state = np.random.get_state()
        with torch.random.fork_rng(devices=cuda):
            torch.default_generator.manual_seed(seed)
            for i in cuda:
                torch.cuda.default_generators[i].manual_seed(seed)
            np.random.seed(seed % 2**32)
            try:
                return self.model.predict(obs, state, episode_start, False)
            finally:
                np.random.set_state(np_state)

    def get_state(self) -> dict[str, Any]:
        """The exploring generator and the action space's sampler (DQN's random actions).

        Network weights are the policy file's and do not change while acting.
        """
        return {
            "rng": self._rng.bit_generator.state,
            "action_space_rng": self.model.action_space.np_random.bit_generator.state,
        }

    def set_state(self, state: dict[str, Any]) -> None:  # noqa: D102 - documented on Agent
        self._rng.bit_generator.state = copy.deepcopy(state["rng"])
        space_rng = self.model.action_space.np_random
        space_rng.bit_generator.state = copy.deepcopy(state["action_space_rng"])

    def learn(
        self,
        total_timesteps: int,
        progress_bar: bool = False,
        callback: LearnCallback | BaseCallback | list[BaseCallback] | None = None,
    ) -> SB3Agent:
        """Run ``model.learn`` (see :meth:`Agent.learn`); later calls continue counting.

        Args:
            total_timesteps: decisions to collect (SB3 rounds up to whole rollouts for
                PPO/A2C).
            progress_bar: passed to SB3 (whose bar needs ``tqdm``; without it a rich bar
                is shown instead, with a warning).
            callback: ``callback(step: dict) -> bool`` (actions given as ``MultiDiscrete``
                menu indices, also for DQN), or SB3 callback(s) passed through unchanged.

        Returns:
            self.
        """
        check_int("total_timesteps", total_timesteps, 0)
        if self.model.get_env() is None:
            raise RuntimeError(
                f"{type(self).__name__} was loaded without an env; load(path, env=...) to learn"
            )
        cb: Any = callback
        if callback is not None and not isinstance(callback, BaseCallback | list):
            if not callable(callback):
                raise TypeError(f"callback must be callable(dict) -> bool, got {callback!r}")
            cb = _FunctionCallback(callback, self._to_multi)
        if progress_bar and importlib.util.find_spec("tqdm") is None:
            # SB3's bar needs tqdm; a missing cosmetic dependency must not stop training
            warnings.warn(
                "stable-baselines3's progress bar needs tqdm (pip install tqdm); "
                "showing a rich progress bar instead",
                stacklevel=2,
            )
            progress_bar = False
            bar = _RichProgressCallback(int(total_timesteps), type(self).__name__)
            cb = [bar] if cb is None else [bar, *(cb if isinstance(cb, list) else [cb])]
        self.model.learn(
            int(total_timesteps),
            callback=cb,
            progress_bar=progress_bar,
            reset_num_timesteps=not self._learned_once,
        )
        self._learned_once = True
        return self

    def warm_start(
        self,
        expert: Any,
        episodes: int,
        *,
        epochs: int = 30,
        batch_size: int = 256,
        learning_rate: float = 1e-3,
        explore: float = 0.0,
        dagger_rounds: int = 0,
        regret_scale_s: float | None = None,
        callback: Any = None,
    ) -> dict[str, float]:
        """Behaviour-clone ``expert`` on the env this agent learns on, before RL.

        Records ``episodes`` whole episodes of the expert through the algorithm's own
        ``VecEnv`` (:func:`~commgym.agents.imitation.oracle_demonstrations`; its frame
        stack and normaliser see them, so the normaliser's statistics start from the
        expert's states) and fits the policy to them (:meth:`behaviour_clone`). The
        normaliser's statistics are frozen afterwards (as :meth:`fine_tune` freezes them):
        RL after the clone learns in the clone's input scale.

        Args:
            expert: ``expert(unwrapped env) -> action or None``, e.g.
                :class:`~commgym.agents.imitation.SimScheduleExpert`.
            episodes: expert episodes to record (int >= 1).
            epochs: passes over the demonstrations (:meth:`behaviour_clone`).
            batch_size: decisions per gradient step (:meth:`behaviour_clone`).
            learning_rate: Adam's step size (:meth:`behaviour_clone`).
            explore: probability of a random entry played in the expert's place, its
                label still the expert's (noise injection, see
                :func:`~commgym.agents.imitation.oracle_demonstrations`).
            dagger_rounds: DAgger rounds after the first fit (Ross, Gordon & Bagnell,
                AISTATS 2011): each records ``episodes`` more episodes played by the clone
                (deterministic) and labelled by the expert, adds them to all recorded so
                far and fits the policy again on the whole set. The first fit sees only the
                expert's own states; a clone that agrees on 97 % of them can still keep a
                dense entry a decision too long where the expert would not, a state the
                expert never visits (int >= 0; 0: plain behaviour cloning).
            regret_scale_s: weigh each decision by what the clone's current choice there
                would cost (:meth:`behaviour_clone`'s ``regret_scale_s``); needs an expert
                that prices every entry (``mpc``). ``None``: every decision alike.
            callback: called after each recorded episode.

        Returns:
            :meth:`behaviour_clone`'s figures (on the last fit's whole set) plus
            ``episodes`` (recorded in all rounds), ``skipped`` and, with DAgger rounds,
            ``dagger_agreement``: the fraction of the last round's decisions on which the
            clone played the expert's label before that round's fit.

        Raises:
            ValueError: the algorithm has no action log-likelihood (DQN), bad sizes.
            TypeError: the expert cannot read this env (not the simulator).
        """
        from commgym.agents.imitation import Demonstrations, oracle_demonstrations

        fit_kwargs = {
            "epochs": epochs,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "regret_scale_s": regret_scale_s,
        }

        self._check_clonable()
        check_int("dagger_rounds", dagger_rounds, 0)
        seed = 0 if self.seed is None else int(self.seed)
        venv = self.model.get_env()

        def record(learner: Any, round_: int) -> Demonstrations:
            return oracle_demonstrations(
                venv,
                expert,
                episodes,
                gamma=self._gamma,
                normalizer=self._norm,
                explore=explore,
                learner=learner,
                seed=seed + round_,
                callback=callback,
            )

        demos = record(None, 0)
        fit = self.behaviour_clone(demos, **fit_kwargs)
        if self._norm is not None:
            # what the clone learned is relative to these statistics: measured on
            # flaky-link's simulator, letting them move on during 2,048 PPO decisions at
            # learning rate 0 (one field's variance grew 67x as the sampling policy visited
            # values the expert never did) turned the clone into a static policy
            self._norm.training = False
        extra: dict[str, float] = {}
        for r in range(1, int(dagger_rounds) + 1):

            def clone(obs: np.ndarray) -> np.ndarray:
                return self.model.predict(obs, deterministic=True)[0]

            new = record(clone, r)
            # the clone's action at each recorded decision, in recording order, to report
            # how often it already agreed with the expert on its own states
            mine = self._clone_actions(new.observations)
            extra["dagger_agreement"] = float((mine == new.actions).all(axis=1).mean())
            demos = demos + new
            fit = self.behaviour_clone(demos, **fit_kwargs)
        # SB3 resets its env at the start of learn() only on its first call; the cloning
        # episodes left it mid-episode, so learn() must start from a reset
        self.model._last_obs = None
        return {
            **fit,
            "episodes": float(demos.episodes),
            "skipped": float(demos.skipped),
            **extra,
        }

    def _clone_actions(self, observations: np.ndarray) -> np.ndarray:
        """The policy's deterministic actions ``(n, 3)`` on unscaled demonstration rows."""
        policy = self.model.policy
        obs = torch.as_tensor(self._normalized(observations), dtype=torch.float32)
        with torch.no_grad():
            mode = policy.get_distribution(obs).mode()
        return mode.reshape(len(observations), -1).cpu().numpy().astype(np.int64)

    def _check_clonable(self) -> None:
        from stable_baselines3.common.policies import ActorCriticPolicy

        if not isinstance(self.model.policy, ActorCriticPolicy):
            raise ValueError(
                f"behaviour cloning fits an actor-critic policy's action likelihood (ppo, a2c); "
                f"{type(self).__name__}'s {type(self.model.policy).__name__} has none"
            )

    def behaviour_clone(
        self,
        demos: Any,
        *,
        epochs: int = 30,
        batch_size: int = 256,
        learning_rate: float = 1e-3,
        ent_weight: float = 1e-3,
        vf_weight: float = 0.5,
        regret_scale_s: float | None = None,
    ) -> dict[str, float]:
        """Fit the policy to demonstrations (behaviour cloning) and the critic to their returns.

        Loss per minibatch: ``-mean(log pi(a|s)) - ent_weight * mean(H(pi(.|s))) + vf_weight
        * mean((V(s) - G)^2)``; the first two terms are the ``imitation`` library's BC loss
        (Adam, its default learning rate 1e-3), the last fits the value head to the
        demonstrations' discounted returns ``G`` so RL fine-tuning starts with a critic that
        values the cloned policy. A fresh Adam optimiser; the algorithm's own is untouched.
        Observations are scaled by the agent's normaliser as :meth:`predict` scales them.

        Args:
            demos: :class:`~commgym.agents.imitation.Demonstrations` (observations ``(n,
                d)`` float32 unscaled, actions ``(n, 3)`` int64, returns ``(n,)``).
            epochs: passes over the demonstrations (int >= 1).
            batch_size: decisions per gradient step (int >= 1).
            learning_rate: Adam's step size (> 0).
            ent_weight: weight of the entropy bonus (>= 0).
            vf_weight: weight of the value loss (>= 0).
            regret_scale_s: cost-sensitive cloning (> 0, s; ``None``: off): each decision's
                log-likelihood term is weighted ``1 + r / regret_scale_s`` (at most
                :data:`MAX_REGRET_WEIGHT`), ``r`` the expert's expected regret, s, of the
                entry the policy now plays there (``demos.regret_s``, recomputed every
                minibatch), normalised by the minibatch's weights. A 0/1 imitation loss weighs
                a mistake that costs a 12 s decision on a slow link like one that costs
                10 ms; weighting by the learner's own cost-to-go is what AggreVaTe (Ross &
                Bagnell, 2014) adds to DAgger, here with the expert's model as the cost.

        Returns:
            ``{"decisions", "nll", "accuracy", "value_mse"}`` on the demonstrations after
            the last epoch; ``accuracy`` is the fraction of decisions whose deterministic
            action (the mode of every dimension) is the expert's.

        Raises:
            ValueError: no demonstrations, bad sizes, a policy without an action likelihood;
                ``regret_scale_s`` not > 0, or given for demonstrations without regrets.
        """
        self._check_clonable()
        regret = None
        if regret_scale_s is not None:
            if isinstance(regret_scale_s, bool) or not float(regret_scale_s) > 0:
                raise ValueError(f"regret_scale_s must be > 0 s, got {regret_scale_s!r}")
            if demos.regret_s is None:
                raise ValueError(
                    "regret_scale_s weighs each decision by the expert's priced regret; "
                    "these demonstrations hold none (the expert must price every entry: "
                    "expert mpc), drop regret_scale_s"
                )
            regret = torch.as_tensor(np.nan_to_num(demos.regret_s, nan=0.0))
            nvec = tuple(int(v) for v in self.model.action_space.nvec)
            strides = torch.tensor([nvec[1] * nvec[2], nvec[2], 1], dtype=torch.int64)
        check_int("epochs", epochs, 1)
        check_int("batch_size", batch_size, 1)
        if not learning_rate > 0 or ent_weight < 0 or vf_weight < 0:
            raise ValueError(
                f"learning_rate must be > 0 and ent_weight, vf_weight >= 0; got "
                f"{learning_rate!r}, {ent_weight!r}, {vf_weight!r}"
            )
        n = len(demos.actions)
        if n == 0:
            raise ValueError(
                "no demonstrations to clone (every episode lacked the expert's advice)"
            )
        policy = self.model.policy
        obs = torch.as_tensor(self._normalized(demos.observations), dtype=torch.float32)
        acts = torch.as_tensor(demos.actions, dtype=torch.int64)
        rets = torch.as_tensor(demos.returns, dtype=torch.float32)
        opt = torch.optim.Adam(policy.parameters(), lr=float(learning_rate))
        gen = torch.Generator().manual_seed(0 if self.seed is None else int(self.seed))
        policy.set_training_mode(True)
        for _ in range(int(epochs)):
            for idx in torch.randperm(n, generator=gen).split(int(batch_size)):
                values, logp, entropy = policy.evaluate_actions(obs[idx], acts[idx])
                if regret is None:
                    nll = -logp.mean()
                else:
                    with torch.no_grad():  # the entry the policy plays now, its cost there
                        k = (policy.get_distribution(obs[idx]).mode() * strides).sum(dim=1)
                        r = regret[idx].gather(1, k.reshape(-1, 1)).flatten()
                        w = (1.0 + r / float(regret_scale_s)).clamp(max=MAX_REGRET_WEIGHT)
                    nll = -(w.float() * logp).sum() / w.sum().float()
                loss = nll - ent_weight * entropy.mean()
                loss = loss + vf_weight * torch.mean((values.flatten() - rets[idx]) ** 2)
                opt.zero_grad()
                loss.backward()
                opt.step()
        policy.set_training_mode(False)
        with torch.no_grad():
            values, logp, _ = policy.evaluate_actions(obs, acts)
        mode = self._clone_actions(demos.observations)
        return {
            "decisions": float(n),
            "nll": float(-logp.mean()),
            "accuracy": float((mode == demos.actions).all(axis=1).mean()),
            "value_mse": float(torch.mean((values.flatten() - rets) ** 2)),
        }

    def _rollout_buffer(self, n_steps: int) -> Any:
        """An on-policy rollout buffer of ``n_steps`` decisions shaped as the algorithm's."""
        from stable_baselines3.common.buffers import RolloutBuffer

        m = self.model
        return RolloutBuffer(
            n_steps, m.observation_space, m.action_space, device=m.device, gamma=m.gamma,
            gae_lambda=m.gae_lambda, n_envs=m.n_envs,
        )  # fmt: skip

    def fine_tune(
        self,
        env: gym.Env,
        episodes: int,
        *,
        rollout_steps: int = 32,
        callback: LearnCallback | None = None,
    ) -> int:
        """Continue learning on another env (real ranks) for whole episodes.

        The sim-to-real recipe: a policy learned on ``commgym/Surrogate-v1`` is refined
        on a few real episodes. On-policy algorithms (PPO, A2C) collect ``rollout_steps``
        decisions per update here instead of their training ``n_steps`` (a few hundred on
        the surrogate would leave no update in ten real episodes); the last partial
        rollout is not used for an update. The learned weights and optimizer are kept.

        Args:
            env: the env to continue on (same action menu and observation layout).
            episodes: episodes to run (int >= 0; 0 does nothing).
            rollout_steps: decisions per on-policy update (int >= 1).
            callback: called per decision as in :meth:`learn`.

        Returns:
            Decisions run on ``env``.

        Raises:
            ValueError: ``episodes`` < 0 or ``rollout_steps`` < 1.
        """
        check_int("episodes", episodes, 0)
        check_int("rollout_steps", rollout_steps, 1)
        if episodes == 0:
            return 0
        from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

        model = self.model
        model.set_env(self._learning_env(env, frozen=True))
        saved = None
        if isinstance(model, OnPolicyAlgorithm):
            saved = (model.n_steps, model.rollout_buffer)
            model.n_steps = int(rollout_steps)
            model.rollout_buffer = self._rollout_buffer(int(rollout_steps))
        count = {"episodes": 0, "decisions": 0}

        def stop_after(step: dict[str, Any]) -> bool:
            count["decisions"] += 1
            if step["terminated"] or step["truncated"]:
                count["episodes"] += 1
            if callback is not None and callback(step) is False:
                return False
            return count["episodes"] < episodes

        try:
            # the bound is never reached: stop_after ends learning after `episodes`
            self.learn(10**9, callback=stop_after)
        finally:
            if saved is not None:
                model.n_steps, model.rollout_buffer = saved
        return count["decisions"]

    def save(self, path: str | Path) -> Path:  # noqa: D102 - documented on Agent
        path = zip_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.model.save(path)
        state: dict[str, Any] = {"num_timesteps": int(self.model.num_timesteps)}
        if self._norm is not None:
            state["normalization"] = _rms_json(self._norm)
        if self._clock_filter is not None:  # what the clock's filter learned of the links
            state["clock_filter"] = {
                "agent": self._clock_filter.get_state(),
                # the job it was built for, so it loads without an env (a replay)
                "config": self._clock_filter.env.unwrapped.config.to_dict(),
            }
        meta = self._policy_json(state)
        with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(POLICY_JSON, json.dumps(meta, indent=1, allow_nan=False))
        return path

    @classmethod
    def load(cls, path: str | Path, env: gym.Env | None = None) -> SB3Agent:
        """Load an SB3 policy file (see :meth:`Agent.load`).

        .. warning:: SB3 files contain pickles: never load one from an untrusted source.
        """
        path = Path(path)
        meta = read_policy_json(path)
        agent_env = cls._check_file(meta, path, env)
        agent = cls.__new__(cls)
        Agent.__init__(agent, agent_env, seed=meta.get("seed"), **meta.get("hyperparams", {}))
        hp = meta.get("hyperparams", {})
        agent.history = _check_history(hp.get("history", 1))
        agent.normalize = _check_normalize(hp.get("normalize", False))
        agent.reads_probe = _check_probe(hp.get("probe", True))
        agent._mask = _field_mask(hp.get("obs_fields"))
        agent.link_clock = _check_link_clock(hp.get("link_clock", False))
        agent._clock_filter = _clock_filter(
            agent.link_clock, env, meta.get("state", {}).get("clock_filter"), path
        )
        agent.shield_regret_s = _check_shield(hp.get("shield_regret_s"), agent.link_clock)
        agent.shield_counts = {"decisions": 0, "overrides": 0}
        agent._gamma = float(hp.get("gamma", 0.99))
        agent._norm = None
        saved_norm = meta.get("state", {}).get("normalization")
        if agent.normalize is not None:
            if saved_norm is None:
                raise ValueError(f"{path} was learned with normalize but holds no statistics")
            from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

            d = int(np.prod(agent_env.observation_space.shape))
            from commgym.agents.features import clock_fields

            d += len(clock_fields(agent.link_clock))
            shape = (agent.history * d,)
            space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
            # the statistics' holder when no env is given (predict-only, e.g. replay)
            agent._norm = VecNormalize(
                DummyVecEnv([lambda: _SpaceOnly(space)]), training=False, **agent.normalize
            )
            _set_rms(agent._norm, saved_norm)
        algo_env = agent._learning_env(env) if env is not None else None
        agent.model = cls.algo.load(path, env=algo_env, device="cpu")
        _quiet_logger(agent.model)
        agent._learned_once = True
        agent._rng = np.random.default_rng(meta.get("seed"))
        return agent


def _check_history(history: Any) -> int:
    return check_int("history", history, 1, note=" (observations stacked)")


#: VecNormalize keyword arguments a policy may set (``gamma`` is the algorithm's).
_NORMALIZE_KEYS = ("norm_obs", "norm_reward", "clip_obs", "clip_reward", "epsilon")


def _check_normalize(normalize: Any) -> dict[str, Any] | None:
    """``normalize`` as VecNormalize keyword arguments (``None``: off)."""
    if normalize is False or normalize is None:
        return None
    if normalize is True:
        return {}
    if isinstance(normalize, dict):
        bad = sorted(set(normalize) - set(_NORMALIZE_KEYS))
        if bad:
            raise ValueError(
                f"normalize has unknown keys {bad}; valid: {', '.join(_NORMALIZE_KEYS)}"
            )
        return dict(normalize)
    raise ValueError(
        f"normalize must be true, false or a dict of VecNormalize arguments, got {normalize!r}"
    )


#: the largest weight cost-sensitive cloning gives one decision (``regret_scale_s``): a
#: handful of 24 s decisions must not drown the rest of the demonstrations
MAX_REGRET_WEIGHT = 100.0

#: ``link_clock: {reader: mpc, ...}``'s keys, and the probe clock's.
_FILTER_KEYS = {"reader", "calibration", "learn_decisions", "belief", "timing_sigma"}
_PROBE_CLOCK_KEYS = {"change_decades", "levels"}


def _check_link_clock(link_clock: Any) -> dict[str, Any] | None:
    """``link_clock`` as its settings (``None``: no clock).

    :class:`~commgym.agents.features.LinkClock` keyword arguments, or ``{"reader": "mpc",
    "calibration": path, "learn_decisions": n}``; ``True``: the move rule at 0.5 decades
    (learning in the simulator, :func:`_resolve_link_clock` gives its levels instead).
    """
    if link_clock is False or link_clock is None:
        return None
    if link_clock is True:
        return {"change_decades": 0.5}
    if isinstance(link_clock, dict) and link_clock.get("reader") is not None:
        if link_clock["reader"] != "mpc" or not set(link_clock) <= _FILTER_KEYS:
            raise ValueError(
                "link_clock with a reader is {reader: mpc, calibration: PATH, "
                "learn_decisions: N, belief: BOOL, timing_sigma: X} (mpc's timing filter), "
                f"got {link_clock!r}"
            )
        belief = link_clock.get("belief", False)
        if not isinstance(belief, bool):
            raise ValueError(f"link_clock.belief must be true or false, got {belief!r}")
        cal = link_clock.get("calibration")
        if not isinstance(cal, str) or not cal:
            raise ValueError(
                f"link_clock {{reader: mpc}} needs calibration: the path of the `commgym "
                f"calibrate-sim` record mpc reads (train gives the run's), got {cal!r}"
            )
        n = check_int("link_clock.learn_decisions", link_clock.get("learn_decisions", 300), 0)
        out = {"reader": "mpc", "calibration": cal, "learn_decisions": n}
        # saved only where set: policy files without them load unchanged
        if belief:
            out["belief"] = True
        if "timing_sigma" in link_clock:
            out["timing_sigma"] = check_float(
                "link_clock.timing_sigma", link_clock["timing_sigma"], 0.0, strict=True
            )
        return out
    if isinstance(link_clock, dict) and link_clock and set(link_clock) <= _PROBE_CLOCK_KEYS:
        from commgym.agents.features import LinkClock

        clock = LinkClock(**link_clock)  # its own check of the values
        out: dict[str, Any] = {"change_decades": clock.change_decades}
        if clock.levels is not None:
            out["levels"] = list(clock.levels)
        return out
    raise ValueError(
        "link_clock must be true, false, {'levels': [log10 Gbit/s, ...]}, "
        f"{{'change_decades': x}} or {{'reader': 'mpc', ...}}, got {link_clock!r}"
    )


def _resolve_link_clock(link_clock: Any, env: gym.Env) -> dict[str, Any] | None:
    """:func:`_check_link_clock`, with ``True`` reading the simulator's probe levels."""
    if link_clock is True and hasattr(env.unwrapped, "calibration"):
        from commgym.agents.features import probe_levels

        return {"change_decades": 0.5, "levels": probe_levels(env)}
    return _check_link_clock(link_clock)


def _clock_filter(
    clock: dict[str, Any] | None,
    env: gym.Env | None,
    state: dict[str, Any] | None = None,
    path: Any = None,
) -> Any:
    """The mpc agent a ``{reader: mpc}`` clock reads (``None`` for any other clock).

    Built on ``env`` (reading its own timing, probe-free); with ``state`` (a saved policy's:
    what it learned and the job's config) it knows the links as it did, and without an env
    (predict-only) it is built for the saved config; else it learns their dwells in the
    simulator (``learn_decisions`` decisions of ``env``'s scenario as it is).

    Raises:
        ValueError: no ``state`` and ``env`` is missing or not the simulator.
    """
    if clock is None or clock.get("reader") != "mpc":
        return None
    from commgym.agents.mpc import TIMING_SIGMA, ModelPredictiveAgent

    filter_kwargs = {
        "link_from": "timing",
        "timing_sigma": clock.get("timing_sigma", TIMING_SIGMA),
    }
    if state is not None:
        if env is None:  # predict-only (a replay in a user's job): the saved job's config
            from commgym.env import EnvConfig

            env = _ConfigEnv(EnvConfig(**state["config"]))
        agent = ModelPredictiveAgent(env, calibration=clock["calibration"], **filter_kwargs)
        agent.set_state(state["agent"])
        return agent
    if env is None:
        raise ValueError(
            f"{path}: its link clock reads mpc's timing filter, but the file "
            "holds no filter state (saved before it learned?)"
        )
    if not hasattr(env.unwrapped, "calibration"):
        raise ValueError(
            "a link clock reading mpc's timing filter learns the links' dwells in the "
            "simulator: learn in it (env_kind: sim), or use link_clock: true"
        )
    from commgym.env.sim import SimEnv

    sim = SimEnv(env.unwrapped.calibration, env.unwrapped.config)
    agent = ModelPredictiveAgent(sim, calibration=clock["calibration"], **filter_kwargs)
    agent.learn(clock["learn_decisions"])
    return agent


def _check_clock_inputs(clock: dict[str, Any] | None, reads_probe: bool) -> None:
    """Refuse a probe clock without the probe (it would read nothing).

    The clock reads the whole observation (``obs_fields`` masks what the policy reads), and
    a ``{reader: mpc}`` clock reads the decisions' timing, not the probe.
    """
    if clock is None or clock.get("reader") == "mpc":
        return
    if not reads_probe:
        raise ValueError(
            "link_clock reads the probe's bandwidth (log10_probe_gbps), which probe=False "
            "turns off: keep probe: true, use link_clock: {reader: mpc}, or drop link_clock"
        )


def _check_shield(regret_s: Any, clock: dict[str, Any] | None) -> float | None:
    """``shield_regret_s`` as seconds (``None``: no shield); it prices with mpc's clock."""
    if regret_s is None:
        return None
    regret_s = check_float("shield_regret_s", regret_s, 0.0, note=" (seconds)")
    if clock is None or clock.get("reader") != "mpc":
        raise ValueError(
            "shield_regret_s prices the policy's entries with the plan of mpc's link filter: "
            "it needs link_clock: {reader: mpc} (the clock that steps the filter), got "
            f"link_clock {clock!r}"
        )
    return regret_s


def _check_probe(probe: Any) -> bool:
    if not isinstance(probe, bool):
        raise ValueError(f"probe must be true or false, got {probe!r}")
    return probe


def _field_mask(fields: Any) -> np.ndarray | None:
    """``obs_fields`` as a float32 0/1 mask over the observation (``None``: all read)."""
    if fields is None:
        return None
    from commgym.env.spaces import OBSERVATION_FIELDS

    names = [f.name for f in OBSERVATION_FIELDS]
    if isinstance(fields, str) or not isinstance(fields, list | tuple) or not fields:
        raise ValueError(f"obs_fields must be a non-empty list of field names, got {fields!r}")
    bad = [f for f in fields if f not in names]
    if bad:
        raise ValueError(f"obs_fields has unknown fields {bad}; valid: {', '.join(names)}")
    return np.array([n in fields for n in names], dtype=np.float32)


class _FieldMask(gym.ObservationWrapper):
    """The observation with the fields a policy does not read at 0 (``obs_fields``)."""

    def __init__(self, env: gym.Env, mask: np.ndarray) -> None:
        super().__init__(env)
        self.mask = mask

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """``observation`` times the mask (float32)."""
        return (observation * self.mask).astype(np.float32)


class _ConfigEnv(LayoutEnv):
    """A job's config and spaces without a job: what an mpc filter checks, for a replay."""

    def __init__(self, config: Any) -> None:
        super().__init__(config.menu)
        self.config = config


class _ProbeOff(gym.Wrapper):
    """Every reset runs its episode without the probe (SB3 resets without options)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self.env.reset(seed=seed, options={**(options or {}), "probe": False})


def _rms_json(norm: Any) -> dict[str, Any]:
    """A VecNormalize's running statistics as plain JSON values."""
    return {
        "obs_mean": norm.obs_rms.mean.tolist(),
        "obs_var": norm.obs_rms.var.tolist(),
        "obs_count": float(norm.obs_rms.count),
        "ret_var": float(np.asarray(norm.ret_rms.var).reshape(-1)[0]),
        "ret_count": float(norm.ret_rms.count),
    }


def _set_rms(norm: Any, saved: dict[str, Any]) -> None:
    """Inverse of :func:`_rms_json` on ``norm``."""
    norm.obs_rms.mean = np.asarray(saved["obs_mean"], dtype=np.float64)
    norm.obs_rms.var = np.asarray(saved["obs_var"], dtype=np.float64)
    norm.obs_rms.count = float(saved["obs_count"])
    norm.ret_rms.var = np.asarray(saved["ret_var"], dtype=np.float64)
    norm.ret_rms.count = float(saved["ret_count"])


class _SpaceOnly(gym.Env):
    """An env that only carries an observation space (a normaliser's holder)."""

    def __init__(self, space: gym.spaces.Box) -> None:
        self.observation_space = space
        self.action_space = gym.spaces.Discrete(1)

    def reset(self, *, seed: int | None = None, options: Any = None):
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: Any):
        raise RuntimeError("a statistics holder does not step")


def _push(stack: np.ndarray | None, obs: np.ndarray, history: int, starts: Any) -> np.ndarray:
    """``obs`` (``(n, d)``) pushed onto the stacks of the last ``history`` observations.

    The layout of SB3's ``StackedObservations`` for 1-D observations: ``(n, history x d)``,
    the oldest first; a row whose episode starts (or a missing stack) is zeros before it.
    """
    n, d = obs.shape
    if stack is None or stack.shape != (n, history * d):
        stack = np.zeros((n, history * d), dtype=obs.dtype)
    else:
        stack = np.roll(stack, -d, axis=1)
    if starts is not None:
        stack[np.asarray(starts, dtype=bool).reshape(-1)[:n]] = 0
    stack[:, -d:] = obs
    return stack


class PPOAgent(SB3Agent):
    """PPO (Schulman et al., "Proximal Policy Optimization Algorithms", 2017).

    Acts on the ``MultiDiscrete`` menu directly (one categorical head per list).
    Defaults: ``n_steps=32, batch_size=32, n_epochs=4, ent_coef=0.01``.
    """

    name = "ppo"
    algo = PPO
    defaults: ClassVar[dict[str, Any]] = {
        "n_steps": 32, "batch_size": 32, "n_epochs": 4, "ent_coef": 0.01,
    }  # fmt: skip


class RecurrentPPOAgent(SB3Agent):
    """PPO with an LSTM policy and critic (sb3-contrib's ``RecurrentPPO``).

    The recurrent alternative to PPO over a frame stack (``history``): the policy carries
    what it learned of the link and the loss in its LSTM state instead of seeing the last
    observations side by side (Aurora used a history, Pensieve a window of past chunks).
    ``predict`` returns the LSTM state in ``state``; callers thread it and
    ``episode_start`` (``rollout`` and ``CommScheduler`` do). SB3 docs: expect several
    times fewer decisions per second than ``ppo`` (the LSTM runs per step and over whole
    sequences in each update). Behaviour cloning (:meth:`warm_start`) does not apply: its
    loss has no sequence state. Defaults: PPO's, with ``policy="MlpLstmPolicy"``.
    """

    name = "recurrent-ppo"
    algo = RecurrentPPO
    defaults: ClassVar[dict[str, Any]] = {
        "policy": "MlpLstmPolicy", "n_steps": 32, "batch_size": 32, "n_epochs": 4,
        "ent_coef": 0.01,
    }  # fmt: skip

    def _rollout_buffer(self, n_steps: int) -> Any:
        """RecurrentPPO's buffer: it also keeps the LSTM states of every step."""
        from sb3_contrib.common.recurrent.buffers import RecurrentRolloutBuffer

        m = self.model
        lstm = m.policy.lstm_actor
        return RecurrentRolloutBuffer(
            n_steps, m.observation_space, m.action_space,
            (n_steps, lstm.num_layers, m.n_envs, lstm.hidden_size), m.device, gamma=m.gamma,
            gae_lambda=m.gae_lambda, n_envs=m.n_envs,
        )  # fmt: skip

    def _check_clonable(self) -> None:
        raise ValueError(
            "behaviour cloning fits a feed-forward actor-critic's action likelihood (ppo, a2c); "
            "recurrent-ppo's LSTM policy needs whole sequences and their states"
        )


class A2CAgent(SB3Agent):
    """A2C (Mnih et al., "Asynchronous Methods for Deep Reinforcement Learning", ICML 2016).

    Acts on the ``MultiDiscrete`` menu directly. Defaults: ``n_steps=8, ent_coef=0.01``.
    """

    name = "a2c"
    algo = A2C
    defaults: ClassVar[dict[str, Any]] = {"n_steps": 8, "ent_coef": 0.01}


class DQNAgent(SB3Agent):
    """DQN (Mnih et al., "Human-level control through deep reinforcement learning", 2015).

    Learns on :class:`~commgym.env.FlattenAction` (``Discrete(menu.size)``, row-major);
    ``predict`` maps the index back to ``MultiDiscrete`` menu indices, so callers see the
    env's original action space. Defaults: ``learning_starts=32, buffer_size=5000,
    train_freq=4, target_update_interval=100, exploration_fraction=0.3``.
    """

    name = "dqn"
    algo = DQN
    flat_actions = True
    defaults: ClassVar[dict[str, Any]] = {
        "learning_starts": 32, "buffer_size": 5000, "train_freq": 4,
        "target_update_interval": 100, "exploration_fraction": 0.3,
    }  # fmt: skip

    def _algo_env(self, env: gym.Env) -> gym.Env:
        return FlattenAction(super()._algo_env(env))

    def _to_multi(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, dtype=np.int64)
        out = np.stack(np.unravel_index(a, tuple(self.menu.nvec)), axis=-1)
        return out.astype(np.int64)
