"""The env docstring's observation table (the spec card) is the code's observation layout."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from commgym.env import AllReduceEnv
from commgym.env.measure import DecisionMeasurement
from commgym.env.spaces import OBSERVATION_FIELDS, ActionMenu, ObservationBuilder


def spec_card_rows() -> list[dict]:
    """Rows of the ``idx name unit range meaning`` table in AllReduceEnv's docstring."""
    lines = AllReduceEnv.__doc__.splitlines()
    head = next(
        i for i, line in enumerate(lines) if re.match(r"\s*idx\s+name\s+unit\s+range", line)
    )
    rule = lines[head - 1]
    # column spans from the reST rule line (runs of '=')
    spans = [m.span() for m in re.finditer(r"=+", rule)]
    rows = []
    for line in lines[head + 2 :]:
        if line.strip().startswith("==="):
            break
        cells = [line[a:b].strip() if i < len(spans) - 1 else line[a:].strip()
                 for i, (a, b) in enumerate(spans)]  # fmt: skip
        lo, hi = re.fullmatch(r"\[(\S+), (\S+)\]", cells[3]).groups()
        rows.append(
            {"idx": int(cells[0]), "name": cells[1], "unit": cells[2], "low": float(lo),
             "high": float(hi)}
        )  # fmt: skip
    return rows


def test_spec_card_matches_the_observation_fields_and_space():
    rows = spec_card_rows()
    assert [r["idx"] for r in rows] == list(range(len(OBSERVATION_FIELDS)))
    builder = ObservationBuilder(ActionMenu(), 2, 1000)
    for r, f in zip(rows, OBSERVATION_FIELDS, strict=True):
        assert (r["name"], r["unit"], r["low"], r["high"]) == (f.name, f.unit, f.low, f.high), r
        assert builder.space.low[r["idx"]] == np.float32(r["low"])
        assert builder.space.high[r["idx"]] == np.float32(r["high"])
    count = re.search(r"``Box\(float32\)`` of (\d+) values", AllReduceEnv.__doc__)
    assert count and int(count.group(1)) == len(OBSERVATION_FIELDS)


def _measurement(**kw) -> DecisionMeasurement:
    base = dict(
        train_time_s=0.05, step_time_s=0.004, iter_mean_s=0.005, compute_s=0.002,
        comm_wait_s=0.001, compress_s=0.0003, comm_s=0.004, bytes_per_step=1e5,
        bytes_total=5e5, train_loss=1.5, eval_loss=1.2, eval_acc=0.5, eval_s=0.001,
        grad_norm=2.0, compression_error=0.25, nonfinite=False, samples=320, steps=5,
        probe_s=0.002, probe_bytes=65536,
    )  # fmt: skip
    return DecisionMeasurement(**{**base, **kw})


def test_builder_fills_each_field_by_name():
    menu = ActionMenu()
    builder = ObservationBuilder(menu, 4, 26122)
    builder.reset(2.0, np.array([1, 2, 0]))
    m = _measurement()
    obs = builder.build(m, np.array([2, 1, 2]), 0.25, link_gbps=0.02, straggler_ms=12.5)
    by_name = dict(zip([f.name for f in OBSERVATION_FIELDS], obs.tolist(), strict=True))
    expected = {
        "step_time_s": 0.004,
        "comm_wait_frac": 0.001 / 0.005,
        "compress_s": 0.0003,
        "log10_bytes_per_step": math.log10(1 + 1e5),
        "bandwidth_gbps": 5e5 * 8 / 0.004 / 1e9,
        "train_loss": 1.5,
        "eval_loss": 1.2,
        "loss_change": math.log(2.0) - math.log(1.2),
        "log10_grad_norm": math.log10(2.0),
        "grad_norm_rel_change": 0.0,  # no previous gradient norm after reset
        "compression_error": 0.25,
        "compression_index": 2 / (len(menu.compression) - 1),
        "bucket_index": 1 / (len(menu.bucket_mb) - 1),
        "period_index": 2 / (len(menu.sync_period) - 1),
        "elapsed_frac": 0.25,
        "world_size": 4.0,
        "log10_num_params": math.log10(26122),
        # bus bandwidth of the probe: bytes * 2(W-1)/W * 8 / t, W = 4
        "log10_probe_gbps": math.log10(65536 * 1.5 * 8 / 0.002 / 1e9),
        "log10_link_gbps": math.log10(0.02),
        "straggler_ms": 12.5,
    }
    assert set(by_name) == set(expected)
    for name, value in expected.items():
        assert by_name[name] == pytest.approx(value, rel=1e-6), name
    # the dict form that info["measured"] carries builds the same observation
    again = ObservationBuilder(menu, 4, 26122)
    again.reset(2.0, np.array([1, 2, 0]))
    np.testing.assert_array_equal(
        again.build(m.to_dict(), np.array([2, 1, 2]), 0.25, link_gbps=0.02, straggler_ms=12.5),
        obs,
    )
    # without a probe or the privileged values those fields are 0
    plain = ObservationBuilder(menu, 4, 26122)
    plain.reset(2.0, np.array([1, 2, 0]))
    quiet = dict(zip([f.name for f in OBSERVATION_FIELDS],
                     plain.build(_measurement(probe_s=0.0, probe_bytes=0), np.array([2, 1, 2]),
                                 0.25).tolist(), strict=True))  # fmt: skip
    assert quiet["log10_probe_gbps"] == quiet["log10_link_gbps"] == quiet["straggler_ms"] == 0
