"""Command-line options generated from field tables: no option is written out per command.

A command built with :func:`config_command` gets one option per config field it names
(all of :data:`~commgym.experiments.config.CLI_FIELDS` when it names none): the flag, help
and bound come from that table, the type from the field's annotation on
:class:`~commgym.experiments.config.RunConfig` or :class:`~commgym.env.EnvConfig`. The
values given on the command line reach the command as one ``overrides`` mapping (keys
as :func:`~commgym.experiments.config.load_run_config` takes them), so the command
resolves its :class:`RunConfig` once and the env is built from ``cfg.env_config``.

Why typer (click) rather than tyro, which derives a whole CLI from a dataclass: the
commands keep click's parser, so the conventions of :mod:`commgym.experiments.cli` hold
unchanged (one ``error:`` line and exit 2, registry lists in help, the existing option
names such as ``--env`` and ``--network-strict/--drop-impairments``), and the commands
that take no config (``ui``, ``bench ...``) stay as they are; tyro would name options
after the nesting (``--env.world-size``) and bring a second parser and error format.

The options are built when the command is first parsed or its help shown, not at
import: the field types live on ``EnvConfig``, whose import loads torch, and
``commgym ui`` or ``netem cleanup`` should not pay for it.

A command's own options (``--policy``, ``--steps``, the ``bench`` commands' knobs) come
from a table of the same :class:`~commgym.experiments.config.CliField` entries through
:func:`own_options`: the flag, help and bound from the table, the type and default from
the command's own signature (typed once, where the value is used). :func:`fail` is the one
way a command reports bad input (one ``error:`` line, exit status 2).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from types import UnionType
from typing import Any, NoReturn

import typer
from typer.core import TyperCommand

__all__ = [
    "CONFIG_HELP",
    "ENV_OPTIONS",
    "ConfigCommand",
    "RegistryHelpCommand",
    "config_command",
    "comma_list",
    "config_option_type",
    "fail",
    "own_options",
]

#: Help of ``--config`` (a YAML file or a shipped scenario name).
CONFIG_HELP = "YAML scenario file, or a shipped name: {configs} (default: default)."

#: The env options every command that runs the real env offers (a subset of CLI_FIELDS).
ENV_OPTIONS: tuple[str, ...] = (
    "env.workload",
    "env.world_size",
    "env.network",
    "env.network_strict",
    "env.steps_per_decision",
    "env.time_budget_s",
)

#: Where :class:`ConfigCommand` leaves the given values for the command (``ctx.meta``).
_OVERRIDES = "commgym.config_overrides"
#: Name of the context parameter the generated command signature adds.
_CTX = "commgym_context"


def _registry_lists() -> dict[str, str]:
    """Names for option help, read from the registries (imports torch: help time only)."""
    from commgym.agents import agent_names
    from commgym.env.workloads import WORKLOADS
    from commgym.experiments.config import shipped_configs

    return {
        "agents": ", ".join(agent_names()),
        "workloads": ", ".join(WORKLOADS),
        "configs": ", ".join(shipped_configs()),
    }


class RegistryHelpCommand(TyperCommand):
    """A command whose option help may name ``{agents}``, ``{workloads}``, ``{configs}``.

    The lists are filled in from the registries when help is rendered, so they cannot
    drift from what the command accepts, and normal runs do not pay for the imports.
    """

    def _help_suffix(self, ctx: typer.Context, param: Any) -> str:
        """Text added to ``param``'s help before its final full stop (none here)."""
        return ""

    def format_help(self, ctx: Any, formatter: Any) -> None:  # noqa: D102
        lists: dict[str, str] | None = None
        for param in self.get_params(ctx):
            template = getattr(param, "_help_template", None)
            if template is None:
                template, suffix = getattr(param, "help", None) or "", self._help_suffix(ctx, param)
                if suffix:  # inside the sentence: "Number of ranks (default: 2)."
                    end = "." if template.endswith(".") else ""
                    template = template.removesuffix(".") + suffix + end
                param._help_template = template  # type: ignore[attr-defined]
            if "{" in template:
                lists = lists if lists is not None else _registry_lists()
                template = template.format(**lists)
            if template:
                param.help = template  # type: ignore[attr-defined]
        return super().format_help(ctx, formatter)


