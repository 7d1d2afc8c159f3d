"""Key_Shared dispatch rules, used by a subscription's dispatcher.

Messages with one key are delivered to, and stay unacked at, one consumer at a time, as
Pulsar's ``PersistentStickyKeyDispatcherMultipleConsumers`` does. :class:`KeySharedRules`
holds what that needs beyond a Shared dispatcher: the sticky-key selector (immutable
snapshots, binary search), the draining-hashes tracker (PIP-379), the sticky-key hash of
each pending or replayed entry, and the look-ahead limit. The dispatcher calls it at
membership changes, when it reads, when it hands entries out and when entries are
acknowledged or redelivered; all on the dispatcher actor.

How ordering holds through churn:

* a range that moves away from a consumer still holding unacked messages of a hash blocks
  that hash for the new owner until those are acked or the old consumer leaves (draining);
* while a hash has entries waiting in the replay set, newer entries of that hash wait too,
  and within one read batch, once an entry of a hash is held back, the later ones are too;
* a replay read whose result could overtake an entry redelivered meanwhile is discarded and
  retried (the order guard).

``allowOutOfOrderDelivery`` turns the last three off, keeping one consumer per key at a time.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from itertools import compress, repeat
from typing import Any

from brokerlet.actors.errors import BrokerError
from brokerlet.config import Settings
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.dispatch.replay import ReplaySet
from brokerlet.dispatch.strategy import (
    BACK_OFF,
    KEY_SHARED,
    NOTHING,
    Deliver,
    ReadPlan,
    Strategy,
    WakeAfter,
)
from brokerlet.keyshared import (
    ConsumerAssignError,
    DrainingHashesTracker,
    HashRange,
    KeySharedMeta,
    Selector,
    make_selector,
    sticky_key_hash,
)
from brokerlet.keyshared.meta import AUTO_SPLIT, STICKY
from brokerlet.storage.ledger import Entry, messages_of
from brokerlet.transport.protocol import ProtocolError, parse_metadata, pb, sticky_key

__all__ = ["KeySharedRules", "KeySharedStrategy", "entry_key_hash"]

log = logging.getLogger(__name__)

NO_KEY_HASH = sticky_key_hash(b"NONE_KEY") or 1
"""The hash of an entry whose key cannot be read: Pulsar's ``NONE_KEY`` sticky key."""


def entry_key_hash(entry: Entry) -> int:
    """The 31-bit sticky-key hash of an entry, as a Pulsar broker computes it.

    The key is the ordering key, else the partition key (base64-decoded when flagged), else
    ``<producer name>-<sequence id>``. A batch carries its first message's key; producers
    should batch by key (``batching_type=KeyBased``) for per-key routing.

    The hash the SEND's check kept with the entry when it has one; else the key is read off
    the metadata's wire format (:func:`sticky_key`), which answers for every entry the
    official client writes; anything it declines goes through protobuf.

    Raises:
        ProtocolError: the metadata cannot be decoded.
    """
    if entry.key_hash > 0:
        return entry.key_hash
    key = sticky_key(entry.data)
    if key is None:
        return protobuf_key_hash(entry)
    return sticky_key_hash(key) or 1  # 0 means "no hash"


def protobuf_key_hash(entry: Entry) -> int:
    """:func:`entry_key_hash` through a full protobuf decode of the metadata: the reference
    the wire-format walk is tested against, and its fallback."""
    metadata = parse_metadata(entry.data)
    if metadata.HasField("ordering_key"):
        key = metadata.ordering_key
    elif metadata.HasField("partition_key"):
        key = metadata.partition_key.encode()
        if metadata.partition_key_b64_encoded:
            with contextlib.suppress(ValueError):
                key = base64.b64decode(key, validate=True)
    else:
        key = f"{metadata.producer_name}-{metadata.sequence_id}".encode()
    return sticky_key_hash(key) or 1  # 0 means "no hash"


