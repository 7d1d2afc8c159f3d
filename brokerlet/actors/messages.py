"""Every actor message, grouped by the actor that receives it.

Messages are frozen dataclasses (or bare marker classes where they carry nothing); a ref in a
message is typed with the actor it reaches. The few built for every message or dispatch pass
(appends, reads, receipts, acks, consumer batches) are plain slotted dataclasses instead, and
no one changes them after sending: building a frozen one sets each field through
``object.__setattr__``, 2.1 µs for six fields against 0.5 µs, and a published message builds
about ten of them below saturation. An actor that receives a message it does not
handle raises :class:`UnexpectedMessage`: a bug of ours, never a silent drop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

from brokerlet.storage.cursor import CursorState
from brokerlet.transport.protocol import Frame, pb

if TYPE_CHECKING:
    import pykka

    from brokerlet.actors.connection import ConnectionActor
    from brokerlet.actors.dispatcher import DispatcherActor
    from brokerlet.actors.topic import TopicActor
    from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
    from brokerlet.storage.ledger import Entry, NewEntry

__all__ = [
    "Ack",
    "AckDropped",
    "AckUpTo",
    "AddConsumer",
    "AddProducer",
    "Append",
    "AppendDone",
    "AppendItem",
    "Appended",
    "AppendedAll",
    "BacklogQuotaReport",
    "BatchWritten",
    "CancelRead",
    "CloseClients",
    "CloseConsumers",
    "CloseIfIdle",
    "Compact",
    "CompactionDone",
    "CompactionStatus",
    "ConnectionLost",
    "ConsumerClosedByBroker",
    "CreateSubscription",
    "CreateTopic",
    "CursorState",
    "DeleteSubscription",
    "DeleteTopic",
    "DispatcherFailed",
    "EndOfTopicReached",
    "EntriesRead",
    "ExamineMessage",
    "ExpireEntries",
    "ExpireMessages",
    "ExpireUpTo",
    "FindTopic",
    "GetCursorState",
    "GetLastEntry",
    "GetMarkDelete",
    "GetMessage",
    "GetPermitTotal",
    "GetStats",
    "GetTopic",
    "Handlers",
    "InternalStats",
    "IsIdle",
    "LastMessageId",
    "ListSubscriptions",
    "ListTopics",
    "MarkDeleteMoved",
    "MaybeCompact",
    "OpenTopic",
    "PartitionedMetadata",
    "PeekMessage",
    "PersistCursor",
    "ReadEntries",
    "ReadIds",
    "ReadMore",
    "Receipt",
    "Received",
    "Redeliver",
    "RemoveConsumer",
    "RemoveProducer",
    "ReplayReady",
    "ResetCursor",
    "ResolvePosition",
    "Seek",
    "SendMessageBatches",
    "SendMessages",
    "SkipEntries",
    "SkipEntriesOf",
    "Subscribe",
    "SubscriptionClosed",
    "TerminateTopic",
    "TopicClosedByBroker",
    "TopicFailed",
    "TopicStats",
    "TopicStatsPart",
    "TopicTerminated",
    "TopicsOfNamespace",
    "UnexpectedMessage",
    "UnloadTopic",
    "UpdatePartitions",
    "WritabilityChanged",
    "WriteAfterMessages",
    "WriteCompletion",
    "on_ops",
]


Handlers: TypeAlias = dict[type, Callable[[Any, Any], Any]]
"""An actor class's handlers: message type -> ``handler(actor, message)``.

One table per class rather than bound methods per actor: a topic and its subscription built
about 85 objects for their tables (bound methods, closures, their cells), 44% of what an open
topic keeps for the garbage collector to walk, and the work showed in every topic creation.
An actor whose handlers vary (a terminated topic, a non-persistent one) runs a copy.
"""


def on_ops(operation: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A table entry for an operation of the actor's ``ops`` part (brokerlet.topicops): it
    runs ``operation(actor.ops, message)``."""

    def handle(actor: Any, message: Any) -> Any:
        return operation(actor.ops, message)

    return handle


class UnexpectedMessage(Exception):  # noqa: N818 - named for what the receiver got
    """An actor received a message it has no handler for."""

    def __init__(self, actor: object, message: object) -> None:
        super().__init__(f"{type(actor).__name__} has no handler for {message!r}")
        self.actor = actor
        self.message = message


