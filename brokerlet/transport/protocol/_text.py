"""String fields that are not valid UTF-8.

The protobuf runtime hands back invalid UTF-8 in a proto2 ``string`` field as ``bytes``
instead of refusing it. Every name a peer sends (topic, subscription, producer, consumer)
is such a field, and code downstream treats them as ``str``: a bytes name fails later, far
from the peer, in a log line, a JSON cursor file or a regex. The decoder checks each command
once, here, so the connection can refuse the request with an error instead.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._payload import ANY_VARINT, walk_varint

__all__ = ["invalid_text_field"]

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _holds_text(descriptor: Descriptor, seen: dict[str, bool]) -> bool:
    """Whether messages of ``descriptor`` can hold a string field at any depth."""
    name = descriptor.full_name
    if name in seen:
        return seen[name]
    seen[name] = False  # a recursive type holds text only through its other fields
    found = False
    for field in descriptor.fields:
        child = field.message_type
        if field.type == _STRING or (
            field.type == _MESSAGE and child is not None and _holds_text(child, seen)
        ):
            found = True
    seen[name] = found
    return found


_HOLDS_TEXT: dict[str, bool] = {}
_holds_text(pb.BaseCommand.DESCRIPTOR, _HOLDS_TEXT)

_T = pb.BaseCommand
# Commands not walked: hot ones whose string fields brokerlet never reads (ACK properties,
# for example), the closes (only a broker sends their assigned-broker URLs), and every
# command whose body has no string field at any depth (a body's field number is its type).
SKIPPED_TYPES = frozenset(
    (_T.SEND, _T.MESSAGE, _T.ACK, _T.FLOW, _T.PING, _T.PONG, _T.CLOSE_PRODUCER, _T.CLOSE_CONSUMER)
) | frozenset(
    field.number
    for field in _T.DESCRIPTOR.fields
    if field.message_type is not None and not _HOLDS_TEXT[field.message_type.full_name]
)


def invalid_text_field(
    command: pb.BaseCommand,
    type_value: int | None = None,
    serialized: bytes | memoryview | None = None,
) -> str | None:
    """The path of the first string field of ``command`` that is not valid UTF-8, or None
    (``type_value``: the command's type, if the caller has read it already; ``serialized``:
    the bytes it was parsed from, if at hand).

    >>> invalid_text_field(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing()))
    """
    if (command.type if type_value is None else type_value) in SKIPPED_TYPES:
        return None
    # A string's bytes lie within the body's: with no byte above 0x7F there, every string
    # is ASCII. Most requests of a client with small ids pass this without a walk.
    if serialized is not None:
        data = bytes(serialized)
        if data.isascii() or _body(data).isascii():
            return None
    return _walk(command, "")


def _body(serialized: bytes) -> bytes:
    """``serialized`` past its leading type field and the body's tag and length: varints,
    never text, and the tag of a body numbered 16 or more (LOOKUP's, say) is above 0x7F.
    Anything laid out otherwise is returned whole (a walk at worst)."""
    end = len(serialized)
    if serialized[:1] != b"\x08":  # the type field (1, varint) first, as encoders write it
        return serialized
    kind, at = walk_varint(serialized, 1, end, ANY_VARINT)
    tag, at = walk_varint(serialized, at, end, ANY_VARINT) if kind >= 0 else (-1, 0)
    if tag < 0 or tag & 7 != 2:  # the body is length-delimited
        return serialized
    length, at = walk_varint(serialized, at, end, ANY_VARINT)
    return serialized[at:] if length >= 0 else serialized


def _walk(message: Message, prefix: str) -> str | None:
    for field, value in message.ListFields():
        if field.type == _STRING:
            values = value if field.is_repeated else (value,)
            if any(not isinstance(v, str) for v in values):
                return prefix + field.name
        elif (
            field.type == _MESSAGE
            and field.message_type is not None
            and _HOLDS_TEXT.get(field.message_type.full_name)
        ):
            children = value if field.is_repeated else (value,)
            for child in children:
                found = _walk(child, f"{prefix}{field.name}.")
                if found is not None:
                    return found
    return None
