"""Consumers: the receive queue, permits, acks, negative acks and redelivery.

A :class:`Consumer` fronts one :class:`PartitionConsumer` per partition (exactly one for a
non-partitioned topic); they all feed one receive queue. The rules follow the official
client:

* **Permits.** After subscribing, FLOW grants ``receiver_queue_size`` messages. Each
  message the application takes with ``receive()`` earns a permit back, and they are
  returned in one FLOW once half the queue's worth has accumulated. A batch counts as
  its number of messages.
* **Batches** are split into messages with a ``batch_index``. The entry is acked only
  once every message of its batch is acked.
* **Acks** are grouped: sent every 100 ms (or when 1000 are waiting, or on close).
* **Negative acks** turn, after the configured delay, into
  REDELIVER_UNACKNOWLEDGED_MESSAGES: with the entries' ids for Shared and Key_Shared,
  without ids ("everything unacked") for Exclusive and Failover.
* **Redeliver all** (and a reconnect) drops this consumer's messages from the local queue
  and returns their permits, as the Java client does, so they are not received twice.
  Without consumer epochs a message already in flight can still arrive twice.
"""

from __future__ import annotations

import logging
import struct
import time
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import gevent.event

from brokerlet.client.connection import ClientContext, Connection
from brokerlet.client.errors import (
    AlreadyClosed,
    CumulativeAcknowledgementNotAllowedError,
    PulsarError,
    Timeout,
)
from brokerlet.client.handler import Handler, OneShotTimer, State
from brokerlet.client.types import (
    ConsumerType,
    InitialPosition,
    MessageId,
    partition_topic,
)
from brokerlet.transport.protocol import (
    ProtocolError,
    decode_payload,
    encode_ack,
    encode_command,
    encode_flow,
    parse_metadata,
    pb,
    split_batch,
)

__all__ = ["Consumer", "ConsumerConfig", "Message", "PartitionConsumer"]

log = logging.getLogger("brokerlet.client")

T = pb.BaseCommand

_U32 = struct.Struct(">I")
_MAX_GROUPED_ACKS = 1000
_ACK_BATCH_SHARED = (ConsumerType.Shared, ConsumerType.KeyShared)


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A consumer's settings; see :meth:`brokerlet.client.Client.subscribe`."""

    subscription_name: str
    consumer_name: str
    consumer_type: ConsumerType = ConsumerType.Exclusive
    receiver_queue_size: int = 1000
    initial_position: InitialPosition = InitialPosition.Latest
    negative_ack_redelivery_delay_ms: int = 60000
    priority_level: int = 0
    ack_group_time_ms: int = 100


def _still_unacked(ack_set: Sequence[int], index: int) -> bool:
    """Whether bit ``index`` of a broker's batch ack set (64-bit words) is set.

    Bits past the end count as clear (acked), as in Java's BitSet.
    """
    word = index >> 6
    return word < len(ack_set) and bool((ack_set[word] >> (index & 63)) & 1)


