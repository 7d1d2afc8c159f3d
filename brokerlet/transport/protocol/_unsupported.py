"""Answers to requests brokerlet knows of but does not serve yet.

brokerlet's schema declares the type of every Pulsar command but not the body of the ones it
does not implement (transactions, topic-list watchers), so their body
arrives as an unknown field. A client waits for the answer to such a request until its
operation timeout (30 s); answering at once with an error fails it promptly. The request id
is read from the unknown body, and the answer is the command's own response type where that
has an error field (what the C++ client completes the request from), else CommandError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import unknown_fields

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._framing import encode_command
from brokerlet.transport.protocol._payload import varint_field

__all__ = ["UNSUPPORTED", "encode_unsupported_reply", "unsupported_request_id"]

T = pb.BaseCommand


@dataclass(frozen=True, slots=True)
class _Reply:
    request_id_field: int  # field number of request_id in the request body
    response_type: int  # 0: answer with CommandError
    error_field: int = 0  # field numbers of the error code and message in the response
    message_field: int = 0


_TXN_STYLE = (4, 5)  # txnid bits are 2 and 3; error = 4, message = 5

UNSUPPORTED: dict[int, _Reply] = {
    T.NEW_TXN: _Reply(1, T.NEW_TXN_RESPONSE, *_TXN_STYLE),
    T.ADD_PARTITION_TO_TXN: _Reply(1, T.ADD_PARTITION_TO_TXN_RESPONSE, *_TXN_STYLE),
    T.ADD_SUBSCRIPTION_TO_TXN: _Reply(1, T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, *_TXN_STYLE),
    T.END_TXN: _Reply(1, T.END_TXN_RESPONSE, *_TXN_STYLE),
    T.END_TXN_ON_PARTITION: _Reply(1, T.END_TXN_ON_PARTITION_RESPONSE, *_TXN_STYLE),
    T.END_TXN_ON_SUBSCRIPTION: _Reply(1, T.END_TXN_ON_SUBSCRIPTION_RESPONSE, *_TXN_STYLE),
    T.TC_CLIENT_CONNECT_REQUEST: _Reply(1, T.TC_CLIENT_CONNECT_RESPONSE, 2, 3),
    T.WATCH_TOPIC_LIST: _Reply(2, 0),  # watcher_id = 1, request_id = 2
    T.WATCH_TOPIC_LIST_CLOSE: _Reply(1, 0),
}
"""Request types with a request id that brokerlet answers with an error, and how."""


def unsupported_request_id(command: pb.BaseCommand) -> int | None:
    """The request id of an unsupported request, or None (not one, or no id sent)."""
    reply = UNSUPPORTED.get(command.type)
    if reply is None:
        return None
    fields: Any = unknown_fields.UnknownFieldSet(command)  # iterable; the stubs lack it
    for field in fields:
        if field.field_number == command.type and field.wire_type == 2:
            return varint_field(bytes(field.data), reply.request_id_field)
    return None


def encode_unsupported_reply(
    command: pb.BaseCommand, code: pb.ServerError.ValueType, message: str
) -> bytes | None:
    """The frame answering an unsupported request with ``code``, or None if it has no id."""
    request_id = unsupported_request_id(command)
    if request_id is None:
        return None
    reply = UNSUPPORTED[command.type]
    if reply.response_type == 0:
        error = pb.CommandError(request_id=request_id, error=code, message=message)
        return encode_command(T(type=T.ERROR, error=error))
    text = message.encode()
    body = b"".join(
        (
            _key(1, 0) + _varint(request_id),
            _key(reply.error_field, 0) + _varint(int(code)),
            _key(reply.message_field, 2) + _varint(len(text)) + text,
        )
    )
    command_bytes = (
        _key(1, 0)
        + _varint(reply.response_type)
        + _key(reply.response_type, 2)
        + _varint(len(body))
        + body
    )
    size = len(command_bytes)
    return (size + 4).to_bytes(4, "big") + size.to_bytes(4, "big") + command_bytes


def _key(field_number: int, wire_type: int) -> bytes:
    return _varint((field_number << 3) | wire_type)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
