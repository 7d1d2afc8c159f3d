"""Commands of the topic operations that brokerlet's protocol schema does not model.

``CommandReachedEndOfTopic`` (BaseCommand field 27, ``reachedEndOfTopic``) has one field,
``consumer_id`` (1). It is added to the command as encoded protobuf bytes, which the
generated class keeps as an unknown field and writes back out, so the codec stays as it is.
"""

from __future__ import annotations

from brokerlet.transport.protocol import pb

__all__ = ["knows_end_of_topic", "reached_end_of_topic"]

REACHED_END_OF_TOPIC_VERSION = 9  # ProtocolVersion.v9 added the command
CPP_CLIENT_PREFIX = "Pulsar-CPP-"


def knows_end_of_topic(protocol_version: int, client_version: str) -> bool:
    """Whether a client can take REACHED_END_OF_TOPIC.

    Pulsar's Consumer#reachedEndOfTopic sends it to clients of protocol v9 or later. The C++
    client (and the Python client built on it; CONNECT says ``Pulsar-CPP-v4.2.0``) announces
    v20 but its ClientConnection has no case for the command: the ``default`` branch logs
    "Received invalid message from server" and closes the connection, and the consumer's
    reconnect would be told again, for ever. So it is never sent to that client.
    """
    if protocol_version < REACHED_END_OF_TOPIC_VERSION:
        return False
    return not client_version.startswith(CPP_CLIENT_PREFIX)


_REACHED_END_OF_TOPIC_FIELD = 27


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def reached_end_of_topic(consumer_id: int) -> pb.BaseCommand:
    inner = b"\x08" + _varint(consumer_id)
    field = _varint((_REACHED_END_OF_TOPIC_FIELD << 3) | 2) + _varint(len(inner)) + inner
    command = pb.BaseCommand(type=pb.BaseCommand.REACHED_END_OF_TOPIC)
    command.MergeFromString(field)
    return command
