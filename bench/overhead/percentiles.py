"""Percentiles with linear interpolation, and the summary every step reports."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0-100) with linear interpolation; ``values`` need not be sorted."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p90, p99, mean and max of ``values`` (NaN when empty)."""
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "mean": statistics.fmean(values) if values else float("nan"),
        "max": max(values) if values else float("nan"),
    }
