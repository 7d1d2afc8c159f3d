"""Actor messages of the topic operations, grouped by the actor that receives them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AckDropped",
    "AckUpTo",
    "CloseConsumers",
    "CreateSubscription",
    "DeleteSubscription",
    "EndOfTopicReached",
    "ExamineMessage",
    "ExpireMessages",
    "FindTopic",
    "FullStats",
    "GetMessage",
    "GetPermitTotal",
    "InternalStats",
    "LastMessageId",
    "ListSubscriptions",
    "PeekMessage",
    "ProducerClosedByBroker",
    "ResetCursor",
    "SkipEntries",
    "SkipEntriesOf",
    "TerminateTopic",
    "TopicTerminated",
    "UnloadTopic",
]

# Asked of the broker actor.


@dataclass(frozen=True, slots=True)
class FindTopic:
    """The topic's actor, or None when the topic does not exist (never creates it)."""

    name: str


# Asked of the topic actor.


@dataclass(frozen=True, slots=True)
class TerminateTopic:
    """Refuse later messages; answers the last message id ``(ledger, entry)``."""


@dataclass(frozen=True, slots=True)
class UnloadTopic:
    """Close every producer and consumer (they reconnect); state stays stored."""


@dataclass(frozen=True, slots=True)
class CreateSubscription:
    subscription: str
    position: str | tuple[int, int]  # "latest", "earliest" or a message id


@dataclass(frozen=True, slots=True)
class DeleteSubscription:
    subscription: str
    force: bool


@dataclass(frozen=True, slots=True)
class ListSubscriptions:
    pass


@dataclass(frozen=True, slots=True)
class SkipEntries:
    subscription: str
    count: int | None  # None: skip everything


@dataclass(frozen=True, slots=True)
class ResetCursor:
    subscription: str
    publish_time_ms: int | None = None
    message_id: tuple[int, int] | None = None
    excluded: bool = False  # the message id's own entry is skipped too


@dataclass(frozen=True, slots=True)
class ExpireMessages:
    subscription: str | None  # None: every subscription
    seconds: int


@dataclass(frozen=True, slots=True)
class PeekMessage:
    subscription: str
    position: int  # 1 = the first entry after the mark-delete position


@dataclass(frozen=True, slots=True)
class ExamineMessage:
    initial_position: str  # "earliest" or "latest"
    position: int


@dataclass(frozen=True, slots=True)
class GetMessage:
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class InternalStats:
    pass


@dataclass(frozen=True, slots=True)
class FullStats:
    """The topic's stats in Pulsar's TopicStats shape."""


@dataclass(frozen=True, slots=True)
class LastMessageId:
    pass


# Told or asked of a dispatcher actor.


@dataclass(frozen=True, slots=True)
class AckUpTo:
    """Acknowledge every entry up to ``entry_id`` (skip all, expiry)."""

    entry_id: int
    expiry: bool = False  # counted in totalMsgExpired / lastExpireTimestamp


@dataclass(frozen=True, slots=True)
class SkipEntriesOf:
    """Acknowledge the next ``count`` unacknowledged entries up to ``last_entry_id``."""

    count: int
    last_entry_id: int


@dataclass(frozen=True, slots=True)
class CloseConsumers:
    """Broker-initiated CLOSE_CONSUMER to every consumer; answers how many were closed.

    With ``only_if_idle`` nothing is closed when any consumer is connected (answers the count).
    """

    only_if_idle: bool = False
    forget_cursor: bool = False  # the subscription is being deleted: never save it again


@dataclass(frozen=True, slots=True)
class TopicTerminated:
    """The topic was terminated after ``last_entry_id``: tell consumers at the end."""

    last_entry_id: int


@dataclass(frozen=True, slots=True)
class AckDropped:
    """Non-persistent: entries dropped for this subscription count as acknowledged."""

    entry_ids: list[int]


@dataclass(frozen=True, slots=True)
class GetPermitTotal:
    """The dispatcher's permit total (shared, read by the non-persistent rule)."""


# Told to a connection actor.


@dataclass(frozen=True, slots=True)
class ProducerClosedByBroker:
    """The broker closed this producer (CLOSE_PRODUCER; the client reconnects)."""

    producer_id: int
    name: str


@dataclass(frozen=True, slots=True)
class EndOfTopicReached:
    """The consumer read a terminated topic to its end (REACHED_END_OF_TOPIC)."""

    consumer: Any
