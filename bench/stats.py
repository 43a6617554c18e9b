"""Small statistics shared by the benchmarks (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending ``sorted_values``, nearest-rank method; NaN if empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summarize(lags: Sequence[float]) -> dict[str, float]:
    """``{"p50_s", "p95_s", "p99_s", "max_s"}`` of ``lags`` (seconds, rounded to ms)."""
    ordered = sorted(lags)
    return {
        f"{name}_s": round(percentile(ordered, q), 3) if ordered else math.nan
        for name, q in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))
    }
