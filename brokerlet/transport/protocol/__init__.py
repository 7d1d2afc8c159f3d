"""brokerlet's sans-IO codec for the Pulsar binary protocol.

Nothing here does I/O or imports gevent or Pykka: bytes go in, commands and frames come
out. Commands are the generated protobuf classes in ``pb``::

    from brokerlet.transport.protocol import pb, encode_command

    frame = encode_command(pb.BaseCommand(
        type=pb.BaseCommand.CONNECTED,
        connected=pb.CommandConnected(server_version="brokerlet", protocol_version=20),
    ))
"""

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._batch import (
    Member,
    UnreadableBatchError,
    repack_entry,
    unpack_entry,
)
from brokerlet.transport.protocol._errors import ProtocolError
from brokerlet.transport.protocol._fast import (
    SendFields,
    decode_send,
    encode_ack,
    encode_flow,
    encode_lookup_connect,
    encode_message,
    encode_messages,
    encode_producer_success,
    encode_send,
    encode_send_receipt,
    encode_send_receipts,
    encode_success,
    encode_topic_partitions,
)
from brokerlet.transport.protocol._framing import (
    PING_FRAME,
    PONG_FRAME,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    command_body,
    command_name,
    encode_command,
    encode_payload_command,
)
from brokerlet.transport.protocol._payload import (
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    Payload,
    PayloadFields,
    build_entry,
    crc32c,
    decode_payload,
    encode_batch,
    metadata_problem,
    parse_metadata,
    plain_key,
    split_batch,
)
from brokerlet.transport.protocol._replies import (
    ConsumerStatsFigures,
    consumer_stats_request,
    encode_ack_response,
    encode_consumer_stats_response,
)
from brokerlet.transport.protocol._scan import (
    deliver_at_time,
    may_deliver_later,
    publish_time,
    sticky_key,
)

__all__ = [
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "PING_FRAME",
    "PONG_FRAME",
    "PROTOCOL_VERSION",
    "ConsumerStatsFigures",
    "Frame",
    "FrameDecoder",
    "Member",
    "Payload",
    "PayloadFields",
    "ProtocolError",
    "SendFields",
    "UnreadableBatchError",
    "build_entry",
    "command_body",
    "command_name",
    "consumer_stats_request",
    "crc32c",
    "decode_payload",
    "decode_send",
    "deliver_at_time",
    "encode_ack",
    "encode_ack_response",
    "encode_batch",
    "encode_command",
    "encode_consumer_stats_response",
    "encode_flow",
    "encode_lookup_connect",
    "encode_message",
    "encode_messages",
    "encode_payload_command",
    "encode_producer_success",
    "encode_send",
    "encode_send_receipt",
    "encode_send_receipts",
    "encode_success",
    "encode_topic_partitions",
    "may_deliver_later",
    "metadata_problem",
    "parse_metadata",
    "pb",
    "plain_key",
    "publish_time",
    "repack_entry",
    "split_batch",
    "sticky_key",
    "unpack_entry",
]
