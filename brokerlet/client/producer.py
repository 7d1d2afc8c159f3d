"""Producers: sequence ids, pending sends matched to receipts, batching, send timeouts.

A :class:`Producer` fronts one :class:`PartitionProducer` per partition (exactly one for a
non-partitioned topic) and routes each message to one of them. A partition producer keeps
its sends in a queue in sequence-id order; the broker's receipts arrive in the same order,
so each receipt completes the head of the queue. After a reconnect the whole queue is sent
again, under the same sequence ids.

Callbacks run on the connection's reader greenlet (or a timer's greenlet for send timeouts)
and must not block: a callback that waited for another receipt would wait for itself.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import gevent.event

from brokerlet.client.connection import ClientContext, Connection
from brokerlet.client.errors import (
    AlreadyClosed,
    ChecksumError,
    ConnectError,
    MessageTooBig,
    ProducerQueueIsFull,
    PulsarError,
    Timeout,
    error_for_code,
)
from brokerlet.client.handler import Handler, OneShotTimer, State
from brokerlet.client.types import MessageId, java_string_hash, partition_topic
from brokerlet.transport.protocol import (
    build_entry,
    encode_batch,
    encode_send,
    pb,
)

__all__ = ["PartitionProducer", "Producer", "ProducerConfig", "SendCallback"]

log = logging.getLogger("brokerlet.client")

T = pb.BaseCommand

SendCallback = Callable[[PulsarError | None, MessageId | None], None]
"""Called once per message: ``(None, message_id)`` on success, ``(error, None)`` on failure."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """A producer's settings; see :meth:`brokerlet.client.Client.create_producer`."""

    producer_name: str | None = None
    batching_enabled: bool = False
    batching_max_messages: int = 1000
    batching_max_publish_delay_ms: int = 10
    batching_max_allowed_size_in_bytes: int = 131072
    max_pending_messages: int = 1000
    block_if_queue_full: bool = False
    send_timeout_millis: int = 30000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _notify(
    callback: SendCallback, error: PulsarError | None, message_id: MessageId | None
) -> None:
    try:
        callback(error, message_id)
    except Exception:
        log.exception("send callback %r raised", callback)


class _PendingSend:
    """One SEND awaiting its receipt: one message, or one batch of them."""

    __slots__ = (
        "batched",
        "callbacks",
        "deadline",
        "entry",
        "highest_sequence_id",
        "num_messages",
        "sequence_id",
        "waiters",
    )

    def __init__(  # noqa: PLR0917 -- one per send: positional calls are cheaper
        self,
        sequence_id: int,
        highest_sequence_id: int,
        entry: bytes,
        callbacks: list[SendCallback],
        deadline: float,
        batched: bool,
    ) -> None:
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest_sequence_id
        self.num_messages = len(callbacks)
        self.entry = entry
        self.callbacks = callbacks
        self.deadline = deadline
        self.batched = batched
        self.waiters: list[gevent.event.AsyncResult] | None = None


class _Batch:
    """Messages collected for one batched SEND."""

    __slots__ = ("callbacks", "deadline", "first_sequence_id", "messages", "size")

    def __init__(self) -> None:
        self.messages: list[tuple[pb.SingleMessageMetadata, bytes]] = []
        self.callbacks: list[SendCallback] = []
        self.size = 0
        self.first_sequence_id = 0
        self.deadline = 0.0


