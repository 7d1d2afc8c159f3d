"""ACK_RESPONSE, CONSUMER_STATS and CONSUMER_STATS_RESPONSE, whose bodies brokerlet's schema
does not declare (so the generated module stays as other commands need it): the request is
read from its unknown body, the answers are encoded by field number (PulsarApi.proto's)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from google.protobuf import unknown_fields

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._payload import varint_field
from brokerlet.transport.protocol._unsupported import _key, _varint

__all__ = [
    "ConsumerStatsFigures",
    "consumer_stats_request",
    "encode_ack_response",
    "encode_consumer_stats_response",
]

T = pb.BaseCommand
_DOUBLE = struct.Struct("<d")


def consumer_stats_request(command: pb.BaseCommand) -> tuple[int, int] | None:
    """``(request_id, consumer_id)`` of a CONSUMER_STATS request, or None if either is missing."""
    fields: Any = unknown_fields.UnknownFieldSet(command)
    for field in fields:
        if field.field_number == T.CONSUMER_STATS and field.wire_type == 2:
            data = bytes(field.data)
            request_id = varint_field(data, 1)
            consumer_id = varint_field(data, 4)
            if request_id is None or consumer_id is None:
                return None
            return request_id, consumer_id
    return None


def _frame(kind: int, body: bytes) -> bytes:
    command = _key(1, 0) + _varint(kind) + _key(kind, 2) + _varint(len(body)) + body
    size = len(command)
    return (size + 4).to_bytes(4, "big") + size.to_bytes(4, "big") + command


def _string(number: int, text: str) -> bytes:
    data = text.encode()
    return _key(number, 2) + _varint(len(data)) + data


def _double(number: int, value: float) -> bytes:
    return _key(number, 1) + _DOUBLE.pack(value)


def encode_ack_response(
    consumer_id: int,
    request_id: int,
    error: pb.ServerError.ValueType | None = None,
    message: str = "",
) -> bytes:
    """ACK_RESPONSE: consumer_id 1, (txnid bits 2, 3), error 4, message 5, request_id 6."""
    body = _key(1, 0) + _varint(consumer_id)
    if error is not None:
        body += _key(4, 0) + _varint(int(error)) + _string(5, message)
    body += _key(6, 0) + _varint(request_id)
    return _frame(T.ACK_RESPONSE, body)


@dataclass(frozen=True, slots=True)
class ConsumerStatsFigures:
    """A consumer's figures as CONSUMER_STATS_RESPONSE carries them."""

    msg_rate_out: float
    msg_throughput_out: float
    msg_rate_redeliver: float
    consumer_name: str
    available_permits: int
    unacked_messages: int
    blocked_consumer_on_unacked_msgs: bool
    address: str
    connected_since: str
    type: str
    msg_rate_expired: float
    msg_backlog: int
    message_ack_rate: float


def encode_consumer_stats_response(
    request_id: int,
    figures: ConsumerStatsFigures | None,
    error: pb.ServerError.ValueType = pb.UnknownError,
    message: str = "",
) -> bytes:
    """CONSUMER_STATS_RESPONSE with ``figures``, or with ``error`` when they are None."""
    body = _key(1, 0) + _varint(request_id)
    if figures is None:
        body += _key(2, 0) + _varint(int(error)) + _string(3, message)
        return _frame(T.CONSUMER_STATS_RESPONSE, body)
    f = figures
    body += b"".join(
        (
            _double(4, f.msg_rate_out),
            _double(5, f.msg_throughput_out),
            _double(6, f.msg_rate_redeliver),
            _string(7, f.consumer_name),
            _key(8, 0) + _varint(max(0, f.available_permits)),
            _key(9, 0) + _varint(max(0, f.unacked_messages)),
            _key(10, 0) + _varint(int(f.blocked_consumer_on_unacked_msgs)),
            _string(11, f.address),
            _string(12, f.connected_since),
            _string(13, f.type),
            _double(14, f.msg_rate_expired),
            _key(15, 0) + _varint(max(0, f.msg_backlog)),
            _double(16, f.message_ack_rate),
        )
    )
    return _frame(T.CONSUMER_STATS_RESPONSE, body)