# BrokerActor: the topic registry.


@dataclass(frozen=True, slots=True)
class GetTopic:
    """Asked: the topic's actor, created on first use.

    ``recovering``: a topic found in storage at start-up, admitted without the metadata's
    existence rules (and recorded in the metadata if it was missing there).
    """

    name: str
    recovering: bool = False
    create: bool = True  # False: TopicNotFound unless it exists (force_topic_creation=false)


@dataclass(frozen=True, slots=True)
class PartitionedMetadata:
    """Asked: the topic's partition count (0: non-partitioned); a partitioned topic may be
    auto-created. Raises BrokerError when refused."""

    name: str


@dataclass(frozen=True, slots=True)
class TopicsOfNamespace:
    """Asked: the namespace's full topic names (partitions expanded)."""

    namespace: str
    mode: int


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """Asked by the admin API: record a topic (``partitions`` 0: non-partitioned)."""

    name: str
    partitions: int
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UpdatePartitions:
    """Asked by the admin API: grow a partitioned topic to ``partitions``."""

    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """Asked by the admin API: delete a topic (or, ``partitioned``, every partition and the
    partitioned topic's metadata). Without ``force`` a topic with producers or consumers is
    refused (``TopicBusy``); with it they are closed first."""

    name: str
    force: bool = False
    partitioned: bool = False


@dataclass(frozen=True, slots=True)
class FindTopic:
    """Asked: the topic's actor, or None for a topic the broker does not have (never creates)."""

    name: str


@dataclass(frozen=True, slots=True)
class ListTopics:
    """Asked: every topic's actor, by topic name."""


@dataclass(frozen=True, slots=True)
class CloseIfIdle:
    """Asked: close (never delete) ``topic`` if it is still the open ``name`` and still idle
    (no producer, subscription or waiting read); answers whether it closed."""

    name: str
    topic: pykka.ActorRef[TopicActor]


@dataclass(frozen=True, slots=True)
class TopicFailed:
    """This topic actor failed: drop it, and reopen it with these cursors on next use."""

    name: str
    topic: pykka.ActorRef[TopicActor]  # the dead ref
    cursors: dict[str, CursorState]


@dataclass(frozen=True, slots=True)
class OpenTopic:
    """Asked (topic operations): the topic's actor, opening a topic the metadata store or the
    disk knows but no actor serves yet; None for a topic that does not exist (never creates)."""

    name: str


# TopicActor: appends, producers, subscriptions and reads.


AppendItem: TypeAlias = (
    "tuple[int, int, NewEntry | None, tuple[pb.ServerError.ValueType, str] | None]"
)
"""One SEND of an `Append`: a plain tuple ``(sequence_id, highest_sequence_id, entry, refusal)``
(not a NamedTuple: one per message, as `NewEntry`). ``entry`` is None when the SEND was
refused before storage: ``refusal`` says why, or is None for a checksum mismatch."""


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class Append:
    """One run of SENDs of one producer; answered with :class:`AppendedAll` or
    :class:`Appended`."""

    reply_to: pykka.ActorRef[ConnectionActor]
    producer_id: int
    items: list[AppendItem]


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class AppendDone:
    """A disk ledger's completion, brought back onto the topic actor."""

    handle: Callable[[Any], None]
    result: Any


@dataclass(frozen=True, slots=True)
class AddProducer:
    """Asked: admit a producer (brokerlet.producers.access); answered with a
    ProducerAdmitted (brokerlet.producers.messages) or a BrokerError."""

    name: str
    peer: str
    connection: pykka.ActorRef[ConnectionActor] | None = None  # told if the topic fails
    producer_id: int = -1
    access_mode: int = 0  # pb.ProducerAccessMode
    topic_epoch: int | None = None  # the epoch the producer presents, if any
    # The namespace's policy as the connection read it (None: the broker's setting). The
    # topic applies it as each producer arrives, where Pulsar re-checks it too.
    deduplication: bool | None = None


@dataclass(frozen=True, slots=True)
class CloseClients:
    """Asked before a topic is deleted: how many producers and consumers are connected;
    with ``close``, each is closed the broker's way first (CLOSE_PRODUCER / CLOSE_CONSUMER)."""

    close: bool


