"""Pulsar's schema registry: types, records, compatibility rules, storage and admission.

Runtime-free: nothing here imports gevent or Pykka. The connection actor asks a
:class:`SchemaRegistry` when a PRODUCER or SUBSCRIBE carries a schema and for GET_SCHEMA /
GET_OR_CREATE_SCHEMA; the admin API's schema routes use the same object.
"""

from brokerlet.schema.policies import SchemaPolicies, schema_policies
from brokerlet.schema.record import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    SchemaError,
    SchemaNotFoundError,
    SchemaRecord,
    StoredSchema,
    decode_version,
    encode_version,
)
from brokerlet.schema.registry import SchemaRegistry, schema_id
from brokerlet.schema.storage import (
    MemorySchemaStorage,
    SchemaStorage,
    SqlDatabase,
    TableSchemaStorage,
)
from brokerlet.schema.types import (
    SchemaType,
    Strategy,
    UnknownSchemaTypeError,
    from_wire,
    parse_strategy,
    parse_type,
    to_wire,
)

__all__ = [
    "IncompatibleSchemaError",
    "InvalidSchemaError",
    "MemorySchemaStorage",
    "SchemaError",
    "SchemaNotFoundError",
    "SchemaPolicies",
    "SchemaRecord",
    "SchemaRegistry",
    "SchemaStorage",
    "SchemaType",
    "SqlDatabase",
    "StoredSchema",
    "Strategy",
    "TableSchemaStorage",
    "UnknownSchemaTypeError",
    "decode_version",
    "encode_version",
    "from_wire",
    "parse_strategy",
    "parse_type",
    "schema_id",
    "schema_policies",
    "to_wire",
]
