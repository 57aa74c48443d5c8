"""The number checks every layer shares (commgym.collectives.checks)."""

from __future__ import annotations

import numpy as np
import pytest

from commgym.collectives.checks import check_float, check_int


def test_check_int_accepts_integers_in_range_and_names_the_field_otherwise():
    assert check_int("episodes", np.int64(3), 1) == 3
    assert check_int("period", 4, 1, 8) == 4
    for bad in (0, True, 2.0, "2"):
        with pytest.raises(ValueError, match=r"episodes must be an integer >= 1, got "):
            check_int("episodes", bad, 1)
    with pytest.raises(ValueError, match=r"period must be an integer in 1\.\.8 \(x\), got 9"):
        check_int("period", 9, 1, 8, note=" (x)")


def test_check_float_accepts_finite_reals_at_or_above_the_bound():
    assert check_float("shield_regret_s", 0, 0.0) == 0.0
    assert isinstance(check_float("sigma", np.float32(0.25), 0.0, strict=True), float)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "0.3", None):
        with pytest.raises(ValueError, match=r"sigma must be a finite number > 0 \(log\), got "):
            check_float("sigma", bad, 0.0, strict=True, note=" (log)")
    with pytest.raises(ValueError, match=r"x must be a finite number >= 0, got -0\.5"):
        check_float("x", -0.5, 0.0)
