"""KEY_VALUE schemas: two schemas in one, encoded as Pulsar's KeyValueSchemaInfo does.

The definition is ``[key length i32 BE][key definition][value length i32 BE][value
definition]`` (length -1 means an absent half); each half's name, type (Java name) and
properties (a JSON object) travel in the parent's properties under ``key.schema.name``,
``key.schema.type``, ``key.schema.properties`` and the ``value.`` equivalents, with
``kv.encoding.type`` INLINE or SEPARATED. A half with no type property is BYTES.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

from brokerlet.schema.record import InvalidSchemaError, SchemaRecord
from brokerlet.schema.types import PRIMITIVE_TYPES, SchemaType, UnknownSchemaTypeError, parse_type

__all__ = ["decode_halves", "encode_halves", "from_rest_data", "to_rest_data"]

_LENGTH = struct.Struct(">i")
_ENCODINGS = ("INLINE", "SEPARATED")


def _split(data: bytes) -> tuple[bytes, bytes]:
    halves: list[bytes] = []
    offset = 0
    for which in ("key", "value"):
        if len(data) - offset < _LENGTH.size:
            raise InvalidSchemaError(
                f"KEY_VALUE schema data ends before the {which} schema's length"
            )
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if length == -1:
            length = 0
        if length < 0 or offset + length > len(data):
            raise InvalidSchemaError(
                f"KEY_VALUE schema data: the {which} schema's length {length} does not fit "
                f"in {len(data)} bytes"
            )
        halves.append(data[offset : offset + length])
        offset += length
    if offset != len(data):
        raise InvalidSchemaError(
            f"KEY_VALUE schema data has {len(data) - offset} bytes after the value schema"
        )
    return halves[0], halves[1]


def _half(which: str, data: bytes, properties: Mapping[str, str]) -> SchemaRecord:
    type_name = properties.get(f"{which}.schema.type") or "BYTES"
    try:
        schema_type = parse_type(type_name)
    except UnknownSchemaTypeError as error:
        raise InvalidSchemaError(f"KEY_VALUE {which} schema: {error}") from None
    raw = properties.get(f"{which}.schema.properties") or ""
    half_properties: dict[str, str] = {}
    if raw:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise InvalidSchemaError(
                f"KEY_VALUE {which} schema: {which}.schema.properties is not a JSON object"
            )
        half_properties = {str(k): str(v) for k, v in parsed.items()}
    return SchemaRecord(schema_type, data, half_properties)


def decode_halves(record: SchemaRecord) -> tuple[SchemaRecord, SchemaRecord]:
    """The key and value schemas of a KEY_VALUE record.

    Raises:
        InvalidSchemaError: the data or the properties are malformed.
    """
    encoding = record.properties.get("kv.encoding.type") or "INLINE"
    if encoding not in _ENCODINGS:
        raise InvalidSchemaError(
            f"KEY_VALUE schema: kv.encoding.type {encoding!r} is not INLINE or SEPARATED"
        )
    key_data, value_data = _split(record.data)
    return (
        _half("key", key_data, record.properties),
        _half("value", value_data, record.properties),
    )


def encode_halves(key: SchemaRecord, value: SchemaRecord, encoding: str = "INLINE") -> SchemaRecord:
    """One KEY_VALUE record from its halves (what a client's KeyValueSchema sends)."""
    data = b"".join(
        (_LENGTH.pack(len(key.data)), key.data, _LENGTH.pack(len(value.data)), value.data)
    )
    properties: dict[str, str] = {"kv.encoding.type": encoding}
    for which, half in (("key", key), ("value", value)):
        properties[f"{which}.schema.name"] = ""
        properties[f"{which}.schema.type"] = half.type.name
        properties[f"{which}.schema.properties"] = json.dumps(dict(half.properties))
    return SchemaRecord(SchemaType.KEY_VALUE, data, properties)


def _rest_half(half: SchemaRecord) -> object:
    if half.type in PRIMITIVE_TYPES or half.type in (SchemaType.STRING, SchemaType.BYTES):
        return ""
    try:
        return json.loads(half.data)
    except ValueError:
        return half.data.decode("utf-8", "replace")


def to_rest_data(record: SchemaRecord) -> str:
    """The admin API's ``data`` of a KEY_VALUE schema: ``{"key": ..., "value": ...}``."""
    key, value = decode_halves(record)
    return json.dumps({"key": _rest_half(key), "value": _rest_half(value)})


def from_rest_data(schema: str) -> bytes:
    """The stored definition of a KEY_VALUE schema posted as ``{"key": ..., "value": ...}``.

    Raises:
        InvalidSchemaError: not a JSON object with ``key`` and ``value``.
    """
    try:
        document = json.loads(schema)
    except ValueError as error:
        raise InvalidSchemaError(f"KEY_VALUE schema is not JSON: {error}") from None
    if not isinstance(document, dict) or "key" not in document or "value" not in document:
        raise InvalidSchemaError(
            'KEY_VALUE schema must be a JSON object {"key": ..., "value": ...}'
        )
    parts = []
    for which in ("key", "value"):
        half = document[which]
        encoded = b"" if half == "" else json.dumps(half).encode()
        parts.append(_LENGTH.pack(len(encoded)) + encoded)
    return b"".join(parts)
