"""Event-loop actors: the I/O tasks of the connections assigned to them (Netty-style).

A dispatcher hands each consumer batch to the event loop of the consumer's connection as one
message; the loop encodes the MESSAGE frames and makes one vectored write of the batch. The
channel's write completions and writability changes come back here as messages, so they run
as later tasks of this loop, never on the stack of the write that caused them:

* a batch's completion runs the dispatcher's conflated read request;
* a connection turning writable wakes the dispatchers of its consumers. Notifications for one
  connection coalesce (a :class:`ConflatedTell` on the connection handle): while one is queued,
  further flips add nothing, and writability is checked again per consumer when the task runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.dispatcher import SendMessages
from brokerlet.dispatch.consumer import ConnectionHandle
from brokerlet.transport.protocol import encode_message

__all__ = ["EventLoopActor", "WritabilityChanged"]


@dataclass(frozen=True, slots=True)
class WriteCompleted:
    callback: Callable[[], object]


@dataclass(frozen=True, slots=True)
class WritabilityChanged:
    connection: ConnectionHandle


class EventLoopActor(GeventActor):
    """Runs the I/O tasks of the connections assigned to it."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def on_receive(self, message: Any) -> None:
        kind = message.__class__
        if kind is SendMessages:
            self._send_messages(message)
        elif kind is WriteCompleted:
            message.callback()
        elif kind is WritabilityChanged:
            self._writability_changed(message.connection)

    def _send_messages(self, message: SendMessages) -> None:
        consumer = message.consumer
        connection = consumer.connection
        if connection.closed:
            return  # the connection's cleanup releases these entries for redelivery
        consumer_id = consumer.consumer_id
        buffers: list[bytes] = []
        for entry, redelivery_count in zip(message.entries, message.redelivery_counts, strict=True):
            header, data = encode_message(
                consumer_id,
                entry.ledger_id,
                entry.entry_id,
                redelivery_count,
                entry.data,
                entry.checksum,
            )
            buffers.append(header)
            buffers.append(data)
        on_complete = message.on_complete
        tell = self.actor_ref.tell

        def completed(error: BaseException | None) -> None:
            if error is None:
                tell(WriteCompleted(on_complete))

        connection.channel.write(buffers, completed)

    def _writability_changed(self, connection: ConnectionHandle) -> None:
        if connection.writable_notice is not None:
            connection.writable_notice.taken()
        if connection.closed or not connection.channel.writable:
            return
        for consumer in connection.consumers:
            if consumer.writable and consumer.read_gate is not None:
                consumer.read_gate.request()
