"""``commgym bench executor``: episodes per minute, local vs Ray env actors, driver overhead.

The same episodes (one agent, seeds ``1000 + i``, THE rollout) run three ways, each after
an untimed warm-up episode per env (ranks started, kernels compiled):

* **local**: the embedded executor, one env in this process, one episode after another
  (alternating with one Ray actor's, see below);
* **ray, k actors** (for each ``k`` asked): a local Ray instance of ``k x`` an actor's
  CPUs (logical CPUs: on a small machine the actors' ranks share its cores), episodes as
  cells of :class:`~commgym.experiments.executors.RayExecutor`.

Reported per setting: episodes per minute (episodes / wall time of the batch). And the
driver's per-episode overhead of the Ray path, from local episodes and one-actor Ray
episodes played alternately, seed by seed (so a drifting machine load favours neither):
the mean per-episode wall time the driver sees on Ray (submission to result: policy
loaded in the actor, rollout, steps sent back) minus the local one, as a share of the
latter; and the part of it spent outside the actor (driver wall time minus the actor's).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from commgym.experiments.bench import write_json

__all__ = ["run_executor_benchmark"]


def _side_by_side(cfg: Any, agent_name: str, seeds: list[int]) -> tuple[list[float], list[Any]]:
    """Local episodes and one-actor Ray episodes, alternating seed by seed.

    Both envs are up (and warmed) before the first timed episode; alternating keeps a
    machine whose load drifts from favouring either side.
    """
    from commgym.agents import make_agent
    from commgym.agents.ray_env import actor_resources
    from commgym.agents.rollout import rollout
    from commgym.experiments.executors import RayExecutor, policy_bytes
    from commgym.experiments.session import make_env

    need = actor_resources(cfg.env_config)
    target = cfg.env_config.target_loss
    env = make_env(cfg)
    try:
        agent = make_agent(agent_name, env, seed=0)
        policy = {agent_name: policy_bytes(agent)}
        with RayExecutor(envs=1, num_cpus=int(need["CPU"])) as ex:
            warm = seeds[-1] + 1
            rollout(env, agent, warm, target_loss=target)  # ranks, kernels
            list(ex.episodes(cfg.env_config, [(agent_name, warm)], policy, target))
            walls, played = [], []
            for s in seeds:
                t0 = time.perf_counter()
                rollout(env, agent, s, target_loss=target)
                walls.append(time.perf_counter() - t0)
                [(_, p)] = ex.episodes(cfg.env_config, [(agent_name, s)], policy, target)
                played.append(p)
            return walls, played
    finally:
        env.close()


def _ray_batch(cfg: Any, agent_name: str, seeds: list[int], k: int) -> tuple[float, list[Any]]:
    from commgym.agents import make_agent
    from commgym.agents.ray_env import actor_resources
    from commgym.experiments.executors import RayExecutor, policy_bytes
    from commgym.experiments.session import make_env

    need = actor_resources(cfg.env_config)
    layout = make_env(cfg)
    try:
        policy = {agent_name: policy_bytes(make_agent(agent_name, layout, seed=0))}
    finally:
        layout.close()
    target = cfg.env_config.target_loss
    with RayExecutor(envs=k, num_cpus=int(k * need["CPU"])) as ex:
        warm = [(agent_name, seeds[-1] + 1 + i) for i in range(k)]
        list(ex.episodes(cfg.env_config, warm, policy, target))  # ranks up on every actor
        t0 = time.perf_counter()
        played = [
            p for _, p in ex.episodes(cfg.env_config, [(agent_name, s) for s in seeds],
                                      policy, target)
        ]  # fmt: skip
        return time.perf_counter() - t0, played


def run_executor_benchmark(
    config: str = "default",
    episodes: int = 8,
    actors: tuple[int, ...] = (1, 2),
    agent: str = "static:ddp-default",
    json_path: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark (see the module docstring), print its table, return the figures.

    Args:
        config: the scenario (shipped name or YAML file).
        episodes: timed episodes per setting.
        actors: env actor counts to measure on Ray.
        agent: the agent playing every episode (a deterministic one keeps the episodes
            alike across settings).
        json_path: also write the figures here.

    Returns:
        ``{"local": {...}, "ray": {k: {...}}, "overhead": {...}}``.
    """
    from commgym.experiments.config import load_run_config

    cfg = load_run_config(config)
    seeds = [1000 + i for i in range(episodes)]
    walls, side = _side_by_side(cfg, agent, seeds)
    local_ep = statistics.fmean(walls)
    one = statistics.fmean(p.wall_s for p in side)
    in_actor = statistics.fmean(p.actor_s for p in side)
    result: dict[str, Any] = {
        "config": config,
        "agent": agent,
        "episodes": episodes,
        "local": {"episodes_per_min": 60 * episodes / sum(walls), "episode_wall_s": local_ep},
        "overhead": {
            "ray_episode_wall_s": one,
            "ray_actor_s": in_actor,
            "vs_local_s": one - local_ep,
            "vs_local_frac": (one - local_ep) / local_ep,
            "outside_actor_s": one - in_actor,
            "outside_actor_frac": (one - in_actor) / local_ep,
        },
        "ray": {},
    }
    for k in actors:
        total, played = _ray_batch(cfg, agent, seeds, k)
        result["ray"][k] = {
            "episodes_per_min": 60 * episodes / total,
            "episode_wall_s": statistics.fmean(p.wall_s for p in played),
            "actor_s": statistics.fmean(p.actor_s for p in played),
            "nodes": len({p.node_id for p in played}),
        }
    console = Console()
    table = Table(title=f"{config}: {episodes} episodes of {agent} per setting")
    for col in ("executor", "episodes/min", "episode wall s (driver)", "in the actor s"):
        table.add_column(col, justify="left" if col == "executor" else "right")
    table.add_row("local", f"{result['local']['episodes_per_min']:.1f}", f"{local_ep:.3f}", "-")
    for k, r in result["ray"].items():
        table.add_row(
            f"ray, {k} env actor{'s' if k > 1 else ''}",
            f"{r['episodes_per_min']:.1f}",
            f"{r['episode_wall_s']:.3f}",
            f"{r['actor_s']:.3f}",
        )
    console.print(table)
    o = result["overhead"]
    console.print(
        f"side by side, alternating: local episode {local_ep:.3f} s, Ray (1 actor) "
        f"{o['ray_episode_wall_s']:.3f} s as the driver sees it: {o['vs_local_s'] * 1e3:+.1f} ms "
        f"({o['vs_local_frac']:+.1%}); of that outside the actor (submit, result, logging "
        f"data back) {o['outside_actor_s'] * 1e3:.1f} ms ({o['outside_actor_frac']:.2%})"
    )
    write_json(result, json_path, console)
    return result