@dataclass(frozen=True, slots=True)
class RemoveProducer:
    name: str
    connection: pykka.ActorRef[ConnectionActor] | None = None
    producer_id: int = -1


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Asked: the subscription's dispatcher, created on first use."""

    subscription: str
    sub_type: int
    durable: bool
    initial_position: int  # pb.CommandSubscribe.Latest / Earliest
    start_message_id: tuple[int, int] | None = None
    read_compacted: bool = False  # read the compacted view up to its horizon first


@dataclass(frozen=True, slots=True)
class GetLastEntry:
    """Asked: (ledger id, last entry id); a read_compacted ``subscription`` gets the
    compacted view's last entry while the topic's last is within the horizon."""

    subscription: str | None = None


@dataclass(frozen=True, slots=True)
class FindByPublishTime:
    """Told: find the first entry published at or after ``publish_time`` (epoch ms); the topic
    calls ``reply`` with ``(ledger id, entry id)`` (the end if none is) or the read's error."""

    publish_time: int
    reply: Callable[[tuple[int, int] | BaseException], None]


@dataclass(frozen=True, slots=True)
class ResolvePosition:
    """Asked: the entry id a subscription should restart at for ``message_id``."""

    message_id: tuple[int, int]


@dataclass(frozen=True, slots=True)
class TopicStats:
    """Asked: the topic's own part of its stats, answered at once (:class:`TopicStatsPart`);
    the caller asks the subscriptions' dispatchers itself (``brokerlet.actors.stats_reader``)."""


@dataclass(frozen=True, slots=True)
class TopicStatsPart:
    """A topic's answer to :class:`TopicStats`."""

    own: dict[str, Any]  # Pulsar's topic stats fields the topic actor keeps itself
    last_entry_id: int
    subscriptions: dict[str, tuple[pykka.ActorRef[DispatcherActor], int]]  # with mark-delete
    extra: dict[str, Any] = field(default_factory=dict)  # topic operations: terminated, drops


class IsIdle:
    """Asked: whether the topic has no producer, subscription or waiting read."""


# Data rules (issue 14): told or asked of the topic.


@dataclass(frozen=True, slots=True)
class ExpireEntries:
    """Acknowledge every entry up to ``entry_id`` on every subscription (message TTL, or the
    admin expireMessages operation; storage/expiry.py finds the entry). ``expiry`` False: a
    backlog-quota eviction, not counted as expired."""

    entry_id: int
    expiry: bool = True


@dataclass(frozen=True, slots=True)
class BacklogQuotaReport:
    """The backlog-quota check's finding (storage/backlog_quota.py); ``evict_to`` >= 0 moves
    the subscriptions behind it there (consumer_backlog_eviction)."""

    state: Any  # storage.backlog_quota.QuotaState
    evict_to: int = -1


class Compact:
    """Asked (admin PUT .../compaction): start a compaction; BrokerError when one runs."""


class CompactionStatus:
    """Asked: Pulsar's LongRunningProcessStatus of the last compaction."""


@dataclass(frozen=True, slots=True)
class CompactionDone:
    result: Any  # compaction.CompactionResult, or the error that failed it


@dataclass(frozen=True, slots=True)
class MaybeCompact:
    """The compaction monitor: compact if the bytes after the horizon exceed ``threshold``."""

    threshold: int


@dataclass(frozen=True, slots=True)
class DispatcherFailed:
    """This dispatcher failed: restart its subscription from ``cursor`` on next use."""

    subscription: str
    dispatcher: pykka.ActorRef[DispatcherActor]  # the dead ref
    cursor: CursorState | None  # None for a non-durable subscription: nothing to resume


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class ReadEntries:
    """Read up to ``max_entries`` from ``start``; at the end of the ledger, wait (long poll).

    ``standing``: a read that waited and then reached the end of the ledger may stay armed
    from the entry after its last one (the answer says whether it did, see
    :class:`EntriesRead`), so a caught-up dispatcher need not ask again for each append.
    """

    subscription: str
    read_id: int
    start: int
    max_entries: int
    max_bytes: int
    reply_to: pykka.ActorRef[DispatcherActor]
    standing: bool = False

    def resumed_at(self, start: int) -> ReadEntries:
        """The same read from ``start`` (``dataclasses.replace`` costs several times more,
        and a standing read is re-armed at every push)."""
        return ReadEntries(
            self.subscription,
            self.read_id,
            start,
            self.max_entries,
            self.max_bytes,
            self.reply_to,
            self.standing,
        )


