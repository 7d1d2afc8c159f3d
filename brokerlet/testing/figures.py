"""The one percentile rule the bench and the load tests report by."""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values``; NaN when there are none.

    The rank rule: of ``n`` values in ascending order, the ``fraction`` percentile is the one
    at 1-based rank ``ceil(fraction * n)`` (at least 1, at most ``n``). It is always one of
    the measured values, never an interpolation: the p99 of 100 samples is the 99th
    smallest, of 1,000 the 990th, and of 10 samples the largest.

    Args:
        values: the samples, in any order.
        fraction: from 0 to 1 (0.99 for p99).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within [0, 1], not {fraction}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    # round() first: 0.07 * 100 is 7.000000000000001, whose ceil would skip a rank.
    rank = math.ceil(round(fraction * len(ordered), 9))
    return float(ordered[min(len(ordered), max(1, rank)) - 1])
