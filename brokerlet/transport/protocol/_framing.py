"""Frame decoding and generic frame encoding.

A frame is::

    [total_size u32 BE][command_size u32 BE][BaseCommand][payload section...]

where ``total_size`` counts everything after itself and only SEND and MESSAGE carry a
payload section. The decoder is sans-IO in the h11 style: the caller feeds it whatever
bytes arrived and gets back complete frames.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from google.protobuf.message import DecodeError, Message

from brokerlet.transport.protocol import pulsar_pb2 as pb
from brokerlet.transport.protocol._errors import ProtocolError
from brokerlet.transport.protocol._fast import AckFields, SendFields, decode_ack, decode_send
from brokerlet.transport.protocol._payload import (
    COMPILED,
    MAGIC_CRC32C,
    read_u32,
    split_checksummed,
    varint_field,
)
from brokerlet.transport.protocol._proto import merge_from, missing_fields
from brokerlet.transport.protocol._text import invalid_text_field

__all__ = [
    "PROTOCOL_VERSION",
    "Frame",
    "FrameDecoder",
    "command_body",
    "command_name",
    "encode_command",
    "encode_payload_command",
]

PROTOCOL_VERSION = 20
"""The Pulsar protocol version brokerlet speaks (adds TOPIC_MIGRATED; we never send it)."""

_U32: Final = struct.Struct(">I")
_FRAME_HEADER: Final = struct.Struct(">II")
_CHECKSUM_HEADER: Final = struct.Struct(">HI")

# An incomplete frame larger than this is collected read by read (FrameDecoder.feed).
_COLLECT_FROM: Final = 64 * 1024

_SEND: Final = pb.BaseCommand.SEND
_ACK: Final = pb.BaseCommand.ACK
# From source, protobuf and a loop over its objects beat a walk in bytecode.
_FAST_ACK: Final = COMPILED
_MESSAGE: Final = pb.BaseCommand.MESSAGE
_PAYLOAD_TYPES: Final = frozenset((_SEND, _MESSAGE))
_KNOWN_TYPES: Final = frozenset(pb.BaseCommand.Type.values())

# Type value -> name of its body field, for the types our schema declares a body for.
# The schema keeps body field numbers equal to type values, so the descriptor is the table.
_BODY_FIELDS: dict[int, str] = {
    field.number: field.name
    for field in pb.BaseCommand.DESCRIPTOR.fields
    if field.number in _KNOWN_TYPES
}


def command_name(type_value: int) -> str:
    """Name of a command type for logs, e.g. ``"SEND"``; ``"UNKNOWN(99)"`` if undefined."""
    if type_value in _KNOWN_TYPES:
        return pb.BaseCommand.Type.Name(type_value)  # type: ignore[arg-type]
    return f"UNKNOWN({type_value})"


def command_body(command: pb.BaseCommand) -> Message | None:
    """The body of a command (``command.producer`` for PRODUCER), or None if it has none."""
    name = _BODY_FIELDS.get(command.type)
    if name is None:
        return None
    body: Message = getattr(command, name)
    return body


class Frame:
    """One decoded frame.

    Attributes:
        type: The command's type (a ``pb.BaseCommand.Type`` value).
        payload: The raw payload section (see ``decode_payload``) for SEND and MESSAGE;
            None for every other command.
        section: For a SEND the fast decoder took, its payload section already split, as
            a plain `PayloadFields` tuple (the fields ``decode_payload(payload)`` returns)
            when it has the usual layout; else None. ``payload`` is then rebuilt only if
            it is read.
        send: For a SEND, the fields the broker acts on (a plain `SendFields` tuple); None
            for every other command.
        ack: For an ACK of whole entries that the fast decoder took (compiled only), the
            fields the broker acts on; else None, and ``command`` is the ACK.
        invalid_text: The path of a string field that is not valid UTF-8 (for example
            ``producer.topic``), or None; the receiver refuses such a command.
    """

    __slots__ = ("_command", "_payload", "_raw", "ack", "invalid_text", "section", "send", "type")

    def __init__(
        self,
        command: pb.BaseCommand,
        payload: bytes | None,
        invalid_text: str | None = None,
        type_value: int | None = None,
    ) -> None:
        """A frame of an already decoded command (``type_value``: its type, if read already)."""
        self._command: pb.BaseCommand | None = command
        self._raw = b""
        self.type: int = command.type if type_value is None else type_value
        self._payload = payload
        # Tuples of any length, not `PayloadFields` and `SendFields`: compiled, a reader then
        # takes their items as the objects they are, where a fixed-length tuple type would be
        # unboxed into a C struct and its ints boxed again where they are stored (the SEND's
        # append item, producers/appends.py).
        self.section: tuple[Any, ...] | None = None
        self.invalid_text = invalid_text
        self.send: tuple[Any, ...] | None = None
        self.ack: AckFields | None = None
        if self.type == _SEND:
            send = command.send
            highest = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
            self.send = (send.producer_id, send.sequence_id, send.num_messages, highest)

    @property
    def payload(self) -> bytes | None:
        payload = self._payload
        if payload is None and self.section is not None:
            # Only the checksum layout is split early, so it is the section's exact bytes.
            entry, checksum, _ = self.section
            payload = self._payload = _CHECKSUM_HEADER.pack(MAGIC_CRC32C, checksum) + entry
        return payload

    @property
    def command(self) -> pb.BaseCommand:
        """The command, with its required fields and its body present."""
        command = self._command
        if command is None:
            # decode_send accepted these bytes, so protobuf parses them completely.
            command = self._command = pb.BaseCommand.FromString(self._raw)
        return command

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (
            self.payload == other.payload
            and self.invalid_text == other.invalid_text
            and self.command == other.command
        )

    __hash__ = None  # type: ignore[assignment]  # mutable protobuf inside, as before

    def __repr__(self) -> str:
        return (
            f"Frame(command={self.command!r}, payload={self.payload!r}, "
            f"invalid_text={self.invalid_text!r})"
        )


class _SendFrame(Frame):
    """A SEND that `decode_send` took: its protobuf object is built only if asked for."""

    __slots__ = ()

    def __init__(self, raw: bytes, send: SendFields | None) -> None:
        """``send``: what `decode_send` made of ``raw``; None, declined (the frame is dropped).
        The payload (``section`` or ``payload``) is set by the decoder if it is kept."""
        self._command = None
        self._raw = raw
        self.type = _SEND
        self._payload = None
        self.section = None
        self.send = send
        self.ack = None
        self.invalid_text = None  # SEND's strings are never read (see _text.SKIPPED_TYPES)


class _AckFrame(Frame):
    """An ACK that `decode_ack` took: its protobuf object is built only if asked for."""

    __slots__ = ()

    def __init__(self, raw: bytes, ack: AckFields) -> None:
        self._command = None
        self._raw = raw
        self.type = _ACK
        self._payload = None
        self.section = None
        self.send = None
        self.ack = ack
        self.invalid_text = None  # what it took holds no string


class FrameDecoder:
    """Turns a byte stream into frames.

    After a ProtocolError the decoder is broken for good: the stream has lost sync.
    Frames decoded earlier in the same ``feed`` call are dropped with it, which is
    harmless because the connection is about to be closed.
    """

    def __init__(self, max_frame_size: int) -> None:
        """Create a decoder.

        Args:
            max_frame_size: Largest ``total_size`` accepted. Callers add headroom for the
                command and metadata on top of the largest message they allow.
        """
        if max_frame_size < 4:
            raise ValueError(f"max_frame_size must be at least 4, got {max_frame_size}")
        self._max_frame_size = max_frame_size
        self._rest = b""  # the start of an incomplete frame, for the next feed
        # A large incomplete frame's reads (the first starts with its size), joined once it
        # is whole (see feed).
        self._chunks: list[bytes] = []
        self._collected = 0
        self._failure: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back because they do not yet form a complete frame."""
        return len(self._rest) + self._collected

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add received bytes and return every frame they complete.

        Args:
            data: The next bytes of the stream, in any chunking.

        Returns:
            Complete frames in stream order (possibly none).

        Raises:
            ProtocolError: The stream is malformed, or an earlier call already failed.
        """
        if self._failure is not None:
            raise ProtocolError(f"decoder already failed: {self._failure.reason}")
        # Decoded from bytes, indexed and sliced without views: a frame cut by the previous
        # read costs a copy of its start and this read. A large one would cost that at every
        # read it spans, so its reads are kept and joined once it is whole.
        if type(data) is not bytes:
            data = bytes(data)
        if self._chunks:
            self._chunks.append(data)
            self._collected += len(data)
            if self._collected < 4 + _U32.unpack_from(self._chunks[0])[0]:
                return []
            source = b"".join(self._chunks)
            self._chunks = []
            self._collected = 0
        else:
            source = self._rest + data if self._rest else data
        try:
            frames, consumed = self._decode_frames(source)
        except ProtocolError as exc:
            self._failure = exc
            self._rest = b""
            raise
        rest = source[consumed:] if consumed < len(source) else b""
        # _decode_frames stops at a frame it has the size of, and checked that size.
        if len(rest) >= 4 and 4 + _U32.unpack_from(rest)[0] > _COLLECT_FROM:
            self._chunks = [rest]
            self._collected = len(rest)
            rest = b""
        self._rest = rest
        return frames

    def eof(self) -> None:
        """Signal the end of the stream.

        Raises:
            ProtocolError: The stream ended inside a frame.
        """
        if self.buffered:
            raise ProtocolError(
                f"connection closed inside a frame ({self.buffered} bytes buffered)"
            )

    def _decode_frames(self, source: bytes) -> tuple[list[Frame], int]:
        """Decode all complete frames in ``source``; return them and the bytes used."""
        frames: list[Frame] = []
        end = len(source)
        offset = 0
        limit = self._max_frame_size
        unpack_u32 = _U32.unpack_from
        unpack_sizes = _FRAME_HEADER.unpack_from
        command_size = 0
        while end - offset >= 4:
            if COMPILED:
                total_size = read_u32(source, offset)
                if end - offset >= 8:
                    command_size = read_u32(source, offset + 4)
            elif end - offset >= 8:
                total_size, command_size = unpack_sizes(source, offset)  # both in one call
            else:
                total_size = unpack_u32(source, offset)[0]
            if total_size > limit:
                raise ProtocolError(f"frame of {total_size} bytes exceeds the limit of {limit}")
            if total_size < 4:
                raise ProtocolError(f"frame size {total_size} is too small to hold a command size")
            frame_end = offset + 4 + total_size
            if frame_end > end:
                break  # else the frame is whole, so its header was, and command_size is read
            if command_size + 4 > total_size:
                raise ProtocolError(
                    f"command of {command_size} bytes does not fit in a frame of {total_size} bytes"
                )
            command_end = offset + 8 + command_size
            if command_size > 3 and source[offset + 9] == _SEND and source[offset + 8] == 8:
                # Most likely a SEND (type is field 1, a varint): try the fast decoder.
                raw = source[offset + 8 : command_end]
                # Checked on the frame, not on a local: compiled, a local narrowed to the
                # tuple type is unpacked and built again (docs/performance.md, 24th pass).
                frame = _SendFrame(raw, decode_send(raw))
                if frame.send is not None:
                    # The entry is copied out of the buffer once, not via the section.
                    section = frame.section = split_checksummed(source, command_end, frame_end)
                    if section is None:
                        frame._payload = source[command_end:frame_end]
                    frames.append(frame)
                    offset = frame_end
                    continue
            serialized = source[offset + 8 : command_end]
            if (
                _FAST_ACK
                and command_size > 3
                and command_end == frame_end
                and source[offset + 9] == _ACK
            ):
                ack = decode_ack(serialized)  # a consumer's acks: one id per message
                if ack is not None:
                    frames.append(_AckFrame(serialized, ack))
                    offset = frame_end
                    continue
            command, type_value = _decode_command(serialized)
            if type_value in _PAYLOAD_TYPES:
                payload = source[command_end:frame_end]
            elif command_end != frame_end:
                raise ProtocolError(
                    f"{frame_end - command_end} unexpected bytes after a "
                    f"{command_name(type_value)} command"
                )
            else:
                payload = None
            invalid_text = invalid_text_field(command, type_value, serialized)
            frames.append(Frame(command, payload, invalid_text, type_value))
            offset = frame_end
        return frames, offset


def _decode_command(data: bytes) -> tuple[pb.BaseCommand, int]:
    """Parse and validate one BaseCommand; return it and its type.

    Every protobuf attribute read costs as much as a few lines of Python here, so each is
    read once: ``type`` is required, so one ``IsInitialized`` also says it is present.
    """
    command = pb.BaseCommand()
    try:
        # MergeFromString rather than FromString: it leaves required-field checking to
        # us, so the error can name the missing fields.
        merge_from(command, data)
    except DecodeError as exc:
        peeked = _peek_type(data)
        if peeked is not None and peeked not in _KNOWN_TYPES:
            raise ProtocolError(f"unknown command type {peeked}") from None
        what = command_name(peeked) if peeked is not None else "untyped"
        raise ProtocolError(f"undecodable {what} command: {exc}") from None
    if not command.IsInitialized():
        if not command.HasField("type"):
            # proto2 keeps an undefined enum value as an unknown field, so look ourselves.
            peeked = _peek_type(data)
            if peeked is None:
                raise ProtocolError("command has no type")
            raise ProtocolError(f"unknown command type {peeked}")
        missing = missing_fields(command)
        raise ProtocolError(
            f"{command_name(command.type)} command is missing required fields: {missing}"
        )
    type_value: int = command.type
    body = _BODY_FIELDS.get(type_value)
    # The stubs type HasField's argument as a Literal of field names; ours come from the
    # descriptor, so they are valid by construction.
    if body is not None and not command.HasField(body):  # type: ignore[arg-type]
        raise ProtocolError(f"{command_name(type_value)} without its body")
    return command, type_value


def _peek_type(data: bytes) -> int | None:
    """Find the raw value of field 1 (``type``) in a serialised BaseCommand."""
    return varint_field(data, 1)


def encode_command(command: pb.BaseCommand) -> bytes:
    """Frame a command that carries no payload.

    Args:
        command: A complete command.

    Returns:
        The frame, ready to write.

    Raises:
        google.protobuf.message.EncodeError: A required field is missing (a bug in the
            caller: the official client would drop the connection over it).
    """
    body = command.SerializeToString()
    return _FRAME_HEADER.pack(len(body) + 4, len(body)) + body


PING_FRAME = encode_command(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing()))
"""The keep-alive PING, framed once: it never varies."""

PONG_FRAME = encode_command(pb.BaseCommand(type=pb.BaseCommand.PONG, pong=pb.CommandPong()))
"""The answer to every PING, framed once (building it per PING was a tenth of a PING's broker
CPU)."""


def encode_payload_command(command: pb.BaseCommand, entry: bytes, checksum: int | None) -> bytes:
    """Frame a SEND or MESSAGE with its payload section.

    Args:
        command: A complete SEND or MESSAGE command.
        entry: ``[metadata_size u32][MessageMetadata][payload]``.
        checksum: CRC-32C of ``entry`` to send after the 0x0e01 magic, or None to send
            no checksum at all.

    Returns:
        The frame, ready to write.

    Raises:
        ValueError: The command is not SEND or MESSAGE.
        google.protobuf.message.EncodeError: A required field is missing.
    """
    if command.type not in _PAYLOAD_TYPES:
        raise ValueError(f"{command_name(command.type)} carries no payload")
    body = command.SerializeToString()
    if checksum is None:
        header = _FRAME_HEADER.pack(4 + len(body) + len(entry), len(body))
        return b"".join((header, body, entry))
    header = _FRAME_HEADER.pack(10 + len(body) + len(entry), len(body))
    return b"".join((header, body, _CHECKSUM_HEADER.pack(MAGIC_CRC32C, checksum), entry))
