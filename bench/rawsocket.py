"""A Pulsar connection on a plain blocking socket, for benchmarks that count the broker's CPU.

No client library runs in the measuring process: it sends pre-encoded frames and reads the
replies with brokerlet's own decoder, so what is measured is the broker's side only.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

from brokerlet.transport.protocol import (
    Frame,
    FrameDecoder,
    encode_ack,
    encode_command,
    encode_flow,
    pb,
)

__all__ = ["RawConnection", "consume"]

T = pb.BaseCommand
_PONG = encode_command(T(type=T.PONG, pong=pb.CommandPong()))


class RawConnection:
    """A connected, CONNECTed socket to a broker's ``pulsar://`` URL."""

    def __init__(self, url: str, client_version: str = "raw-bench") -> None:
        host, port = url.removeprefix("pulsar://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(8 << 20)
        connect = pb.CommandConnect(client_version=client_version, protocol_version=20)
        reply = self.request(T(type=T.CONNECT, connect=connect))
        if reply.type != T.CONNECTED:
            raise RuntimeError(f"CONNECT failed: {reply}")

    def request(self, command: pb.BaseCommand) -> pb.BaseCommand:
        """Send ``command`` and return the next command the broker sends."""
        self.sock.sendall(encode_command(command))
        return self.read(1)[0]

    def subscribe(
        self,
        topic: str,
        subscription: str,
        consumer_id: int = 1,
        sub_type: pb.CommandSubscribe.SubType.ValueType = pb.CommandSubscribe.Shared,
    ) -> None:
        """A consumer (Shared unless ``sub_type`` says) on ``subscription`` (from the earliest
        entry); waits for SUCCESS."""
        subscribe = pb.CommandSubscribe(
            topic=topic,
            subscription=subscription,
            sub_type=sub_type,
            consumer_id=consumer_id,
            request_id=1,
            initial_position=pb.CommandSubscribe.Earliest,
        )
        self.expect(T(type=T.SUBSCRIBE, subscribe=subscribe), T.SUCCESS)

    def expect(
        self, command: pb.BaseCommand, kind: pb.BaseCommand.Type.ValueType
    ) -> pb.BaseCommand:
        """`request`, whose answer must be of ``kind`` (a RuntimeError otherwise)."""
        reply = self.request(command)
        if reply.type != kind:
            raise RuntimeError(
                f"{T.Type.Name(command.type)}: expected {T.Type.Name(kind)}, got {reply}"
            )
        return reply

    def close_consumer(self, consumer_id: int = 1, request_id: int = 1) -> None:
        """CLOSE_CONSUMER; waits for SUCCESS."""
        close = pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=request_id)
        self.expect(T(type=T.CLOSE_CONSUMER, close_consumer=close), T.SUCCESS)

    def read(self, wanted: int) -> list[pb.BaseCommand]:
        """At least ``wanted`` commands: every one that the bytes received so far complete."""
        commands: list[pb.BaseCommand] = []
        while len(commands) < wanted:
            commands += [frame.command for frame in self.read_frames()]
        return commands

    def read_frames(self) -> list[Frame]:
        """The frames one receive completes (possibly none); a keep-alive PING is answered
        and left out (a slow broker, under valgrind, sends them mid-measurement)."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise RuntimeError("broker closed the connection")
        frames = self.decoder.feed(data)
        if any(frame.type == T.PING for frame in frames):
            self.sock.sendall(_PONG)
            frames = [frame for frame in frames if frame.type != T.PING]
        return frames

    def close(self) -> None:
        self.sock.close()


def consume(
    connection: RawConnection,
    consumer_ids: Iterable[int],
    messages: int,
    *,
    queue: int,
    ack_group: int,
    batch: int = 1,
) -> None:
    """Receive ``messages`` messages on ``connection``'s consumers, ``batch`` to a MESSAGE,
    answering as the official client does (see `_Replies`): the consume side of the
    micro-benchmarks."""
    replies = _Replies(consumer_ids, queue, ack_group, batch)
    connection.sock.sendall(replies.first_flows())
    received = 0
    while received < messages:
        for frame in connection.read_frames():
            if frame.type != T.MESSAGE:
                raise RuntimeError(f"unexpected frame: {frame.command}")
            replies.received(frame.command.message)
            received += batch
        out = replies.due(last=received == messages)
        if out:
            connection.sock.sendall(out)


class _Replies:
    """What raw-socket consumers send back as MESSAGEs arrive, as the official client does:
    a FLOW refilling half of each one's receiver queue, and its individual acks in groups (a
    batch's messages acked together as its entry, as without batch-index acks).

    Args:
        consumer_ids: the consumers on the connection.
        queue: each one's receiver queue (the permits of its first FLOW).
        ack_group: messages acked per ACK frame.
        batch: messages per MESSAGE frame (permits per entry).
    """

    def __init__(
        self, consumer_ids: Iterable[int], queue: int, ack_group: int, batch: int = 1
    ) -> None:
        self.queue = queue
        self.ack_group = ack_group
        self.batch = batch
        self._since_flow = dict.fromkeys(consumer_ids, 0)
        self._acks: dict[int, list[tuple[int, int]]] = {c: [] for c in self._since_flow}

    def first_flows(self) -> bytes:
        """Each consumer's first FLOW, for its whole queue."""
        return b"".join(encode_flow(c, self.queue) for c in self._since_flow)

    def received(self, message: pb.CommandMessage) -> None:
        consumer_id = message.consumer_id
        self._acks[consumer_id].append((message.message_id.ledger_id, message.message_id.entry_id))
        self._since_flow[consumer_id] += self.batch

    def due(self, last: bool) -> bytes:
        """The FLOW and ACK frames due now (``last``: every ack still held, too)."""
        out = []
        for consumer_id, since_flow in self._since_flow.items():
            if since_flow >= self.queue // 2:
                out.append(encode_flow(consumer_id, since_flow))
                self._since_flow[consumer_id] = 0
            pending = self._acks[consumer_id]
            # Counted in messages: held back by entries, a batch's acks would pass the
            # broker's unacked-message limit (50,000 per consumer) and stall it.
            if len(pending) * self.batch >= self.ack_group or (pending and last):
                out.append(encode_ack(consumer_id, pending))
                self._acks[consumer_id] = []
        return b"".join(out)