class PartitionProducer(Handler):
    """The producer of one (partition) topic, on one connection at a time.

    Args:
        context: the client.
        topic: the (partition) topic.
        partition: the partition index, or -1 for a non-partitioned topic.
        config: the producer's settings.
    """

    def __init__(
        self, context: ClientContext, topic: str, partition: int, config: ProducerConfig
    ) -> None:
        super().__init__(context, topic)
        self.partition = partition
        self.producer_name = config.producer_name or ""
        self._config = config
        self._user_named = config.producer_name is not None
        self._producer_id = -1
        self._epoch = 0
        self._next_sequence_id = 0
        self._pending: deque[_PendingSend] = deque()
        self._queued = 0  # messages in the batch or awaiting receipts
        self._room = gevent.event.Event()  # set whenever a message completes
        self._batch = _Batch()
        self._batch_timer = OneShotTimer(self.flush_batch)
        self._timeout_timer = OneShotTimer(self._expire_sends)
        self._send_timeout = config.send_timeout_millis / 1000

    def __repr__(self) -> str:
        name = self.producer_name or "?"
        return f"<PartitionProducer {name} on {self.topic} {self._state.value}>"

    # -- registration --------------------------------------------------------------------

    def _register(self, connection: Connection, *, initial: bool) -> None:
        producer_id = connection.new_producer_id()
        request_id = connection.new_request_id()
        if not initial:
            self._epoch += 1
        body = pb.CommandProducer(
            topic=self.topic,
            producer_id=producer_id,
            request_id=request_id,
            epoch=self._epoch,
            user_provided_producer_name=self._user_named,
        )
        if self.producer_name:
            body.producer_name = self.producer_name
        connection.producers[producer_id] = self
        try:
            response = connection.request(T(type=T.PRODUCER, producer=body), request_id)
        except BaseException:
            connection.producers.pop(producer_id, None)
            raise
        success = response.producer_success
        self.producer_name = success.producer_name
        if initial and success.last_sequence_id >= 0:
            self._next_sequence_id = success.last_sequence_id + 1
        self._producer_id = producer_id
        self._connection = connection

    def _unregister(self, connection: Connection) -> None:
        connection.producers.pop(self._producer_id, None)
        self._close_on(connection)

    def _reconnected(self) -> None:
        # The broker may have stored some of these already; it answers each with a receipt.
        connection = self._connection
        if connection is not None:
            for pending in self._pending:
                connection.write(self._encode(pending))

    def _failed(self, error: PulsarError) -> None:
        self._fail_all(error)

    # -- sending -------------------------------------------------------------------------

    def send_async(
        self,
        content: bytes,
        callback: SendCallback,
        *,
        partition_key: str | None,
        ordering_key: bytes | None,
        properties: dict[str, str] | None,
        event_timestamp: int | None,
    ) -> None:
        """Queue one message; ``callback`` reports its outcome (see :data:`SendCallback`)."""
        error = self._admit(len(content))
        if error is not None:
            _notify(callback, error, None)
            return
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        deadline = time.monotonic() + self._send_timeout
        if self._config.batching_enabled:
            self._add_to_batch(
                sequence_id,
                deadline,
                content,
                callback,
                partition_key=partition_key,
                ordering_key=ordering_key,
                properties=properties,
                event_timestamp=event_timestamp,
            )
            return
        metadata = pb.MessageMetadata(
            producer_name=self.producer_name, sequence_id=sequence_id, publish_time=_now_ms()
        )
        _set_message_fields(metadata, properties, partition_key, ordering_key, event_timestamp)
        entry = build_entry(metadata, content)
        self._enqueue(_PendingSend(sequence_id, sequence_id, entry, [callback], deadline, False))

    def _admit(self, size: int) -> PulsarError | None:
        """Take a place in the pending queue; return why not if there is none."""
        if self._state in (State.CLOSING, State.CLOSED):
            return self._failure or AlreadyClosed(f"producer on {self.topic} is closed")
        connection = self._connection
        if connection is not None and size > connection.max_message_size:
            return MessageTooBig(
                f"{size} bytes is over the broker's limit of {connection.max_message_size}"
            )
        limit = self._config.max_pending_messages
        while 0 < limit <= self._queued:
            if not self._config.block_if_queue_full:
                return ProducerQueueIsFull(f"{self._queued} messages already pending")
            self._room.clear()
            self._room.wait()
            if self.state in (State.CLOSING, State.CLOSED):
                return self._failure or AlreadyClosed(f"producer on {self.topic} is closed")
        self._queued += 1
        return None

    def _add_to_batch(
        self,
        sequence_id: int,
        deadline: float,
        content: bytes,
        callback: SendCallback,
        *,
        partition_key: str | None,
        ordering_key: bytes | None,
        properties: dict[str, str] | None,
        event_timestamp: int | None,
    ) -> None:
        config = self._config
        batch = self._batch
        if batch.messages and batch.size + len(content) > config.batching_max_allowed_size_in_bytes:
            self.flush_batch()
            batch = self._batch
        single = pb.SingleMessageMetadata(payload_size=len(content), sequence_id=sequence_id)
        _set_message_fields(single, properties, partition_key, ordering_key, event_timestamp)
        if not batch.messages:
            batch.first_sequence_id = sequence_id
            batch.deadline = deadline
            self._batch_timer.start(config.batching_max_publish_delay_ms / 1000)
        batch.messages.append((single, content))
        batch.callbacks.append(callback)
        batch.size += len(content)
        if (
            len(batch.messages) >= config.batching_max_messages
            or batch.size >= config.batching_max_allowed_size_in_bytes
        ):
            self.flush_batch()

    def flush_batch(self) -> None:
        """Send the messages collected for the current batch, if any, as one SEND."""
        self._batch_timer.cancel()
        batch = self._batch
        if not batch.messages:
            return
        self._batch = _Batch()
        first = batch.messages[0][0]
        metadata = pb.MessageMetadata(
            producer_name=self.producer_name,
            sequence_id=batch.first_sequence_id,
            publish_time=_now_ms(),
            num_messages_in_batch=len(batch.messages),
        )
        # Like the official client: the batch carries its first message's keys.
        if first.HasField("partition_key"):
            metadata.partition_key = first.partition_key
        if first.HasField("ordering_key"):
            metadata.ordering_key = first.ordering_key
        entry = build_entry(metadata, encode_batch(batch.messages))
        highest = batch.first_sequence_id + len(batch.messages) - 1
        self._enqueue(
            _PendingSend(
                batch.first_sequence_id, highest, entry, batch.callbacks, batch.deadline, True
            )
        )

    def _enqueue(self, pending: _PendingSend) -> None:
        self._pending.append(pending)
        if self._send_timeout > 0:
            self._timeout_timer.start(self._send_timeout)
        connection = self._connection
        if self._state is State.READY and connection is not None:
            connection.write(self._encode(pending))

    def _encode(self, pending: _PendingSend) -> tuple[bytes, bytes]:
        if pending.batched:
            return encode_send(
                self._producer_id,
                pending.sequence_id,
                pending.num_messages,
                pending.entry,
                pending.highest_sequence_id,
            )
        return encode_send(self._producer_id, pending.sequence_id, 1, pending.entry)

    # -- completions (reader greenlet) ---------------------------------------------------

    def on_receipt(self, receipt: pb.CommandSendReceipt) -> None:
        pending = self._pending
        if not pending:
            return
        head = pending[0]
        sequence_id = receipt.sequence_id
        if sequence_id not in (head.sequence_id, head.highest_sequence_id):
            if sequence_id < head.sequence_id:
                return  # a late receipt for a send that already timed out
            # The broker skipped a message: resend everything from a fresh connection.
            log.warning(
                "%r: receipt for sequence id %d while expecting %d",
                self,
                sequence_id,
                head.sequence_id,
            )
            connection = self._connection
            if connection is not None:
                connection.close(ConnectError("send receipts out of order"))
            return
        pending.popleft()
        message_id = receipt.message_id
        self._complete(head, None, message_id.ledger_id, message_id.entry_id)

    def on_send_error(self, error: pb.CommandSendError) -> None:
        pending = self._pending
        if error.error == pb.ChecksumError:
            # Only that message is lost; the connection is fine (the official client's rule).
            if pending and pending[0].sequence_id == error.sequence_id:
                self._complete(pending.popleft(), ChecksumError(error.message), 0, 0)
            return
        log.warning(
            "%r: send error %s; reconnecting to resend",
            self,
            error_for_code(error.error, error.message),
        )
        connection = self._connection
        if connection is not None:
            connection.close(ConnectError(f"send failed: {error.message}"))

    def _complete(
        self, pending: _PendingSend, error: PulsarError | None, ledger_id: int, entry_id: int
    ) -> None:
        self._queued -= pending.num_messages
        self._room.set()
        if error is None:
            partition = self.partition
            if pending.batched:
                for index, callback in enumerate(pending.callbacks):
                    _notify(callback, None, MessageId(ledger_id, entry_id, index, partition))
            else:
                _notify(pending.callbacks[0], None, MessageId(ledger_id, entry_id, -1, partition))
        else:
            for callback in pending.callbacks:
                _notify(callback, error, None)
        if pending.waiters is not None:
            for waiter in pending.waiters:
                waiter.set(None)

    def _expire_sends(self) -> None:
        now = time.monotonic()
        pending = self._pending
        expired: list[_PendingSend] = []
        while pending and pending[0].deadline <= now:
            expired.append(pending.popleft())
        for send in expired:
            self._complete(
                send, Timeout(f"no receipt within {self._config.send_timeout_millis} ms"), 0, 0
            )
        if pending:
            self._timeout_timer.start(pending[0].deadline - now)

    def _fail_all(self, error: PulsarError) -> None:
        self._batch_timer.cancel()
        self._timeout_timer.cancel()
        batch, self._batch = self._batch, _Batch()
        failed = list(self._pending)
        self._pending.clear()
        if batch.messages:
            failed.append(
                _PendingSend(
                    batch.first_sequence_id,
                    batch.first_sequence_id,
                    b"",
                    batch.callbacks,
                    0.0,
                    True,
                )
            )
        for send in failed:
            self._complete(send, error, 0, 0)

    # -- flushing and closing ------------------------------------------------------------

    def wait_for_pending(self, timeout: float | None) -> bool:
        """Wait until every send queued so far has completed; False on timeout."""
        if not self._pending:
            return True
        tail = self._pending[-1]
        done = gevent.event.AsyncResult()
        if tail.waiters is None:
            tail.waiters = []
        tail.waiters.append(done)
        done.wait(timeout)
        ready: bool = done.ready()
        return ready

    def close(self) -> None:
        """Send what is batched, wait (up to the operation timeout) for the receipts, close."""
        if self._state in (State.CLOSING, State.CLOSED):
            return
        self.flush_batch()
        if self._state is not State.CREATING:
            self.wait_for_pending(self._context.operation_timeout)
        self._state = State.CLOSING
        connection = self._connection
        if connection is not None:
            connection.producers.pop(self._producer_id, None)
            self._close_on(connection)
        self._fail_all(AlreadyClosed(f"producer on {self.topic} closed"))
        self._mark_closed()

    def _close_on(self, connection: Connection) -> None:
        if connection.closed:
            return
        request_id = connection.new_request_id()
        command = T(
            type=T.CLOSE_PRODUCER,
            close_producer=pb.CommandCloseProducer(
                producer_id=self._producer_id, request_id=request_id
            ),
        )
        try:
            connection.request(command, request_id)
        except PulsarError as error:
            log.debug("%r: CLOSE_PRODUCER failed: %s", self, error)


