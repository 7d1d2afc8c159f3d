"""Micro-benchmark of the Pulsar codec's hot paths.

Prints rates, never asserts them. Run with ``python bench/micro/codec.py`` (or ``-m``);
``--quick`` shortens every measurement.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Callable

import gevent
import gevent.socket

from brokerlet.storage.ledger import Entry
from brokerlet.transport.channel import Channel
from brokerlet.transport.protocol import (
    FrameDecoder,
    build_entry,
    crc32c,
    decode_payload,
    encode_message,
    encode_messages,
    encode_payload_command,
    encode_send,
    pb,
)

_CHUNK = 64 * 1024


def _entry(payload_size: int) -> bytes:
    metadata = pb.MessageMetadata(
        producer_name="bench-producer", sequence_id=1, publish_time=1_700_000_000_000
    )
    metadata.partition_key = "key-1"
    return build_entry(metadata, b"x" * payload_size)


def _send_stream(count: int, payload_size: int) -> bytes:
    entry = _entry(payload_size)
    frames = []
    for sequence_id in range(count):
        header, body = encode_send(0, sequence_id, 1, entry)
        frames.append(header + body)
    return b"".join(frames)


def _rate(operation: Callable[[], int], seconds: float) -> float:
    """Run ``operation`` (which returns how many items it handled) for about ``seconds``."""
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        done += operation()
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start)


def bench_decode(payload_size: int, seconds: float, with_payload: bool) -> float:
    """SEND frames decoded per second, fed in socket-sized chunks."""
    count = 2000
    stream = _send_stream(count, payload_size)
    chunks = [stream[i : i + _CHUNK] for i in range(0, len(stream), _CHUNK)]

    def run() -> int:
        decoder = FrameDecoder(8 * 1024 * 1024)
        decoded = 0
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                if with_payload:
                    decode_payload(frame.payload or b"")
                decoded += 1
        return decoded

    return _rate(run, seconds)


def bench_large_frame(seconds: float, chunk_size: int) -> float:
    """5 MB frames decoded per second when they arrive ``chunk_size`` bytes at a time."""
    entry = _entry(5 * 1024 * 1024 - 200)
    header, body = encode_send(0, 0, 1, entry)
    stream = header + body
    chunks = [stream[i : i + chunk_size] for i in range(0, len(stream), chunk_size)]

    def run() -> int:
        decoder = FrameDecoder(6 * 1024 * 1024)
        decoded = 0
        for chunk in chunks:
            decoded += len(decoder.feed(chunk))
        return decoded

    return _rate(run, seconds)


def bench_encode_message(seconds: float) -> float:
    """Hand-rolled MESSAGE headers per second."""
    entry = _entry(1024)
    checksum = crc32c(entry)

    def run() -> int:
        for entry_id in range(1000):
            encode_message(3, 7, 100_000 + entry_id, 0, entry, checksum)
        return 1000

    return _rate(run, seconds)


def bench_encode_message_protobuf(seconds: float) -> float:
    """The same MESSAGE frames built through protobuf objects, for comparison."""
    entry = _entry(1024)
    checksum = crc32c(entry)

    def run() -> int:
        for entry_id in range(1000):
            command = pb.BaseCommand(
                type=pb.BaseCommand.MESSAGE,
                message=pb.CommandMessage(
                    consumer_id=3,
                    message_id=pb.MessageIdData(ledger_id=7, entry_id=100_000 + entry_id),
                    redelivery_count=0,
                ),
            )
            encode_payload_command(command, entry, checksum)
        return 1000

    return _rate(run, seconds)


def bench_batch_write(seconds: float, batch_size: int, joined: bool) -> float:
    """Consumer batches of 128-byte messages encoded and written through a Channel.

    ``joined``: :func:`encode_messages` (one buffer for the batch); otherwise a header and
    an entry buffer per message, as before it. The socket's peer is drained by a thread, so
    this is process CPU per message, the kernel's copy included.
    """
    entry = _entry(128)
    checksum = crc32c(entry)
    entries = [Entry(7, 100_000 + i, entry, checksum, 1) for i in range(batch_size)]
    counts = [0] * batch_size

    def pairs() -> list[bytes]:
        buffers: list[bytes] = []
        for e in entries:
            buffers.extend(encode_message(3, e.ledger_id, e.entry_id, 0, e.data, e.checksum))
        return buffers

    def batch() -> list[bytes]:
        return encode_messages(3, entries, counts)

    encode = batch if joined else pairs
    ours, peer = socket.socketpair()

    def drain() -> None:
        while peer.recv(1 << 20):
            pass

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    channel = Channel(
        gevent.socket.socket(fileno=ours.detach()), high_watermark=1 << 30, low_watermark=1 << 29
    )
    written = 0
    started, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        for _ in range(20):
            channel.write(encode())
        gevent.sleep(0)  # the channel's flush
        written += 20 * batch_size
    used = time.process_time() - cpu
    channel.close()
    drainer.join(5)
    peer.close()
    return used / written * 1e6


def main() -> None:
    """Print each measurement on its own line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="0.2 s per measurement")
    args = parser.parse_args()
    seconds = 0.2 if args.quick else 1.0

    for size in (100, 1024, 16 * 1024):
        rate = bench_decode(size, seconds, with_payload=False)
        print(f"decode SEND frames, {size:>6}-byte payload: {rate:>12,.0f} frames/s")
    rate = bench_decode(1024, seconds, with_payload=True)
    print(f"decode SEND + payload section, 1 KiB:    {rate:>12,.0f} frames/s")
    for chunk_size in (4 * 1024, 64 * 1024):
        rate = bench_large_frame(seconds, chunk_size)
        label = f"decode 5 MB frame in {chunk_size // 1024:>2} KiB chunks:"
        print(f"{label:<41}{rate:>12,.1f} frames/s")
    fast = bench_encode_message(seconds)
    slow = bench_encode_message_protobuf(seconds)
    print(f"encode_message:                          {fast:>12,.0f} messages/s")
    print(f"MESSAGE via protobuf objects:            {slow:>12,.0f} messages/s")
    print(f"hand-rolled / protobuf:                  {fast / slow:>12.2f}x")
    for size in (1, 20, 100):
        pairs = bench_batch_write(seconds, size, joined=False)
        joined = bench_batch_write(seconds, size, joined=True)
        print(
            f"encode + write a batch of {size:>3}, process CPU per message: joined "
            f"{joined:.2f} µs, a header and an entry buffer each {pairs:.2f} µs "
            f"({joined / pairs:.2f}x)"
        )


if __name__ == "__main__":
    main()
