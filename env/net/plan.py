"""What network an episode runs on: link specs, named profiles, schedules, and the plan.

A :class:`NetworkSpec` (``"1gbit:100us:jitter=20us:loss=0.1%"`` or a profile name of
:data:`PROFILES`) describes one link; a :class:`NetworkSchedule` a link that changes over
training time. :class:`NetworkPlan` is an env's ``network`` option (every form users write
in YAML or on the command line: ``None``, a spec, a schedule, ``{"schedule": [...],
"shift_s": s}``, ``{"profiles": [...]}``) parsed once into one typed value, which the real
env, the surrogate, the transition recorder and the tables read: the link of each episode
(:meth:`NetworkPlan.for_episode`), its title (:meth:`NetworkPlan.label`) and the specs it
may put in force (:attr:`NetworkPlan.specs`). :func:`link_rate_gbps` is the one reader of
a configured rate (``info["network"]``).
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from commgym.env.schedule import Condition, Phases

#: Named network profiles (values are spec strings; see :meth:`NetworkSpec.parse`).
#:
#: * ``datacenter-25g``: 25 GbE inside one rack: ~20 us one-way through one ToR switch.
#: * ``cloud-10g``: a typical cloud VM NIC (10 Gbit/s) where the virtual network adds
#:   ~100 us one-way with noticeable jitter.
#: * ``ethernet-1g``: commodity 1 GbE office/lab cluster, ~200 us one-way (host stacks +
#:   a store-and-forward switch).
#: * ``wan-100m``: cross-site / federated setting: 100 Mbit/s, 10 ms one-way, 1 ms
#:   jitter and 0.01 % loss.
PROFILES: dict[str, str] = {
    "datacenter-25g": "25gbit:20us",
    "cloud-10g": "10gbit:100us:jitter=20us",
    "ethernet-1g": "1gbit:200us",
    "wan-100m": "100mbit:10ms:jitter=1ms:loss=0.01%",
}

_SPEC_FORMS = (
    "valid forms: RATE[:DELAY][:jitter=DURATION][:loss=PERCENT%] with RATE in "
    "bit/kbit/mbit/gbit/tbit (decimal SI, e.g. 1gbit, 2.5gbit), DELAY/DURATION in s/ms/us "
    "(e.g. 5ms, 200us), loss as a percentage (e.g. loss=0.1%); or a profile name: "
    + ", ".join(sorted(PROFILES))
)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BYTE_RATE_UNITS = ("bps", "kbps", "mbps", "gbps", "tbps", "kibps", "mibps", "gibps")
_TIME_UNITS = {
    "s": decimal.Decimal(1),
    "ms": decimal.Decimal("1e-3"),
    "us": decimal.Decimal("1e-6"),
}
_NUM = r"(\d+(?:\.\d+)?|\.\d+)"


def _parse_rate(text: str, spec: str) -> int:
    m = re.fullmatch(_NUM + r"([a-z]+)", text.strip().lower())
    if m is None:
        raise ValueError(f"bad rate {text!r} in network spec {spec!r}; {_SPEC_FORMS}")
    value, unit = decimal.Decimal(m.group(1)), m.group(2)
    if unit in _BYTE_RATE_UNITS:
        raise ValueError(
            f"ambiguous rate unit {unit!r} in network spec {spec!r}: tc reads 'bps' as "
            f"bytes/s while people usually mean bits/s; write it in bits, e.g. "
            f"'{m.group(1)}{unit[:-3] or ''}bit' (or multiply by 8); {_SPEC_FORMS}"
        )
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {unit!r} in network spec {spec!r}; {_SPEC_FORMS}")
    rate = int((value * _RATE_UNITS[unit]).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))
    if rate <= 0:
        raise ValueError(f"rate must be positive in network spec {spec!r}; {_SPEC_FORMS}")
    return rate


def _parse_duration(text: str, spec: str, what: str) -> float:
    m = re.fullmatch(_NUM + r"(s|ms|us)", text.strip().lower())
    if m is None:
        raise ValueError(
            f"bad {what} {text!r} in network spec {spec!r} (a unit s/ms/us is required); "
            f"{_SPEC_FORMS}"
        )
    return float(decimal.Decimal(m.group(1)) * _TIME_UNITS[m.group(2)])


def _parse_loss(text: str, spec: str) -> float:
    m = re.fullmatch(_NUM + r"%", text.strip())
    if m is None:
        raise ValueError(
            f"bad loss {text!r} in network spec {spec!r} (a percentage like 0.1% is "
            f"required); {_SPEC_FORMS}"
        )
    return float(decimal.Decimal(m.group(1)) / 100)


def _fmt_rate(rate: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if rate % _RATE_UNITS[unit] == 0:
            return f"{rate // _RATE_UNITS[unit]}{unit}"
    return f"{rate}bit"


def _fmt_decimal(value: decimal.Decimal) -> str:
    text = format(value.normalize(), "f")
    return text


def _fmt_duration(seconds: float) -> str:
    value = decimal.Decimal(repr(seconds))
    for unit in ("s", "ms"):
        scaled = value / _TIME_UNITS[unit]
        if scaled >= 1 and scaled == scaled.to_integral_value():
            return f"{_fmt_decimal(scaled)}{unit}"
    return f"{_fmt_decimal(value / _TIME_UNITS['us'])}us"


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
    """What the network between two ranks looks like (end to end, one direction).

    Attributes:
        rate_bit_s: Link rate in bit/s (every rank's link, both directions).
        delay_s: One-way rank-to-rank latency added by the emulator, in seconds.
        jitter_s: Uniform jitter around ``delay_s`` (at most ``delay_s``), in seconds.
        loss_frac: End-to-end random packet loss probability in ``[0, 1)``.
    """

    rate_bit_s: int
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss_frac: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.rate_bit_s, int) or isinstance(self.rate_bit_s, bool):
            raise ValueError(f"rate_bit_s must be an int, got {self.rate_bit_s!r}")
        if self.rate_bit_s <= 0:
            raise ValueError(f"rate_bit_s must be positive, got {self.rate_bit_s}")
        for field in ("delay_s", "jitter_s", "loss_frac"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, field, float(value))
        if self.jitter_s > self.delay_s:
            raise ValueError(
                f"jitter ({_fmt_duration(self.jitter_s)}) must not exceed delay "
                f"({_fmt_duration(self.delay_s)}): netem would clamp negative delays"
            )
        if self.loss_frac >= 1:
            raise ValueError(f"loss_frac must be < 1 (100%), got {self.loss_frac}")

    @classmethod
    def parse(cls, text: str | NetworkSpec) -> NetworkSpec:
        """Parses a spec string or profile name.

        Args:
            text: ``RATE[:DELAY][:jitter=DUR][:loss=PCT%]`` (e.g. ``"1gbit"``,
                ``"100mbit:5ms"``, ``"10gbit:200us:jitter=50us:loss=0.1%"``), a name in
                :data:`PROFILES`, or a :class:`NetworkSpec` (returned unchanged).

        Returns:
            The parsed spec.

        Raises:
            ValueError: The text is malformed; the message names the spec and the valid
                forms.
        """
        if isinstance(text, NetworkSpec):
            return text
        if not isinstance(text, str):
            raise ValueError(f"network spec must be a string, got {text!r}; {_SPEC_FORMS}")
        spec = text.strip()
        if spec in PROFILES:
            return cls.parse(PROFILES[spec])
        parts = spec.split(":")
        if not spec or any(not p.strip() for p in parts):
            raise ValueError(f"empty field in network spec {text!r}; {_SPEC_FORMS}")
        rate = _parse_rate(parts[0], text)
        values: dict[str, float] = {}
        for i, part in enumerate(parts[1:]):
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep:
                if i != 0:
                    raise ValueError(
                        f"unexpected positional field {part!r} in network spec {text!r} "
                        f"(only the delay may follow the rate without a key); {_SPEC_FORMS}"
                    )
                key, value = "delay", part
            if key in values:
                raise ValueError(f"{key} given twice in network spec {text!r}; {_SPEC_FORMS}")
            if key in ("delay", "jitter"):
                values[key] = _parse_duration(value, text, key)
            elif key == "loss":
                values[key] = _parse_loss(value, text)
            else:
                raise ValueError(f"unknown key {key!r} in network spec {text!r}; {_SPEC_FORMS}")
        try:
            return cls(
                rate,
                values.get("delay", 0.0),
                values.get("jitter", 0.0),
                values.get("loss", 0.0),
            )
        except ValueError as exc:
            raise ValueError(f"invalid network spec {text!r}: {exc}; {_SPEC_FORMS}") from None

    def __str__(self) -> str:
        parts = [_fmt_rate(self.rate_bit_s)]
        if self.delay_s:
            parts.append(_fmt_duration(self.delay_s))
        if self.jitter_s:
            if not self.delay_s:  # unreachable (jitter <= delay) but keep the grammar valid
                parts.append("0s")
            parts.append(f"jitter={_fmt_duration(self.jitter_s)}")
        if self.loss_frac:
            pct = decimal.Decimal(repr(self.loss_frac)) * 100
            parts.append(f"loss={_fmt_decimal(pct)}%")
        return ":".join(parts)

    @property
    def rate_bytes_s(self) -> float:
        """The link rate in bytes per second."""
        return self.rate_bit_s / 8

    @property
    def rate_gbps(self) -> float:
        """The link rate in Gbit/s (decimal: ``rate_bit_s / 1e9``)."""
        return self.rate_bit_s / 1e9

    def without_impairments(self) -> NetworkSpec:
        """Returns this spec with delay, jitter and loss removed (rate only)."""
        return NetworkSpec(self.rate_bit_s)

    @property
    def has_impairments(self) -> bool:
        """Whether delay, jitter or loss are non-zero (these need sch_netem)."""
        return bool(self.delay_s or self.jitter_s or self.loss_frac)


@dataclasses.dataclass(frozen=True)
class NetworkSchedule(Phases[NetworkSpec]):
    """A piecewise-constant network over elapsed training time.

    The network's :class:`~commgym.env.schedule.Phases` (the one changing-condition type
    of network, stragglers and cross traffic): :meth:`spec_at` is its ``value_at``, its
    per-episode shift is :class:`~commgym.env.schedule.Condition`'s.

    Attributes:
        entries: ``(start_seconds, spec)`` pairs, strictly increasing, the first at 0.
        shift_s: how far each switch after the first entry may move per episode
            (:meth:`for_episode`): uniformly in ``[-shift_s, +shift_s]`` seconds, drawn
            from the episode seed, so a policy cannot learn the switch times by heart.
            0 keeps the times as given.
    """

    shift_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a network schedule needs at least one (0, spec) entry")
        self._condition()  # one validation of times and shift for every condition schedule

    def _condition(self) -> Condition[NetworkSpec]:
        return Condition("schedule", self.entries, self.shift_s, name="network")

    @classmethod
    def parse(
        cls,
        items: Iterable[tuple[float, str | NetworkSpec]] | str | NetworkSpec,
        shift_s: float = 0.0,
    ) -> NetworkSchedule:
        """Builds a schedule from ``(elapsed_training_seconds, spec)`` pairs.

        Args:
            items: Pairs like ``[(0, "1gbit"), (30, "100mbit"), (60, "1gbit")]``; a single
                spec string or :class:`NetworkSpec` means a constant network.
            shift_s: per-episode shift bound of the switch times (see the class).

        Returns:
            The validated schedule.

        Raises:
            ValueError: Times are not finite numbers >= 0, not strictly increasing, the
                first is not 0, or a spec is malformed.
        """
        if isinstance(items, (str, NetworkSpec)):
            return cls(((0.0, NetworkSpec.parse(items)),), shift_s)
        parsed = Condition.parse(
            {"schedule": list(items), "shift_s": shift_s}, NetworkSpec.parse, "network"
        )
        return cls(parsed.entries, parsed.shift_s)

    def for_episode(self, seed: int | None) -> NetworkSchedule:
        """The schedule of one episode: every switch after the first moved by a seeded shift.

        Args:
            seed: episode seed; the same seed always gives the same times.

        Returns:
            A schedule with ``shift_s=0`` (itself when ``shift_s`` is 0).
        """
        if not self.shift_s:
            return self
        return NetworkSchedule(tuple(self._condition().for_episode(seed).entries))

    def spec_at(self, elapsed_s: float) -> NetworkSpec:
        """Returns the spec in force after ``elapsed_s`` seconds of training."""
        return self.value_at(elapsed_s)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def choose_profile(profiles: Sequence[str | NetworkSpec], seed: int | None) -> NetworkSpec:
    """Picks one network per episode, reproducibly.

    Args:
        profiles: Profile names and/or spec strings (all are validated up front).
        seed: Episode seed; the same seed always picks the same entry.

    Returns:
        The chosen spec.

    Raises:
        ValueError: ``profiles`` is empty or an entry is malformed.
    """
    if isinstance(profiles, (str, NetworkSpec)):
        profiles = [profiles]
    specs = [NetworkSpec.parse(p) for p in profiles]
    if not specs:
        raise ValueError("choose_profile needs at least one profile or spec")
    return random.Random(seed).choice(specs)


#: Rate, Gbit/s, that stands for an unshaped link (``info["network"]`` is ``None``:
#: loopback or a real cluster's own network) where a number is needed: far above any
#: emulated rate, so the surrogate's ``log(rate)`` feature separates it from every shaped
#: link and its prior adds no wire term for it.
UNSHAPED_LINK_GBPS = 1e4


def link_rate_gbps(
    network: str | NetworkSpec | None, *, unshaped: float = UNSHAPED_LINK_GBPS
) -> float:
    """Configured link rate, Gbit/s, of an ``info["network"]`` value (the one reader of it).

    Args:
        network: a spec string (``"1gbit"``, ``"100mbit:5ms"``, a profile name), a
            :class:`NetworkSpec`, or ``None`` / NaN (an unshaped link).
        unshaped: what an unshaped link reads as: :data:`UNSHAPED_LINK_GBPS` (the
            transition recorder and the surrogate) or NaN (tables and plots: no rate).

    Returns:
        :attr:`NetworkSpec.rate_gbps` of the parsed spec; ``unshaped`` without one.

    Raises:
        ValueError: a malformed spec (from :meth:`NetworkSpec.parse`).
    """
    if network is None or (isinstance(network, float) and math.isnan(network)):
        return unshaped
    return NetworkSpec.parse(network).rate_gbps


@dataclasses.dataclass(frozen=True)
class NetworkPlan:
    """An env's ``network`` option, parsed once (:meth:`parse`); what every reader reads.

    Attributes:
        kind: ``"unshaped"`` (loopback, no emulation), ``"fixed"`` (one link for every
            episode), ``"schedule"`` (a link that changes with training time, its switches
            shifted per episode by ``schedule.shift_s``) or ``"profiles"`` (one link per
            episode, drawn from the episode seed).
        schedule: the link over training time for ``fixed`` (one entry) and ``schedule``;
            ``None`` otherwise.
        profiles: the links ``profiles`` draws from; empty otherwise.
        source: the option as written (YAML or command line), which titles quote.
    """

    kind: str = "unshaped"
    schedule: NetworkSchedule | None = None
    profiles: tuple[NetworkSpec, ...] = ()
    source: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        expected = {
            "unshaped": self.schedule is None and not self.profiles,
            "fixed": self.schedule is not None and len(self.schedule) == 1 and not self.profiles,
            "schedule": self.schedule is not None and not self.profiles,
            "profiles": self.schedule is None and bool(self.profiles),
        }
        if not expected.get(self.kind, False):
            raise ValueError(
                f"inconsistent network plan: kind {self.kind!r} with schedule "
                f"{self.schedule!r} and profiles {self.profiles!r}"
            )

    @classmethod
    def parse(cls, network: Any) -> NetworkPlan:
        """Validate an env's ``network`` option.

        Args:
            network: ``None``; a spec or profile string (``"1gbit"``, ``"ethernet-1g"``);
                a schedule ``[[elapsed_training_s, spec], ...]``; ``{"schedule": [...],
                "shift_s": s}``; or ``{"profiles": [spec, ...]}``.

        Returns:
            The plan (kind ``"unshaped"`` for ``None``).

        Raises:
            ValueError: another form, an unknown dict key, empty profiles, or a malformed
                spec or schedule (the message names the valid forms).
        """
        if network is None:
            return cls()
        if isinstance(network, str):
            return cls("fixed", NetworkSchedule.parse(network), source=network)
        if isinstance(network, dict | list | tuple):
            form = Condition.parse(network, NetworkSpec.parse, "network")
            if form.kind == "profiles":
                return cls("profiles", profiles=tuple(form.values), source=network)
            return cls("schedule", NetworkSchedule(form.entries, form.shift_s), source=network)
        raise ValueError(
            "network must be None, a spec string, a schedule list or a profiles dict, got "
            f"{network!r}"
        )

    @property
    def emulated(self) -> bool:
        """Whether the ranks run on emulated links (every kind but ``unshaped``)."""
        return self.kind != "unshaped"

    @property
    def specs(self) -> tuple[NetworkSpec, ...]:
        """Every link spec the plan may put in force, in the order written."""
        if self.schedule is not None:
            return tuple(spec for _, spec in self.schedule)
        return self.profiles

    @property
    def fastest_spec(self) -> NetworkSpec | None:
        """The spec with the highest rate (the first of equals); None when unshaped.

        The real env runs each reset's collectives (the parameter broadcasts that make the
        replicas identical) on it: they are not training, so a slow link would only cost
        wall time, up to ~20 s per reset of ``mid-mlp`` at 10 Mbit/s.
        """
        specs = self.specs
        if not specs:
            return None
        return max(specs, key=lambda s: s.rate_gbps)  # max keeps the first of equals

    def for_episode(self, episode_seed: int | None) -> NetworkSchedule | None:
        """One episode's link over its training time (the real env and the surrogate read it).

        Args:
            episode_seed: the episode's seed: picks the profile (:func:`choose_profile`) and
                shifts a schedule's switches (:meth:`NetworkSchedule.for_episode`).

        Returns:
            A :class:`NetworkSchedule` (one entry for a fixed spec or a profile;
            ``spec_at(elapsed_training_s)`` gives the link in force), or ``None`` for an
            unshaped link.
        """
        if self.kind == "profiles":
            return NetworkSchedule.parse(choose_profile(self.profiles, episode_seed))
        if self.schedule is None:
            return None
        return self.schedule.for_episode(episode_seed)

    def label(self) -> str:
        """How a table or figure title names the network (the specs as written)."""
        network = self.source
        if self.kind == "unshaped":
            return "loopback (unshaped)"
        if self.kind == "fixed":
            return f"emulated {network}"
        if self.kind == "profiles":
            return f"emulated, per episode one of {' / '.join(map(str, network['profiles']))}"
        entries = network.get("schedule", []) if isinstance(network, dict) else network
        shift = network.get("shift_s") if isinstance(network, dict) else None
        steps = " -> ".join(f"{spec} at {t:g} s" for t, spec in entries)
        return f"emulated schedule {steps}" + (f" (switches shifted ±{shift:g} s)" if shift else "")
