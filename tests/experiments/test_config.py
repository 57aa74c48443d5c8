"""Run configuration: defaults < YAML < CLI, unknown keys rejected with suggestions."""

from __future__ import annotations

import pytest
import yaml

from commgym.experiments.config import CONFIG_DIR, RunConfig, load_run_config, shipped_configs


def test_shipped_scenarios_load():
    for name in ("default", "smoke"):
        cfg = load_run_config(name)
        assert isinstance(cfg, RunConfig)
        assert cfg.env["workload"] == "mlp-digits"
    assert (CONFIG_DIR / "default.yaml").exists()


def test_precedence_yaml_then_cli(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        yaml.safe_dump(
            {"agent": "a2c", "timesteps": 50, "env": {"world_size": 2, "steps_per_decision": 4}}
        )
    )
    cfg = load_run_config(p)
    assert (cfg.agent, cfg.timesteps, cfg.env["steps_per_decision"]) == ("a2c", 50, 4)
    cfg = load_run_config(p, {"agent": "dqn", "env.steps_per_decision": 7, "timesteps": None})
    assert (cfg.agent, cfg.timesteps, cfg.env["steps_per_decision"]) == ("dqn", 50, 7)
    assert cfg.env["world_size"] == 2
    cfg = load_run_config(None, {"baselines": "static:ddp-default, bayesopt"})
    assert cfg.baselines == ["static:ddp-default", "bayesopt"]


@pytest.mark.parametrize(
    "data,match",
    [
        ({"agnet": "ppo"}, "did you mean 'agent'"),
        ({"env": {"world_sise": 2}}, "did you mean 'world_size'"),
        ({"timesteps": 0}, "timesteps"),
        ({"env": {"world_size": 0}}, "world_size"),
        ({"env": {"reward": "fast"}}, "unknown reward"),
        ({"eval_seed": -1}, "eval_seed must be an integer >= 0"),
        ({"eval_seed": "1000"}, "eval_seed must be an integer"),
        # evaluation seeds 9999, 10000, 10001 would meet the learners' training seeds
        ({"eval_seed": 9999, "episodes": 3}, "learners train on the seeds from there"),
        ({"eval_seed": 0, "episodes": 2}, "include seed=0, the seed of the agent's first"),
    ],
)
def test_bad_config_is_refused(tmp_path, data, match):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=match):
        load_run_config(p)


def test_the_first_evaluation_seed_comes_from_the_command_line():
    from commgym.agents.rollout_table import FIRST_TRAINING_SEED, training_seeds

    cfg = load_run_config("link-lottery", {"eval_seed": 1003, "episodes": 3})
    assert (cfg.eval_seed, cfg.episodes) == (1003, 3)
    last = load_run_config(None, {"eval_seed": FIRST_TRAINING_SEED - 3, "episodes": 3})
    assert last.eval_seed + last.episodes - 1 < min(training_seeds(0, 3))


def test_missing_file_lists_shipped_scenarios():
    with pytest.raises(FileNotFoundError, match="smoke"):
        load_run_config("no-such-scenario")


def test_unknown_override_is_refused():
    with pytest.raises(ValueError, match="unknown"):
        load_run_config(None, {"env.sped": 3})


# -- a scenario's agent settings are its own agent's ---------------------------------------
def _names(scenario: str) -> list[str]:
    """Every name ``--agent`` takes: the registry, static presets and a static menu entry
    (the scenario's last)."""
    from commgym.agents import agent_names

    menu = load_run_config(scenario).env_config.menu
    return [*agent_names(), f"static:{menu.decode(menu.nvec - 1)}"]


def _on_menu(scenario: str, preset: str) -> bool:
    from commgym.agents.baselines import resolve_preset

    try:
        resolve_preset(load_run_config(scenario).env_config.menu, preset)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("scenario", shipped_configs())
