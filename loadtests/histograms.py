"""Microsecond latency histograms.

Locust buckets response times to whole milliseconds below 100 ms, which hides a local
broker's sub-millisecond latencies. Every latency is therefore also recorded here, in
microseconds, in an HDR histogram (3 significant digits, 1 µs to 10 minutes).
"""

from __future__ import annotations

from hdrh.histogram import HdrHistogram

__all__ = ["PERCENTILES", "LatencyHistogram"]

PERCENTILES = (50.0, 99.0, 99.9)
_LOWEST_US = 1
_HIGHEST_US = 600_000_000
_SIGNIFICANT_DIGITS = 3


class LatencyHistogram:
    """Latencies in microseconds, with the percentiles the reports print."""

    def __init__(self) -> None:
        self._histogram = HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIGNIFICANT_DIGITS)

    def record_ns(self, nanoseconds: int) -> None:
        """Record one latency given in nanoseconds (clamped into the histogram's range)."""
        microseconds = min(max(nanoseconds // 1000, _LOWEST_US), _HIGHEST_US)
        self._histogram.record_value(microseconds)

    @property
    def count(self) -> int:
        """How many latencies were recorded."""
        total: int = self._histogram.get_total_count()
        return total

    def percentile_us(self, percentile: float) -> int | None:
        """The latency at ``percentile`` (0-100) in µs, or None if nothing was recorded."""
        if not self.count:
            return None
        value: int = self._histogram.get_value_at_percentile(percentile)
        return value

    def summary(self) -> dict[str, float | int | None]:
        """Count, mean and the p50/p99/p99.9/max latencies in µs."""
        if not self.count:
            return {"count": 0, "mean_us": None, "p50_us": None, "p99_us": None,
                    "p99.9_us": None, "max_us": None}
        histogram = self._histogram
        return {
            "count": self.count,
            "mean_us": round(histogram.get_mean_value(), 1),
            "p50_us": self.percentile_us(50.0),
            "p99_us": self.percentile_us(99.0),
            "p99.9_us": self.percentile_us(99.9),
            "max_us": histogram.get_max_value(),
        }
