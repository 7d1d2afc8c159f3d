"""Raw PRODUCER and SEND frames with the fields the official client hides (names, access
modes, epochs, chunk metadata)."""

from __future__ import annotations

import time

from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import build_entry, encode_send, pb

T = pb.BaseCommand


def raw_producer(
    client: RawClient,
    topic: str,
    producer_id: int,
    name: str,
    *,
    mode: int = pb.Shared,
    epoch: int | None = None,
) -> pb.BaseCommand:
    """PRODUCER with a name, access mode and epoch; returns the broker's answer."""
    request = pb.CommandProducer(
        topic=topic,
        producer_id=producer_id,
        request_id=1000 + producer_id,
        producer_name=name,
        producer_access_mode=mode,
    )
    if epoch is not None:
        request.topic_epoch = epoch
    client.send_command(T(type=T.PRODUCER, producer=request))
    client._producer_names[producer_id] = name
    frame = client.recv_frame()
    return frame.command


def send_frame(producer_id: int, name: str, sequence_id: int, payload: bytes, **meta: int) -> bytes:
    metadata = pb.MessageMetadata(
        producer_name=name, sequence_id=sequence_id, publish_time=int(time.time() * 1000), **meta
    )
    header, body = encode_send(producer_id, sequence_id, 1, build_entry(metadata, payload))
    return header + body
