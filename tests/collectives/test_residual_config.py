"""ResidualMemory (error-feedback buffers) and CommConfig (frozen, validated)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from commgym.collectives import CommConfig, CompressionSpec, ResidualMemory

# =========================================================================== ResidualMemory


def test_get_allocates_zeros_once_per_key():
    mem = ResidualMemory()
    like = torch.randn(17, dtype=torch.float64)
    r = mem.get("b0", like)
    assert r.dtype == torch.float32 and r.shape == (17,) and r.device == like.device
    assert bool((r == 0).all())
    r.add_(1.5)  # updated in place by the kernels
    again = mem.get("b0", torch.randn(17))
    assert again is r and bool((again == 1.5).all())
    other = mem.get("b1", like)
    assert other is not r and bool((other == 0).all())
    assert len(mem) == 2 and "b0" in mem and "b2" not in mem
    assert mem.keys() == ["b0", "b1"]


def test_size_change_restarts_from_zeros():
    mem = ResidualMemory()
    mem.get("b0", torch.zeros(10)).fill_(3.0)
    r = mem.get("b0", torch.zeros(12))
    assert r.shape == (12,) and bool((r == 0).all())
    assert len(mem) == 1


def test_reset_and_norm():
    mem = ResidualMemory()
    assert mem.norm() == 0.0
    mem.get("a", torch.zeros(2)).copy_(torch.tensor([3.0, 0.0]))
    mem.get("b", torch.zeros(1)).copy_(torch.tensor([4.0]))
    assert math.isclose(mem.norm(), 5.0, rel_tol=1e-7)
    mem.reset()
    assert len(mem) == 0 and mem.norm() == 0.0
    assert bool((mem.get("a", torch.zeros(2)) == 0).all())


def test_state_dict_round_trip_copies():
    mem = ResidualMemory()
    mem.get("a", torch.zeros(5)).copy_(torch.arange(5.0))
    mem.get("b", torch.zeros(3)).copy_(torch.tensor([-1.0, 0.5, 2.0]))
    state = mem.state_dict()
    assert set(state["residuals"]) == {"a", "b"}
    mem.get("a", torch.zeros(5)).fill_(99.0)  # the state is a copy
    assert torch.equal(state["residuals"]["a"], torch.arange(5.0))
    fresh = ResidualMemory()
    fresh.load_state_dict(state)
    state["residuals"]["b"].fill_(123.0)  # and loading copies too
    assert torch.equal(fresh.get("a", torch.zeros(5)), torch.arange(5.0))
    assert torch.equal(fresh.get("b", torch.zeros(3)), torch.tensor([-1.0, 0.5, 2.0]))
    assert fresh.keys() == ["a", "b"]


def test_load_converts_to_fp32():
    mem = ResidualMemory()
    mem.load_state_dict({"residuals": {"a": torch.tensor([1.0, 2.0], dtype=torch.float64)}})
    r = mem.get("a", torch.zeros(2))
    assert r.dtype == torch.float32 and r.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_load_refuses_non_finite_and_keeps_previous_state(bad):
    mem = ResidualMemory()
    mem.get("keep", torch.zeros(2)).fill_(1.0)
    state = {"residuals": {"ok": torch.zeros(3), "bad": torch.tensor([0.0, bad])}}
    with pytest.raises(ValueError, match="'bad'"):
        mem.load_state_dict(state)
    assert mem.keys() == ["keep"] and bool((mem.get("keep", torch.zeros(2)) == 1).all())


def test_load_refuses_non_1d():
    with pytest.raises(ValueError, match="1-D"):
        ResidualMemory().load_state_dict({"residuals": {"m": torch.zeros(2, 2)}})


# =========================================================================== CommConfig


def test_defaults_and_derived_values():
    cfg = CommConfig()
    assert cfg.compression == CompressionSpec.parse("none")
    assert cfg.bucket_mb == 25.0 and cfg.sync_period == 1
    assert cfg.error_feedback is True and cfg.stochastic_rounding is False
    assert cfg.bucket_bytes == 25 * 2**20
    assert not cfg.local_sgd
    assert str(cfg) == "none/25MB/H1"


def test_compression_is_parsed_and_values_normalised():
    cfg = CommConfig("TopK:0.01", bucket_mb=4, sync_period=8)
    assert isinstance(cfg.compression, CompressionSpec)
    assert str(cfg.compression) == "topk:0.01"
    assert isinstance(cfg.bucket_mb, float) and cfg.bucket_mb == 4.0
    assert cfg.local_sgd and cfg.bucket_bytes == 4 * 2**20
    assert CommConfig(bucket_mb=1e-12).bucket_bytes == 1
    spec = CompressionSpec.parse("powersgd:2")
    assert CommConfig(spec).compression is spec


def test_to_dict_round_trip_and_equality():
    cfg = CommConfig(
        "int4", bucket_mb=0.5, sync_period=1, error_feedback=False, stochastic_rounding=True
    )
    d = cfg.to_dict()
    assert d == {
        "compression": "int4",
        "bucket_mb": 0.5,
        "sync_period": 1,
        "error_feedback": False,
        "stochastic_rounding": True,
    }
    again = CommConfig(**d)
    assert again == cfg and hash(again) == hash(cfg)


@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.5, float("nan"), float("inf"), True, "25", None])
def test_bad_bucket_mb_names_value(bad):
    with pytest.raises(ValueError, match="bucket_mb") as info:
        CommConfig(bucket_mb=bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, False, "2", None])
def test_bad_sync_period_names_value(bad):
    with pytest.raises(ValueError, match="sync_period") as info:
        CommConfig(sync_period=bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["topk:2", "tpok:0.1", "powersgd:0", "fp16:3", "topk"])
def test_bad_compression_names_value(bad):
    with pytest.raises(ValueError) as info:
        CommConfig(bad)
    assert bad.split(":")[0] in str(info.value)


def test_non_string_compression_raises_type_error():
    with pytest.raises(TypeError):
        CommConfig(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["error_feedback", "stochastic_rounding"])
@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_flags_must_be_bool(field, bad):
    with pytest.raises(TypeError, match=field) as info:
        CommConfig(**{field: bad})
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("compression", "fp16"), ("bucket_mb", 1.0), ("sync_period", 2), ("error_feedback", False)],
)
def test_frozen(name, value):
    cfg = CommConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, name, value)
    assert cfg == CommConfig()
