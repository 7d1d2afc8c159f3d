"""A stored schema, its hash, its version encoding, and the registry's errors."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from brokerlet.schema.types import SchemaType

__all__ = [
    "IncompatibleSchemaError",
    "InvalidSchemaError",
    "SchemaError",
    "SchemaNotFoundError",
    "SchemaRecord",
    "StoredSchema",
    "decode_version",
    "encode_version",
]

_VERSION = struct.Struct(">q")


class SchemaError(Exception):
    """A schema was refused; the message names the problem."""


class IncompatibleSchemaError(SchemaError):
    """The schema breaks the compatibility strategy (Pulsar's IncompatibleSchemaException)."""


class InvalidSchemaError(SchemaError):
    """The definition is malformed for its type (Pulsar's InvalidSchemaDataException)."""


class SchemaNotFoundError(SchemaError):
    """No schema (or no such version) for the topic."""


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """One schema as the registry keeps it.

    Attributes:
        type: its :class:`SchemaType`.
        data: the definition bytes as the client sent them (Avro JSON, a protobuf
            descriptor document, a KEY_VALUE's two halves, or empty for primitives).
        properties: the schema's properties.
        timestamp_ms: when it was registered (ms since the epoch).
        deleted: a deletion marker: versions before it no longer count.
    """

    type: SchemaType
    data: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    timestamp_ms: int = 0
    deleted: bool = False

    @property
    def digest(self) -> bytes:
        """SHA-256 of the definition, as Pulsar's SchemaHash computes it."""
        return hashlib.sha256(self.data).digest()

    def same_hash(self, other: SchemaRecord) -> bool:
        """Pulsar's SchemaHash equality: same type and same definition bytes."""
        return self.type == other.type and self.data == other.data


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """A record at its version (versions count from 0, one per put, markers included)."""

    version: int
    record: SchemaRecord


def encode_version(version: int) -> bytes:
    """The wire form of a version: an 8-byte big-endian signed long."""
    return _VERSION.pack(version)


def decode_version(data: bytes) -> int:
    """The version an 8-byte ``schema_version`` names.

    Raises:
        SchemaNotFoundError: not 8 bytes.
    """
    if len(data) != _VERSION.size:
        raise SchemaNotFoundError(f"schema version must be 8 bytes, got {len(data)}")
    (version,) = _VERSION.unpack(data)
    return int(version)
