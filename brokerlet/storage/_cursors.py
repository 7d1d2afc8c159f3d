"""Durable cursors: each durable subscription's acknowledgement state, kept in one file per topic.

`CursorStore.save` only records the state on the hub; the file is rewritten at most
``flush_delay`` seconds later, by the writer thread, all subscriptions at once (a temporary file,
synced, then renamed over the old one), so a crash leaves the previous version or the new one.
Individually acknowledged ids are stored as ranges, so a run of acks costs two numbers; past
``max_unacked_ranges`` ranges (Pulsar's ``managedLedgerMaxUnackedRangesToPersist``) the later ones
are kept in memory only, and a restart delivers their entries again.

The file is JSON, for the benefit of whoever has to look at it::

    {"format": 1, "subscriptions": {"sub": {"mark_delete": 41, "acked": [[43, 45], [50, 50]]}}}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import gevent.event

from brokerlet.storage._io import StorageError
from brokerlet.storage._segments import ReplaceFileJob, SegmentLog
from brokerlet.storage._worker import HubWorker
from brokerlet.storage.cursor import CursorState

__all__ = ["CURSORS_FORMAT", "CursorState", "CursorStore", "load_cursors"]

log = logging.getLogger(__name__)

CURSORS_FORMAT = 1


class CursorStore:
    """The durable cursors of one topic's subscriptions.

    Every method runs on the hub that opened the topic. Non-durable subscriptions (readers)
    simply never call it.

    Args:
        path: the cursors file.
        cursors: the state found on disk at open.
        writer: the writer thread that rewrites the file.
        ledger_log: the topic's ledger, synced before each rewrite so a durable cursor never
            points past durable entries.
        hub: the hub timers run on.
        flush_delay: seconds a save may wait before it is written.
        max_unacked_ranges: how many runs of individually acknowledged ids a subscription's
            saved state keeps, the lowest first.
        topic: for messages.
        new: the topic was created by this run: there is no file to read yet.
    """

    def __init__(
        self,
        path: str,
        *,
        cursors: dict[str, CursorState],
        writer: HubWorker,
        ledger_log: SegmentLog | None,
        hub: Any,
        flush_delay: float,
        topic: str,
        new: bool = False,
        max_unacked_ranges: int = 10_000,
    ) -> None:
        self._path = path
        self._cursors = cursors
        self._max_ranges = max_unacked_ranges
        self._encoded: dict[str, str] = {}  # JSON of cursors unchanged since the last write
        self._writer = writer
        self._ledger_log = ledger_log
        self._topic = topic
        self._dirty = False
        self._timer = hub.loop.timer(flush_delay)
        # Partly acknowledged batch entries per subscription: entry id -> [batch size, words];
        # read from the file on first use (older files have none).
        # A new topic's file does not exist yet: nothing to read.
        self._batch_acks: dict[str, dict[int, list[int]]] | None = {} if new else None
        self._last_write: gevent.event.AsyncResult | None = None
        self._closed = False
        self._properties: dict[str, Any] | None = {} if new else None  # read on first use

    def subscriptions(self) -> list[str]:
        """Names of the subscriptions with a saved cursor."""
        return sorted(self._cursors)

    @property
    def max_unacked_ranges(self) -> int:
        """How many runs of acknowledged ids a saved cursor keeps; `save` drops the rest."""
        return self._max_ranges

    def load(self, subscription: str) -> CursorState | None:
        """The saved ``(mark_delete, acked ranges)`` of ``subscription``, or None if none is."""
        state = self._cursors.get(subscription)
        if state is None:
            return None
        return state[0], list(state[1])

    def save(
        self, subscription: str, mark_delete: int, acked: Sequence[tuple[int, int]] = ()
    ) -> None:
        """Record a subscription's cursor; it is written within ``flush_delay``.

        Args:
            mark_delete: every entry up to this id is acknowledged.
            acked: the acknowledged ids above ``mark_delete`` as ascending inclusive runs
                (`Cursor.acked_ranges`); the first ``max_unacked_ranges`` are copied.
        """
        if self._closed:
            log.debug("topic %r: cursor %r saved after close; ignored", self._topic, subscription)
            return
        self._cursors[subscription] = (mark_delete, list(acked[: self._max_ranges]))
        self._encoded.pop(subscription, None)
        self._changed()

    def load_batch_acks(self, subscription: str) -> dict[int, list[int]]:
        """The saved batch-index acks of ``subscription``: entry id -> [size, words...]."""
        return dict(self._loaded_batch_acks().get(subscription, {}))

    def save_batch_acks(self, subscription: str, state: dict[int, list[int]]) -> None:
        """Record a subscription's batch-index acks, written with its cursor."""
        if self._closed:
            return
        known = self._loaded_batch_acks()
        if known.get(subscription, {}) == state:
            return
        if state:
            known[subscription] = dict(state)
        else:
            known.pop(subscription, None)
        self._encoded.pop(subscription, None)
        self._changed()

    def _loaded_batch_acks(self) -> dict[str, dict[int, list[int]]]:
        if self._batch_acks is None:
            self._batch_acks = load_batch_acks(self._path)
        return self._batch_acks

    def delete(self, subscription: str) -> None:
        """Forget a subscription's cursor (the subscription was deleted)."""
        if self._batch_acks is not None:
            self._batch_acks.pop(subscription, None)
        if self._closed or self._cursors.pop(subscription, None) is None:
            return
        self._encoded.pop(subscription, None)
        self._changed()

    def properties(self) -> dict[str, Any]:
        """The topic's other durable state (topic epoch, deduplication snapshot): JSON values
        kept in the same file, under ``"properties"``. A copy: change it with `set_property`."""
        if self._properties is None:
            self._properties = load_properties(self._path, self._topic)
        return dict(self._properties)

    def set_property(self, key: str, value: Any) -> None:
        """Record one property (a JSON value); it is written within ``flush_delay``."""
        if self._closed:
            return
        self.properties()
        assert self._properties is not None
        self._properties[key] = value
        self._changed()

    def flush(self, timeout: float | None = 10.0) -> None:
        """Write what was saved now and wait until it is durable. Call from a greenlet.

        Raises:
            StorageError: the write failed (it is retried at the next save or flush).
            gevent.Timeout: not written within ``timeout`` seconds.
        """
        if self._dirty:
            self._write()
        pending = self._last_write
        if pending is None:
            return
        error = pending.get(timeout=timeout)
        if error is not None:
            raise StorageError(
                f"topic {self._topic!r}: cannot write cursors to {self._path}: {error}"
            ) from error

    def close(self) -> None:
        """Write what is pending (without waiting) and refuse later saves."""
        if self._closed:
            return
        if self._dirty:
            self._write()
        self._closed = True
        self._timer.stop()
        self._timer.close()

    # On the hub.

    def _changed(self) -> None:
        self._dirty = True
        if not self._timer.active:
            self._timer.start(self._on_timer)

    def _on_timer(self) -> None:
        if self._dirty and not self._closed:
            self._write()

    def _write(self) -> None:
        self._timer.stop()
        self._dirty = False
        data = self._encode()
        done = gevent.event.AsyncResult()
        self._last_write = done

        def written(job: ReplaceFileJob) -> None:
            done.set(job.error)
            if job.error is not None:
                log.warning(
                    "topic %r: cannot write cursors (%s); will retry", self._topic, job.error
                )
                if not self._closed:
                    self._changed()

        self._writer.submit(ReplaceFileJob(self._path, data, self._ledger_log, written))

    def _encode(self) -> bytes:
        encoded = self._encoded
        batch_acks = self._batch_acks or {}
        parts = []
        for name, (mark_delete, acked) in self._cursors.items():
            fragment = encoded.get(name)
            if fragment is None:
                document: dict[str, Any] = {"mark_delete": mark_delete, "acked": acked}
                partial = batch_acks.get(name)
                if partial:
                    document["batch_acks"] = {str(e): words for e, words in partial.items()}
                fragment = json.dumps(document)
                encoded[name] = fragment
            parts.append(f"{json.dumps(name)}:{fragment}")
        body = ",".join(parts)
        properties = json.dumps(self.properties())
        return (
            f'{{"format":{CURSORS_FORMAT},"subscriptions":{{{body}}},"properties":{properties}}}\n'
        ).encode()


