"""A Pulsar connection on a plain blocking socket, for benchmarks that count the broker's CPU.

No client library runs in the measuring process: it sends pre-encoded frames and reads the
replies with brokerlet's own decoder, so what is measured is the broker's side only.
"""

from __future__ import annotations

import socket

from brokerlet.transport.protocol import Frame, FrameDecoder, encode_command, pb

__all__ = ["RawConnection"]

T = pb.BaseCommand


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
        reply = self.request(T(type=T.SUBSCRIBE, subscribe=subscribe))
        if reply.type != T.SUCCESS:
            raise RuntimeError(f"SUBSCRIBE failed: {reply}")

    def read(self, wanted: int) -> list[pb.BaseCommand]:
        """At least ``wanted`` commands: every one that the bytes received so far complete."""
        commands: list[pb.BaseCommand] = []
        while len(commands) < wanted:
            commands += [frame.command for frame in self.read_frames()]
        return commands

    def read_frames(self) -> list[Frame]:
        """The frames one receive completes (possibly none)."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise RuntimeError("broker closed the connection")
        return self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()
