"""The registry as the binary protocol meets it: PRODUCER, SUBSCRIBE, GET_SCHEMA, GET_OR_CREATE.

Each function takes the decoded command and answers in Pulsar's terms, so the connection
actor only forwards. Schema refusals are ``IncompatibleSchema`` on the wire, as Pulsar's
``BrokerServiceException.getClientErrorCode`` maps schema exceptions.
"""

from __future__ import annotations

from collections.abc import Callable

from brokerlet.schema.record import (
    SchemaError,
    SchemaNotFoundError,
    SchemaRecord,
    decode_version,
    encode_version,
)
from brokerlet.schema.registry import SchemaRegistry, schema_id
from brokerlet.schema.types import SchemaType, UnknownSchemaTypeError, from_wire, to_wire
from brokerlet.transport.protocol import pb

__all__ = [
    "admit_consumer",
    "admit_producer",
    "answer_get_or_create_schema",
    "answer_get_schema",
    "record_from_wire",
]


def record_from_wire(schema: pb.Schema) -> SchemaRecord | None:
    """The registry record of a command's schema; None for type None (bytes, no schema).

    Raises:
        SchemaError: the type value is one brokerlet does not know.
    """
    try:
        kind = from_wire(schema.type)
    except UnknownSchemaTypeError:
        raise SchemaError(
            f"Unknown schema type value {schema.type} in schema {schema.name!r}: brokerlet "
            "knows the types of Pulsar's protocol up to External (22)"
        ) from None
    if kind is SchemaType.NONE:
        return None
    return SchemaRecord(kind, schema.schema_data, {p.key: p.value for p in schema.properties})


def record_to_wire(name: str, record: SchemaRecord) -> pb.Schema:
    schema = pb.Schema(name=name, schema_data=record.data, type=to_wire(record.type))
    for key, value in sorted(record.properties.items()):
        schema.properties.add(key=key, value=value)
    return schema


def admit_producer(registry: SchemaRegistry, request: pb.CommandProducer) -> bytes | None:
    """The PRODUCER_SUCCESS ``schema_version`` for this producer, None without a schema.

    Raises:
        SchemaError: refuse the producer with IncompatibleSchema and this message.
    """
    record = record_from_wire(request.schema) if request.HasField("schema") else None
    version = registry.admit_producer(request.topic, record)
    return None if version is None else encode_version(version)


def admit_consumer(
    registry: SchemaRegistry, request: pb.CommandSubscribe, topic_idle: Callable[[], bool]
) -> None:
    """Check a SUBSCRIBE's schema (registering it on an idle topic without one).

    Raises:
        SchemaError: refuse the consumer with IncompatibleSchema and this message.
    """
    if request.HasField("schema"):
        registry.admit_consumer(request.topic, record_from_wire(request.schema), topic_idle)


def answer_get_schema(
    registry: SchemaRegistry, request: pb.CommandGetSchema
) -> pb.CommandGetSchemaResponse:
    """GET_SCHEMA: the latest or the asked version; TopicNotFound when there is none."""
    response = pb.CommandGetSchemaResponse(request_id=request.request_id)
    try:
        key = schema_id(request.topic)
    except ValueError as error:
        response.error_code = pb.InvalidTopicName
        response.error_message = str(error)
        return response
    version: int | None = None
    if request.HasField("schema_version"):
        if not request.schema_version:
            response.error_code = pb.IncompatibleSchema
            response.error_message = "Empty schema version"
            return response
        try:
            version = decode_version(request.schema_version)
        except SchemaNotFoundError as error:
            response.error_code = pb.UnknownError
            response.error_message = str(error)
            return response
    stored = registry.get(request.topic, version)
    if stored is None:
        response.error_code = pb.TopicNotFound
        response.error_message = f"Topic not found or no-schema {request.topic}"
        return response
    response.schema.CopyFrom(record_to_wire(key, stored.record))
    response.schema_version = encode_version(stored.version)
    return response


def answer_get_or_create_schema(
    registry: SchemaRegistry, request: pb.CommandGetOrCreateSchema, topic_exists: bool
) -> pb.CommandGetOrCreateSchemaResponse:
    """GET_OR_CREATE_SCHEMA: a producer's admission without the producer."""
    response = pb.CommandGetOrCreateSchemaResponse(request_id=request.request_id)
    if not topic_exists:
        response.error_code = pb.TopicNotFound
        response.error_message = f"Topic not found {request.topic}"
        return response
    try:
        version = registry.admit_producer(request.topic, record_from_wire(request.schema))
    except SchemaError as error:
        response.error_code = pb.IncompatibleSchema
        response.error_message = str(error)
        return response
    response.schema_version = b"" if version is None else encode_version(version)
    return response
