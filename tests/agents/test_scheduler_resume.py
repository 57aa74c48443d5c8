"""Resuming a job steered by a stateful policy decides exactly as if it had not stopped.

Every agent of the registry (``AGENTS``, static presets included) declares what its
``predict`` depends on (``Agent.get_state`` / ``set_state``): random generators, bandit
statistics, search state, counters. ``CommScheduler.state_dict()`` carries it (rank 0's
file), so a job checkpointed per rank and resumed in fresh objects ends bit-identical to
the uninterrupted one, with the same decisions. An agent that does not declare its state
makes ``state_dict()`` raise on every rank instead of resuming wrong.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from commgym.agents import AGENTS, make_agent
from commgym.agents.base import Agent, LayoutEnv
from commgym.agents.oracle import OracleEntry
from commgym.agents.registry import agent_names
from commgym.agents.scheduler import CommScheduler
from commgym.env.spaces import OBSERVATION_FIELDS, ActionMenu, ObservationBuilder
from tests.agents.synthetic import TableEnv
from tests.collectives.test_ddp_semantics import BNNet, _images

MENU = ActionMenu()
_FIELD = {f.name: i for i, f in enumerate(OBSERVATION_FIELDS)}
#: Fields measured with a clock: they differ between two runs of the same job.
CLOCK_FIELDS = ("step_time_s", "comm_wait_frac", "compress_s", "bandwidth_gbps")
#: Every agent name make_agent accepts, with the agent-specific settings the test uses.
#: (``oracle-adaptive`` is left out: it does not act, and CommScheduler refuses it. ``mpc``
#: too: it plans over a calibrated simulator of the scenario's own env config, which the
#: layout-only env here has not; its save/load and acting are tests/agents/test_mpc.py's.)
NOT_HERE = {"mpc"}
NAMES = [
    n for n in agent_names() if n != "static" and AGENTS.get(n, Agent).acts and n not in NOT_HERE
] + ["static:int8/4MB/H2"]
#: Agents that learn before acting (their learned statistics travel too).
LEARNED = ("grid", "bayesopt", "bandit")


def test_every_registered_agent_is_covered():
    silent = {n for n, cls in AGENTS.items() if not cls.acts}
    assert silent == {"oracle-adaptive"}
    assert set(AGENTS) - {"static"} - silent - NOT_HERE <= set(NAMES)


def _agent(name: str, *, env: Any = None, seed: int = 3) -> Agent:
    """The agent as CommScheduler gets it: oracle-static with a ranking, rollout-table with
    a table, some learned."""
    env = env if env is not None else LayoutEnv(MENU)
    kwargs: dict[str, Any] = {}
    if name == "bayesopt":
        kwargs = {"budget": 3, "repeats": 1, "warmup": 0, "retune_every": 2}
    agent = make_agent(name, env, seed=seed, **kwargs)
    if name in ("oracle-static", "best-static"):
        entry = OracleEntry("int8/4MB/H2", 1.0, 1, (1.0,), 0.5, ())
        agent.set_state(
            {
                "ranking": [entry.to_dict()],
                "search_cost_s": 1.0,
                "search_decisions": 1,
                "search_train_time_s": 1.0,
            }
        )
    if name == "rollout-table":
        from commgym.agents.rollout_table import CONDITION_FIELDS

        k = len(CONDITION_FIELDS)
        agent.set_state(
            {
                "table": {"fast": "none/25MB/H1", "slow": "int8/4MB/H2"},
                "first": "int8/4MB/H2",
                "centres": {"fast": [0.8] * k, "slow": [0.2] * k},
                "scale": [1.0] * k,
                "cost_s": 1.0,
                "cost_decisions": 1,
            }
        )
    return agent


def _learned(name: str, seed: int = 3) -> Agent:
    """The agent after a short ``learn`` on the synthetic env (statistics, cursor, ...)."""
    agent = _agent(name, env=TableEnv(episode_len=6), seed=seed)
    agent.learn(60 if name == "bandit" else 9)  # the bandit plays every arm once
    return agent


def _observations(n: int) -> list[np.ndarray]:
    space = ObservationBuilder(MENU, 2, 1000).space
    rng = np.random.default_rng(0)
    out = []
    for t in range(n):
        obs = rng.uniform(0.0, 1.0, size=space.shape).astype(np.float32)
        obs[_FIELD["elapsed_frac"]] = t / n  # 0 first: an episode start
        obs[_FIELD["eval_loss"]] = 2.0 - 0.1 * t
        out.append(obs)
    return out


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=False)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "exploring"])
@pytest.mark.parametrize("name", NAMES)
def test_agent_state_resumes_its_decisions(name, deterministic):
    build = _learned if name in LEARNED else _agent
    obs = _observations(8)

    def decide(agent, steps, state):
        actions = []
        for t in steps:
            start = np.array([t == 0])
            a, state = agent.predict(obs[t], state, start, deterministic=deterministic)
            actions.append(np.asarray(a).tolist())
        return actions, state

    whole, _ = decide(build(name), range(8), None)
    first = build(name)
    head, state = decide(first, range(3), None)
    saved = _roundtrip(first.get_state())
    fresh = build(name)
    fresh.set_state(saved)
    tail, _ = decide(fresh, range(3, 8), state)
    assert head + tail == whole


def test_sb3_exploration_draws_from_the_agent_only():
    # the caller's global generators are untouched, and the agent's stream is its own
    agent = _agent("ppo")
    torch.manual_seed(1)
    np.random.seed(1)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy())
    first = [agent.predict(o, deterministic=False)[0].tolist() for o in _observations(6)]
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    torch.manual_seed(2)  # another global seed does not change the agent's draws
    again = [_agent("ppo").predict(o, deterministic=False)[0].tolist() for o in _observations(6)]
    assert len({str(a) for a in first}) > 1  # it explores
    assert first[0] == again[0]


class _Unsaved(Agent):
    """A test agent that neither learns nor saves (policy files are not the point)."""

    def learn(self, total_timesteps, progress_bar=False, callback=None):
        return self

    def save(self, path):
        raise NotImplementedError

    @classmethod
    def load(cls, path, env=None):
        raise NotImplementedError


class OpaqueAgent(_Unsaved):
    """A user's agent that does not declare its state (Agent's defaults)."""

    name = "opaque-test"

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        return MENU.default_action(), None


def test_an_agent_without_declared_state_refuses_to_checkpoint():
    with pytest.raises(NotImplementedError, match="implement get_state"):
        OpaqueAgent(LayoutEnv(MENU)).get_state()


# -- through CommScheduler on two gloo ranks ------------------------------------------------
class ClockFree(_Unsaved):
    """Shows the wrapped agent observations without wall-clock fields.

    Two runs of one job measure different times, so a policy reading them decides
    differently even when nothing is lost in a checkpoint. This wrapper zeroes those
    fields and sets ``elapsed_frac`` from its decision count (its own state), so what the
    policy sees depends on the training alone, and a resumed job must decide exactly as
    the uninterrupted one.
    """

    name = "clock-free-test"

    def __init__(self, inner: Agent) -> None:
        super().__init__(inner.env, seed=inner.seed)
        self.inner = inner
        self.decisions = 0

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        obs = np.array(observation, dtype=np.float32)
        for f in CLOCK_FIELDS:
            obs[_FIELD[f]] = 0.0
        obs[_FIELD["elapsed_frac"]] = min(1.0, 0.05 * self.decisions)
        self.decisions += 1
        return self.inner.predict(obs, state, episode_start, deterministic)

    def get_state(self) -> dict[str, Any]:
        return {"decisions": self.decisions, "inner": self.inner.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.decisions = int(state["decisions"])
        self.inner.set_state(state["inner"])


def _job(rank: int, name: str, deterministic: bool):
    torch.manual_seed(rank)
    model = BNNet()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.02)
    inner = (_learned if name in LEARNED else _agent)(name) if rank == 0 else _agent("random")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a policy trained on another job: a warning
        sched = CommScheduler(
            model,
            opt,
            ClockFree(inner),
            decision_every=1,
            time_budget_s=100.0,
            seed=4,
            deterministic=deterministic,
        )
    return model, opt, sched


def _train(rank, model, opt, sched, steps):
    for step in steps:
        opt.zero_grad(set_to_none=True)
        x, y = _images(rank, step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        sched.step(loss)


def _state(model, opt) -> torch.Tensor:
    tensors = [*model.state_dict().values()]
    for s in opt.state.values():
        tensors += [v for _, v in sorted(s.items()) if isinstance(v, torch.Tensor)]
    return torch.cat([t.detach().double().reshape(-1) for t in tensors])


def rank_resume(rank, world, name, deterministic, stop_at=3, total=8):
    model, opt, sched = _job(rank, name, deterministic)
    _train(rank, model, opt, sched, range(total))
    sched.close()
    configs, reference = [r.config for r in sched.records], _state(model, opt)

    model, opt, sched = _job(rank, name, deterministic)
    _train(rank, model, opt, sched, range(stop_at))
    ckpt = _roundtrip(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    )
    model, opt, sched = _job(rank, name, deterministic)  # a fresh job
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    sched.load_state_dict(ckpt["sched"])
    _train(rank, model, opt, sched, range(stop_at, total))
    sched.close()
    resumed = _state(model, opt)
    return {
        "configs": configs,
        "resumed_configs": [r.config for r in sched.records],
        "bit_identical": torch.equal(resumed, reference),
        "max_diff": float((resumed - reference).abs().max()),
    }


@pytest.mark.parametrize("name", NAMES)
def test_scheduler_resume_is_bit_identical_for_every_agent(dist2, name):
    deterministic = name not in ("ppo", "recurrent-ppo", "a2c", "dqn", "bandit")  # explore
    for r in dist2.run(rank_resume, name, deterministic):
        assert r["resumed_configs"] == r["configs"], (name, r["configs"], r["resumed_configs"])
        assert r["bit_identical"], f"{name}: resume deviates by {r['max_diff']}"
    if name in ("random", "ppo", "recurrent-ppo", "a2c"):  # decisions changed: it has teeth
        assert len(set(r["configs"])) > 1, r["configs"]


def rank_opaque(rank, world):
    model = BNNet()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = CommScheduler(model, opt, OpaqueAgent(LayoutEnv(MENU)), time_budget_s=1.0)
    try:
        sched.state_dict()
    except NotImplementedError as err:
        return str(err)
    finally:
        sched.close()
    return "no error"


def test_opaque_policy_refuses_state_dict_on_every_rank(dist2):
    for msg in dist2.run(rank_opaque):
        assert "cannot checkpoint policy" in msg and "get_state()" in msg, msg


def rank_wrong_file(rank, world):
    model, opt, sched = _job(rank, "random", True)
    _train(rank, model, opt, sched, range(2))
    states = [None] * world
    torch.distributed.all_gather_object(states, sched.state_dict())
    out = {}
    try:  # rank 0 loads rank 1's file: its policy state is missing there
        sched.load_state_dict(states[1])
    except ValueError as err:
        out["other_rank"] = str(err)
    old = dict(states[rank])
    del old["policy"]  # a checkpoint written before policies had state
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched.load_state_dict(old)
    out["old_warns"] = any("holds no policy state" in str(w.message) for w in caught)
    sched.close()
    return out


def test_misloaded_checkpoints_are_refused_or_flagged(dist2):
    results = dist2.run(rank_wrong_file)
    for r in results:
        assert "saved on a rank other than 0" in r["other_rank"], r
    assert results[0]["old_warns"] and not results[1]["old_warns"]
