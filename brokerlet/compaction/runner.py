"""Running a compaction off the actors' greenlets.

`run_compaction` blocks its greenlet on the topic's reads (phase one, phase two) and on the
thread-pool write of the view file; the topic actor spawns it on a greenlet of its own and
gets the outcome back as a message. Phases, for the crash tests: read and decide, copy,
write the new file beside the old one, sync, rename. Until the rename the previous view is
the one a restart finds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import gevent
import gevent.event

from brokerlet.compaction.compactor import CompactionResult, compact
from brokerlet.compaction.view import CompactedView, save_view
from brokerlet.storage._io import FileOps
from brokerlet.storage.ledger import Entry, Ledger

__all__ = ["run_compaction"]

_CHUNK = 1000


def _read_range(
    ledger: Ledger, start: int, stop: int, timeout: float, cpu_share: float
) -> Iterator[Entry]:
    """The entries ``start..stop`` in chunks; between chunks the greenlet pauses so the
    compaction's share of the hub stays near ``cpu_share`` (the broker shares one core
    with it: produce and dispatch go on while a topic compacts)."""
    position = max(start, ledger.first_entry_id)
    resumed = time.perf_counter()
    while position <= stop:
        busy = time.perf_counter() - resumed
        gevent.sleep(busy * (1 - cpu_share) / cpu_share if cpu_share < 1 else 0)
        resumed = time.perf_counter()
        result: gevent.event.AsyncResult[Any] = gevent.event.AsyncResult()
        ledger.read(position, min(_CHUNK, stop - position + 1), 0, result.set)
        entries = result.get(timeout=timeout)
        if isinstance(entries, BaseException):
            raise entries
        if not entries:
            return
        for entry in entries:
            if entry.entry_id > stop:
                return
            yield entry
        position = entries[-1].entry_id + 1


def run_compaction(
    ledger: Ledger,
    previous: CompactedView | None,
    *,
    retain_null_key: bool,
    directory: str | None,
    file_ops: FileOps | None = None,
    timeout: float = 60.0,
    cpu_share: float = 1.0,
) -> CompactionResult:
    """Compact ``ledger`` up to its current last entry; the view file is replaced (when
    ``directory`` is given) before this returns."""
    horizon = ledger.last_entry_id
    result = compact(
        previous,
        lambda start, stop: _read_range(ledger, start, stop, timeout, cpu_share),
        ledger.ledger_id,
        horizon,
        retain_null_key=retain_null_key,
    )
    # A disk topic that never stored an entry has no directory yet (it is made with the
    # first segment), and then nothing to keep either.
    if directory is not None and (result.view.entries or previous is not None):
        gevent.get_hub().threadpool.apply(save_view, (directory, result.view, file_ops))
    return result