class Producer:
    """Publishes messages to a topic (one partition producer per partition).

    Create it with :meth:`brokerlet.client.Client.create_producer`.
    """

    def __init__(
        self, context: ClientContext, topic: str, partitions: int, config: ProducerConfig
    ) -> None:
        self._context = context
        self._topic = topic
        if partitions > 0:
            self._producers = [
                PartitionProducer(context, partition_topic(topic, index), index, config)
                for index in range(partitions)
            ]
        else:
            self._producers = [PartitionProducer(context, topic, -1, config)]
        self._round_robin = itertools.count()

    def __repr__(self) -> str:
        return f"<Producer {self.producer_name} on {self._topic}>"

    def _start(self) -> None:
        started: list[PartitionProducer] = []
        try:
            for producer in self._producers:
                producer.start()
                started.append(producer)
        except BaseException:
            for producer in started:
                producer.close()
            raise

    @property
    def topic(self) -> str:
        """The fully qualified topic name."""
        return self._topic

    @property
    def producer_name(self) -> str:
        """The producer's name: the one given, or the one the broker assigned."""
        return self._producers[0].producer_name

    def is_connected(self) -> bool:
        """Whether every partition producer is registered with a broker right now."""
        return all(p.state is State.READY for p in self._producers)

    def send(
        self,
        content: bytes,
        *,
        partition_key: str | None = None,
        ordering_key: bytes | None = None,
        properties: dict[str, str] | None = None,
        event_timestamp: int | None = None,
    ) -> MessageId:
        """Publish one message and wait for the broker to store it.

        Args:
            content: the message body.
            partition_key: the message key (routes a partitioned topic; Key_Shared uses it).
            ordering_key: a key for Key_Shared ordering that overrides ``partition_key``.
            properties: application-defined string properties.
            event_timestamp: an application event time in milliseconds.

        Returns:
            Where the broker stored it.

        Raises:
            PulsarError: the send failed (Timeout, ProducerQueueIsFull, MessageTooBig,
                AlreadyClosed, ...).
        """
        done = gevent.event.AsyncResult()

        def finished(error: PulsarError | None, message_id: MessageId | None) -> None:
            done.set((error, message_id))

        self.send_async(
            content,
            finished,
            partition_key=partition_key,
            ordering_key=ordering_key,
            properties=properties,
            event_timestamp=event_timestamp,
        )
        error, message_id = done.get()
        if error is not None:
            raise error
        assert message_id is not None
        return message_id  # type: ignore[no-any-return]

    def send_async(
        self,
        content: bytes,
        callback: SendCallback,
        *,
        partition_key: str | None = None,
        ordering_key: bytes | None = None,
        properties: dict[str, str] | None = None,
        event_timestamp: int | None = None,
    ) -> None:
        """Publish one message without waiting; ``callback(error, message_id)`` follows.

        The callback runs on the client's reader greenlet once the broker answered (or on
        a timer's greenlet if the send timed out); it must not block. Callbacks of one
        producer run in send order. Errors known at once (closed producer, full queue,
        message too big) are passed to the callback before this returns.

        Args:
            content: the message body.
            callback: receives ``(None, message_id)`` or ``(error, None)``.
            partition_key: see :meth:`send`.
            ordering_key: see :meth:`send`.
            properties: see :meth:`send`.
            event_timestamp: see :meth:`send`.
        """
        producers = self._producers
        if len(producers) == 1:
            producer = producers[0]
        elif partition_key:
            producer = producers[java_string_hash(partition_key) % len(producers)]
        else:
            producer = producers[next(self._round_robin) % len(producers)]
        producer.send_async(
            content,
            callback,
            partition_key=partition_key,
            ordering_key=ordering_key,
            properties=properties,
            event_timestamp=event_timestamp,
        )

    def flush(self) -> None:
        """Send any batched messages now and wait until every pending send completed."""
        for producer in self._producers:
            producer.flush_batch()
        for producer in self._producers:
            producer.wait_for_pending(None)

    def close(self) -> None:
        """Flush, wait (up to the operation timeout) for pending receipts, and close.

        Sends still pending after that fail with AlreadyClosed. Idempotent.
        """
        for producer in self._producers:
            producer.close()
        self._context.forget(self)


def _set_message_fields(
    metadata: pb.MessageMetadata | pb.SingleMessageMetadata,
    properties: dict[str, str] | None,
    partition_key: str | None,
    ordering_key: bytes | None,
    event_timestamp: int | None,
) -> None:
    """Fill what a message and a message inside a batch carry alike (same field names)."""
    if properties:
        for key, value in properties.items():
            metadata.properties.add(key=key, value=value)
    if partition_key is not None:
        metadata.partition_key = partition_key
    if ordering_key is not None:
        metadata.ordering_key = ordering_key
    if event_timestamp is not None:
        metadata.event_time = event_timestamp
