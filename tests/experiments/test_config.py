"""Run configuration: defaults < YAML < CLI, unknown keys rejected with suggestions."""

from __future__ import annotations

import pytest
import yaml

from commgym.experiments.config import CONFIG_DIR, RunConfig, load_run_config


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
    ],
)
def test_bad_config_is_refused(tmp_path, data, match):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=match):
        load_run_config(p)


def test_missing_file_lists_shipped_scenarios():
    with pytest.raises(FileNotFoundError, match="smoke"):
        load_run_config("no-such-scenario")


def test_unknown_override_is_refused():
    with pytest.raises(ValueError, match="unknown"):
        load_run_config(None, {"env.sped": 3})