def _field_hints(key: str) -> tuple[type, Any]:
    """``(dataclass, annotation)`` of config key ``key`` (``env.<name>`` or a RunConfig field)."""
    from commgym.env import EnvConfig
    from commgym.experiments.config import RunConfig

    cls, name = (EnvConfig, key[4:]) if key.startswith("env.") else (RunConfig, key)
    if name not in {f.name for f in dataclasses.fields(cls) if f.init}:
        raise ValueError(f"CLI_FIELDS key {key!r} is not a field of {cls.__name__}")
    return cls, typing.get_type_hints(cls)[name]


def config_option_type(key: str) -> type:
    """The command-line type of config key ``key``.

    ``CliField.cli_type`` when set, else the field's annotation without ``None``.

    Raises:
        ValueError: ``key`` is no field, or its type is not int/float/str/bool and the
            table gives no ``cli_type``.
    """
    from commgym.experiments.config import CLI_FIELDS

    cls, hint = _field_hints(key)
    if CLI_FIELDS[key].cli_type is not None:
        return CLI_FIELDS[key].cli_type  # type: ignore[return-value]
    args = (
        [a for a in typing.get_args(hint) if a is not type(None)]
        if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union
        else [hint]
    )
    if len(args) == 1 and args[0] in (int, float, str, bool):
        return args[0]
    raise ValueError(
        f"{cls.__name__} field {key!r} has type {hint}; give its CliField a cli_type "
        "(int, float, str or bool)"
    )


def _param_name(key: str) -> str:
    return key.replace(".", "__")


def _flag(spec: Any, name: str, kind: Any) -> str:
    """``spec.flag``, else ``--<name>`` (``--<name>/--no-<name>`` for a bool)."""
    if spec.flag:
        return spec.flag
    flag = name.rsplit(".", 1)[-1].replace("_", "-")
    return f"--{flag}/--no-{flag}" if kind is bool else f"--{flag}"


def _declaration(key: str, kind: type) -> str:
    from commgym.experiments.config import CLI_FIELDS

    return _flag(CLI_FIELDS[key], key, kind)


def comma_list(text: str, cast: Callable[[str], Any] = str) -> list[Any]:
    """The comma-separated items of ``text``, stripped, empty ones dropped, each ``cast``."""
    return [cast(item.strip()) for item in text.split(",") if item.strip()]


def fail(err: Exception | str) -> NoReturn:
    """One ``error:`` line on stderr, exit status 2 (every command's bad-input path)."""
    text = " ".join(str(err).split())  # one line, whatever the exception's text holds
    typer.secho(f"error: {text}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def own_options(table: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a command's own options from a table of :class:`CliField` entries.

    Every parameter of the decorated command (but ``overrides``, which
    :func:`config_command` fills) becomes the option its table entry describes: flag (or
    ``--<name>``), help, bound and whether help shows the default; its type and default
    are the parameter's own (no default: a required option).

    Args:
        table: parameter name -> ``CliField``; exactly the command's parameters.

    Raises:
        ValueError: a parameter without an entry, or an entry without a parameter.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func)
        hints = typing.get_type_hints(func)
        names = [n for n in sig.parameters if n != "overrides"]
        if set(names) != set(table):
            raise ValueError(
                f"{func.__name__}: options {sorted(set(names) - set(table))} have no table "
                f"entry, entries {sorted(set(table) - set(names))} no parameter"
            )
        params = []
        for p in sig.parameters.values():
            if p.name == "overrides":
                params.append(p)
                continue
            spec, kind = table[p.name], hints[p.name]
            default = ... if p.default is inspect.Parameter.empty else p.default
            extra = {"min": spec.min} if spec.min is not None else {}
            option = typer.Option(
                default,
                _flag(spec, p.name, kind),
                help=spec.help,
                show_default=spec.show_default,
                **extra,
            )
            params.append(p.replace(default=option))
        func.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return func

    return decorate


def _build_options(keys: tuple[str, ...]) -> list[Any]:
    """Click options of ``keys``, made by typer from a generated signature (public API).

    Typer, not click directly, builds them: typer carries its own copy of click, and
    its parameter classes render in its help like the hand-written options.
    """
    from commgym.experiments.config import CLI_FIELDS

    params = []
    for key in keys:
        spec, kind = CLI_FIELDS[key], config_option_type(key)
        extra = {"min": spec.min} if spec.min is not None else {}
        option = typer.Option(None, _declaration(key, kind), help=spec.help, **extra)
        params.append(
            inspect.Parameter(
                _param_name(key), inspect.Parameter.KEYWORD_ONLY, default=option,
                annotation=kind | None,
            )
        )  # fmt: skip

    def options(**_: Any) -> None:  # pragma: no cover - never called, only inspected
        """Generated options."""

    options.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    options.__annotations__ = {p.name: p.annotation for p in params}
    probe = typer.Typer(add_completion=False)
    probe.command()(options)
    return list(typer.main.get_command(probe).params)


