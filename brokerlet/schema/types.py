"""Schema types and compatibility strategies, with Pulsar's names and values.

Two numberings exist in Pulsar and both are facts we keep:

- ``SchemaType`` (Java's ``org.apache.pulsar.common.schema.SchemaType``): the registry's and
  the admin API's names; client-side types (BYTES, AUTO, AUTO_CONSUME, AUTO_PUBLISH) are
  negative there and never stored.
- ``Schema.Type`` on the wire (``PulsarApi.proto``): the same values for 0..20, then
  ``AutoConsume = 21`` and ``External = 22``. ``None = 0`` is also what a Java client sends
  for BYTES.
"""

from __future__ import annotations

import enum

__all__ = [
    "CLIENT_SIDE_TYPES",
    "PRIMITIVE_TYPES",
    "AutoUpdateStrategy",
    "SchemaType",
    "Strategy",
    "UnknownSchemaTypeError",
    "from_wire",
    "parse_strategy",
    "parse_type",
    "to_wire",
]


class UnknownSchemaTypeError(ValueError):
    """A schema type value or name brokerlet does not know."""


class SchemaType(enum.IntEnum):
    """Pulsar's ``SchemaType`` (Java values)."""

    NONE = 0
    STRING = 1
    JSON = 2
    PROTOBUF = 3
    AVRO = 4
    BOOLEAN = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FLOAT = 10
    DOUBLE = 11
    DATE = 12
    TIME = 13
    TIMESTAMP = 14
    KEY_VALUE = 15
    INSTANT = 16
    LOCAL_DATE = 17
    LOCAL_TIME = 18
    LOCAL_DATE_TIME = 19
    PROTOBUF_NATIVE = 20
    # The wire value of External; its schema lives in an external registry (PIP-420).
    EXTERNAL = 22
    BYTES = -1
    AUTO = -2
    AUTO_CONSUME = -3
    AUTO_PUBLISH = -4


PRIMITIVE_TYPES = frozenset(
    {
        SchemaType.BOOLEAN,
        SchemaType.INT8,
        SchemaType.INT16,
        SchemaType.INT32,
        SchemaType.INT64,
        SchemaType.FLOAT,
        SchemaType.DOUBLE,
        SchemaType.DATE,
        SchemaType.TIME,
        SchemaType.TIMESTAMP,
        SchemaType.INSTANT,
        SchemaType.LOCAL_DATE,
        SchemaType.LOCAL_TIME,
        SchemaType.LOCAL_DATE_TIME,
    }
)
"""Types whose definition must be empty (Pulsar's PrimitiveSchemaDataValidator)."""

CLIENT_SIDE_TYPES = frozenset({SchemaType.AUTO, SchemaType.AUTO_CONSUME, SchemaType.AUTO_PUBLISH})
"""Types a client resolves itself; the registry refuses to store them."""

_WIRE_AUTO_CONSUME = 21
_WIRE_EXTERNAL = 22


def from_wire(value: int) -> SchemaType:
    """The registry type of a ``Schema.Type`` value from a PRODUCER/SUBSCRIBE/GET_OR_CREATE.

    Raises:
        UnknownSchemaTypeError: a value Pulsar's protocol does not define (yet).
    """
    if value == _WIRE_AUTO_CONSUME:
        return SchemaType.AUTO_CONSUME
    if value == _WIRE_EXTERNAL:
        return SchemaType.EXTERNAL
    if 0 <= value <= SchemaType.PROTOBUF_NATIVE:
        return SchemaType(value)
    raise UnknownSchemaTypeError(f"unknown schema type value {value}")


def to_wire(schema_type: SchemaType) -> int:
    """The ``Schema.Type`` value for a registry type (client-side types map to None = 0)."""
    if schema_type is SchemaType.AUTO_CONSUME:
        return _WIRE_AUTO_CONSUME
    if schema_type < 0:
        return 0
    return int(schema_type)


def parse_type(name: str) -> SchemaType:
    """A type by its Java name (``"AVRO"``, ``"KEY_VALUE"``), as the admin API spells it.

    Raises:
        UnknownSchemaTypeError: not one of Pulsar's names.
    """
    try:
        return SchemaType[name.strip().upper()]
    except KeyError:
        known = ", ".join(t.name for t in SchemaType)
        raise UnknownSchemaTypeError(f"unknown schema type {name!r} (known: {known})") from None


class Strategy(enum.Enum):
    """Pulsar's ``SchemaCompatibilityStrategy``."""

    UNDEFINED = "UNDEFINED"
    ALWAYS_INCOMPATIBLE = "ALWAYS_INCOMPATIBLE"
    ALWAYS_COMPATIBLE = "ALWAYS_COMPATIBLE"
    BACKWARD = "BACKWARD"
    FORWARD = "FORWARD"
    FULL = "FULL"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @property
    def transitive(self) -> bool:
        """Checked against every version, not only the latest."""
        return self.name.endswith("_TRANSITIVE")


def parse_strategy(name: str) -> Strategy:
    """A strategy by name, ignoring case.

    Raises:
        ValueError: not one of Pulsar's strategy names.
    """
    try:
        return Strategy[name.strip().upper()]
    except KeyError:
        known = ", ".join(s.name for s in Strategy)
        raise ValueError(
            f"unknown schema compatibility strategy {name!r} (known: {known})"
        ) from None


class AutoUpdateStrategy(enum.Enum):
    """The deprecated namespace policy ``schemaAutoUpdateCompatibilityStrategy``."""

    AutoUpdateDisabled = Strategy.ALWAYS_INCOMPATIBLE
    Backward = Strategy.BACKWARD
    Forward = Strategy.FORWARD
    Full = Strategy.FULL
    AlwaysCompatible = Strategy.ALWAYS_COMPATIBLE
    BackwardTransitive = Strategy.BACKWARD_TRANSITIVE
    ForwardTransitive = Strategy.FORWARD_TRANSITIVE
    FullTransitive = Strategy.FULL_TRANSITIVE
