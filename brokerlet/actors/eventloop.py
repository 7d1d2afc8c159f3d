"""Event-loop actors: the I/O tasks of the connections assigned to them (Netty-style).

A dispatcher hands a dispatch pass's consumer batches for one connection to its event loop as
one message (a lone batch as itself); the loop encodes the MESSAGE frames (small ones joined
into one buffer) and makes one vectored write of them. With many consumers on one connection
(the official client shares one per broker), a pass's batches are small: one hand-over, one
write and one completion per pass and connection, not per batch.

* The batch carries what its written bytes wake (the dispatcher's conflated read request):
  the channel's writer greenlet requests it once the batch is in the kernel. One hop, straight
  to the dispatcher's inbox; a request only flips a flag and tells, so it is safe there.
* A connection turning writable, or its writer's parked send returning (see
  `ConnectionHandle.channel_send_unblocked`), comes back here as a message, so it runs as a
  later task of this loop, never on the stack of the write that caused it, and wakes the
  dispatchers of its consumers. Notifications for one connection coalesce (a
  ``ConflatedTell`` on the connection handle): while one is queued, further flips add
  nothing, and writability is checked again per consumer when the task runs.
* Frames the connection actor must order after the MESSAGE frames already queued here (a
  broker-initiated CLOSE_CONSUMER) come as a message too: this inbox is the order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.messages import (
    SendMessageBatches,
    SendMessages,
    UnexpectedMessage,
    WritabilityChanged,
    WriteAfterMessages,
    WriteCompletion,
)
from brokerlet.dispatch.consumer import ConnectionHandle
from brokerlet.transport.channel import WriteCallback
from brokerlet.transport.protocol import encode_messages

__all__ = ["EventLoopActor"]


class EventLoopActor(GeventActor):
    """Runs the I/O tasks of the connections assigned to it."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def on_receive(self, message: Any) -> None:
        kind = message.__class__
        if kind is SendMessages:
            self._write((message,), _Written(message.completion))
        elif kind is SendMessageBatches:
            self._write(message.batches, _written(message.batches))
        elif kind is WritabilityChanged:
            self._writability_changed(message.connection)
        elif kind is WriteAfterMessages:
            if not message.connection.closed:
                message.connection.channel.write(message.frames)
        else:
            raise UnexpectedMessage(self, message)

    def _write(self, batches: Sequence[SendMessages], written: WriteCallback) -> None:
        """One write of the batches (a dispatch pass's, for one connection)."""
        connection = batches[0].consumer.connection
        if connection.closed:
            return  # the connection's cleanup releases these entries for redelivery
        buffers: list[bytes] = []
        for message in batches:
            consumer = message.consumer
            if consumer.closed:
                continue  # its client closed it; its dispatcher takes these back
            buffers += encode_messages(
                consumer.consumer_id,
                message.entries,
                message.redelivery_counts,
                message.ack_sets,
                message.epoch,
            )
        if not buffers:
            written(None)  # the dispatcher reads again as after a write
            return
        channel = connection.channel
        channel.write(buffers, written)
        if channel.send_blocked:
            # This write's completion, which was to request the next read, waits for the
            # client to read: the dispatchers read now for their other consumers.
            for message in batches:
                if message.consumer.read_gate is not None:
                    message.consumer.read_gate.request()

    def _writability_changed(self, connection: ConnectionHandle) -> None:
        if connection.writable_notice is not None:
            connection.writable_notice.taken()
        if connection.closed or not connection.channel.writable:
            return
        for consumer in connection.consumers:
            if consumer.writable and consumer.read_gate is not None:
                consumer.read_gate.request()


class _Written:
    """A batch's write callback: a completed write requests what the batch carries; a failed
    one does nothing (the connection's cleanup releases the batch for redelivery)."""

    __slots__ = ("_completion",)

    def __init__(self, completion: WriteCompletion) -> None:
        self._completion = completion

    def __call__(self, error: BaseException | None) -> None:
        if error is None:
            self._completion.request()


def _written(batches: list[SendMessages]) -> WriteCallback:
    """The write callback of several batches: usually they carry one completion (their
    dispatcher's read request); each barrier notice counts, each distinct one once."""
    completions = {id(message.completion): message.completion for message in batches}
    if len(completions) == 1:
        return _Written(batches[0].completion)
    return _AllWritten(list(completions.values()))


class _AllWritten:
    """:class:`_Written` for a write of several batches: each distinct completion once."""

    __slots__ = ("_completions",)

    def __init__(self, completions: list[WriteCompletion]) -> None:
        self._completions = completions

    def __call__(self, error: BaseException | None) -> None:
        if error is None:
            for completion in self._completions:
                completion.request()