@dataclass(frozen=True, slots=True)
class ReadIds:
    """Read these entries (a replay read)."""

    subscription: str
    read_id: int
    entry_ids: list[int]
    reply_to: pykka.ActorRef[DispatcherActor]


@dataclass(frozen=True, slots=True)
class CancelRead:
    """Drop the subscription's waiting long-poll read ``read_id``."""

    subscription: str
    read_id: int


@dataclass(frozen=True, slots=True)
class MarkDeleteMoved:
    subscription: str
    mark_delete: int


@dataclass(frozen=True, slots=True)
class SubscriptionClosed:
    subscription: str
    dispatcher: pykka.ActorRef[DispatcherActor]
    deleted: bool = False  # unsubscribed (or non-durable): forget its stored cursor too


# TopicActor, topic operations (brokerlet.topicops.topic_side handles them).


@dataclass(frozen=True, slots=True)
class TerminateTopic:
    """Asked: refuse later messages; answers the last message id ``(ledger, entry)``."""


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
    """Asked: the managed-ledger part of internalStats and the dispatchers' refs (the caller
    asks those itself, see ``brokerlet.topicops.api``)."""


@dataclass(frozen=True, slots=True)
class LastMessageId:
    pass


# ConnectionActor: what the reader greenlet decoded, receipts, broker-initiated closes.


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class Received:
    """One received chunk of frames, from the connection's reader greenlet."""

    frames: list[Frame]


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    reason: str


class Receipt(NamedTuple):  # a tuple: one per message, built cheaply
    sequence_id: int
    highest_sequence_id: int
    ledger_id: int
    entry_id: int  # -1 when refused; see ``error``
    error: pb.ServerError.ValueType | None = None
    message: str = ""


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class AppendedAll:
    """Every item of one :class:`Append` stored, in order, at entry ids from
    ``first_entry_id`` in ledger ``ledger_id``: the usual answer, without a receipt object
    per message (the connection encodes the receipts from its own items)."""

    producer_id: int
    items: list[AppendItem]
    ledger_id: int
    first_entry_id: int


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class Appended:
    """The receipts of one :class:`Append`, one per item: when some were refused, answered
    without storing (repeated sequence ids), or the append failed."""

    producer_id: int
    receipts: list[Receipt]


@dataclass(frozen=True, slots=True)
class ConsumerClosedByBroker:
    """The broker closed this consumer (the client reconnects)."""

    consumer: Consumer


@dataclass(frozen=True, slots=True)
class TopicClosedByBroker:
    """The topic failed, was unloaded or terminated: close your producers on it (the clients
    reconnect)."""

    topic: pykka.ActorRef[TopicActor]


@dataclass(frozen=True, slots=True)
class EndOfTopicReached:
    """The consumer read a terminated topic to its end (REACHED_END_OF_TOPIC)."""

    consumer: Consumer


# DispatcherActor: one subscription's delivery.


class ReadMore:
    """The conflated read request (one instance per dispatcher, see ``ConflatedTell``)."""


@dataclass(frozen=True, slots=True)
class AddConsumer:
    """Asked: join the subscription (BrokerError if the consumer may not)."""

    consumer: Consumer


@dataclass(frozen=True, slots=True)
class RemoveConsumer:
    consumer: Consumer
    unsubscribe: bool = False


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class EntriesRead:
    """The answer to :class:`ReadEntries` (``replay=False``) or :class:`ReadIds`.

    ``standing``: the read stays armed at the topic, from the entry after the last of
    ``entries``, until it is cancelled or replaced.
    """

    read_id: int
    entries: list[Entry] | BaseException
    replay: bool
    standing: bool = False


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class Ack:
    consumer: Consumer
    positions: Sequence[tuple[int, int]]  # (ledger id, entry id)
    cumulative: bool
    # Batch-index acks: (ledger id, entry id) -> ack-set words (set bit: not acked yet).
    ack_sets: Mapping[tuple[int, int], Sequence[int]] | None = None


@dataclass(frozen=True, slots=True)
class ExpireUpTo:
    """Message TTL, eviction or expireMessages (storage/expiry.py): acknowledge every entry
    up to ``entry_id``, counting those not acknowledged yet as expired (unless ``expiry`` is
    False: a backlog-quota eviction). Answers how many entries it acknowledged."""

    entry_id: int
    expiry: bool = True


