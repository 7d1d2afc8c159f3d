"""The cursor section (``--only cursor``): :mod:`bench.micro.cursor`'s figures as rows."""

from __future__ import annotations

from bench.micro import cursor as cursor_bench
from bench.plan import Plan, SectionResult
from bench.report import Row

__all__ = ["run_cursor"]


def run_cursor(plan: Plan) -> SectionResult:
    """A cursor save behind unacknowledged entries, and an ack, against a set of ids."""
    print("cursor: bench/micro/cursor.py" + (" --quick" if plan.micro_quick else ""))
    results = cursor_bench.run(quick=plan.micro_quick)
    section = SectionResult(data={"quick": plan.micro_quick, "results": results})
    for figures in results:
        section.rows.append(
            Row(
                f"cursor save, {figures['pattern']}",
                f"{figures['save_ms']:.2f} ms",
                f"{figures['runs']:,} runs; a set of ids {figures['before_save_ms']:.2f} ms in "
                f"this run; an ack {figures['ack_us']:.2f} µs (set {figures['before_ack_us']:.2f})",
                "",
                "",
            )
        )
    return section