class Message:
    """A received message.

    Accessors are methods, as in the official client.
    """

    __slots__ = (
        "_batch_index",
        "_data",
        "_entry_id",
        "_ledger_id",
        "_metadata",
        "_owner",
        "_properties",
        "_redelivery_count",
        "_single",
    )

    def __init__(  # noqa: PLR0917 -- one per message: positional calls are cheaper
        self,
        owner: PartitionConsumer,
        data: bytes,
        metadata: pb.MessageMetadata,
        single: pb.SingleMessageMetadata | None,
        ledger_id: int,
        entry_id: int,
        batch_index: int,
        redelivery_count: int,
    ) -> None:
        self._owner = owner
        self._data = data
        self._metadata = metadata
        self._single = single
        self._ledger_id = ledger_id
        self._entry_id = entry_id
        self._batch_index = batch_index
        self._redelivery_count = redelivery_count
        self._properties: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"<Message {self.message_id()} {len(self._data)} bytes>"

    def data(self) -> bytes:
        """The message body."""
        return self._data

    def value(self) -> bytes:
        """The message body (there is no schema to decode it with)."""
        return self._data

    def properties(self) -> dict[str, str]:
        """The application-defined properties (a fresh dict on each call)."""
        if self._properties is None:
            source = self._single if self._single is not None else self._metadata
            self._properties = {kv.key: kv.value for kv in source.properties}
        return dict(self._properties)

    def partition_key(self) -> str:
        """The message key, or ``""`` if it has none."""
        source = self._single if self._single is not None else self._metadata
        return source.partition_key

    def ordering_key(self) -> bytes | None:
        """The ordering key, or None if it has none."""
        source = self._single if self._single is not None else self._metadata
        return source.ordering_key if source.HasField("ordering_key") else None

    def message_id(self) -> MessageId:
        """Where the message is stored (with its batch index and partition)."""
        return MessageId(self._ledger_id, self._entry_id, self._batch_index, self._owner.partition)

    def redelivery_count(self) -> int:
        """How many times the broker delivered this message before."""
        return self._redelivery_count

    def publish_timestamp(self) -> int:
        """When the producer published it, in milliseconds since the epoch."""
        return self._metadata.publish_time

    def event_timestamp(self) -> int:
        """The application's event time in milliseconds, or 0 if none was given."""
        source = self._single if self._single is not None else self._metadata
        return source.event_time

    def producer_name(self) -> str:
        """The name of the producer that published it."""
        return self._metadata.producer_name

    def topic_name(self) -> str:
        """The (partition) topic it came from."""
        return self._owner.topic


