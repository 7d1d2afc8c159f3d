"""Is a definition well formed for its type? (Pulsar's SchemaDataValidator family.)

Every schema is validated before it is compared or stored, so a malformed one is refused
with a reason and nothing is registered.
"""

from __future__ import annotations

import base64
import binascii
import json

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from brokerlet.schema import keyvalue
from brokerlet.schema.avro_rules import try_parse_avro
from brokerlet.schema.record import InvalidSchemaError, SchemaRecord
from brokerlet.schema.types import CLIENT_SIDE_TYPES, PRIMITIVE_TYPES, SchemaType

__all__ = ["protobuf_native_root", "validate"]


def validate(record: SchemaRecord, max_size: int) -> None:
    """Check ``record``'s definition.

    Args:
        record: the schema to check.
        max_size: the largest definition accepted, in bytes.

    Raises:
        InvalidSchemaError: naming the type and what is wrong.
    """
    if len(record.data) > max_size:
        raise InvalidSchemaError(
            f"{record.type.name} schema definition of {len(record.data)} bytes exceeds the "
            f"limit of {max_size} bytes (schema_max_size_bytes)"
        )
    _validate(record)


def _validate(record: SchemaRecord) -> None:
    kind = record.type
    if kind in (SchemaType.AVRO, SchemaType.JSON, SchemaType.PROTOBUF):
        schema, why = try_parse_avro(record.data)
        if schema is None and not (kind is SchemaType.JSON and _is_json_object(record.data)):
            raise InvalidSchemaError(
                f"Invalid schema definition data for {kind.name} schema: {why}"
            )
    elif kind is SchemaType.PROTOBUF_NATIVE:
        protobuf_native_root(record.data)
    elif kind in PRIMITIVE_TYPES:
        if record.data:
            raise InvalidSchemaError(
                f"Invalid schema definition data for primitive schemas: length of schema data "
                f"should be zero, but {len(record.data)} bytes is found ({kind.name})"
            )
    elif kind in CLIENT_SIDE_TYPES:
        raise InvalidSchemaError(f"Schema {kind.name} is a client-side schema type")
    elif kind is SchemaType.KEY_VALUE:
        key, value = keyvalue.decode_halves(record)
        for which, half in (("key", key), ("value", value)):
            if half.type is SchemaType.KEY_VALUE:
                raise InvalidSchemaError(f"KEY_VALUE {which} schema may not be a KEY_VALUE")
            try:
                _validate(half)
            except InvalidSchemaError as error:
                raise InvalidSchemaError(f"KEY_VALUE {which} schema: {error}") from None
    # STRING, NONE, BYTES and EXTERNAL carry free-form data (the Python client sends "null").


def _is_json_object(data: bytes) -> bool:
    """The pre-Avro JSON schema format (a Jackson JsonSchema document) is a JSON object."""
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False


def protobuf_native_root(data: bytes) -> str:
    """The root message's full name of a PROTOBUF_NATIVE definition.

    The definition is a JSON document ``{"fileDescriptorSet": base64 FileDescriptorSet,
    "rootMessageTypeName": "pkg.Msg", "rootFileDescriptorName": "file.proto"}``.

    Raises:
        InvalidSchemaError: the document, the descriptors or the root are malformed.
    """
    what = "Invalid schema definition data for PROTOBUF_NATIVE schema"
    try:
        document = json.loads(data)
    except ValueError as error:
        raise InvalidSchemaError(f"{what}: not JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidSchemaError(f"{what}: not a JSON object")
    encoded, root, root_file = (
        document.get("fileDescriptorSet"),
        document.get("rootMessageTypeName"),
        document.get("rootFileDescriptorName"),
    )
    if not all(isinstance(v, str) and v for v in (encoded, root, root_file)):
        raise InvalidSchemaError(
            f"{what}: fileDescriptorSet, rootMessageTypeName and rootFileDescriptorName "
            "must be non-empty strings"
        )
    assert isinstance(encoded, str)
    assert isinstance(root, str)
    try:
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(
            base64.b64decode(encoded, validate=True)
        )
    except (binascii.Error, ValueError, DecodeError) as error:
        raise InvalidSchemaError(f"{what}: fileDescriptorSet does not decode: {error}") from None
    for file in descriptors.file:
        if file.name != root_file:
            continue
        prefix = f"{file.package}." if file.package else ""
        if any(prefix + message.name == root for message in file.message_type):
            return root
        raise InvalidSchemaError(f"{what}: {root_file} has no message {root}")
    raise InvalidSchemaError(f"{what}: no file {root_file} in fileDescriptorSet")
