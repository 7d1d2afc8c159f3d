"""Non-persistent topics: Pulsar's NonPersistentTopic delivery rule.

Nothing is stored: an entry lives in the topic's in-memory ledger only until every
subscription that could take it has read it. When a message arrives, each subscription
whose consumers have permits left (beyond what it has been given already) keeps it; every
other subscription drops it and counts it (``msgDropRate``, as Pulsar's
NonPersistentDispatcher* record ``msgDrop`` when no consumer has permits). There is no
backlog and no redelivery: entries a consumer held when it left, or that a dispatcher sends
back for replay, are dropped too. A topic with no subscription drops everything, uncounted,
as Pulsar does.

:class:`NonPersistentRule` takes over the topic actor's read and append handling for such
a topic (see :meth:`TopicOps.handlers <brokerlet.topicops.topic_side.TopicOps.handlers>`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brokerlet.actors.messages import AckDropped
from brokerlet.dispatch.permits import PermitTotal
from brokerlet.dispatch.stats import Rate
from brokerlet.storage.ledger import Entry, Ledger

if TYPE_CHECKING:
    from brokerlet.actors.messages import ReadEntries, ReadIds

__all__ = ["NonPersistentRule", "is_non_persistent"]


def is_non_persistent(topic: str) -> bool:
    return topic.startswith("non-persistent://")


@dataclass(slots=True)
class _Subscriber:
    dispatcher: Any  # its DispatcherActor's ref, told which entries it dropped
    permits: PermitTotal
    position: int  # next entry id this subscription reads
    kept_unread: int = 0  # messages kept for it and not read yet
    skipped: list[list[int]] = field(default_factory=list)  # dropped [low, high] id runs
    dropped: int = 0
    waiting: Any = None  # its ReadEntries at the end of the ledger
    drop_rate: Rate = field(default_factory=Rate)


class NonPersistentRule:
    """Keep-or-drop per subscription at publish time, and reads that skip what was dropped.

    Args:
        ledger: the topic's in-memory ledger.
        reply: sends an ``EntriesRead(read_id, entries, replay)`` to a dispatcher.
    """

    def __init__(self, ledger: Ledger, reply: Callable[[Any, int, list[Entry], bool], None]):
        self.ledger = ledger
        self._reply = reply
        self.subscribers: dict[str, _Subscriber] = {}

    # Membership.

    def subscribed(self, subscription: str, dispatcher: Any, permits: PermitTotal) -> None:
        if subscription not in self.subscribers:
            self.subscribers[subscription] = _Subscriber(
                dispatcher, permits, self.ledger.last_entry_id + 1
            )

    def unsubscribed(self, subscription: str) -> None:
        self.subscribers.pop(subscription, None)
        self._trim()

    # Appends.

    def appended(self, entries: list[Entry]) -> None:
        """Decide for each subscription which of the new ``entries`` it keeps."""
        for subscriber in self.subscribers.values():
            room = subscriber.permits.value - subscriber.kept_unread
            dropped: list[int] = []
            for entry in entries:
                if room > 0:
                    room -= entry.num_messages
                    subscriber.kept_unread += entry.num_messages
                    continue
                subscriber.dropped += entry.num_messages
                dropped.append(entry.entry_id)
                runs = subscriber.skipped
                if runs and runs[-1][1] == entry.entry_id - 1:
                    runs[-1][1] = entry.entry_id
                else:
                    runs.append([entry.entry_id, entry.entry_id])
            if dropped:
                # Its cursor counts them as acknowledged, so acks of later ones move it on.
                subscriber.dispatcher.tell(AckDropped(dropped))
        for name, subscriber in self.subscribers.items():
            if subscriber.waiting is not None:
                waiting, subscriber.waiting = subscriber.waiting, None
                self._serve(name, subscriber, waiting)
        self._trim()

    # Reads.

    def read_entries(self, message: ReadEntries) -> None:
        subscriber = self.subscribers.get(message.subscription)
        if subscriber is None:
            return  # not a subscription of this topic (any more)
        self._serve(message.subscription, subscriber, message)
        self._trim()

    def read_ids(self, message: ReadIds) -> None:
        """No redelivery on a non-persistent topic: what comes back for replay is dropped."""
        subscriber = self.subscribers.get(message.subscription)
        if subscriber is not None:
            low, high = self.ledger.first_entry_id, self.ledger.last_entry_id
            # Counted per entry when the entry is gone already (its message count with it).
            subscriber.dropped += sum(1 for i in message.entry_ids if not low <= i <= high)
            ids = [i for i in message.entry_ids if low <= i <= high]
            if ids:

                def count(result: list[Entry] | BaseException) -> None:
                    if not isinstance(result, BaseException):
                        subscriber.dropped += sum(e.num_messages for e in result)

                self.ledger.read_ids(ids, count)
            if message.entry_ids:
                # Nobody will acknowledge them: settled, so the dispatcher never asks again
                # (told before the empty answer, so the replay set is clear when it comes).
                subscriber.dispatcher.tell(AckDropped(list(message.entry_ids)))
        self._reply(message.reply_to, message.read_id, [], True)

    def cancel(self, subscription: str, read_id: int) -> None:
        subscriber = self.subscribers.get(subscription)
        waiting = None if subscriber is None else subscriber.waiting
        if subscriber is not None and waiting is not None and waiting.read_id == read_id:
            subscriber.waiting = None

    def _serve(self, name: str, subscriber: _Subscriber, message: ReadEntries) -> None:
        start = max(message.start, subscriber.position, self.ledger.first_entry_id)
        runs = subscriber.skipped
        while runs and runs[0][0] <= start:
            _low, high = runs.pop(0)
            if high >= start:
                start = high + 1
        last = self.ledger.last_entry_id
        if start > last:
            subscriber.position = start
            subscriber.waiting = message.resumed_at(start)
            return
        end = min(last, runs[0][0] - 1) if runs else last
        window: list[Entry] = []

        def done(result: list[Entry] | BaseException) -> None:
            if not isinstance(result, BaseException):
                window.extend(result)

        self.ledger.read(start, min(message.max_entries, end - start + 1), message.max_bytes, done)
        if window:
            subscriber.position = window[-1].entry_id + 1
            subscriber.kept_unread = max(
                0, subscriber.kept_unread - sum(e.num_messages for e in window)
            )
        self._reply(message.reply_to, message.read_id, window, False)

    def _trim(self) -> None:
        last = self.ledger.last_entry_id
        for subscriber in self.subscribers.values():
            # Dropped runs right at its position need not be kept for it.
            runs = subscriber.skipped
            while runs and runs[0][0] <= subscriber.position:
                subscriber.position = max(subscriber.position, runs.pop(0)[1] + 1)
        keep_from = min((s.position for s in self.subscribers.values()), default=last + 1)
        # Per entry: a non-persistent topic keeps nothing for retention (issue 14's segment
        # rule is for persistent topics).
        forget = getattr(self.ledger, "forget_entries", self.ledger.trim)
        forget(keep_from - 1)

    # Stats.

    def dropped(self, subscription: str) -> tuple[int, float]:
        """Messages dropped for ``subscription``: (count, per-second rate)."""
        subscriber = self.subscribers.get(subscription)
        if subscriber is None:
            return 0, 0.0
        return subscriber.dropped, subscriber.drop_rate.sample(subscriber.dropped)