def _kept_hashes(entries: list[Entry]) -> tuple[list[int], bool]:
    """The hashes kept with ``entries``, and whether each has one (nearly every keyed read
    ends here). Typed: compiled, a third cheaper than ``map`` and ``min``."""
    # Each entry's own int goes into the list: read by type, compiled code would unbox
    # it and box a new one (an allocation an entry), read untyped it is only referenced.
    rows: list[tuple[Any, ...]] = entries  # type: ignore[assignment]
    hashes: list[int] = [row[5] for row in rows]  # Entry.key_hash
    for h in hashes:
        if h <= 0:
            return hashes, False
    return hashes, True


class KeySharedRules:
    """The Key_Shared part of one subscription's dispatcher.

    Args:
        meta: the first consumer's options; they fix the subscription's mode.
        settings: the broker's settings (selector and look-ahead keys).
        on_unblocked: called when a draining hash that had blocked someone is released.
    """

    def __init__(
        self, meta: KeySharedMeta, settings: Settings, on_unblocked: Callable[[], None]
    ) -> None:
        self.meta = meta
        self.settings = settings
        self.selector: Selector[Consumer] = make_selector(
            "STICKY" if meta.mode == STICKY else "AUTO_SPLIT",
            use_consistent_hashing=settings.subscription_key_shared_use_consistent_hashing,
            replica_points=settings.subscription_key_shared_consistent_hashing_replica_points,
        )
        self.draining: DrainingHashesTracker[Consumer] = DrainingHashesTracker(
            lambda _hash: on_unblocked()
        )
        self.pending_hashes: dict[int, int] = {}  # entry id -> hash, for pending entries
        self._ranges_of: tuple[object, dict[Consumer, list[HashRange]]] = (None, {})
        self._unparseable_logged = False

    @property
    def ordered(self) -> bool:
        """False when the subscription allows out-of-order delivery."""
        return not self.meta.allow_out_of_order

    # Membership.

    def check_compatible(self, meta: KeySharedMeta) -> None:
        if meta.mode != self.meta.mode:
            names: dict[int, str] = {AUTO_SPLIT: "AUTO_SPLIT", STICKY: "STICKY"}
            raise BrokerError.consumer_busy(
                f"Key_Shared subscription is in {names.get(self.meta.mode)} mode, "
                f"not {names.get(meta.mode)}"
            )
        if meta.allow_out_of_order != self.meta.allow_out_of_order:
            raise BrokerError.consumer_busy(
                "Key_Shared subscription's allowOutOfOrderDelivery differs from this consumer's"
            )

    def add_consumer(self, consumer: Consumer, meta: KeySharedMeta) -> None:
        """Give ``consumer`` its ranges; the hashes it takes from others start draining."""
        ranges = [HashRange(start, end) for start, end in meta.ranges] or None
        try:
            impacted = self.selector.add(consumer, ranges)
        except ConsumerAssignError as error:
            raise BrokerError(pb.ConsumerAssignError, str(error)) from None
        if consumer not in self.selector.snapshot.slot_owners:  # consumers compare by identity
            log.warning("Key_Shared consumer %r got no hash range (all points collide)", consumer)
        if self.ordered and self.meta.mode == AUTO_SPLIT:
            for other, changes in impacted.items():
                if other is not consumer and changes.removed:
                    self._start_draining(other, changes.removed)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Give the ranges of a consumer whose pending entries were released to the others."""
        self.draining.consumer_removed(consumer)
        self.selector.remove(consumer)

    def _start_draining(self, consumer: Consumer, lost: Iterable[HashRange]) -> None:
        # Runs over every pending entry of each consumer a newcomer takes slots from (a
        # thousand each at the default receiver queue): one mask of the lost slots, then a
        # lookup per entry.
        selector = self.selector
        lost_slots = bytearray(selector.snapshot.last + 1)
        for hash_range in lost:
            lost_slots[hash_range.start : hash_range.end + 1] = b"\x01" * len(hash_range)
        hashes = [h for h in map(self.pending_hashes.get, consumer.pending) if h]
        moved = map(lost_slots.__getitem__, selector.slots(hashes))
        for key_hash in compress(hashes, moved):
            self.draining.add_entry(consumer, key_hash)

    # Hashes of entries.

    def key_hash(self, entry: Entry) -> int:
        """The entry's sticky-key hash."""
        return self.key_hashes((entry,))[0]

    def key_hashes(self, entries: Sequence[Entry], replay: ReplaySet | None = None) -> list[int]:
        """:meth:`key_hash` of each entry: the hashes kept with the entries (a keyed SEND's,
        in memory and the tail cache), then for a replay read those the replay set kept
        (``replay``), and any still missing worked out, each distinct key of the read once."""
        hashes, kept = _kept_hashes(entries if isinstance(entries, list) else list(entries))
        if kept:
            return hashes
        if replay:
            hashes = [
                h if h > 0 else replay.key_hash(e.entry_id)
                for h, e in zip(hashes, entries, strict=True)
            ]
            if min(hashes) > 0:
                return hashes
        by_key: dict[bytes, int] = {}
        for index, entry in enumerate(entries):
            if hashes[index] > 0:
                continue
            key = sticky_key(entry.data)
            if key is None:
                hashes[index] = self._protobuf_hash(entry)
                continue
            key_hash = by_key.get(key)
            if key_hash is None:
                key_hash = by_key[key] = sticky_key_hash(key) or 1
            hashes[index] = key_hash
        return hashes

    def _protobuf_hash(self, entry: Entry) -> int:
        """The hash of an entry the wire-format walk declined, through protobuf."""
        try:
            return protobuf_key_hash(entry)
        except ProtocolError as error:
            # Stored before metadata was checked on SEND (or damaged since): one such
            # entry must not stop the subscription. It is routed as having no key.
            if not self._unparseable_logged:
                self._unparseable_logged = True
                log.warning(
                    "entry %d has unparseable metadata (%s); delivered as having no key "
                    "(logged once per subscription)",
                    entry.entry_id,
                    error.reason,
                )
            return NO_KEY_HASH

    def released(self, consumer: Consumer, entry_id: int, *, closing: bool = False) -> int:
        """``consumer``'s pending ``entry_id`` was acked or sent back; returns its hash."""
        key_hash = self.pending_hashes.pop(entry_id, 0)
        if key_hash:
            self.draining.reduce_ref_count(consumer, key_hash, closing=closing)
        return key_hash

    def acked(self, entry_ids: list[int], owners: Mapping[int, Consumer]) -> None:
        """:meth:`released` for each acknowledged entry pending at its owner in ``owners``;
        with no hash draining (nearly always), only the pending hashes are dropped."""
        if not len(self.draining):
            # In C: compiled, a loop over the ids as ints would box each one anew.
            for _ in map(self.pending_hashes.pop, entry_ids, repeat(None)):
                pass
            return
        owner_of = owners.get
        for entry_id in entry_ids:
            owner = owner_of(entry_id)
            if owner is not None:
                self.released(owner, entry_id)

    # Reading.

    def look_ahead_limit(self, consumers: int) -> int:
        """How many entries the replay set may hold before normal reads pause."""
        s = self.settings
        terms = [
            t
            for t in (
                s.key_shared_look_ahead_msg_in_replay_threshold_per_consumer * consumers,
                s.key_shared_look_ahead_msg_in_replay_threshold_per_subscription,
            )
            if t > 0
        ]
        if terms:
            return min(terms)
        unacked = [
            t
            for t in (
                s.max_unacked_messages_per_subscription,
                consumers * s.max_unacked_messages_per_consumer,
            )
            if t > 0
        ]
        return min(unacked) if unacked else 2**31 - 1

    def select_replay(
        self, replay: ReplaySet, budgets: dict[Consumer, int], count: int
    ) -> list[int]:
        """The replay entries worth reading now, in order: skip any whose consumer cannot take
        it (no owner, no budget, the hash draining elsewhere); the hash then stays blocked for
        the rest of the pass."""
        chosen: list[int] = []
        # A slow consumer's hashes can fill the replay set up to the look-ahead limit (20,000
        # entries by default), and this runs at every pass: when none of the distinct hashes
        # can go now, say so without walking every entry.
        if (
            self.ordered
            and not replay.unhashed
            and not any(self._taker(h, budgets) for h in replay.hashes())
        ):
            return chosen
        blocked: set[int] = set()
        for entry_id in replay:
            key_hash = replay.key_hash(entry_id)
            if not key_hash or not self.ordered:
                chosen.append(entry_id)
            elif key_hash not in blocked:
                consumer = self._taker(key_hash, budgets)
                if consumer is None:
                    blocked.add(key_hash)
                else:
                    chosen.append(entry_id)
                    budgets[consumer] -= 1
            if len(chosen) >= count:
                break
        return chosen

    def _taker(self, key_hash: int, budgets: dict[Consumer, int]) -> Consumer | None:
        """The consumer that may take an entry of ``key_hash`` now, if any: its owner, with
        permits left, and the hash not draining at another consumer."""
        consumer = self.selector.select(key_hash)
        if (
            consumer is None
            or budgets.get(consumer, 0) <= 0
            or self.draining.should_block(consumer, key_hash)
        ):
            return None
        return consumer

    # Handing entries out.

    def assign(
        self,
        entries: Sequence[Entry],
        budgets: dict[Consumer, int],
        replay: ReplaySet,
        *,
        from_replay: bool,
    ) -> tuple[dict[Consumer, list[Entry]], list[tuple[Entry, int]]]:
        """Split a read into per-consumer batches (in entry order) and entries held back.

        ``budgets`` holds each available consumer's effective permits, in messages. The
        batches' entries are pending from here on: the caller delivers every batch.
        """
        batches: dict[Consumer, list[Entry]] = {}
        held: list[tuple[Entry, int]] = []
        blocked: set[int] = set()
        pending = self.pending_hashes
        hashes = self.key_hashes(entries, replay if from_replay else None)
        owners = self.selector.select_batch(hashes)
        ordered = self.ordered
        # Asked once per read: nothing below adds to the replay set or the draining hashes
        # (should_block only drops them), so an empty one stays empty through the loop.
        waiting = ordered and not from_replay and bool(replay)
        draining = self.draining if ordered and len(self.draining) else None
        # Compiled, an int-typed hash or id is boxed anew (allocated) each time it goes into a
        # set or dict: typed Any, each stays the object the list or the entry already holds.
        hash_objects: list[Any] = hashes
        entry_id: Any
        for entry, h, consumer in zip(entries, hash_objects, owners, strict=True):
            if h in blocked:
                held.append((entry, h))
                continue
            if consumer is None or (budget := budgets.get(consumer, 0)) <= 0:
                blocked.add(h)
                held.append((entry, h))
                continue
            if (waiting and replay.has_hash(h)) or (
                draining is not None and draining.should_block(consumer, h)
            ):
                blocked.add(h)
                held.append((entry, h))
                continue
            batch = batches.get(consumer)
            if batch is None:
                batches[consumer] = [entry]
            else:
                batch.append(entry)
            _, entry_id, _, _, num_messages, _ = entry
            budgets[consumer] = budget - num_messages
            pending[entry_id] = h
        return batches, held

    # Observability.

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        ranges = self._ranges().get(consumer, [])
        stats: dict[str, Any] = {"keyHashRanges": [f"[{r.start}, {r.end}]" for r in ranges]}
        stats.update(self.draining.stats_for(consumer))
        return stats

    def _ranges(self) -> dict[Consumer, list[HashRange]]:
        """Every consumer's ranges, worked out once per published snapshot (stats only)."""
        snapshot = self.selector.snapshot
        if self._ranges_of[0] is not snapshot:
            self._ranges_of = (snapshot, snapshot.ranges())
        return self._ranges_of[1]

    def stats(self) -> dict[str, Any]:
        return {
            "keySharedMode": "STICKY" if self.meta.mode == STICKY else "AUTO_SPLIT",
            "allowOutOfOrderDelivery": self.meta.allow_out_of_order,
            "drainingHashesCount": len(self.draining),
        }


