"""Config options are generated from CLI_FIELDS and the dataclass annotations, and the
values given reach the one resolved config."""

from __future__ import annotations

import dataclasses
import typing
from types import UnionType

import gymnasium as gym
import pytest
import typer
from typer.testing import CliRunner

from commgym.env import EnvConfig
from commgym.env.net import delay_available, netem_available
from commgym.experiments.cli import app
from commgym.experiments.cli_options import ConfigCommand, config_command
from commgym.experiments.config import CLI_FIELDS, CliField, RunConfig, load_run_config
from commgym.experiments.replay import replay_config
from tests.experiments.cli_helpers import cli

#: Options that users, scripts and the README rely on, per command.
RELIED_ON = {
    "train": {
        "--config", "--agent", "--workload", "--world-size", "--timesteps", "--network",
        "--network-strict", "--drop-impairments", "--seed", "--steps-per-decision",
        "--time-budget-s", "--episodes", "--baselines", "--tuning-decisions",
        "--tracking-uri", "--output-dir", "--env", "--surrogate", "--surrogate-decisions",
    },
    "evaluate": {
        "--policy", "--baselines", "--episodes", "--config", "--workload", "--world-size",
        "--network", "--network-strict", "--drop-impairments", "--time-budget-s",
        "--tuning-decisions", "--tracking-uri", "--output-dir", "--eval-seed",
    },
    "replay": {
        "--policy", "--workload", "--world-size", "--network", "--network-strict",
        "--drop-impairments", "--steps", "--time-budget-s", "--target-loss",
        "--steps-per-decision", "--seed", "--baselines",
    },
    "collect": {
        "--config", "--workload", "--world-size", "--network", "--network-strict",
        "--drop-impairments", "--decisions", "--policy", "--steps-per-decision",
        "--time-budget-s", "--seed", "--out", "--bench", "--no-bench", "--fit",
        "--tracking-uri",
    },
    "leaderboard": {
        "--scenarios", "--agents", "--seeds", "--eval-seed", "--policy-dir", "--output-dir",
        "--timesteps",
        "--surrogate-decisions", "--fine-tune-episodes", "--tuning-decisions",
        "--steps-per-decision", "--time-budget-s", "--max-decisions", "--drop-impairments",
        "--tracking-uri",
    },
}  # fmt: skip


def _commands() -> dict[str, ConfigCommand]:
    group = typer.main.get_command(app)
    return {n: c for n, c in group.commands.items() if isinstance(c, ConfigCommand)}


def _params(command: ConfigCommand) -> list:
    ctx = command.make_context(command.name, [], resilient_parsing=True)
    return command.get_params(ctx)


def _field_type(key: str) -> type:
    """The field's own annotation without ``None`` (independent of the generator)."""
    cls, name = (EnvConfig, key[4:]) if key.startswith("env.") else (RunConfig, key)
    assert name in {f.name for f in dataclasses.fields(cls) if f.init}, key
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else object
    return hint


#: A command-line value per type and what it parses to.
_SAMPLE = {int: ("3", 3), float: ("0.5", 0.5), str: ("1gbit", "1gbit")}


def _parse(command: ConfigCommand, args: list[str]) -> dict:
    """Parse ``args`` with the real command (no callback runs); its parameter values."""
    required = ["--policy", "p.zip"] if any(p.name == "policy" for p in _params(command)) else []
    return command.make_context(command.name, [*required, *args]).params


def test_every_config_command_offers_what_users_rely_on():
    commands = _commands()
    assert set(commands) == set(RELIED_ON)
    for name, command in commands.items():
        flags = {o for p in _params(command) for o in (*p.opts, *p.secondary_opts)}
        assert RELIED_ON[name] <= flags, (name, sorted(RELIED_ON[name] - flags))
        assert not any("completion" in f for f in flags), name  # as before: no completion


def test_generated_options_match_the_fields_they_come_from():
    from typer._click.exceptions import BadParameter

    for name, command in _commands().items():
        keys = command._config()[0]
        by_param = {k.replace(".", "__"): k for k in keys}
        generated = [p for p in _params(command) if p.name in by_param]
        assert len(generated) == len(keys), name
        unset = _parse(command, [])
        for param in generated:
            key = by_param[param.name]
            spec, own = CLI_FIELDS[key], _field_type(key)
            field = key.rsplit(".", 1)[-1].replace("_", "-")
            assert unset[param.name] is None, key  # unset: the scenario decides
            assert param.help.startswith(spec.help.removesuffix(".")), key
            if own is bool:
                on, off = (spec.flag or f"--{field}/--no-{field}").split("/")
                assert (param.opts, param.secondary_opts) == ([on], [off]), key
                assert _parse(command, [on])[param.name] is True
                assert _parse(command, [off])[param.name] is False
                continue
            assert param.opts == [spec.flag or f"--{field}"], key
            kind = spec.cli_type or own
            assert kind in _SAMPLE, key  # int, float or str from the field itself
            text, value = _SAMPLE[kind]
            parsed = _parse(command, [param.opts[0], text])[param.name]
            assert parsed == value and type(parsed) is kind, (key, parsed)
            if kind is not str:
                with pytest.raises(BadParameter):
                    _parse(command, [param.opts[0], "not-a-number"])
            if spec.min is not None:
                with pytest.raises(BadParameter):
                    _parse(command, [param.opts[0], str(spec.min - 1)])


