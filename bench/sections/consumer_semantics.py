"""The consumer-semantics section (``--only consumer``): delayed delivery at scale and seek by
publish time on a large topic.

Both run in process on the dispatch and storage code itself, no broker process and no
client: what they measure is the cost these rules add to the dispatcher's path, which a
network run would bury in noise on a shared machine.

- **Delayed delivery**: the per-read cost of the delay filter (``admit`` plus the
  ``release_due`` every read pass makes) for 100-entry reads of non-delayed entries with real
  metadata, with 1,000,000 delayed messages pending in the tracker against an empty tracker
  (target: no more than 10% slower), and the tracker's memory per delayed message.
- **Seek by time**: the binary search of a 1,000,000-entry in-memory ledger by publish time
  (each probe an ordinary ledger read), median of random targets (target: under 5 ms).
"""

from __future__ import annotations

import random
import statistics
import time
import tracemalloc

from bench.plan import Plan, SectionResult
from bench.report import Row, format_bytes, format_seconds, judge
from brokerlet.config import Settings
from brokerlet.dispatch.delayed import DelayedDelivery
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.storage.cursor import Cursor
from brokerlet.storage.ledger import Entry, MemoryLedger, new_entry
from brokerlet.storage.time_search import PublishTimeSearch
from brokerlet.transport.protocol import build_entry, pb, publish_time

__all__ = ["run_consumer_semantics"]

PENDING = 1_000_000
ENTRIES = 1_000_000
SLOWDOWN_TARGET = 1.10
SEEK_TARGET_S = 0.005
READ = 100


def _filter() -> DelayedDelivery:
    return DelayedDelivery(
        Settings(),
        applies=lambda: True,
        replay=ReplaySet(),
        cursor=Cursor(-1),
        wake_after=lambda _ms: None,
    )


def _read_cost(rule: DelayedDelivery, entries: list[Entry], rounds: int) -> float:
    """Seconds per 100-entry read through the filter (best of five runs, less noise)."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            rule.release_due()
            rule.admit(entries, replay=False)
        best = min(best, (time.perf_counter() - start) / rounds)
    return best


def _delayed(rounds: int) -> tuple[dict[str, float], list[Row]]:
    now = int(time.time() * 1000)
    metadata = pb.MessageMetadata(producer_name="bench", sequence_id=0, publish_time=now)
    entries = [Entry(1, i, build_entry(metadata, b"x" * 100), 0, 1) for i in range(READ)]
    empty = _filter()
    loaded = _filter()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    track = loaded.tracker.add
    far = now + 86_400_000
    for entry_id in range(PENDING):
        track(far + entry_id % 3_600_000, entry_id + READ)
    memory = (tracemalloc.get_traced_memory()[0] - before) / PENDING
    tracemalloc.stop()
    assert loaded.delayed == PENDING
    baseline = _read_cost(empty, entries, rounds)
    with_pending = _read_cost(loaded, entries, rounds)
    ratio = with_pending / baseline
    figures = {
        "pending": PENDING,
        "read_s_empty": baseline,
        "read_s_pending": with_pending,
        "ratio": ratio,
        "bytes_per_delayed": memory,
    }
    rows = [
        Row(
            f"delay filter per {READ}-entry read, {PENDING:,} delayed pending",
            f"{with_pending * 1e6:.1f} us",
            f"empty tracker {baseline * 1e6:.1f} us, x{ratio:.3f}",
            f"<= x{SLOWDOWN_TARGET:.2f}",
            judge(ratio, at_most=SLOWDOWN_TARGET),
        ),
        Row("  tracker memory per delayed message", format_bytes(memory)),
    ]
    return figures, rows


def _seek(samples: int) -> tuple[dict[str, float], list[Row]]:
    ledger = MemoryLedger(1)
    base = 1_700_000_000_000
    chunk = 100_000
    for first in range(0, ENTRIES, chunk):
        ledger.append(
            [
                new_entry(
                    build_entry(
                        pb.MessageMetadata(
                            producer_name="bench", sequence_id=i, publish_time=base + i
                        ),
                        b"x",
                    ),
                    0,
                    1,
                )
                for i in range(first, first + chunk)
            ],
            lambda _first: None,
        )
    rng = random.Random(13)
    times = []
    probes = []
    for _ in range(samples):
        target = base + rng.randrange(ENTRIES)
        start = time.perf_counter()
        search = PublishTimeSearch(
            ledger.first_entry_id, ledger.last_entry_id, target, publish_time
        )
        while (probe := search.probe()) is not None:
            found: list[Entry] = []
            ledger.read_ids([probe], found.extend)  # type: ignore[arg-type]
            search.observe(probe, found)
        times.append(time.perf_counter() - start)
        probes.append(search.probes)
        assert search.result == target - base
    median = statistics.median(times)
    figures = {
        "entries": ENTRIES,
        "median_s": median,
        "max_s": max(times),
        "probes": statistics.median(probes),
    }
    rows = [
        Row(
            f"seek by publish time, {ENTRIES:,}-entry memory ledger",
            format_seconds(median),
            f"max {format_seconds(max(times))}, {statistics.median(probes):.0f} probes",
            f"< {format_seconds(SEEK_TARGET_S)}",
            judge(median, below=SEEK_TARGET_S),
        )
    ]
    return figures, rows


def run_consumer_semantics(plan: Plan) -> SectionResult:
    """Delayed delivery at scale and seek by publish time (in process)."""
    print(
        "consumer: delay filter with 1,000,000 pending; seek by time on 1,000,000 entries",
        flush=True,
    )
    quick = plan.micro_quick
    delayed, delayed_rows = _delayed(rounds=200 if quick else 1_000)
    seek, seek_rows = _seek(samples=50 if quick else 200)
    return SectionResult(data={"delayed": delayed, "seek": seek}, rows=delayed_rows + seek_rows)
