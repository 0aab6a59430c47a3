"""Percentiles for the benchmarks' figures, one rule for all of them."""

from __future__ import annotations

from collections.abc import Sequence


def pct(samples: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `samples`: p99 of 100 samples is the largest."""
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]