@dataclass(frozen=True, slots=True)
class Redeliver:
    consumer: Consumer
    positions: Sequence[tuple[int, int]] | None  # None: every entry pending on the consumer
    epoch: int | None = None  # consumer_epoch of the request (Exclusive/Failover clients)


@dataclass(frozen=True, slots=True)
class Seek:
    """Asked: reset the subscription so ``entry_id`` is the next entry delivered.

    Answers the requester's own consumers, which it closes itself before it answers the seek.
    """

    entry_id: int
    requester: ConnectionHandle


@dataclass(frozen=True, slots=True)
class GetStats:
    """Asked: the subscription's part of the topic stats."""


class GetMarkDelete:
    """Asked: the subscription's mark-delete entry id."""


class GetCursorState:
    """Asked: the subscription's :data:`CursorState`."""


@dataclass(frozen=True, slots=True)
class CloseConsumers:
    """Asked: how many consumers are attached; with ``close``, also close each of them the
    broker's way (CLOSE_CONSUMER; the client reconnects, its unacked entries come again).

    Used before a topic is deleted, by unload and by subscription deletes. With
    ``only_if_idle`` nothing is closed while a consumer is attached; ``forget_cursor``: the
    subscription is being deleted, its cursor is never saved again.
    """

    close: bool = True
    only_if_idle: bool = False
    forget_cursor: bool = False


class BatchWritten:
    """A consumer batch's write completed (sent only with the completion barrier on)."""


class PersistCursor:
    """Time to write the subscription's acknowledgements to its cursor store."""


class ReplayReady:
    """A strategy's delayed wake-up has come: replayed entries may go out now (Key_Shared:
    draining hashes were released and the unblocking interval has passed)."""


# DispatcherActor, topic operations (brokerlet.topicops.subscription_side handles them).


@dataclass(frozen=True, slots=True)
class AckUpTo:
    """Acknowledge every entry up to ``entry_id`` (skip all, expiry)."""

    entry_id: int
    expiry: bool = False  # counted in totalMsgExpired / lastExpireTimestamp


@dataclass(frozen=True, slots=True)
class SkipEntriesOf:
    """Asked: acknowledge the next ``count`` unacknowledged entries up to ``last_entry_id``."""

    count: int
    last_entry_id: int


@dataclass(frozen=True, slots=True)
class TopicTerminated:
    """The topic was terminated after ``last_entry_id``: tell consumers at the end."""

    last_entry_id: int


@dataclass(frozen=True, slots=True)
class AckDropped:
    """Non-persistent: entries dropped for this subscription (or vanished from the ledger
    before a replay read) count as acknowledged."""

    entry_ids: list[int]


@dataclass(frozen=True, slots=True)
class GetPermitTotal:
    """Asked: the dispatcher's permit total (shared, read by the non-persistent rule)."""


# EventLoopActor: a connection's I/O tasks.


class WriteCompletion(Protocol):
    """What a consumer batch's written bytes wake: ``request()`` is called by the writer
    greenlet, so it must be safe from any greenlet or thread (a ``ConflatedTell`` is)."""

    def request(self) -> object: ...


@dataclass(slots=True)  # built for every message or pass: see the module docstring
class SendMessages:
    """One consumer batch to encode and write; ``completion`` is requested once it is written."""

    consumer: Consumer
    entries: list[Entry]
    redelivery_counts: list[int]
    completion: WriteCompletion
    ack_sets: dict[int, list[int]] | None = None  # entry id -> members not acked yet
    epoch: int | None = None  # the consumer's epoch when the batch was handed out


@dataclass(slots=True)  # built for every dispatch pass with more than one batch
class SendMessageBatches:
    """A dispatch pass's consumer batches for one connection, in the order they were made:
    the event loop writes them as one write (one completion for them)."""

    batches: list[SendMessages]


@dataclass(frozen=True, slots=True)
class WriteAfterMessages:
    """Frames of the connection actor that must follow every MESSAGE frame queued before them
    on this connection (a broker-initiated CLOSE_CONSUMER, and a SEEK's answer after it)."""

    connection: ConnectionHandle
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class WritabilityChanged:
    """The connection's channel dropped below its low watermark (conflated per connection)."""

    connection: ConnectionHandle
