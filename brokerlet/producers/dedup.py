"""Message deduplication: per producer name, the highest sequence id stored.

As Pulsar's MessageDeduplication: each producer name has a ``pushed`` sequence id (the
highest sent on to storage) and a ``persisted`` one (the highest stored). A SEND's sequence
id is the larger of ``sequence_id`` and ``highest_sequence_id`` (a batch); a SEND at or
below ``pushed`` is a duplicate when it is at or below ``persisted`` (answered with the
``-1:-1`` receipt, not stored), and of unknown fate otherwise (its original is still being
written: answered with a PersistenceError, so the client resends it later). Chunks of one
chunked message share a sequence id: only the last chunk moves the state on, and earlier
chunks are duplicates only once the whole message was stored.

The state survives a restart as a snapshot (every ``entries_interval`` stored entries and
at close, written with the topic's cursors, after the ledger is synced) plus the metadata
of the entries stored after the snapshot, replayed at recovery (`replay`), as Pulsar
replays its dedup cursor. Producer names are bounded (``max_producers``: the least
recently active disconnected ones go first) and a name disconnected for longer than the
inactivity timeout is forgotten.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Deduplication", "Verdict"]


class Verdict(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"  # at or below pushed, above persisted: still being written


class Deduplication:
    """The deduplication state of one topic."""

    def __init__(
        self,
        *,
        max_producers: int = 10000,
        inactivity_seconds: float = 360 * 60,
        entries_interval: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_producers = max_producers
        self.inactivity_seconds = inactivity_seconds
        self.entries_interval = entries_interval
        self._clock = clock
        self.pushed: dict[str, int] = {}
        self.persisted: dict[str, int] = {}
        self.connected: dict[str, int] = {}  # name -> connected producers of that name
        self.inactive_since: dict[str, float] = {}
        self.snapshot_entry = -1  # the last entry id the snapshot covers
        self._since_snapshot = 0

    # Producers.

    def connect(self, name: str) -> int:
        """A producer of this name connected: its last sequence id (-1 if none)."""
        self.connected[name] = self.connected.get(name, 0) + 1
        self.inactive_since.pop(name, None)
        return self.last_sequence_id(name)

    def disconnect(self, name: str) -> None:
        left = self.connected.get(name, 0) - 1
        if left > 0:
            self.connected[name] = left
            return
        self.connected.pop(name, None)
        self.inactive_since[name] = self._clock()

    def last_sequence_id(self, name: str) -> int:
        return self.pushed.get(name, self.persisted.get(name, -1))

    def purge_inactive(self) -> list[str]:
        """Forget the names disconnected for longer than the inactivity timeout."""
        limit = self._clock() - self.inactivity_seconds
        gone = [name for name, since in self.inactive_since.items() if since <= limit]
        for name in gone:
            self._forget(name)
        return gone

    # SENDs.

    def check(
        self, name: str, sequence_id: int, highest: int, *, last_chunk: bool = True
    ) -> Verdict:
        """The verdict on one SEND; a NEW one moves ``pushed`` on (the last chunk only).

        Sequence ids are uint64 on the wire and Java longs in Pulsar: one above 2**63 - 1 is
        negative there, so it is compared as the signed value here too.
        """
        if sequence_id >= _LONG_LIMIT or highest >= _LONG_LIMIT:
            sequence_id = _signed(sequence_id)
            highest = _signed(highest)
        highest = max(highest, sequence_id)
        pushed = self.pushed.get(name)
        if pushed is None:
            pushed = self.persisted.get(name)
        if pushed is not None and sequence_id <= pushed:
            persisted = self.persisted.get(name)
            if persisted is not None and sequence_id <= persisted:
                return Verdict.DUPLICATE
            return Verdict.UNKNOWN if last_chunk else Verdict.NEW
        if last_chunk:
            self.pushed[name] = highest
        return Verdict.NEW

    def check_run(self, name: str, first: int, highest: int) -> bool:
        """`check` of a whole run of SENDs at once: whole messages whose ids only go up, each
        past the highest of the one before, from ``first`` to ``highest``. They are all NEW
        if the first is (and no id wraps to a negative long); then ``pushed`` moves to
        ``highest`` and this answers True. False changes nothing: check them one by one."""
        if highest >= _LONG_LIMIT:
            return False
        pushed = self.pushed.get(name)
        if pushed is None:
            pushed = self.persisted.get(name)
        if pushed is not None and first <= pushed:
            return False
        self.pushed[name] = highest
        return True

    def stored(self, name: str, highest: int) -> None:
        """A NEW SEND's entry is stored."""
        if highest >= _LONG_LIMIT:
            highest -= 1 << 64
        persisted = self.persisted
        current = persisted.get(name)
        if current is None:
            persisted[name] = highest
            if len(persisted) > self.max_producers:
                self._bound()
        elif current < highest:
            persisted[name] = highest

    def failed(self, name: str) -> None:
        """A NEW SEND could not be stored: ``pushed`` falls back, so a resend is accepted."""
        if name in self.persisted:
            self.pushed[name] = self.persisted[name]
        else:
            self.pushed.pop(name, None)

    def entries_stored(self, count: int) -> bool:
        """Count stored entries; True when a snapshot is due."""
        self._since_snapshot += count
        return self._since_snapshot >= self.entries_interval

    # Persistence.

    def snapshot(self, last_entry: int) -> dict[str, Any]:
        """The state as JSON, covering entries up to ``last_entry``."""
        self._since_snapshot = 0
        self.snapshot_entry = last_entry
        return {"entry": last_entry, "producers": dict(self.persisted)}

    def restore(self, snapshot: Mapping[str, Any] | None) -> int:
        """Load a snapshot; return the entry id replay starts after."""
        if not snapshot:
            return -1
        for name, sequence_id in snapshot.get("producers", {}).items():
            self.persisted[str(name)] = int(sequence_id)
        self.snapshot_entry = int(snapshot.get("entry", -1))
        self._bound()
        return self.snapshot_entry

    def replay(self, name: str, highest: int) -> None:
        """A stored entry found at recovery: its producer had sent up to ``highest``."""
        self.stored(name, highest)
        self.pushed.pop(name, None)

    def _bound(self) -> None:
        # Disconnected names go first, the longest inactive first, then the oldest names;
        # a connected one never (runs only when a new name passes the bound).
        excess = len(self.persisted) - self.max_producers
        if excess <= 0:
            return
        inactive = sorted(self.inactive_since, key=self.inactive_since.__getitem__)
        others = [
            n for n in self.persisted if n not in self.connected and n not in self.inactive_since
        ]
        for victim in (inactive + others)[:excess]:
            self._forget(victim)

    def _forget(self, name: str) -> None:
        self.persisted.pop(name, None)
        self.pushed.pop(name, None)
        self.inactive_since.pop(name, None)


_LONG_LIMIT = 1 << 63


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
