"""CompressionSpec parsing, round-tripping through ``str()`` and error messages."""

from __future__ import annotations

import math

import pytest

from commgym.collectives import COMPRESSORS, VALID_SPEC_FORMS, CompressionSpec

# (spec string, method, param) for every valid form, incl. case, blanks and percent.
VALID = [
    ("none", "none", None),
    ("fp16", "fp16", None),
    ("bf16", "bf16", None),
    ("int8", "int8", None),
    ("int4", "int4", None),
    ("int2", "int2", None),
    ("topk:0.01", "topk", 0.01),
    ("topk:1", "topk", 1.0),
    ("topk:1e-05", "topk", 1e-05),
    ("randomk:0.25", "randomk", 0.25),
    ("randomk:1.0", "randomk", 1.0),
    ("powersgd:1", "powersgd", 1),
    ("powersgd:4", "powersgd", 4),
    ("  TopK : 0.5 ", "topk", 0.5),
    ("INT4", "int4", None),
    ("topk:1%", "topk", 0.01),
]


@pytest.mark.parametrize(("text", "method", "param"), VALID)
def test_valid_forms_parse(text, method, param):
    spec = CompressionSpec.parse(text)
    assert spec.method == method
    if param is None:
        assert spec.param is None
    elif method == "powersgd":
        assert spec.param == param and isinstance(spec.param, int)
    else:
        assert isinstance(spec.param, float)
        assert math.isclose(spec.param, param, rel_tol=0, abs_tol=1e-15)


@pytest.mark.parametrize(("text", "method", "param"), VALID)
def test_valid_forms_round_trip_via_str(text, method, param):
    spec = CompressionSpec.parse(text)
    again = CompressionSpec.parse(str(spec))
    assert again == spec
    assert str(again) == str(spec)


def test_canonical_strings():
    assert str(CompressionSpec.parse("topk:0.01")) == "topk:0.01"
    assert str(CompressionSpec.parse("powersgd:2")) == "powersgd:2"
    assert str(CompressionSpec.parse(" Int8 ")) == "int8"
    assert str(CompressionSpec("randomk", 1)) == "randomk:1"


def test_parse_returns_existing_spec_unchanged():
    spec = CompressionSpec.parse("topk:0.1")
    assert CompressionSpec.parse(spec) is spec


def test_every_registered_method_has_a_valid_form():
    assert set(COMPRESSORS) == {
        "none",
        "fp16",
        "bf16",
        "int8",
        "int4",
        "int2",
        "topk",
        "randomk",
        "powersgd",
    }
    for form in VALID_SPEC_FORMS:
        assert form.split(":")[0] in COMPRESSORS


def test_lossless_only_for_none():
    assert CompressionSpec.parse("none").lossless
    for text in ("fp16", "bf16", "int8", "topk:1", "randomk:1", "powersgd:1"):
        assert not CompressionSpec.parse(text).lossless


def test_full_precision_density_round_trips():
    spec = CompressionSpec.parse("topk:0.123456789")
    assert CompressionSpec.parse(str(spec)) == spec


BAD_VALUE = [
    "topk0.1",
    "tpok:0.1",
    "topk",
    "topk:0",
    "topk:1.5",
    "topk:nan",
    "topk:-0.1",
    "topk:abc",
    "powersgd:0",
    "powersgd:1.5",
    "powersgd:-2",
    "fp16:3",
    "int8:8",
    "",
]


@pytest.mark.parametrize("text", BAD_VALUE)
def test_bad_spec_raises_value_error(text):
    with pytest.raises(ValueError):
        CompressionSpec.parse(text)


@pytest.mark.parametrize("bad", [42, None, 0.5, b"topk:0.1"])
def test_non_string_spec_raises_type_error(bad):
    with pytest.raises(TypeError, match=type(bad).__name__):
        CompressionSpec.parse(bad)


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [("topk0.1", "topk"), ("tpok:0.1", "topk"), ("powrsgd:2", "powersgd"), ("in8", "int8")],
)
def test_unknown_method_suggests_close_match(text, suggestion):
    with pytest.raises(ValueError, match=f"Did you mean '{suggestion}'") as info:
        CompressionSpec.parse(text)
    msg = str(info.value)
    assert repr(text) in msg
    for form in VALID_SPEC_FORMS:
        assert form in msg


@pytest.mark.parametrize(
    "text",
    [
        "tpok:0.1",
        "powersgd:1.5",
        "fp16:3",
        "topk:abc",
        "topk",
        "topk:0",
        "topk:1.5",
        "topk:nan",
        "powersgd:0",
    ],
)
def test_bad_spec_message_names_spec_and_lists_valid_forms(text):
    with pytest.raises(ValueError) as info:
        CompressionSpec.parse(text)
    msg = str(info.value)
    assert repr(text) in msg, msg
    assert all(form in msg for form in VALID_SPEC_FORMS), msg


@pytest.mark.parametrize(
    ("method", "param"),
    [
        ("topk", 0.0),
        ("topk", 2.0),
        ("topk", float("inf")),
        ("topk", True),
        ("topk", None),
        ("topk", "0.1"),
        ("powersgd", 0),
        ("powersgd", 1.5),
        ("powersgd", True),
        ("int8", 3),
        ("nosuch", None),
    ],
)
def test_direct_construction_validates(method, param):
    with pytest.raises(ValueError, match=method):
        CompressionSpec(method, param)


def test_direct_construction_normalises_param_types():
    assert CompressionSpec("powersgd", 2.0).param == 2
    assert isinstance(CompressionSpec("powersgd", 2.0).param, int)
    assert CompressionSpec("topk", 1).param == 1.0
    assert isinstance(CompressionSpec("topk", 1).param, float)


def test_spec_is_frozen():
    spec = CompressionSpec.parse("topk:0.1")
    with pytest.raises(AttributeError):
        spec.param = 0.5  # type: ignore[misc]


def test_non_string_spec_message_names_value_and_valid_forms():
    with pytest.raises(TypeError) as info:
        CompressionSpec.parse(42)
    msg = str(info.value)
    assert "42" in msg
    assert all(form in msg for form in VALID_SPEC_FORMS), msg