class PartitionConsumer(Handler):
    """The consumer of one (partition) topic, on one connection at a time.

    Args:
        parent: the consumer whose receive queue it fills.
        context: the client.
        topic: the (partition) topic.
        partition: the partition index, or -1 for a non-partitioned topic.
        config: the consumer's settings.
    """

    def __init__(
        self,
        parent: Consumer,
        context: ClientContext,
        topic: str,
        partition: int,
        config: ConsumerConfig,
    ) -> None:
        super().__init__(context, topic)
        self.partition = partition
        self._parent = parent
        self._config = config
        self._consumer_id = -1
        self._consumed = 0  # messages taken since the last FLOW
        self._refill_threshold = max(1, config.receiver_queue_size // 2)
        # (ledger, entry) of a batch -> bit mask of its messages not yet acked.
        self._batches: dict[tuple[int, int], int] = {}
        self._acks: list[tuple[int, int]] = []
        self._cumulative: tuple[int, int] | None = None
        self._ack_timer = OneShotTimer(self.flush_acks)
        self._nacks: dict[tuple[int, int], float] = {}  # entry -> when to redeliver
        self._nack_timer = OneShotTimer(self._redeliver_nacked)

    def __repr__(self) -> str:
        return (
            f"<PartitionConsumer {self._config.consumer_name} on {self.topic} / "
            f"{self._config.subscription_name} {self._state.value}>"
        )

    # -- registration --------------------------------------------------------------------

    def _register(self, connection: Connection, *, initial: bool) -> None:
        config = self._config
        consumer_id = connection.new_consumer_id()
        request_id = connection.new_request_id()
        body = pb.CommandSubscribe(
            topic=self.topic,
            subscription=config.subscription_name,
            sub_type=config.consumer_type.value,  # type: ignore[arg-type]
            consumer_id=consumer_id,
            request_id=request_id,
            consumer_name=config.consumer_name,
            durable=True,
            initial_position=config.initial_position.value,  # type: ignore[arg-type]
        )
        if config.priority_level:
            body.priority_level = config.priority_level
        if config.consumer_type is ConsumerType.KeyShared:
            body.key_shared_meta.key_shared_mode = pb.AUTO_SPLIT
        connection.consumers[consumer_id] = self
        try:
            connection.request(T(type=T.SUBSCRIBE, subscribe=body), request_id)
        except BaseException:
            connection.consumers.pop(consumer_id, None)
            raise
        self._consumer_id = consumer_id
        self._connection = connection
        self._consumed = 0
        connection.write(encode_flow(consumer_id, config.receiver_queue_size))

    def _unregister(self, connection: Connection) -> None:
        connection.consumers.pop(self._consumer_id, None)
        self._close_on(connection)

    def _disconnected(self) -> None:
        # The broker hands every unacked message out again; drop the local copies.
        self._parent._drop_messages_of(self)

    def _reconnected(self) -> None:
        self.flush_acks()

    def _failed(self, error: PulsarError) -> None:
        self._parent._wake()

    # -- incoming messages (reader greenlet) ---------------------------------------------

    def on_message(self, message: pb.CommandMessage, payload: bytes) -> None:
        message_id = message.message_id
        ledger_id = message_id.ledger_id
        entry_id = message_id.entry_id
        try:
            section = decode_payload(payload)
        except ProtocolError as error:
            self._discard(ledger_id, entry_id, pb.CommandAck.ChecksumMismatch, error.reason)
            return
        if not section.checksum_ok:
            self._discard(ledger_id, entry_id, pb.CommandAck.ChecksumMismatch, "checksum mismatch")
            return
        entry = section.entry
        try:
            metadata = parse_metadata(entry)
        except ProtocolError as error:
            self._discard(ledger_id, entry_id, pb.CommandAck.BatchDeSerializeError, error.reason)
            return
        body = entry[4 + _U32.unpack_from(entry, 0)[0] :]
        if metadata.compression == pb.ZLIB:
            try:
                body = zlib.decompress(body)
            except zlib.error as error:
                self._discard(ledger_id, entry_id, pb.CommandAck.DecompressionError, str(error))
                return
        elif metadata.compression != pb.NONE or (
            metadata.HasField("num_chunks_from_msg") and metadata.num_chunks_from_msg > 1
        ):
            # LZ4, ZSTD and SNAPPY need packages brokerlet does not depend on, and chunks are
            # not reassembled. The message is fine, so it is left unacked rather than lost:
            # it goes to another consumer once this one closes.
            self._discard(ledger_id, entry_id, None, "compression or chunking not supported")
            return
        redelivery_count = message.redelivery_count
        parent = self._parent
        if metadata.HasField("num_messages_in_batch"):
            count = metadata.num_messages_in_batch
            try:
                singles = split_batch(body, count)
            except ProtocolError as error:
                self._discard(
                    ledger_id, entry_id, pb.CommandAck.BatchDeSerializeError, error.reason
                )
                return
            ack_set = message.ack_set
            delivered = 0
            mask = 0
            for index, (single, data) in enumerate(singles):
                if ack_set and not _still_unacked(ack_set, index):
                    continue  # acked already (batch-index acks on a real Pulsar broker)
                mask |= 1 << index
                parent._queue.append(
                    Message(
                        self, data, metadata, single, ledger_id, entry_id, index, redelivery_count
                    )
                )
                delivered += 1
            if mask:
                # Keep an existing mask: acks made before a redelivery still count.
                self._batches.setdefault((ledger_id, entry_id), mask)
            if delivered < count:
                self._return_permits(count - delivered)
        else:
            parent._queue.append(
                Message(self, body, metadata, None, ledger_id, entry_id, -1, redelivery_count)
            )
        parent._available.set()

    def _discard(
        self, ledger_id: int, entry_id: int, validation_error: int | None, reason: str
    ) -> None:
        """Drop a message the application cannot be given, and earn its permit back.

        A corrupt one is acked with ``validation_error`` as the reason, as the official
        client does; with None the message is left unacked.
        """
        log.error("%r: dropping %d:%d: %s", self, ledger_id, entry_id, reason)
        connection = self._connection
        if validation_error is not None and connection is not None:
            ack = pb.CommandAck(
                consumer_id=self._consumer_id,
                ack_type=pb.CommandAck.Individual,
                validation_error=validation_error,  # type: ignore[arg-type]
            )
            ack.message_id.add(ledger_id=ledger_id, entry_id=entry_id)
            connection.write(encode_command(T(type=T.ACK, ack=ack)))
        self._return_permits(1)

    # -- permits -------------------------------------------------------------------------

    def message_taken(self) -> None:
        """The application took one of this consumer's messages from the queue."""
        self._consumed += 1
        if self._consumed >= self._refill_threshold:
            self._return_permits(0)

    def _return_permits(self, extra: int) -> None:
        self._consumed += extra
        connection = self._connection
        if self._consumed and self._state is State.READY and connection is not None:
            connection.write(encode_flow(self._consumer_id, self._consumed))
            self._consumed = 0

    # -- acks ----------------------------------------------------------------------------

    def acknowledge(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        position = (ledger_id, entry_id)
        if batch_index >= 0:
            remaining = self._batches.get(position)
            if remaining is not None:
                remaining &= ~(1 << batch_index)
                if remaining:
                    self._batches[position] = remaining
                    return
                del self._batches[position]
        self._nacks.pop(position, None)
        self._acks.append(position)
        if len(self._acks) >= _MAX_GROUPED_ACKS:
            self.flush_acks()
        else:
            self._ack_timer.start(self._config.ack_group_time_ms / 1000)

    def acknowledge_cumulative(self, ledger_id: int, entry_id: int, batch_index: int) -> None:
        if self._config.consumer_type in _ACK_BATCH_SHARED:
            raise CumulativeAcknowledgementNotAllowedError(
                f"cumulative acks are not allowed on {self._config.consumer_type.name} "
                "subscriptions"
            )
        position = (ledger_id, entry_id)
        if batch_index >= 0:
            remaining = self._batches.get(position)
            if remaining is not None:
                remaining &= ~((2 << batch_index) - 1)  # this message and those before it
                if remaining:
                    self._batches[position] = remaining
                    if entry_id == 0:
                        return
                    # Part of the batch is still unacked: ack up to the entry before it.
                    position = (ledger_id, entry_id - 1)
        for tracked in [p for p in self._batches if p <= position]:
            del self._batches[tracked]
        if self._cumulative is None or position > self._cumulative:
            self._cumulative = position
        self._ack_timer.start(self._config.ack_group_time_ms / 1000)

    def flush_acks(self) -> None:
        """Send the grouped acks now (kept for later while not connected)."""
        self._ack_timer.cancel()
        connection = self._connection
        if self._state is not State.READY or connection is None:
            return
        consumer_id = self._consumer_id
        if self._acks:
            acks, self._acks = self._acks, []
            if connection.protocol_version >= 12:
                connection.write(encode_ack(consumer_id, acks))
            else:  # older brokers take one id per ACK
                connection.write([encode_ack(consumer_id, [ack]) for ack in acks])
        if self._cumulative is not None:
            connection.write(encode_ack(consumer_id, [self._cumulative], cumulative=True))
            self._cumulative = None

    # -- negative acks and redelivery ----------------------------------------------------

    def negative_acknowledge(self, ledger_id: int, entry_id: int) -> None:
        delay = self._config.negative_ack_redelivery_delay_ms / 1000
        self._nacks[(ledger_id, entry_id)] = time.monotonic() + delay
        self._nack_timer.start(delay)

    def _redeliver_nacked(self) -> None:
        now = time.monotonic()
        due = [position for position, when in self._nacks.items() if when <= now]
        for position in due:
            del self._nacks[position]
        if self._nacks:
            self._nack_timer.start(min(self._nacks.values()) - now)
        connection = self._connection
        if not due or self._state is not State.READY or connection is None:
            return  # after a reconnect the broker redelivers them anyway
        if self._config.consumer_type in _ACK_BATCH_SHARED:
            request = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=self._consumer_id)
            for ledger_id, entry_id in sorted(due):
                request.message_ids.add(ledger_id=ledger_id, entry_id=entry_id)
            connection.write(
                encode_command(
                    T(
                        type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                        redeliver_unacknowledged_messages=request,
                    )
                )
            )
        else:
            self.redeliver_unacknowledged()

    def redeliver_unacknowledged(self) -> None:
        """Ask the broker to redeliver every unacked message of this consumer."""
        connection = self._connection
        if self._state is not State.READY or connection is None:
            return
        dropped = self._parent._drop_messages_of(self)
        request = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=self._consumer_id)
        connection.write(
            encode_command(
                T(
                    type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                    redeliver_unacknowledged_messages=request,
                )
            )
        )
        # The dropped messages come back, so their permits must go back too.
        self._return_permits(dropped)

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush acks and close the consumer on the broker; idempotent."""
        if self._state in (State.CLOSING, State.CLOSED):
            return
        self.flush_acks()
        self._state = State.CLOSING
        self._cancel_timers()
        connection = self._connection
        if connection is not None:
            connection.consumers.pop(self._consumer_id, None)
            self._close_on(connection)
        self._mark_closed()

    def unsubscribe(self) -> None:
        """Delete the subscription on the broker, then close.

        Raises:
            PulsarError: the broker refused (another consumer is still connected, say).
        """
        if self._state in (State.CLOSING, State.CLOSED):
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        connection = self._connection
        if connection is None:
            raise AlreadyClosed(f"consumer on {self.topic} is not connected")
        self.flush_acks()
        request_id = connection.new_request_id()
        connection.request(
            T(
                type=T.UNSUBSCRIBE,
                unsubscribe=pb.CommandUnsubscribe(
                    consumer_id=self._consumer_id, request_id=request_id
                ),
            ),
            request_id,
        )
        self._state = State.CLOSING
        self._cancel_timers()
        connection.consumers.pop(self._consumer_id, None)
        self._mark_closed()

    def _cancel_timers(self) -> None:
        self._ack_timer.cancel()
        self._nack_timer.cancel()

    def _close_on(self, connection: Connection) -> None:
        """Best-effort CLOSE_CONSUMER: a closing consumer has no one to report to."""
        if connection.closed:
            return
        request_id = connection.new_request_id()
        command = T(
            type=T.CLOSE_CONSUMER,
            close_consumer=pb.CommandCloseConsumer(
                consumer_id=self._consumer_id, request_id=request_id
            ),
        )
        try:
            connection.request(command, request_id)
        except PulsarError as error:
            log.debug("%r: CLOSE_CONSUMER failed: %s", self, error)


class Consumer:
    """Receives messages of one subscription (one partition consumer per partition).

    Create it with :meth:`brokerlet.client.Client.subscribe`.
    """

    def __init__(
        self, context: ClientContext, topic: str, partitions: int, config: ConsumerConfig
    ) -> None:
        self._context = context
        self._topic = topic
        self._config = config
        self._queue: deque[Message] = deque()
        self._available = gevent.event.Event()
        self._closed = False
        if partitions > 0:
            self._consumers = [
                PartitionConsumer(self, context, partition_topic(topic, index), index, config)
                for index in range(partitions)
            ]
        else:
            self._consumers = [PartitionConsumer(self, context, topic, -1, config)]

    def __repr__(self) -> str:
        return f"<Consumer {self.consumer_name} on {self._topic} / {self.subscription_name}>"

    def _start(self) -> None:
        started: list[PartitionConsumer] = []
        try:
            for consumer in self._consumers:
                consumer.start()
                started.append(consumer)
        except BaseException:
            for consumer in started:
                consumer.close()
            raise

    @property
    def topic(self) -> str:
        """The fully qualified topic name."""
        return self._topic

    @property
    def subscription_name(self) -> str:
        return self._config.subscription_name

    @property
    def consumer_name(self) -> str:
        return self._config.consumer_name

    def is_connected(self) -> bool:
        """Whether every partition consumer is registered with a broker right now."""
        return all(c.state is State.READY for c in self._consumers)

    # -- receiving -----------------------------------------------------------------------

    def receive(self, timeout_millis: int | None = None) -> Message:
        """Take the next message, waiting for one if the queue is empty.

        Args:
            timeout_millis: how long to wait; None waits until a message arrives.

        Returns:
            The message.

        Raises:
            Timeout: nothing arrived within ``timeout_millis``.
            AlreadyClosed: the consumer is closed.
        """
        queue = self._queue
        if not queue:
            self._wait_for_message(timeout_millis)
        message = queue.popleft()
        message._owner.message_taken()
        return message

    def _wait_for_message(self, timeout_millis: int | None) -> None:
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        available = self._available
        while not self._queue:
            if self._closed:
                raise AlreadyClosed(f"consumer on {self._topic} is closed")
            for consumer in self._consumers:
                if consumer._failure is not None:
                    raise consumer._failure
            remaining = None
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout(f"no message within {timeout_millis} ms")
            available.clear()
            available.wait(remaining)

    def _drop_messages_of(self, owner: PartitionConsumer) -> int:
        """Remove ``owner``'s messages from the queue; return how many there were."""
        queue = self._queue
        before = len(queue)
        if len(self._consumers) == 1:
            queue.clear()
        else:
            # In place: receive() may hold a reference to the queue.
            kept = [m for m in queue if m._owner is not owner]
            queue.clear()
            queue.extend(kept)
        return before - len(queue)

    def _wake(self) -> None:
        self._available.set()

    # -- acknowledging -------------------------------------------------------------------

    def _target(self, message: Message | MessageId) -> tuple[PartitionConsumer, MessageId]:
        if isinstance(message, Message):
            return message._owner, message.message_id()
        consumers = self._consumers
        index = message.partition if message.partition >= 0 and len(consumers) > 1 else 0
        if index >= len(consumers):
            raise ValueError(f"{message} is not from a partition of {self._topic}")
        return consumers[index], message

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (sent grouped, within 100 ms)."""
        owner, message_id = self._target(message)
        owner.acknowledge(message_id.ledger_id, message_id.entry_id, message_id.batch_index)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge this message and every one before it (Exclusive and Failover only).

        Raises:
            CumulativeAcknowledgementNotAllowedError: on a Shared or Key_Shared subscription.
        """
        owner, message_id = self._target(message)
        owner.acknowledge_cumulative(
            message_id.ledger_id, message_id.entry_id, message_id.batch_index
        )

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Have the message redelivered after ``negative_ack_redelivery_delay_ms``."""
        owner, message_id = self._target(message)
        owner.negative_acknowledge(message_id.ledger_id, message_id.entry_id)

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every message received and not yet acknowledged."""
        for consumer in self._consumers:
            consumer.redeliver_unacknowledged()

    # -- flow control and closing --------------------------------------------------------

    def pause_reading(self) -> None:
        """Stop reading this consumer's connection(s); see ``Client.pause_reading``.

        The connection is shared with every producer and consumer on the same broker, so
        they all stop receiving.
        """
        for consumer in self._consumers:
            if consumer.connection is not None:
                consumer.connection.pause_reading()

    def resume_reading(self) -> None:
        """Read this consumer's connection(s) again."""
        for consumer in self._consumers:
            if consumer.connection is not None:
                consumer.connection.resume_reading()

    def unsubscribe(self) -> None:
        """Delete the subscription and close the consumer.

        Raises:
            PulsarError: the broker refused.
        """
        for consumer in self._consumers:
            consumer.unsubscribe()
        self._finish_close()

    def close(self) -> None:
        """Flush pending acks and close; unacked messages go to other consumers. Idempotent."""
        for consumer in self._consumers:
            consumer.close()
        self._finish_close()

    def _finish_close(self) -> None:
        self._closed = True
        self._queue.clear()
        self._available.set()
        self._context.forget(self)
