"""The seam between the dispatcher's read loop and a subscription type's rules.

A :class:`Strategy` decides, for one subscription type, who may join, which consumers a read
is for, what to read next, and which consumer gets each entry read. The dispatcher actor owns
the loop (permits, rate limits, reads, backoff) and carries out what its strategy decides; the
strategy sees the subscription's state through its :class:`DeliveryBook`. One module per
type: :mod:`~brokerlet.dispatch.shared`, :mod:`~brokerlet.dispatch.single_active` (Exclusive
and Failover) and :mod:`~brokerlet.dispatch.key_shared`. Rules that apply to every type (which
entries may go out at all) are delivery filters (:mod:`brokerlet.dispatch.filters`).

This base class is also the strategy of a subscription with no consumer: nobody is a
candidate, and every entry is held back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from brokerlet.actors.errors import BrokerError
from brokerlet.dispatch.consumer import Consumer
from brokerlet.dispatch.delivery import DeliveryBook
from brokerlet.storage.ledger import Entry, messages_of
from brokerlet.transport.protocol import pb

__all__ = [
    "EXCLUSIVE",
    "FAILOVER",
    "KEY_SHARED",
    "SHARED",
    "SUB_TYPE_NAMES",
    "Deliver",
    "ReadPlan",
    "Strategy",
    "WakeAfter",
]


SHARED = pb.CommandSubscribe.Shared
EXCLUSIVE = pb.CommandSubscribe.Exclusive
FAILOVER = pb.CommandSubscribe.Failover
KEY_SHARED = pb.CommandSubscribe.Key_Shared
SUB_TYPE_NAMES: dict[int, str] = {
    SHARED: "Shared",
    EXCLUSIVE: "Exclusive",
    FAILOVER: "Failover",
    KEY_SHARED: "Key_Shared",
}


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What to read next: entries of the replay set by id, else ``count`` new entries.

    Neither (``count == 0``, no ids) means read nothing now; ``backoff`` asks the loop to try
    again after its retry backoff instead of waiting for a wake-up.
    """

    replay_ids: list[int] = field(default_factory=list)
    count: int = 0
    backoff: bool = False


NOTHING = ReadPlan()
BACK_OFF = ReadPlan(backoff=True)


WakeAfter = Callable[[float], None]
"""``wake_after(delay_ms)``: entries in the replay set may go out after ``delay_ms`` (0: now);
the dispatcher reads again then, merging wake-ups while one is pending."""

Deliver = Callable[[Consumer, list[Entry], int], None]
"""Carries out one batch: ``deliver(consumer, batch, messages)`` records it as pending at the
consumer, charges permits and limits, and sends it; the strategy calls it as it selects, so
its next pick sees the charges."""


