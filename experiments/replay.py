"""``commgym replay``: one full training run per agent, the saved policy next to the baselines.

Each agent (the policy, then ``static:ddp-default`` and ``static:fp16-dense`` by default)
drives ONE long episode of the real environment ``commgym/AllReduce-v1`` with the same
workload, world size, network and seed, until the held-out loss reaches
``target_loss``, the training-time budget is spent or ``steps`` iterations have run.
The table shows time-to-target, bytes per iteration, final loss and accuracy side by side.

Why the environment and not ``torchrun`` of the example script per agent: the env is the
measured path the policy was trained and evaluated on (same ranks, same network
emulation, same definitions of training time and time-to-target, the same
``DecisionMeasurement`` + ``ObservationBuilder`` code that
:class:`~commgym.agents.scheduler.CommScheduler` uses inside a user's job), the ranks are
launched once for all agents, and every run is the one rollout
(:func:`~commgym.agents.rollout.rollout`), whose :class:`~commgym.agents.rollout.Episode`
records ``commgym train`` / ``commgym evaluate`` already print. The example script
(``experiments/examples/train_with_scheduler.py``) shows the same policy inside a user's
own loop.

.. warning:: loading an SB3 policy file (a pickle) from an untrusted source can execute
   arbitrary code.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from commgym.agents.rollout import Episode, rollout
from commgym.agents.scheduler import is_policy_file
from commgym.experiments.config import RunConfig
from commgym.experiments.evaluation import TrainingClock, print_table
from commgym.experiments.progress import console, phase
from commgym.experiments.session import start_ranks

__all__ = ["replay", "replay_config"]


class _TimedPolicy:
    """Forwards ``predict`` and records its wall time (seconds) per call."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.seconds: list[float] = []

    def predict(self, obs: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, Any]:
        t0 = time.perf_counter()
        out = self.agent.predict(obs, **kwargs)
        self.seconds.append(time.perf_counter() - t0)
        return out


def _replay_one(
    env: Any, agent: Any, seed: int, label: str, target: float | None, budget_s: float
) -> Episode:
    """One full run under a progress bar counted in training seconds of the budget."""
    with phase(f"replaying {label} (seed {seed})", budget_s, unit="s of training") as adv:
        return rollout(env, agent, seed, target_loss=target, on_step=TrainingClock(adv))


def replay_config(
    overrides: dict[str, Any] | None = None, *, steps: int | None = None
) -> RunConfig:
    """The run configuration of a replay: dataclass defaults < ``overrides``, resolved once.

    Two rules of replay on top of :func:`~commgym.experiments.config.load_run_config`:
    with ``env.target_loss`` the env's reward becomes ``time_to_target`` (the return then
    ranks agents by time to target, as the table's own column does; the default
    ``log_progress`` rewards slow configurations once the loss plateaus), and ``steps``
    caps each run at ``ceil(steps / steps_per_decision)`` decisions.

    Args:
        overrides: ``load_run_config`` overrides (``env.workload``, ``env.world_size``,
            ``env.network``, ``env.time_budget_s``, ``env.target_loss``, ``seed``,
            ``baselines``, ...). ``seed`` is also the episode seed of every agent's run.
        steps: cap on training iterations per run (rounded up to whole decisions).

    Returns:
        The validated :class:`RunConfig`; its ``env_config`` is what the env runs.

    Raises:
        ValueError: unknown keys or invalid values (the messages ``commgym train`` gives).
    """
    from commgym.env import EnvConfig
    from commgym.experiments.config import load_run_config

    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "seed" in given:
        given.setdefault("env.seed", given["seed"])
    if given.get("env.target_loss") is not None:
        given.setdefault("env.reward", "time_to_target")
    if steps is not None:
        # the dataclass default when not given (read from the field, not copied)
        defaults = {f.name: f.default for f in dataclasses.fields(EnvConfig)}
        per = given.get("env.steps_per_decision", defaults["steps_per_decision"])
        given["env.max_decisions"] = max(1, math.ceil(steps / per))
    return load_run_config(None, {"agent": "static", "episodes": 1, **given})


def replay(policy: str | Path, config: RunConfig | None = None) -> dict[str, Episode]:
    """Run the policy and the baselines for one full training run each; print the table.

    Args:
        policy: policy zip written by ``commgym train`` / ``Agent.save``, or an agent
            name such as ``static:int8/4MB/H1`` (the names ``--baselines`` takes).
        config: from :func:`replay_config` (default: ``replay_config()``): the env every
            agent runs in (``config.env_config``: workload, world size, network,
            budget, target), the episode seed (``config.seed``) and the agents compared
            with the policy (``config.baselines``).

    Returns:
        The :class:`~commgym.agents.rollout.Episode` by agent label (the policy first).

    Raises:
        ValueError: the policy was trained for another action menu / observation layout
            (the message lists the differences), or invalid settings.
        FileNotFoundError: the policy file does not exist (a path or ``.zip`` name that
            is not an agent name).
        RuntimeError: ``network`` asked for without namespace/tc privileges.
    """
    import gymnasium as gym

    import commgym.env  # noqa: F401 - registers the env
    from commgym.agents import load_agent, make_agent

    cfg = replay_config() if config is None else config
    env_cfg, seed, baselines = cfg.env_config, cfg.seed, cfg.baselines
    target_loss, time_budget_s = env_cfg.target_loss, env_cfg.time_budget_s
    env = gym.make("commgym/AllReduce-v1", config=env_cfg)
    results: dict[str, Episode] = {}
    try:
        if is_policy_file(policy):
            agent, label = load_agent(policy, env=env.unwrapped), f"policy ({Path(policy).name})"
        else:  # an agent name, parsed as `evaluate --baselines` parses them
            agent, label = make_agent(str(policy), env.unwrapped, seed=seed), f"policy ({policy})"
        timed = _TimedPolicy(agent)
        agents: dict[str, Any] = {label: timed}
        for name in baselines:
            agents[name] = make_agent(name, env.unwrapped, seed=seed)
        start_ranks(cfg, env)  # says which network the ranks run on
        for label, a in agents.items():
            results[label] = _replay_one(env, a, seed, label, target_loss, time_budget_s)
    finally:
        env.close()
    print_table({k: [v] for k, v in results.items()}, cfg, show_return=target_loss is not None)
    if target_loss is None:
        console.print(
            "no --target-loss: runs went to the time budget, so no time to target and no "
            "return are shown; compare final loss, or set --target-loss (e.g. 0.2 for mlp-digits)"
        )
    for label, res in results.items():
        configs = [step.config for step in res.steps]
        changes = sum(a != b for a, b in itertools.pairwise(configs))
        console.print(
            f"{label}: {res.decisions} decisions, {res.train_time_s:.2f} s training, "
            f"end: {res.reason}, {changes} configuration changes between its decisions, "
            f"final config {configs[-1] if configs else '-'}"
        )
    if timed.seconds:
        console.print(
            f"policy decision time (predict): median {1e3 * statistics.median(timed.seconds):.3f}"
            f" ms, max {1e3 * max(timed.seconds):.3f} ms over {len(timed.seconds)} decisions"
        )
    return results
