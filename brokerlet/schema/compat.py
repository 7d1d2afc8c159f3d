"""Compatibility checks by schema type, as Pulsar's broker runs them by default.

Pulsar registers checkers for AVRO, JSON, PROTOBUF_NATIVE (``schemaRegistryCompatibilityCheckers``),
KEY_VALUE (each half with its own checker) and EXTERNAL; every other type (STRING, the
primitives, PROTOBUF) falls to its DEFAULT check, which refuses only under
ALWAYS_INCOMPATIBLE. The registry itself refuses a change of type and accepts an identical
definition before any checker runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from brokerlet.schema import keyvalue
from brokerlet.schema.avro_rules import check_avro, try_parse_avro
from brokerlet.schema.record import IncompatibleSchemaError, SchemaRecord
from brokerlet.schema.types import SchemaType, Strategy
from brokerlet.schema.validate import protobuf_native_root

__all__ = ["check"]

Checker = Callable[[Sequence[SchemaRecord], SchemaRecord, Strategy], None]


def check(existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy) -> None:
    """Check ``new`` against ``existing`` (latest first, all of the same type as ``new``).

    Raises:
        IncompatibleSchemaError: the strategy refuses it.
        InvalidSchemaError: a definition is malformed.
    """
    _CHECKERS.get(new.type, _default)(existing, new, strategy)


def _default(existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy) -> None:
    if strategy is Strategy.ALWAYS_INCOMPATIBLE:
        raise IncompatibleSchemaError("Schema compatibility strategy is ALWAYS_INCOMPATIBLE")


def _avro(existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy) -> None:
    check_avro([r.data for r in existing], new.data, strategy, new.type.name)


def _json(existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy) -> None:
    # Pulsar's JsonSchemaCompatibilityCheck: Avro-defined JSON schemas get Avro's rules; the
    # pre-Avro JSON format is accepted next to Avro in either direction (the newer format
    # overwrites the older), and two old-format ones must have the same "id".
    new_is_avro = try_parse_avro(new.data)[0] is not None
    avro_existing = [r for r in existing if try_parse_avro(r.data)[0] is not None]
    if new_is_avro and len(avro_existing) == len(existing):
        _avro(existing, new, strategy)
        return
    if not new_is_avro and not avro_existing:
        new_id = json.loads(new.data).get("id")
        for old in existing[: None if strategy.transitive else 1]:
            if json.loads(old.data).get("id") != new_id:
                raise IncompatibleSchemaError(
                    "Incompatible schema: old-format JSON schemas with different ids"
                )


def _protobuf_native(
    existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy
) -> None:
    if strategy is Strategy.ALWAYS_COMPATIBLE:
        return
    if strategy in (Strategy.ALWAYS_INCOMPATIBLE, Strategy.UNDEFINED):
        raise IncompatibleSchemaError(
            f"Schema compatibility strategy {strategy.name} refuses any change"
        )
    root = protobuf_native_root(new.data)
    for old in existing:
        if protobuf_native_root(old.data) != root:
            raise IncompatibleSchemaError(
                f"Protobuf root message isn't allow change! ({protobuf_native_root(old.data)} "
                f"-> {root})"
            )


def _key_value(existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy) -> None:
    if strategy is Strategy.ALWAYS_COMPATIBLE:
        return
    new_key, new_value = keyvalue.decode_halves(new)
    old_keys, old_values = [], []
    for old in existing:
        old_key, old_value = keyvalue.decode_halves(old)
        if old_key.type != new_key.type or old_value.type != new_value.type:
            raise IncompatibleSchemaError(
                "Key schemas or Value schemas are different schema type, from key schema type "
                f"is {old_key.type.name} and to key schema is {new_key.type.name}, from value "
                f"schema is {old_value.type.name} and to value schema is {new_value.type.name}"
            )
        old_keys.append(old_key)
        old_values.append(old_value)
    for which, olds, half in (("key", old_keys, new_key), ("value", old_values, new_value)):
        try:
            check(olds, half, strategy)
        except IncompatibleSchemaError as error:
            raise IncompatibleSchemaError(f"KEY_VALUE {which} schema: {error}") from None


def _external(existing: Sequence[SchemaRecord], new: SchemaRecord, strategy: Strategy) -> None:
    # The registry already refused a type change; EXTERNAL has no further rule.
    return


_CHECKERS: dict[SchemaType, Checker] = {
    SchemaType.AVRO: _avro,
    SchemaType.JSON: _json,
    SchemaType.PROTOBUF_NATIVE: _protobuf_native,
    SchemaType.KEY_VALUE: _key_value,
    SchemaType.EXTERNAL: _external,
}