class KeySharedStrategy(Strategy):
    """Key_Shared as a dispatcher's strategy: :class:`KeySharedRules` on the delivery book.

    Reading differs from Shared in three ways: a replay read takes only the entries whose
    consumer can take them now; a normal read looks ahead past held-back entries, but only
    while the replay set is under the look-ahead limit (else it backs off); and a replay read
    that could overtake an entry redelivered meanwhile is discarded (the order guard).
    """

    delays_delivery = True  # Pulsar's Key_Shared dispatcher extends the Shared one
    looks_ahead = True

    def __init__(
        self,
        book: DeliveryBook,
        meta: KeySharedMeta,
        settings: Settings,
        wake_after: WakeAfter,
    ) -> None:
        super().__init__(book, KEY_SHARED)
        self.tracks_entries = True
        interval = settings.key_shared_unblocking_interval_ms
        self.rules = KeySharedRules(meta, settings, lambda: wake_after(interval))
        self._min_replayed = -1  # the replay set's head when the last replay read was planned

    def add(self, consumer: Consumer) -> None:
        super().add(consumer)
        meta = consumer.key_shared or KeySharedMeta()
        if self.book.consumers:
            self.rules.check_compatible(meta)
        self.rules.add_consumer(consumer, meta)

    def remove(self, consumer: Consumer) -> None:
        self.rules.remove_consumer(consumer)

    def candidates(self) -> Sequence[Consumer]:
        return self.book.consumers

    def plan_read(self, batch: int) -> ReadPlan:
        book = self.book
        replay = book.replay
        budgets = book.budgets()
        if replay:
            ids = self.rules.select_replay(replay, dict(budgets), batch)
            if ids:
                self._min_replayed = replay.first()
                return ReadPlan(replay_ids=ids)
            # Nothing in the replay set can go out now: look ahead with a normal read.
        if book.blocked_on_unacked:
            return NOTHING
        limit = self.rules.look_ahead_limit(len(book.consumers))
        if len(replay) >= limit or not any(b > 0 for b in budgets.values()):
            return BACK_OFF
        return ReadPlan(count=min(batch, max(limit - len(replay), 1)))

    def replay_ready(self) -> bool:
        replay = self.book.replay
        return bool(replay) and bool(self.rules.select_replay(replay, self.book.budgets(), 1))

    def replay_stale(self) -> bool:
        replay = self.book.replay
        return bool(replay) and replay.first() < self._min_replayed

    def assign(
        self, entries: list[Entry], deliver: Deliver, *, replay: bool
    ) -> list[tuple[Entry, int]]:
        book = self.book
        batches, held = self.rules.assign(entries, book.budgets(), book.replay, from_replay=replay)
        for consumer, batch in batches.items():
            deliver(consumer, batch, sum(map(messages_of, batch)))
        return held

    def released(self, consumer: Consumer, entry_id: int, *, closing: bool) -> int:
        return self.rules.released(consumer, entry_id, closing=closing)

    def acked(self, entry_ids: list[int], owners: Mapping[int, Consumer]) -> None:
        self.rules.acked(entry_ids, owners)

    def ack_scope(self) -> AbstractContextManager[object]:
        return self.rules.draining.batch()  # one unblock notification per ACK

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        return self.rules.consumer_stats(consumer)

    def stats(self) -> dict[str, Any]:
        return self.rules.stats()
