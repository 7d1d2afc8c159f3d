"""Typed wrappers for the two protobuf calls whose stubs are narrower than the runtime."""

from __future__ import annotations

from google.protobuf.message import Message

__all__ = ["merge_from", "missing_fields"]


def merge_from(message: Message, data: bytes | memoryview) -> None:
    """Parse ``data`` into ``message`` without checking required fields.

    The runtime accepts any buffer; the stubs say bytes. A memoryview slice saves copying
    the bytes out of a larger buffer (an entry's metadata).

    Raises:
        google.protobuf.message.DecodeError: The bytes are not valid protobuf.
    """
    message.MergeFromString(data)  # type: ignore[arg-type]  # (typing.cast is a call)


def missing_fields(message: Message) -> str:
    """Comma-separated paths of the required fields ``message`` lacks, e.g. ``send.sequence_id``."""
    errors: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
    return ", ".join(errors)
