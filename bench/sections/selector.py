"""The selector section (``--only selector``): :mod:`bench.micro.selector`'s figures as rows."""

from __future__ import annotations

from bench.micro import selector as selector_bench
from bench.plan import Plan, SectionResult
from bench.report import Row, judge

__all__ = ["run_selector"]


def run_selector(plan: Plan) -> SectionResult:
    """``bench/micro/selector.py``: snapshot against SortedDict lookups, and batch selection."""
    print(
        "selector: bench/micro/selector.py" + (" --quick" if plan.micro_quick else ""),
        flush=True,
    )
    results = selector_bench.run(quick=plan.micro_quick)
    from_entries = selector_bench.run_entries(quick=plan.micro_quick)
    table = selector_bench.run_table_build(quick=plan.micro_quick)
    section = SectionResult(
        data={
            "quick": plan.micro_quick,
            "results": results,
            "from_entries": from_entries,
            "table_build": table,
        }
    )
    speedup = selector_bench.SNAPSHOT_SPEEDUP_TARGET
    batch_target = selector_bench.BATCH_NS_TARGET
    # One row per selector and target: the worst consumer count judged, every count shown.
    for kind in dict.fromkeys(figures["selector"] for figures in results):
        mine = [figures for figures in results if figures["selector"] == kind]
        slowest = min(mine, key=lambda figures: figures["ratio"])
        section.rows.append(
            _worst_row(
                f"selector snapshot vs SortedDict, {kind}",
                f"{slowest['ratio']:.1f}x",
                [f"{f['consumers']} consumers {f['ratio']:.1f}x" for f in mine],
                "",
                f">= {speedup:.0f}x",
                judge(slowest["ratio"], at_least=speedup),
            )
        )
        costliest = max(mine, key=lambda figures: figures["batch_ns"])
        section.rows.append(
            _worst_row(
                f"  select_batch per entry, {kind}",
                f"{costliest['batch_ns']:.0f} ns",
                [f"{f['consumers']} consumers {f['batch_ns']:.0f}" for f in mine],
                " ns",
                f"< {batch_target:.0f} ns",
                judge(costliest["batch_ns"], below=batch_target),
            )
        )
    for figures in from_entries:
        section.rows.append(
            Row(
                f"Key_Shared batch selection per entry, {figures['consumers']} consumers, "
                f"consistent hashing (incl. hashing), read batch {figures['batch']}",
                f"{figures['after_ns']:.0f} ns",
                f"{figures['keys']:,} keys; hash kept from the SEND's check: dispatch "
                f"{figures['kept_ns']:.0f} + a keyed SEND's extra in the SEND path "
                f"{figures['send_path_ns']:.0f} (the hash called from Python "
                f"{figures['send_hash_ns']:.0f}); "
                f"an entry read back from a segment (no kept hash) "
                f"{figures['bytes_ns']:.0f} (key read + hash {figures['hash_ns']:.0f}, select "
                f"{figures['select_ns']:.0f}); before (protobuf + bisect) "
                f"{figures['before_ns']:.0f} ns in this run",
                f"<= {batch_target:.0f} ns",
                judge(figures["after_ns"], at_most=batch_target),
            )
        )
    section.rows.append(
        Row(
            "  owner table build per membership change, 50 consumers",
            f"{table['build_us']:.0f} µs",
            f"{table['ranges']} ranges; one add or remove {table['change_us']:.0f} µs all in; "
            f"table {table['table_bytes'] / 1024:.0f} KiB",
            "",
            "",
        )
    )
    return section


def _worst_row(
    figure: str, value: str, per_count: list[str], unit: str, target: str, status: str
) -> Row:
    """A row judged on the worst consumer count, listing every count's figure."""
    return Row(figure, value, "; ".join(per_count) + f"{unit} (worst judged)", target, status)
