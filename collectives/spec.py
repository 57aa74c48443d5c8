"""Compression spec strings (``"topk:0.01"``) and the ``COMPRESSORS`` registry."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from commgym.collectives.compressors import Compressor

__all__ = ["COMPRESSORS", "VALID_SPEC_FORMS", "CompressionSpec", "register_compressor"]

#: Valid spec forms, quoted in every parse error.
VALID_SPEC_FORMS = (
    "none",
    "fp16",
    "bf16",
    "int8",
    "int4",
    "int2",
    "topk:<density in (0, 1]>",
    "randomk:<density in (0, 1]>",
    "powersgd:<rank >= 1>",
)

#: Registry of compressor classes by method name; filled by ``compressors.py``.
COMPRESSORS: dict[str, type[Compressor]] = {}


def register_compressor(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator adding a compressor class to ``COMPRESSORS`` under ``cls.name``.

    Raises:
        ValueError: if the name is already registered to another class.
    """
    existing = COMPRESSORS.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"compressor name {cls.name!r} is already registered to {existing!r}")
    COMPRESSORS[cls.name] = cls
    return cls


def _unknown(method: str, text: str) -> ValueError:
    close = difflib.get_close_matches(method, sorted(COMPRESSORS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(
        f"unknown compression spec {text!r}: method {method!r} is not one of "
        f"{sorted(COMPRESSORS)}.{hint} Valid forms: {', '.join(VALID_SPEC_FORMS)}"
    )


@dataclass(frozen=True)
class CompressionSpec:
    """A validated gradient-compression choice.

    Attributes:
        method: registry name (``"none"``, ``"fp16"``, ``"bf16"``, ``"int8"``, ``"int4"``,
            ``"int2"``, ``"topk"``, ``"randomk"``, ``"powersgd"``).
        param: density in (0, 1] for ``topk``/``randomk``, integer rank >= 1 for
            ``powersgd``, ``None`` for the others.
    """

    method: str
    param: float | int | None = None

    def __post_init__(self) -> None:
        cls = COMPRESSORS.get(self.method)
        if cls is None:
            raise _unknown(self.method, str(self.method))
        kind = cls.param_kind
        text = self.method if self.param is None else f"{self.method}:{self.param}"
        if kind is None:
            if self.param is not None:
                raise ValueError(
                    f"compression spec {text!r}: {self.method!r} takes no parameter. "
                    f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
                )
        elif kind == "density":
            if isinstance(self.param, bool) or not isinstance(self.param, int | float):
                raise ValueError(
                    f"compression spec {text!r}: {self.method} needs a density in (0, 1], "
                    f"e.g. '{self.method}:0.01'"
                )
            density = float(self.param)
            if not (math.isfinite(density) and 0.0 < density <= 1.0):
                raise ValueError(
                    f"compression spec {text!r}: density must be in (0, 1], got {density}"
                )
            object.__setattr__(self, "param", density)
        elif kind == "rank":
            if (
                isinstance(self.param, bool)
                or not isinstance(self.param, int | float)
                or float(self.param) != int(self.param)
                or int(self.param) < 1
            ):
                raise ValueError(
                    f"compression spec {text!r}: {self.method} needs an integer rank >= 1, "
                    f"e.g. '{self.method}:4'"
                )
            object.__setattr__(self, "param", int(self.param))
        else:  # pragma: no cover - registry invariant
            raise AssertionError(f"unknown param kind {kind!r}")

    @classmethod
    def parse(cls, spec: str | CompressionSpec) -> CompressionSpec:
        """Parse a spec string such as ``"none"``, ``"int4"``, ``"topk:0.01"``, ``"powersgd:2"``.

        Args:
            spec: the spec string (case-insensitive, surrounding blanks ignored) or an
                existing ``CompressionSpec`` (returned unchanged).

        Returns:
            The validated spec.

        Raises:
            ValueError: unknown method, missing/extra parameter, density outside (0, 1]
                or rank < 1; the message names the spec and lists the valid forms.
            TypeError: ``spec`` is neither a string nor a ``CompressionSpec``.
        """
        if isinstance(spec, CompressionSpec):
            return spec
        if not isinstance(spec, str):
            raise TypeError(
                f"compression spec must be a string such as 'topk:0.01', got "
                f"{spec!r} ({type(spec).__name__}). Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            )
        text = spec.strip().lower()
        method, sep, arg = text.partition(":")
        method = method.strip()
        if method not in COMPRESSORS:
            raise _unknown(method, spec)
        kind = COMPRESSORS[method].param_kind
        if not sep:
            if kind is not None:
                what = "a density in (0, 1]" if kind == "density" else "an integer rank >= 1"
                raise ValueError(
                    f"compression spec {spec!r}: {method} needs {what}, e.g. "
                    f"'{method}:{'0.01' if kind == 'density' else '4'}'. "
                    f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
                )
            return cls(method)
        arg = arg.strip()
        try:
            value: float | int = (
                int(arg)
                if kind == "rank"
                else float(arg.rstrip("%")) / (100.0 if arg.endswith("%") else 1.0)
            )
        except ValueError:
            raise ValueError(
                f"compression spec {spec!r}: cannot read parameter {arg!r}. "
                f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            ) from None
        if kind is None:
            raise ValueError(
                f"compression spec {spec!r}: {method!r} takes no parameter. "
                f"Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            )
        try:
            return cls(method, value)
        except ValueError as err:
            detail = str(err).split(": ", 1)[-1]
            raise ValueError(
                f"compression spec {spec!r}: {detail}. Valid forms: {', '.join(VALID_SPEC_FORMS)}"
            ) from None

    def __str__(self) -> str:
        if self.param is None:
            return self.method
        text = repr(self.param)  # shortest string that round-trips
        return f"{self.method}:{text[:-2] if text.endswith('.0') else text}"

    @property
    def lossless(self) -> bool:
        """True only for ``none`` (fp32, bit-exact all-reduce)."""
        return self.method == "none"
