"""``/admin/v2/schemas/{tenant}/{namespace}/{topic}/...``: Pulsar's SchemasResource.

Shapes and status codes are Pulsar's: GetSchemaResponse ``{"version", "type", "timestamp",
"data", "properties"}``; an upload answers 202 ``{"version": {"version": n}}`` (Pulsar's
PostSchemaResponse holding a LongSchemaVersion), 409 when incompatible, 422 when the
definition is malformed; ``/compatibility`` answers 202 ``{"isCompatibility", "
schemaCompatibilityStrategy"}``. A partition's name reaches its parent's schema.
"""

from __future__ import annotations

from typing import Any

from brokerlet.admin.rest import (
    AdminRequest,
    Reply,
    RestError,
    Route,
    optional_field,
    require_field,
)
from brokerlet.schema import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    SchemaError,
    SchemaNotFoundError,
    SchemaRecord,
    SchemaRegistry,
    SchemaType,
    StoredSchema,
    UnknownSchemaTypeError,
    keyvalue,
    parse_type,
)

__all__ = ["get_schema_response", "routes"]

_BASE = "/admin/v2/schemas/<seg:tenant>/<seg:namespace>/<seg:topic>"


def routes() -> list[Route]:
    # Auth as SchemasResourceBase: reads are TopicOperation.GET_METADATA (a lookup: produce
    # or consume), an upload is PRODUCE, deleting and the compatibility check need the
    # tenant's admin.
    return [
        Route(f"{_BASE}/schema", ("GET",), _get_latest, auth="lookup"),
        Route(f"{_BASE}/schema/<seg:version>", ("GET",), _get_version, auth="lookup"),
        Route(f"{_BASE}/schemas", ("GET",), _get_all, auth="lookup"),
        Route(f"{_BASE}/schema", ("POST",), _post, auth="produce"),
        Route(f"{_BASE}/schema", ("DELETE",), _delete, auth="tenant"),
        Route(f"{_BASE}/compatibility", ("POST",), _compatibility, auth="tenant"),
        Route(f"{_BASE}/version", ("POST",), _version, auth="lookup"),
    ]


def _registry(request: AdminRequest) -> SchemaRegistry:
    registry = getattr(request.context, "schemas", None)
    if registry is None:
        raise RestError(503, "This broker has no schema registry")
    return registry  # type: ignore[no-any-return]


def _topic(tenant: str, namespace: str, topic: str) -> str:
    return f"persistent://{tenant}/{namespace}/{topic}"


def get_schema_response(stored: StoredSchema) -> dict[str, Any]:
    """Pulsar's GetSchemaResponse for one version."""
    record = stored.record
    if record.type is SchemaType.KEY_VALUE:
        data = keyvalue.to_rest_data(record)
    else:
        data = record.data.decode("utf-8", "replace")
    return {
        "version": stored.version,
        "type": record.type.name,
        "timestamp": record.timestamp_ms,
        "data": data,
        "properties": dict(record.properties),
    }


def _get_latest(request: AdminRequest, tenant: str, namespace: str, topic: str) -> object:
    stored = _registry(request).get(_topic(tenant, namespace, topic))
    if stored is None:
        raise RestError(404, "Schema not found")
    return get_schema_response(stored)


def _get_version(
    request: AdminRequest, tenant: str, namespace: str, topic: str, version: str
) -> object:
    try:
        number = int(version)
    except ValueError:
        raise RestError(400, f"Invalid schema version {version!r}: not a number") from None
    stored = _registry(request).get(_topic(tenant, namespace, topic), number)
    if stored is None:
        raise RestError(404, "Schema not found")
    return get_schema_response(stored)


def _get_all(request: AdminRequest, tenant: str, namespace: str, topic: str) -> object:
    history = _registry(request).history(_topic(tenant, namespace, topic))
    if not history:
        raise RestError(404, "Schemas not found")
    return {"getSchemaResponses": [get_schema_response(s) for s in history]}


def _payload(request: AdminRequest) -> SchemaRecord:
    """A PostSchemaPayload ``{"type", "schema", "properties"}`` as a record."""
    body = request.json()
    type_name = require_field(body, "type", str)
    try:
        schema_type = parse_type(type_name)
    except UnknownSchemaTypeError as error:
        raise RestError(400, f"Field 'type': {error}") from None
    schema = optional_field(body, "schema", str, "")
    properties = optional_field(body, "properties", dict, {})
    if not all(isinstance(v, str) for v in properties.values()):
        raise RestError(400, "Field 'properties' must map strings to strings")
    try:
        if schema_type is SchemaType.KEY_VALUE:
            data = keyvalue.from_rest_data(schema)
        else:
            data = schema.encode()
    except InvalidSchemaError as error:
        raise RestError(422, str(error)) from None
    return SchemaRecord(schema_type, data, {str(k): v for k, v in properties.items()})


def _post(request: AdminRequest, tenant: str, namespace: str, topic: str) -> object:
    record = _payload(request)
    if record.type is SchemaType.BYTES:
        raise RestError(406, "Do not upload a BYTES schema, because it's the default schema type")
    try:
        version = _registry(request).put_if_absent(_topic(tenant, namespace, topic), record)
    except IncompatibleSchemaError as error:
        raise RestError(409, str(error)) from None
    except SchemaError as error:
        raise RestError(422, str(error)) from None
    return Reply(202, {"version": {"version": version}})


def _delete(request: AdminRequest, tenant: str, namespace: str, topic: str) -> object:
    registry = _registry(request)
    name = _topic(tenant, namespace, topic)
    if request.args.get("force", "false").lower() == "true":
        if not registry.history(name):
            raise RestError(404, "Schema not found")
        registry.delete_all(name)
        return {"version": -1}
    try:
        return {"version": registry.delete(name)}
    except SchemaNotFoundError:
        raise RestError(404, "Schema not found") from None


def _compatibility(request: AdminRequest, tenant: str, namespace: str, topic: str) -> object:
    registry = _registry(request)
    name = _topic(tenant, namespace, topic)
    record = _payload(request)
    strategy = registry.policies(name).compatibility
    try:
        registry.check_compatible(name, record, strategy)
        compatible = True
    except IncompatibleSchemaError:
        compatible = False
    except SchemaError as error:
        raise RestError(422, str(error)) from None
    return Reply(202, {"isCompatibility": compatible, "schemaCompatibilityStrategy": strategy.name})


def _version(request: AdminRequest, tenant: str, namespace: str, topic: str) -> object:
    record = _payload(request)
    version = _registry(request).find_version(_topic(tenant, namespace, topic), record)
    # Pulsar answers NO_SCHEMA_VERSION (-1) for a schema it does not have.
    return Reply(202, {"version": -1 if version is None else version})