def test_train_takes_the_whole_table_and_the_others_name_theirs():
    commands = _commands()
    assert commands["train"]._config()[0] == tuple(CLI_FIELDS)
    for name in ("evaluate", "replay", "collect"):
        assert set(commands[name]._config()[0]) < set(CLI_FIELDS), name


def _help(command: str) -> str:
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_a_field_added_to_the_table_appears_in_help(monkeypatch):
    assert "--lr" not in _help("train")
    monkeypatch.setitem(CLI_FIELDS, "env.lr", CliField("Learning rate of the workload.", min=0))
    text = _help("train")
    assert "--lr" in text and "Learning rate of the workload" in text
    assert "--lr" not in _help("evaluate")  # names its options


def test_help_shows_the_resolved_defaults():
    scenario = load_run_config("default")
    train = _help("train")
    assert f"Number of ranks (default scenario: {scenario.env_config.world_size})." in train
    assert f"(default scenario: {scenario.timesteps})" in train
    replay = _help("replay")  # replay starts from the dataclass defaults
    assert f"Number of ranks (default: {EnvConfig().world_size})." in replay
    assert "refuse (default) or drop delay/jitter/loss with a warning" in replay


def test_given_values_reach_overrides_and_the_env_config():
    seen: list[dict] = []
    probe = typer.Typer()

    @config_command(probe, "probe", "env.world_size", "env.network_strict", "baselines")
    def probe_cmd(*, overrides: dict) -> None:
        seen.append(overrides)

    runner = CliRunner()
    res = runner.invoke(probe, ["--world-size", "3", "--drop-impairments", "--baselines", "random"])
    assert res.exit_code == 0, res.output
    assert seen[-1] == {"env.world_size": 3, "env.network_strict": False, "baselines": "random"}
    cfg = load_run_config("smoke", seen[-1])
    assert (cfg.env_config.world_size, cfg.env_config.network_strict) == (3, False)
    assert cfg.baselines == ["random"]
    assert runner.invoke(probe, []).exit_code == 0 and seen[-1] == {}  # nothing given
    bad = runner.invoke(probe, ["--world-size", "0"])
    assert bad.exit_code == 2 and not seen[2:]  # refused by the parser, callback not run


def test_the_env_config_is_built_once_per_path(monkeypatch):
    import commgym.env  # noqa: F401 - registers the env

    built = []
    post_init = EnvConfig.__post_init__
    monkeypatch.setattr(EnvConfig, "__post_init__", lambda self: (built.append(1), post_init(self)))
    cfg = load_run_config("smoke", {"env.world_size": 3, "env.network_strict": False})
    env = gym.make("commgym/AllReduce-v1", config=cfg.env_config)
    try:
        assert env.unwrapped.config is cfg.env_config
    finally:
        env.close()
    assert len(built) == 1
    built.clear()
    cfg = replay_config({"env.target_loss": 0.2, "seed": 4}, steps=7)
    assert len(built) == 1
    env_cfg = cfg.env_config
    assert (env_cfg.reward, env_cfg.seed, cfg.seed) == ("time_to_target", 4, 4)
    assert env_cfg.max_decisions == 1  # ceil(7 / 10 iterations per decision)


_NET_OK, _NET_WHY = netem_available()
_DELAY, _ = delay_available()


@pytest.mark.skipif(not _NET_OK, reason=f"network emulation unavailable: {_NET_WHY}")
@pytest.mark.skipif(_DELAY, reason="this host has sch_netem: impairments are never dropped")
def test_drop_impairments_on_the_command_line_warns_and_keeps_the_rate(tmp_path):
    common = ["replay", "--policy", "static:ddp-default", "--baselines", "static:fp16-dense",
              "--network", "1gbit:5ms", "--steps", "2", "--steps-per-decision", "2",
              "--time-budget-s", "2"]  # fmt: skip
    refused = cli(common, tmp_path, 300)
    lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-2000:]
    assert lines[0].startswith("error: ") and "delay/jitter/loss" in lines[0]
    dropped = cli([*common, "--drop-impairments"], tmp_path, 600)
    assert dropped.returncode == 0, dropped.stdout[-3000:] + dropped.stderr[-3000:]
    assert "ignoring delay/jitter/loss of network spec '1gbit:5ms'" in dropped.stderr
    assert "applied: 1gbit" in " ".join(dropped.stdout.split())


def test_leaderboard_cross_traffic_holds_one_condition_of_a_scenario():
    """``commgym leaderboard --scenarios busy-link --cross-traffic off|4flows`` (docs/headroom.md):
    the option replaces the scenario's cross-traffic schedule by one fixed condition, the
    per-condition rankings ``commgym headroom-bound`` reads."""
    from commgym.experiments.cli import LEADERBOARD_OPTIONS

    assert "env.cross_traffic" in LEADERBOARD_OPTIONS
    assert load_run_config("busy-link", {}).env_config.cross_traffic_condition.kind == "schedule"
    for value, flows in (("off", 0), ("4flows", 4)):
        cond = load_run_config("busy-link", {"env.cross_traffic": value}).env_config
        cond = cond.cross_traffic_condition
        assert cond.kind == "fixed" and [c.flows for c in cond.values] == [flows]