class ConfigCommand(RegistryHelpCommand):
    """A command with options generated from the config fields its callback names.

    The options are added on first use (parse or help). Their values are taken out of
    the parsed parameters and handed to the callback as ``overrides`` (only those given).
    Help appends each option's resolved default: from the shipped scenario the command
    starts from (``defaults_from``), or the dataclass defaults when that is ``None``.
    """

    def _config(self) -> tuple[tuple[str, ...], str | None]:
        from commgym.experiments.config import CLI_FIELDS

        # no keys named: the whole table, read now, so a field added to it appears
        keys = self.callback.config_keys or tuple(CLI_FIELDS)  # type: ignore[union-attr]
        return keys, self.callback.config_defaults_from  # type: ignore[union-attr]

    def get_params(self, ctx: typer.Context) -> list[Any]:  # noqa: D102
        if not getattr(self, "_options_added", False):
            self._options_added = True
            self.params.extend(_build_options(self._config()[0]))
        return super().get_params(ctx)

    def invoke(self, ctx: typer.Context) -> Any:  # noqa: D102
        given = {}
        for key in self._config()[0]:
            value = ctx.params.pop(_param_name(key), None)
            if value is not None:
                given[key] = value
        ctx.meta[_OVERRIDES] = given
        return super().invoke(ctx)

    def _help_suffix(self, ctx: typer.Context, param: Any) -> str:
        from commgym.experiments.config import CLI_FIELDS, load_run_config

        keys, defaults_from = self._config()
        by_name = {_param_name(k): k for k in keys}
        key = by_name.get(param.name or "")
        if key is None or not CLI_FIELDS[key].show_default:
            return ""
        if not hasattr(self, "_defaults"):
            self._defaults = load_run_config(defaults_from)
        cfg = self._defaults
        value = getattr(cfg.env_config, key[4:]) if key.startswith("env.") else getattr(cfg, key)
        if value is None:
            return ""
        if isinstance(value, list | tuple):
            value = ",".join(map(str, value))
        where = "default scenario" if defaults_from == "default" else "default"
        return f" ({where}: {value})"


def config_command(
    app: typer.Typer,
    name: str,
    *keys: str,
    defaults_from: str | None = "default",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a command on ``app`` with generated options for config ``keys``.

    The decorated function takes its own options as usual plus a keyword-only
    ``overrides: dict[str, Any]``: the config values given on the command line, keyed as
    :func:`~commgym.experiments.config.load_run_config` takes them.

    Args:
        app: the typer app (or sub-app) to add the command to.
        name: command name.
        *keys: config keys to offer (``CLI_FIELDS`` keys); none: every key of the table.
        defaults_from: the shipped scenario whose values help shows as defaults
            (``None``: the dataclass defaults).

    Raises:
        ValueError: a key that :data:`~commgym.experiments.config.CLI_FIELDS` lacks.
    """
    from commgym.experiments.config import CLI_FIELDS

    unknown = [k for k in keys if k not in CLI_FIELDS]
    if unknown:
        raise ValueError(f"no CLI_FIELDS entry for {unknown}; known: {sorted(CLI_FIELDS)}")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func)
        if "overrides" not in sig.parameters:
            raise TypeError(f"{func.__name__} must take a keyword-only 'overrides' parameter")

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            ctx = kwargs.pop(_CTX)
            return func(*args, overrides=ctx.meta[_OVERRIDES], **kwargs)

        # typer hands a parameter annotated with its Context the running context
        context = inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        params = [p for p in sig.parameters.values() if p.name != "overrides"]
        command.__signature__ = sig.replace(parameters=[*params, context])  # type: ignore[attr-defined]
        command.config_keys = keys  # type: ignore[attr-defined]
        command.config_defaults_from = defaults_from  # type: ignore[attr-defined]
        app.command(name, cls=ConfigCommand)(command)
        return command

    return decorate
