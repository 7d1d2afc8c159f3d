"""Avro parsing and schema resolution, through the Apache ``avro`` package.

Pulsar checks AVRO, JSON (Avro-defined) and, in each half, KEY_VALUE schemas with Avro's
own resolution rules (``SchemaValidatorBuilder``: can-read, can-be-read, mutual-read, against
the latest or all versions). The ``avro`` package is the Apache project's Python
implementation and ships the same rules as ``avro.compatibility``; we call it rather than
write our own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from brokerlet.schema.record import IncompatibleSchemaError, InvalidSchemaError
from brokerlet.schema.types import Strategy

__all__ = ["check_avro", "parse_avro", "same_avro", "try_parse_avro"]


@functools.lru_cache(maxsize=512)
def _parse(data: bytes) -> avro.schema.Schema:
    # Lenient names, as Pulsar's parser (COMPATIBLE_NAME_VALIDATOR, no default validation).
    return avro.schema.parse(
        data.decode("utf-8"), validate_enum_symbols=False, validate_names=False
    )


def try_parse_avro(data: bytes) -> tuple[avro.schema.Schema | None, str]:
    """The parsed schema, or None and why it is not Avro."""
    try:
        return _parse(data), ""
    except UnicodeDecodeError as error:
        return None, f"not UTF-8 text: {error}"
    except (avro.errors.AvroException, ValueError, TypeError, KeyError, AttributeError) as error:
        return None, str(error) or type(error).__name__


def parse_avro(data: bytes, what: str) -> avro.schema.Schema:
    """Parse an Avro definition.

    Raises:
        InvalidSchemaError: naming ``what`` and the parser's complaint.
    """
    schema, why = try_parse_avro(data)
    if schema is None:
        raise InvalidSchemaError(f"Invalid schema definition data for {what} schema: {why}")
    return schema


def _without_docs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_docs(v) for k, v in node.items() if k != "doc"}
    if isinstance(node, list):
        return [_without_docs(v) for v in node]
    return node


@functools.lru_cache(maxsize=512)
def _identity(data: bytes) -> str:
    return json.dumps(_without_docs(_parse(data).to_json()), sort_keys=True)


def same_avro(a: bytes, b: bytes) -> bool:
    """Avro's schema equality (docs and layout ignored), as Pulsar compares versions."""
    if a == b:
        return True
    if try_parse_avro(a)[0] is None or try_parse_avro(b)[0] is None:
        return False
    return _identity(a) == _identity(b)


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _plain(node: Any) -> bool:
    """A field type built only of primitives, arrays, maps and unions: no named types."""
    if isinstance(node, str):
        return node in _PRIMITIVES
    if isinstance(node, list):
        return all(_plain(branch) for branch in node)
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "array":
            return _plain(node.get("items"))
        if kind == "map":
            return _plain(node.get("values"))
        return isinstance(kind, str) and kind in _PRIMITIVES  # logical types
    return False


def _field_key(field: dict[str, Any]) -> str:
    return json.dumps(_without_docs(field), sort_keys=True)


@functools.lru_cache(maxsize=512)
def _narrowed(reader: bytes, writer: bytes) -> tuple[avro.schema.Schema, avro.schema.Schema]:
    """The pair with the fields they share unchanged left out, where that is sound.

    Avro's checker is pure Python and costs milliseconds for a wide record, yet an evolution
    usually touches a field or two. A field with the same name, type and default on both
    sides resolves in both directions whatever the rest is, and leaving it out changes no
    other field's resolution, provided no name could refer to it: so this applies only to
    two top-level records without aliases whose field types contain no named types. Any
    other pair is checked whole.
    """
    whole = (_parse(reader), _parse(writer))
    left: Any = whole[0].to_json()
    right: Any = whole[1].to_json()
    if not all(
        isinstance(doc, dict) and doc.get("type") == "record" and "aliases" not in doc
        for doc in (left, right)
    ):
        return whole
    fields = [doc.get("fields") for doc in (left, right)]
    for field_list in fields:
        if not isinstance(field_list, list) or not all(
            isinstance(f, dict) and "aliases" not in f and _plain(f.get("type")) for f in field_list
        ):
            return whole
    shared = {_field_key(f) for f in fields[0]} & {_field_key(f) for f in fields[1]}
    if not shared:
        return whole
    narrowed = []
    for doc, field_list in zip((left, right), fields, strict=True):
        kept = [f for f in field_list if _field_key(f) not in shared]
        narrowed.append(_parse(json.dumps({**doc, "fields": kept}).encode()))
    return narrowed[0], narrowed[1]


def _can_read(reader: bytes, writer: bytes) -> str | None:
    """None if ``reader`` can read data written with ``writer``, else why not."""
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(*_narrowed(reader, writer))
    if result.compatibility is SchemaCompatibilityType.compatible:
        return None
    kinds = ", ".join(sorted(i.value for i in result.incompatibilities))
    where = ", ".join(sorted(result.locations))
    detail = ", ".join(sorted(str(m) for m in result.messages))
    return f"{kinds} at {where} ({detail})"


def check_avro(existing: Sequence[bytes], new: bytes, strategy: Strategy, what: str) -> None:
    """Check ``new`` against ``existing`` (latest first) under ``strategy``.

    Non-transitive strategies look at the latest only, as Pulsar's validateLatest does.

    Raises:
        InvalidSchemaError: a definition does not parse.
        IncompatibleSchemaError: the strategy is broken; the message says how.
    """
    if strategy is Strategy.ALWAYS_COMPATIBLE:
        return
    parse_avro(new, what)
    for data in existing:
        parse_avro(data, what)
    if strategy in (Strategy.ALWAYS_INCOMPATIBLE, Strategy.UNDEFINED):
        raise IncompatibleSchemaError(f"Schema compatibility strategy is {strategy.name}")
    olds = list(existing) if strategy.transitive else list(existing[:1])
    base = strategy.name.removesuffix("_TRANSITIVE")
    for index, old in enumerate(olds):
        problems = []
        if base in ("BACKWARD", "FULL"):
            why = _can_read(new, old)
            if why is not None:
                problems.append(f"the new schema cannot read data written with it: {why}")
        if base in ("FORWARD", "FULL"):
            why = _can_read(old, new)
            if why is not None:
                problems.append(f"it cannot read data written with the new schema: {why}")
        if problems:
            which = "the latest schema" if index == 0 else f"the schema {index} versions back"
            raise IncompatibleSchemaError(
                f"Incompatible schema under {strategy.name} with {which}: " + "; ".join(problems)
            )
