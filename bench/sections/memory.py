"""Memory: the broker's RSS idle, and with many idle connections past the handshake.

The connections are raw sockets speaking just enough of the protocol (CONNECT, then wait
for CONNECTED) through brokerlet's own codec, so a thousand of them cost this process
little and the broker sees real, handshaken clients.
"""

from __future__ import annotations

import dataclasses
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bench.plan import Plan, SectionResult
from bench.report import Row, format_bytes, judge
from brokerlet.testing.process import BrokerletProcess
from brokerlet.transport.protocol import PROTOCOL_VERSION, FrameDecoder, encode_command, pb

__all__ = ["MemoryResult", "measure_memory", "open_connections", "raise_file_limit"]

_CONNECT = encode_command(
    pb.BaseCommand(
        type=pb.BaseCommand.CONNECT,
        connect=pb.CommandConnect(
            client_version="brokerlet-bench", protocol_version=PROTOCOL_VERSION
        ),
    )
)
_CHUNK = 100  # connections opened before their handshakes are awaited; below the backlog
_WARM_CONNECTIONS = 10


@dataclass(frozen=True)
class MemoryResult:
    """RSS figures, in bytes.

    Attributes:
        connections: Idle connections held open for the measurement.
        idle_rss: RSS once the broker was ready, before any connection.
        warm_rss: RSS with the first few connections open, so one-off costs (the first
            connection's lazy allocations) are paid.
        loaded_rss: RSS with ``connections`` connections open, the warm ones included.
        per_connection: ``(loaded_rss - idle_rss) / connections``.
        marginal_per_connection: ``(loaded_rss - warm_rss)`` over the connections opened
            after the warm ones: the cost without the one-off part.
    """

    connections: int
    idle_rss: int
    warm_rss: int
    loaded_rss: int
    per_connection: float
    marginal_per_connection: float


def raise_file_limit() -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit; return the pair.

    Child processes inherit it, so call this before spawning the broker.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@contextmanager
def open_connections(port: int, count: int, timeout: float = 10.0) -> Iterator[list[socket.socket]]:
    """Open ``count`` connections that completed CONNECT/CONNECTED; close them on exit.

    Raises:
        RuntimeError: The broker answered a CONNECT with anything but CONNECTED.
        OSError: A connection failed or a handshake timed out.
    """
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            chunk = [
                socket.create_connection(("127.0.0.1", port), timeout=timeout)
                for _ in range(min(_CHUNK, count - len(sockets)))
            ]
            sockets.extend(chunk)
            for sock in chunk:
                sock.sendall(_CONNECT)
            for sock in chunk:
                _await_connected(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _await_connected(sock: socket.socket) -> None:
    decoder = FrameDecoder(max_frame_size=1 << 20)
    while True:
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("the broker closed a connection during the handshake")
        frames = decoder.feed(data)
        if frames:
            reply = frames[0].command
            if reply.type != pb.BaseCommand.CONNECTED:
                raise RuntimeError(f"CONNECT answered with {pb.BaseCommand.Type.Name(reply.type)}")
            return


def measure_memory(connections: int = 1000) -> MemoryResult:
    """Start a broker and measure its RSS idle and with ``connections`` idle connections."""
    with BrokerletProcess() as broker:
        broker.start()
        idle = broker.rss_bytes()
        warm_count = min(_WARM_CONNECTIONS, connections - 1)
        with open_connections(broker.port, warm_count):
            warm = broker.rss_bytes()
            with open_connections(broker.port, connections - warm_count):
                loaded = broker.rss_bytes()
    return MemoryResult(
        connections=connections,
        idle_rss=idle,
        warm_rss=warm,
        loaded_rss=loaded,
        per_connection=(loaded - idle) / connections,
        marginal_per_connection=(loaded - warm) / (connections - warm_count),
    )


# The section: ``--only memory``.

PER_CONNECTION_TARGET = 100_000.0  # bytes, "< 100 KB"


def run_memory(plan: Plan) -> SectionResult:
    """The broker's RSS idle and with ``plan.connections`` handshaken idle connections."""
    print(f"memory: RSS idle and with {plan.connections:,} idle connections", flush=True)
    result = measure_memory(plan.connections)
    section = SectionResult(data=dataclasses.asdict(result))
    section.rows = [
        Row("RSS, idle", format_bytes(result.idle_rss)),
        Row(f"RSS, {result.connections:,} idle connections", format_bytes(result.loaded_rss)),
        Row(
            "per idle connection",
            format_bytes(result.per_connection),
            f"{result.per_connection:,.0f} B",
            f"< {PER_CONNECTION_TARGET / 1000:.0f} KB",
            judge(result.per_connection, below=PER_CONNECTION_TARGET),
        ),
        Row(
            "  marginal, after the first few",
            format_bytes(result.marginal_per_connection),
            f"{result.marginal_per_connection:,.0f} B",
        ),
    ]
    return section
