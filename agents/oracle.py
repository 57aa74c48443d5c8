"""The best static configuration in hindsight: every menu entry run on the evaluation seeds."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from commgym.agents.base import LearnCallback, Preparation, Progress, StepAgent
from commgym.agents.baselines import StaticAgent
from commgym.agents.rollout import Episode, finite_or_none, nan_if_none, rollout
from commgym.collectives import CommConfig
from commgym.collectives.checks import check_int

__all__ = [
    "DEFAULT_SEEDS",
    "FIRST_TRAINING_SEED",
    "BestStaticAgent",
    "OracleEntry",
    "OracleStaticAgent",
    "check_seeds",
    "training_seeds",
]

#: Evaluation seeds searched when none are given.
DEFAULT_SEEDS: tuple[int, ...] = (1000, 1001, 1002)

#: The lowest seed a learner trains on; every evaluation seed lies below it.
FIRST_TRAINING_SEED = 10_000


def training_seeds(seed: int | None, n: int) -> list[int]:
    """The episode seeds a learner searches: ``FIRST_TRAINING_SEED + 100 * seed + i``.

    Evaluation seeds are ``eval_seed + i``, kept below :data:`FIRST_TRAINING_SEED` by
    :class:`~commgym.experiments.config.RunConfig` (``eval_seed = 1000`` in every shipped
    scenario), so training and evaluation episodes never coincide.

    Raises:
        ValueError: a negative ``seed`` (its seeds would fall below
            :data:`FIRST_TRAINING_SEED`, onto the evaluation seeds).
    """
    if seed is not None and int(seed) < 0:
        raise ValueError(
            f"seed must be >= 0: training seeds {FIRST_TRAINING_SEED} + 100 x seed would "
            f"reach the evaluation seeds below {FIRST_TRAINING_SEED}, got seed={seed!r}"
        )
    return [FIRST_TRAINING_SEED + 100 * int(seed or 0) + i for i in range(n)]


@dataclass(frozen=True)
class OracleEntry:
    """One menu entry's result over the evaluation seeds (a row of the ranking).

    Attributes:
        config: the entry, ``str(CommConfig)`` (e.g. ``int8/4MB/H2``).
        mean_time_to_target_s: mean over seeds of the time to target, s; a seed that
            missed the target counts as the env's ``time_budget_s``.
        seeds_reached: seeds on which the target was reached.
        times_to_target_s: per seed, in seed order (None: missed).
        final_eval_loss: mean over seeds of the final held-out loss, nats (NaN if any
            seed diverged).
        episodes: the full episodes (:func:`~commgym.agents.rollout.rollout`'s records),
            in seed order.
    """

    config: str
    mean_time_to_target_s: float
    seeds_reached: int
    times_to_target_s: tuple[float | None, ...]
    final_eval_loss: float
    episodes: tuple[Episode, ...]

    @property
    def seeds_missed(self) -> int:
        """Seeds on which the target was not reached."""
        return len(self.episodes) - self.seeds_reached

    def rank_key(self) -> tuple[int, float, float]:
        """Sort key of the ranking rule (smaller ranks first).

        ``(seeds missed, mean time to target with misses at the budget, mean final
        loss with NaN last)``: an entry that reaches the target on every seed ranks
        before any that misses one; among entries missing equally many seeds the faster
        mean wins; the final loss breaks ties, so entries missing every seed rank by
        final loss. Equal keys keep menu order (the sort is stable).
        """
        loss = self.final_eval_loss
        return (
            self.seeds_missed,
            self.mean_time_to_target_s,
            loss if not math.isnan(loss) else math.inf,
        )

    def to_dict(self, *, json_safe: bool = True) -> dict[str, Any]:
        """Plain values (the episodes' outcomes only, :meth:`Episode.to_dict`).

        Args:
            json_safe: non-finite numbers as ``None`` (``False``: as they are).
        """
        loss = self.final_eval_loss
        return {
            "config": self.config,
            "mean_time_to_target_s": self.mean_time_to_target_s,
            "seeds_reached": self.seeds_reached,
            "times_to_target_s": list(self.times_to_target_s),
            "final_eval_loss": finite_or_none(loss) if json_safe else loss,
            "episodes": [e.to_dict(json_safe=json_safe) for e in self.episodes],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OracleEntry:
        """Inverse of :meth:`to_dict`."""
        return cls(
            config=str(d["config"]),
            mean_time_to_target_s=float(d["mean_time_to_target_s"]),
            seeds_reached=int(d["seeds_reached"]),
            times_to_target_s=tuple(d["times_to_target_s"]),
            final_eval_loss=nan_if_none(d["final_eval_loss"]),
            episodes=tuple(Episode.from_dict(e) for e in d["episodes"]),
        )

    @classmethod
    def from_episodes(
        cls, config: str, episodes: Sequence[Episode], time_budget_s: float
    ) -> OracleEntry:
        """Aggregate one entry's episodes (misses count as ``time_budget_s``)."""
        times = tuple(e.time_to_target_s for e in episodes)
        return cls(
            config=config,
            mean_time_to_target_s=float(
                np.mean([time_budget_s if t is None else t for t in times])
            ),
            seeds_reached=sum(t is not None for t in times),
            times_to_target_s=times,
            final_eval_loss=float(np.mean([e.final_eval_loss for e in episodes])),
            episodes=tuple(episodes),
        )


def check_seeds(seeds: Sequence[int]) -> list[int]:
    """Validate an oracle's evaluation seeds: a non-empty list of distinct ints.

    Raises:
        ValueError: anything else (the message shows the value).
    """
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence) or not seeds:
        raise ValueError(f"seeds must be a non-empty list of ints, got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int | np.integer):
            raise ValueError(f"seeds must be ints, got {s!r} in {list(seeds)!r}")
    out = [int(s) for s in seeds]
    if len(set(out)) != len(out):
        raise ValueError(f"seeds must be distinct, got {out}")
    return out


class _Stop(Exception):
    """The search budget or the callback ended the search."""


class OracleStaticAgent(StepAgent):
    """Oracle: the single menu entry with the best time to target on the evaluation seeds.

    The upper bound of every static tuner: ``learn()`` plays every menu entry (a
    :class:`StaticAgent`) for full episodes on each evaluation seed of the env it is
    given, ranks the entries, and ``predict`` then always returns the best one. It has
    seen the evaluation episodes, so it is marked as an oracle (:attr:`oracle`,
    :attr:`display_name`) and its search cost is reported apart
    (:attr:`search_cost_s`, :attr:`search_decisions`); its own evaluation on
    ``seeds`` is the best entry's episodes (``ranking[0].episodes``), no rerun needed.

    **Ranking rule** (:meth:`OracleEntry.rank_key`). Per entry and seed the time to
    target is the training time (``info["train_time_s"]``) at the first decision whose
    held-out loss is ``<= target_loss`` (the env's ``config.target_loss``), as in every
    commgym evaluation. Entries are sorted by

    1. seeds that missed the target, fewest first (an entry reaching it on every seed
       ranks before all that miss it on any);
    2. the mean over seeds of the time to target, a missed seed counting as the env's
       ``time_budget_s``;
    3. the mean final held-out loss (a diverged seed: last);
    4. menu order.

    An env without ``target_loss`` makes every entry miss, so the ranking is by final
    loss (with a warning).

    Args:
        env: commgym env with ``env.unwrapped.config`` (``time_budget_s``,
            ``target_loss``); the search runs on it.
        seeds: evaluation seeds (distinct ints; default ``DEFAULT_SEEDS``).
        entries: menu entries to search, as ``str(CommConfig)`` strings
            (``"int8/4MB/H1"``) or static presets (``"ddp-default"``); default: the
            whole menu, in flat order.
        seed: unused (the searched episodes use ``seeds``).
        probe: run the searched episodes with the env's probe all-reduce, as a player
            that reads it would. The oracle itself never reads it (its entries are static),
            so its own searches run without (``False``); a learner that learns from these
            episodes and reads the probe when it plays (``rollout-table``) must see the
            probe in them too.

    Raises:
        ValueError: empty or duplicated ``seeds``/``entries``, an entry not on the menu;
            ``probe`` not a bool.
    """

    reads_probe = False

    name = "oracle-static"
    oracle = True

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        seeds: Sequence[int] = DEFAULT_SEEDS,
        entries: Sequence[str] | None = None,
        probe: bool = False,
    ) -> None:
        seeds = check_seeds(seeds)
        if not isinstance(probe, bool):
            raise ValueError(f"probe must be true or false, got {probe!r}")
        if entries is not None:
            if isinstance(entries, str) or not isinstance(entries, Sequence) or not entries:
                raise ValueError(
                    f"entries must be None (whole menu) or a non-empty list of menu-entry "
                    f"strings, got {entries!r}"
                )
            entries = [str(e) for e in entries]
        super().__init__(env, seed=seed, seeds=seeds, entries=entries, probe=probe)
        self.seeds = seeds
        #: whether the searched episodes run the probe (``probe``)
        self.probe = probe
        # resolved through StaticAgent, so presets and menu strings mean what they mean there
        self.entries = (
            [str(self.menu.decode(self._unflat(i))) for i in range(self.menu.size)]
            if entries is None
            else [str(StaticAgent(env, preset=e).config) for e in entries]
        )
        if len(set(self.entries)) != len(self.entries):
            raise ValueError(f"entries name a configuration twice: {entries} -> {self.entries}")
        #: entries, best first (empty before ``learn``)
        self.ranking: list[OracleEntry] = []
        #: wall time of the search (resets included), s; None before ``learn``
        self.search_cost_s: float | None = None
        #: ``env.step`` calls the search made
        self.search_decisions = 0
        #: training time the search's decisions took (sum over episodes), s
        self.search_train_time_s = 0.0
        self._best: np.ndarray | None = None
        self._stop = False

    # -- results ----------------------------------------------------------------------
    @property
    def best_config(self) -> CommConfig | None:
        """The winning entry (None before ``learn``)."""
        return None if self._best is None else self.menu.decode(self._best)

    @property
    def display_name(self) -> str:
        """``oracle-static[<best entry>] (oracle)``; it has seen the evaluation seeds."""
        best = self.best_config
        return f"{self.name}[{best}] (oracle)" if best is not None else f"{self.name} (oracle)"

    @property
    def preparation(self) -> Preparation:
        """What preparing it cost: its search's wall time and decisions."""
        return Preparation(self.search_cost_s, int(self.search_decisions))

    # -- search -----------------------------------------------------------------------
    def learn(
        self,
        total_timesteps: int | None = None,
        progress_bar: bool = False,
        callback: LearnCallback | None = None,
    ) -> OracleStaticAgent:
        """Run every entry for a full episode on every seed and rank the entries.

        Args:
            total_timesteps: optional cap on the search's decisions (None: the full
                search). Entries whose episodes were not all completed when it stops are
                left out of the ranking (with a warning).
            progress_bar: a progress bar over episodes.
            callback: ``callback(step) -> bool`` after every decision (the keys of
                :class:`~commgym.agents.base.Agent.learn`; ``timestep`` counts the
                search's decisions); ``False`` stops the search as the cap does.

        Returns:
            self, with :attr:`ranking`, :attr:`search_cost_s`, :attr:`search_decisions`
            and :attr:`search_train_time_s` set.

        Raises:
            ValueError: ``total_timesteps`` is not None or an integer >= 1.
            TypeError: the env has no ``config.time_budget_s``.
            RuntimeError: the search stopped before any entry finished every seed.
        """
        if total_timesteps is not None and (
            isinstance(total_timesteps, bool)
            or not isinstance(total_timesteps, int | np.integer)
            or total_timesteps < 1
        ):
            raise ValueError(
                f"total_timesteps must be None (full search) or an integer >= 1, "
                f"got {total_timesteps!r}"
            )
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable(dict) -> bool, got {callback!r}")
        env = self._require_env()
        cfg = getattr(env.unwrapped, "config", None)
        budget = getattr(cfg, "time_budget_s", None)
        if budget is None:
            raise TypeError(
                f"{type(env.unwrapped).__name__} has no config.time_budget_s; oracle-static "
                "needs a commgym env (the budget is what a missed target counts as)"
            )
        target = getattr(cfg, "target_loss", None)
        if target is None:
            warnings.warn(
                "the env has no target_loss: every entry misses the target and the oracle "
                "ranks entries by final held-out loss",
                stacklevel=2,
            )
        self.search_decisions, self.search_train_time_s = 0, 0.0
        self._stop = False

        def on_step(step: dict[str, Any]) -> bool:
            """Count the search's decisions; the callback or the cap stops the search."""
            self.search_decisions += 1
            if callback is not None:
                keep = callback({**step, "timestep": self.search_decisions})
                self._stop = self._stop or keep is False
            # an episode that ends on this step still counts (checked before the next one)
            cap = total_timesteps
            self._stop = self._stop or (cap is not None and self.search_decisions >= cap)
            return not self._stop

        progress = (
            Progress(len(self.entries) * len(self.seeds), type(self).__name__)
            if progress_bar
            else None
        )
        done: list[OracleEntry] = []
        t0 = time.perf_counter()
        try:
            for entry in self.entries:
                static = StaticAgent(env, preset=entry)
                static.reads_probe = self.probe  # the rollout runs the probe for a reader
                episodes = []
                for s in self.seeds:
                    if self._stop:
                        raise _Stop
                    ep = rollout(env, static, s, target_loss=target, on_step=on_step)
                    if ep.reason is None:  # stopped inside the episode: it does not count
                        raise _Stop
                    episodes.append(ep)
                    self.search_train_time_s += ep.train_time_s
                    if progress is not None:
                        progress.advance()
                done.append(OracleEntry.from_episodes(entry, episodes, float(budget)))
        except _Stop:
            left = [e for e in self.entries if e not in {d.config for d in done}]
            if not done:
                raise RuntimeError(
                    f"the search stopped after {self.search_decisions} decisions, before any "
                    f"entry finished its {len(self.seeds)} seeds; raise total_timesteps"
                ) from None
            warnings.warn(
                f"the search stopped after {self.search_decisions} decisions; entries left "
                f"out of the ranking: {left}",
                stacklevel=2,
            )
        finally:
            self.search_cost_s = time.perf_counter() - t0
            if progress is not None:
                progress.close()
        self._set_ranking(done)
        return self

    def rank(
        self, episodes: Mapping[str, Sequence[Episode]], search_cost_s: float
    ) -> OracleStaticAgent:
        """Rank entries from their episodes played elsewhere (e.g. in parallel on Ray).

        What :meth:`learn` does after playing every entry itself: ``episodes[entry]``
        holds the entry's episodes in :attr:`seeds` order (each a
        :func:`~commgym.agents.rollout.rollout` of ``static:<entry>`` on that seed).

        Args:
            episodes: entry (as in :attr:`entries`) -> its episodes.
            search_cost_s: wall time the search took, s.

        Returns:
            self, as after :meth:`learn`.

        Raises:
            ValueError: an entry without one episode per seed.
        """
        budget = float(self.env.unwrapped.config.time_budget_s)
        for entry in self.entries:
            if len(episodes.get(entry, ())) != len(self.seeds):
                raise ValueError(
                    f"entry {entry!r} needs {len(self.seeds)} episodes (one per seed), got "
                    f"{len(episodes.get(entry, ()))}"
                )
        done = [OracleEntry.from_episodes(e, list(episodes[e]), budget) for e in self.entries]
        self.search_cost_s = float(search_cost_s)
        self.search_decisions = sum(ep.decisions for e in done for ep in e.episodes)
        self.search_train_time_s = sum(ep.train_time_s for e in done for ep in e.episodes)
        self._set_ranking(done)
        return self

    def _set_ranking(self, done: list[OracleEntry]) -> None:
        self.ranking = sorted(done, key=OracleEntry.rank_key)
        self._best = self.menu.encode(self._entry_config(self.ranking[0].config))

    def _entry_config(self, config: str) -> CommConfig:
        return StaticAgent(self.env, preset=config).config

    # -- StepAgent --------------------------------------------------------------------
    def _act(self, obs: np.ndarray, state: Any, deterministic: bool) -> tuple[np.ndarray, Any]:
        if self._best is None:
            raise RuntimeError(
                "oracle-static has no ranking yet: call learn() (it runs every entry on the "
                "evaluation seeds) or load a saved oracle"
            )
        return self._best.copy(), None

    def _get_state(self) -> dict[str, Any]:
        return {
            "ranking": [e.to_dict() for e in self.ranking],
            "search_cost_s": self.search_cost_s,
            "search_decisions": self.search_decisions,
            "search_train_time_s": self.search_train_time_s,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        if not state.get("ranking"):
            return
        self.ranking = [OracleEntry.from_dict(e) for e in state["ranking"]]
        self.search_cost_s = state["search_cost_s"]
        self.search_decisions = int(state["search_decisions"])
        self.search_train_time_s = float(state["search_train_time_s"])
        self._best = self.menu.encode(self._entry_config(self.ranking[0].config))


class BestStaticAgent(OracleStaticAgent):
    """The best static entry found on *training* seeds: what a user who tuned once deploys.

    ``oracle-static``'s search (every menu entry for full episodes, ranked by
    :meth:`OracleEntry.rank_key`) run on episodes the evaluation never plays: the
    learners' training seeds (:func:`training_seeds` of
    ``seed``). Unlike ``oracle-static`` it has not seen the evaluation seeds, so it is a
    baseline (a one-shot grid search over static configurations), its search counted as
    its tuning cost; on a scenario whose conditions are drawn per episode it picks what
    was best on the draws it tuned on.

    Args:
        env: commgym env (as :class:`OracleStaticAgent`).
        seed: the seed the training seeds derive from (>= 0; default 0).
        episodes: training seeds searched (>= 1) when ``seeds`` is not given.
        seeds: explicit search seeds (instead of the training seeds).
        entries: menu entries to search (default: the whole menu).
        probe: as :class:`OracleStaticAgent`'s (its searched episodes run the probe).

    Raises:
        ValueError: as :class:`OracleStaticAgent`; ``episodes`` < 1; a negative ``seed``.
    """

    name = "best-static"
    oracle = False

    def __init__(
        self,
        env: gym.Env,
        *,
        seed: int | None = None,
        episodes: int = 3,
        seeds: Sequence[int] | None = None,
        entries: Sequence[str] | None = None,
        probe: bool = False,
    ) -> None:
        check_int("episodes", episodes, 1)
        if seeds is None:
            seeds = training_seeds(seed, episodes)
        super().__init__(env, seed=seed, seeds=seeds, entries=entries, probe=probe)
        self._hyperparams["episodes"] = episodes

    @property
    def display_name(self) -> str:
        """``best-static[<best entry>]``: tuned on training seeds, not an oracle."""
        best = self.best_config
        return f"{self.name}[{best}]" if best is not None else self.name
