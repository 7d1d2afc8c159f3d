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


def _can_read(reader: avro.schema.Schema, writer: avro.schema.Schema) -> str | None:
    """None if ``reader`` can read data written with ``writer``, else why not."""
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(reader, writer)
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
    new_schema = parse_avro(new, what)
    olds = [parse_avro(data, what) for data in existing]
    if strategy in (Strategy.ALWAYS_INCOMPATIBLE, Strategy.UNDEFINED):
        raise IncompatibleSchemaError(f"Schema compatibility strategy is {strategy.name}")
    if not strategy.transitive:
        olds = olds[:1]
    base = strategy.name.removesuffix("_TRANSITIVE")
    for index, old in enumerate(olds):
        problems = []
        if base in ("BACKWARD", "FULL"):
            why = _can_read(new_schema, old)
            if why is not None:
                problems.append(f"the new schema cannot read data written with it: {why}")
        if base in ("FORWARD", "FULL"):
            why = _can_read(old, new_schema)
            if why is not None:
                problems.append(f"it cannot read data written with the new schema: {why}")
        if problems:
            which = "the latest schema" if index == 0 else f"the schema {index} versions back"
            raise IncompatibleSchemaError(
                f"Incompatible schema under {strategy.name} with {which}: " + "; ".join(problems)
            )