def test_every_agent_resolves_in_every_shipped_scenario(scenario):
    from commgym.agents.base import LayoutEnv
    from commgym.experiments.config import can_fine_tune
    from commgym.experiments.evaluation import build_agent

    for name in _names(scenario):
        if name == "mpc":  # plans over a calibration record, which a scenario does not name
            if load_run_config(scenario).env_kind == "sim":  # the default file, made first
                from commgym.experiments.calibrate_sim import default_calibration_path

                cfg = load_run_config(scenario, {"agent": name})
                default = str(default_calibration_path(cfg.env_config))
                assert cfg.agent_hyperparams["calibration"] == default
                continue
            with pytest.raises(ValueError, match="calibrate-sim"):
                load_run_config(scenario, {"agent": name})
            continue
        preset = name.split(":", 1)[1] if name.startswith("static:") else None
        if preset and not _on_menu(scenario, preset):  # refused, naming the menu's entries
            with pytest.raises(ValueError, match=r"not on the env's action menu.*its entries"):
                load_run_config(scenario, {"agent": name})
            continue
        cfg = load_run_config(scenario, {"agent": name})
        clock = cfg.agent_hyperparams.get("link_clock")
        if isinstance(clock, dict) and clock.get("reader") == "mpc":
            # its clock's filter is an mpc over the run's calibration (the default file on
            # the simulator, made first), learned there: built by train, not on a layout
            from commgym.experiments.calibrate_sim import default_calibration_path

            assert clock["calibration"] == str(default_calibration_path(cfg.env_config))
            continue
        # only its own hyperparameters, and its constructor takes them
        assert set(cfg.agent_hyperparams) <= set(cfg.agent_kwargs.get(name, {}))
        agent = build_agent(name, LayoutEnv(cfg.env_config.menu), cfg, cfg.agent_hyperparams)
        assert agent.name == name.split(":", 1)[0]
        # the scenario's fine-tuning is its SB3 agent's: another agent gets none
        assert cfg.fine_tune_episodes == 0 or can_fine_tune(name), (scenario, name)
        # and its warm start is its actor-critic agent's
        assert cfg.sim_warm_start is None or name in ("ppo", "a2c"), (scenario, name)


def test_flat_agent_kwargs_belong_to_the_files_own_agent(tmp_path):
    p = tmp_path / "old.yaml"
    p.write_text(yaml.safe_dump({"agent": "ppo", "agent_kwargs": {"n_steps": 64}}))
    assert load_run_config(p).agent_hyperparams == {"n_steps": 64}
    assert load_run_config(p).agent_kwargs == {"ppo": {"n_steps": 64}}
    assert load_run_config(p, {"agent": "bayesopt"}).agent_hyperparams == {}
    keyed = {"agent_kwargs": {"ppo": {"n_steps": 64}, "bayesopt": {"budget": 4}}}
    p.write_text(yaml.safe_dump(keyed))
    assert load_run_config(p, {"agent": "bayesopt"}).agent_hyperparams == {"budget": 4}
    assert RunConfig(agent="a2c", agent_kwargs={"n_steps": 4}).agent_kwargs == {
        "a2c": {"n_steps": 4}
    }


def test_fine_tuning_is_refused_for_an_agent_without_it_when_asked_for():
    # the scenario's own setting is dropped for bayesopt; asking for it is an error
    assert load_run_config("slow-link", {"agent": "bayesopt"}).fine_tune_episodes == 0
    assert load_run_config("slow-link").fine_tune_episodes == 2
    with pytest.raises(ValueError, match="--fine-tune-episodes 0"):
        load_run_config("slow-link", {"agent": "bayesopt", "fine_tune_episodes": 2})


def test_static_presets_are_checked_against_the_scenarios_menu():
    assert load_run_config("smoke", {"agent": "static:int8/4MB/H1"}).agent == "static:int8/4MB/H1"
    with pytest.raises(ValueError, match="int8/3MB/H1"):
        load_run_config("smoke", {"baselines": "static:int8/3MB/H1"})
    with pytest.raises(ValueError, match="fp16/25MB/H4"):  # the scenario's menu is listed
        load_run_config("slow-link", {"agent": "static:int8/4MB/H1"})


def test_a_config_extends_a_scenario_field_by_field(tmp_path):
    base = load_run_config("flaky-link")
    p = tmp_path / "variant.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "extends": "flaky-link",
                "agent": "ppo",
                "env": {"time_budget_s": 40.0},
                "agent_kwargs": {"n_steps": 64},
            }
        )
    )
    cfg = load_run_config(p)
    # env fields replaced one by one, the rest of the scenario's env kept
    assert cfg.env["time_budget_s"] == 40.0
    assert {k: v for k, v in cfg.env.items() if k != "time_budget_s"} == {
        k: v for k, v in base.env.items() if k != "time_budget_s"
    }
    # other keys replaced; flat agent_kwargs are this file's agent's, merged per agent
    assert cfg.agent == "ppo" and cfg.agent_kwargs["ppo"] == {"n_steps": 64}
    assert cfg.baselines == base.baselines and cfg.baseline_kwargs == base.baseline_kwargs
    # a file next to the extending one is found by its file name; cycles are refused
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ValueError, match="extend each other in a cycle"):
        load_run_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: no-such-scenario\n")
    with pytest.raises(FileNotFoundError, match="'no-such-scenario' not found"):
        load_run_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("extends: flaky-link\nepisode: 3\n")
    with pytest.raises(ValueError, match="did you mean 'episodes'"):
        load_run_config(tmp_path / "d.yaml")
