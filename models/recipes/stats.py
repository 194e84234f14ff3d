"""Bootstrap confidence intervals for ratio statistics (WER = errors / words, tokens per call = tokens / calls).

Units (sentences, frames) are resampled with replacement; the statistic is a ratio of sums over the resample.
Paired deltas resample the same units for both systems, so per-unit difficulty cancels.
"""

from __future__ import annotations

import numpy as np


def _draws(n: int, draws: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(draws, n))


def ratio_ci(num, den, draws: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of sum(num) / sum(den) over units."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    idx = _draws(len(num), draws, seed)
    stats = num[idx].sum(1) / np.maximum(den[idx].sum(1), 1e-12)
    a = (1 - level) / 2
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1 - a))


def paired_ratio_delta(num_a, den_a, num_b, den_b, draws: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a) over the same units, with a paired bootstrap CI."""
    num_a, den_a, num_b, den_b = (np.asarray(v, dtype=float) for v in (num_a, den_a, num_b, den_b))
    idx = _draws(len(num_a), draws, seed)
    diff = num_b[idx].sum(1) / np.maximum(den_b[idx].sum(1), 1e-12) - num_a[idx].sum(1) / np.maximum(
        den_a[idx].sum(1), 1e-12
    )
    a = (1 - level) / 2
    delta = num_b.sum() / max(den_b.sum(), 1e-12) - num_a.sum() / max(den_a.sum(), 1e-12)
    return {"delta": round(float(delta), 4),
            "ci95": [round(float(np.quantile(diff, a)), 4), round(float(np.quantile(diff, 1 - a)), 4)]}
