"""Bootstrap intervals for ratio statistics."""

import numpy as np

from leapvox.models.recipes.stats import paired_ratio_delta, ratio_ci


def test_ratio_ci_brackets_the_estimate_and_narrows_with_more_units():
    rng = np.random.default_rng(0)
    num, den = rng.integers(0, 10, 50), rng.integers(5, 10, 50)
    lo, hi = ratio_ci(num, den)
    assert lo < num.sum() / den.sum() < hi
    lo2, hi2 = ratio_ci(np.tile(num, 16), np.tile(den, 16))
    assert hi2 - lo2 < (hi - lo) / 2


def test_paired_delta_cancels_unit_difficulty():
    rng = np.random.default_rng(1)
    den = np.full(200, 10.0)
    a = rng.integers(0, 10, 200).astype(float)  # very different units ...
    b = a + 1  # ... each improved by exactly one
    d = paired_ratio_delta(a, den, b, den)
    assert d["delta"] == 0.1 and d["ci95"] == [0.1, 0.1]
    same = paired_ratio_delta(a, den, a, den)
    assert same["delta"] == 0 and same["ci95"] == [0.0, 0.0]