def load_cursors(path: str, topic: str) -> dict[str, CursorState]:
    """Read a cursors file; a missing file means no cursors yet.

    Raises:
        StorageError: the file is not a cursors file this version can read.
    """
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        return {}
    try:
        document = json.loads(raw)
        if document["format"] != CURSORS_FORMAT:
            raise StorageError(
                f"topic {topic!r}: {path} has cursors format {document['format']}; "
                f"this brokerlet reads format {CURSORS_FORMAT}"
            )
        cursors: dict[str, CursorState] = {}
        for name, cursor in document["subscriptions"].items():
            mark_delete = int(cursor["mark_delete"])
            acked = [(int(low), int(high)) for low, high in cursor["acked"]]
            cursors[str(name)] = (mark_delete, acked)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise StorageError(
            f"topic {topic!r}: {path} is not a readable cursors file: {error}"
        ) from error
    return cursors


def load_properties(path: str, topic: str) -> dict[str, Any]:
    """The ``"properties"`` of a cursors file (none in a missing file or an older one)."""
    try:
        with open(path, "rb") as file:
            document = json.loads(file.read())
    except FileNotFoundError:
        return {}
    except ValueError as error:
        raise StorageError(
            f"topic {topic!r}: {path} is not a readable cursors file: {error}"
        ) from error
    properties = document.get("properties", {}) if isinstance(document, dict) else {}
    return dict(properties) if isinstance(properties, dict) else {}


def load_batch_acks(path: str) -> dict[str, dict[int, list[int]]]:
    """The batch-index acks in a cursors file (``batch_acks``: entry id -> [size, words...]);
    a missing file, or a file of a version without them, has none."""
    try:
        with open(path, "rb") as file:
            document = json.loads(file.read())
        return {
            str(name): {
                int(e): [int(w) for w in words] for e, words in cursor["batch_acks"].items()
            }
            for name, cursor in document["subscriptions"].items()
            if cursor.get("batch_acks")
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