class Strategy:
    """One subscription type's rules; the base is the idle strategy (no consumer yet).

    Args:
        book: the subscription's delivery state, shared with the dispatcher.
        sub_type: the ``CommandSubscribe.SubType`` this strategy serves.
    """

    cumulative_acks = False
    """Whether cumulative acks apply (Exclusive and Failover; Pulsar ignores them on Shared)."""

    delays_delivery = False
    """Whether messages with a ``deliver_at_time`` wait for it (Shared and Key_Shared only,
    as in Pulsar: its single-active dispatchers have no delay tracker)."""

    reads_after_dispatch = False
    """Whether the next read may start before a pass's writes complete (Shared, as Pulsar's
    ``PersistentDispatcherMultipleConsumers`` reads again right after a pass). brokerlet
    uses it at the end of the topic only: a caught-up dispatcher's read stays armed at the
    topic (a standing read) while each push is handed out in full. Otherwise the batches'
    write completions request the next read (Key_Shared since Pulsar #26635, and the
    single-active types)."""

    looks_ahead = False
    """Whether a replay entry can become deliverable while a normal read waits for new
    entries (Key_Shared, see :meth:`replay_ready`). If not, a pass made while such a read
    waits has nothing to do, and the dispatcher drops read requests until it completes."""

    tracks_entries = False
    """Whether ``released`` and ``acked`` do anything (Key_Shared's hashes); when not, the
    delivery book does not call them."""

    def __init__(self, book: DeliveryBook, sub_type: int) -> None:
        self.book = book
        self.sub_type = sub_type
        self.cumulative_acks = sub_type in (EXCLUSIVE, FAILOVER)

    @property
    def type_name(self) -> str:
        return SUB_TYPE_NAMES.get(self.sub_type, str(self.sub_type))

    # Membership.

    def add(self, consumer: Consumer) -> None:
        """``consumer`` is about to join; raise :class:`BrokerError` to refuse it."""
        if self.book.consumers and consumer.sub_type != self.sub_type:
            raise BrokerError.consumer_busy(
                f"Subscription {consumer.subscription!r} is of a different type ({self.type_name})"
            )

    def remove(self, consumer: Consumer) -> None:
        """``consumer`` left; its pending entries are back in the replay set."""

    def membership_changed(self) -> Consumer | None:
        """After a join or a leave: a consumer whose pending entries should move to another
        (a Failover consumer that stopped being active), or None."""
        return None

    def active_notices(self, added: Consumer | None) -> list[tuple[Consumer, bool]]:
        """After a membership change: the ACTIVE_CONSUMER_CHANGE notices to send, as
        ``(consumer, is_active)`` (Failover only; ``added`` joined, None: one left)."""
        return []

    # Reading.

    def candidates(self) -> Sequence[Consumer]:
        """The consumers a read would be for."""
        return ()

    def plan_read(self, batch: int) -> ReadPlan:
        """What to read, with ``batch`` entries allowed by permits and rate limits: the
        head of the replay set first, else new entries unless the subscription is blocked."""
        ids = self.book.replay.head(batch)
        if ids:
            return ReadPlan(replay_ids=ids)
        if self.book.blocked_on_unacked:
            return NOTHING  # acks below half the limit wake us
        return ReadPlan(count=batch)

    def replay_ready(self) -> bool:
        """Some replay entry can go out now, so a long-poll read must not hold it back."""
        return False

    def replay_stale(self) -> bool:
        """The replay read that just completed could overtake an entry redelivered since it
        was issued; the loop then discards it and reads again."""
        return False

    # Handing entries out.

    def assign(
        self, entries: list[Entry], deliver: Deliver, *, replay: bool
    ) -> list[tuple[Entry, int]]:
        """Hand ``entries`` (in order) to the available consumers through ``deliver``.

        Returns the entries held back, each with its key hash (0: none), for the replay set.
        ``replay`` says the entries came from the replay set.
        """
        return [(entry, 0) for entry in entries]

    def released(self, consumer: Consumer, entry_id: int, *, closing: bool) -> int:
        return 0

    def acked(self, entry_ids: list[int], owners: Mapping[int, Consumer]) -> None:
        pass

    def ack_scope(self) -> contextlib.AbstractContextManager[object] | None:
        """What wraps the handling of one ACK command (None: nothing, the common case)."""
        return None

    # Observability.

    def is_active(self, consumer: Consumer) -> bool:
        return False

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        return {}

    def stats(self) -> dict[str, Any]:
        return {}


class InOrderChunks(Strategy):
    """Hands a read out in entry order: chunks of up to :meth:`chunk` entries, each to the
    consumer :meth:`next_consumer` picks, within its budget; what nobody takes is held."""

    def next_consumer(self) -> Consumer | None:
        raise NotImplementedError

    def chunk(self, count: int) -> int:
        raise NotImplementedError

    def assign(
        self, entries: list[Entry], deliver: Deliver, *, replay: bool
    ) -> list[tuple[Entry, int]]:
        index = 0
        count = len(entries)
        chunk = self.chunk(count)
        budget_of = self.book.budget
        while index < count:
            consumer = self.next_consumer()
            if consumer is None:
                break
            budget = budget_of(consumer)
            batch = entries[index : index + chunk]
            messages = sum(map(messages_of, batch))
            if len(batch) > 1 and messages - batch[-1].num_messages >= budget:
                batch, messages = _within_budget(batch, budget)
            index += len(batch)
            deliver(consumer, batch, messages)
        return [(entry, 0) for entry in entries[index:]]


def _within_budget(batch: list[Entry], budget: int) -> tuple[list[Entry], int]:
    """The first entries of ``batch`` while the messages before each are under ``budget``
    (at least one: a batch entry may take a consumer past its permits), and their messages."""
    messages = 0
    for taken, entry in enumerate(batch):
        if taken and messages >= budget:
            return batch[:taken], messages
        messages += entry.num_messages
    return batch, messages
