"""A topic's compaction state: its compacted view, the running compaction, its status.

Owned by the topic actor (touched only on its greenlet); the compaction itself runs on a
greenlet of its own (`runner`) and reports back through ``on_done``, which the topic turns
into a message to itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent

from brokerlet.compaction.compactor import CompactionResult
from brokerlet.compaction.runner import run_compaction
from brokerlet.compaction.view import CompactedView, CorruptViewError, load_view
from brokerlet.storage.ledger import Entry, Ledger

__all__ = ["COMPACTION_SUBSCRIPTION", "CompactionRunningError", "TopicCompaction"]

log = logging.getLogger(__name__)

# Pulsar's compactor subscription: its cursor (the horizon) holds the topic's data after
# the horizon until the next compaction.
COMPACTION_SUBSCRIPTION = "__compaction"


class CompactionRunningError(Exception):
    pass


class TopicCompaction:
    def __init__(
        self, name: str, ledger: Ledger, *, retain_null_key: bool, cpu_share: float = 1.0
    ) -> None:
        self.cpu_share = cpu_share
        self.name = name
        self.ledger = ledger
        self.retain_null_key = retain_null_key
        self.directory: str | None = getattr(ledger, "directory", None)
        self.view: CompactedView | None = getattr(ledger, "compacted_view", None)
        self.status = "NOT_RUN"
        self.last_error = ""
        self.running: gevent.Greenlet[Any, Any] | None = None
        self.removed = 0
        self.succeeded_ms = 0
        self.failed_ms = 0
        self.duration_ms = 0
        self._started = 0.0

    def load(self) -> None:
        """Read the stored view (disk topics), on the hub's thread pool."""
        if self.view is not None or self.directory is None or self.ledger.new:
            self._keep_with_ledger()  # a new topic has no stored view: no thread-pool hop
            return
        try:
            self.view = gevent.get_hub().threadpool.apply(
                load_view, (self.directory, self.ledger.ledger_id)
            )
        except (OSError, CorruptViewError) as error:
            log.error("%s: compacted view unusable, ignored: %s", self.name, error)
        self._keep_with_ledger()

    def _keep_with_ledger(self) -> None:
        if self.view is not None and self.status == "NOT_RUN":
            # A stored view is a compaction that succeeded before this actor (the topic was
            # closed as idle, or the broker restarted): report it rather than NOT_RUN.
            self.status = "SUCCESS"
        # The memory ledger outlives its topic actor; so does its view.
        if hasattr(self.ledger, "compacted_view"):
            self.ledger.compacted_view = self.view

    @property
    def horizon(self) -> int | None:
        return None if self.view is None else self.view.horizon

    def start(self, on_done: Callable[[CompactionResult | BaseException], None]) -> None:
        if self.running is not None:
            raise CompactionRunningError("Compaction already in progress")
        self.status = "RUNNING"
        self._started = time.monotonic()
        previous = self.view

        def run() -> None:
            try:
                result: CompactionResult | BaseException = run_compaction(
                    self.ledger,
                    previous,
                    retain_null_key=self.retain_null_key,
                    directory=self.directory,
                    cpu_share=self.cpu_share,
                )
            except Exception as error:  # reported as the status's lastError
                result = error
            on_done(result)

        self.running = gevent.spawn(run)

    def finished(self, result: CompactionResult | BaseException) -> None:
        self.running = None
        self.duration_ms = int((time.monotonic() - self._started) * 1000)
        now_ms = int(time.time() * 1000)
        if isinstance(result, BaseException):
            self.status = "ERROR"
            self.last_error = str(result) or type(result).__name__
            self.failed_ms = now_ms
            log.warning("%s: compaction failed: %s", self.name, self.last_error)
            return
        self.status = "SUCCESS"
        self.last_error = ""
        self.view = result.view
        self.removed = result.removed
        self.succeeded_ms = now_ms
        self._keep_with_ledger()
        log.info(
            "%s: compacted up to entry %d: %d entries kept, %d messages removed",
            self.name,
            result.view.horizon,
            len(result.view.entries),
            result.removed,
        )

    def status_document(self) -> dict[str, Any]:
        """Pulsar's LongRunningProcessStatus."""
        return {"status": self.status, "lastError": self.last_error}

    def stats(self) -> dict[str, Any]:
        return {
            "lastCompactionRemovedEventCount": self.removed,
            "lastCompactionSucceedTimestamp": self.succeeded_ms,
            "lastCompactionFailedTimestamp": self.failed_ms,
            "lastCompactionDurationTimeInMills": self.duration_ms,
        }

    # Reads of read_compacted subscriptions.

    def read(self, start: int, max_entries: int) -> tuple[list[Entry], int]:
        """For a read_compacted read from ``start``: the view's entries from there, or none
        and the topic entry id to read from instead (past the horizon)."""
        view = self.view
        if view is None or start > view.horizon:
            return [], start
        entries = view.read(start, max_entries)
        return entries, view.horizon + 1

    def first_id(self, topic_first: int) -> int:
        return topic_first if self.view is None else min(topic_first, self.view.first_id)
