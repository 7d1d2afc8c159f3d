"""The schema registry without a broker: types, rules, storage, admission.

Behaviour follows Pulsar's SchemaRegistryServiceImpl (same-schema lookup, type changes,
latest vs all versions, deletion markers, checkConsumerCompatibility), its compatibility
checkers (AvroSchemaBasedCompatibilityCheck, JsonSchemaCompatibilityCheck,
KeyValueSchemaCompatibilityCheck, ProtobufNativeSchemaCompatibilityCheck,
SchemaCompatibilityCheck.DEFAULT), SchemaDataValidator, AbstractTopic.addSchema and
ServerCnx.tryAddSchema.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import avro.schema as avro_schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerlet.config import load_settings
from brokerlet.metadata import MetadataStore
from brokerlet.schema import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    MemorySchemaStorage,
    SchemaError,
    SchemaNotFoundError,
    SchemaRecord,
    SchemaRegistry,
    SchemaType,
    Strategy,
    TableSchemaStorage,
    UnknownSchemaTypeError,
    decode_version,
    encode_version,
    from_wire,
    schema_id,
    schema_policies,
    to_wire,
)
from brokerlet.schema.avro_rules import _can_read
from brokerlet.schema.keyvalue import decode_halves, encode_halves, from_rest_data, to_rest_data
from brokerlet.transport.protocol import FrameDecoder, encode_command, pb

T = TypeVar("T")

TOPIC = "persistent://public/default/orders"


def avro(*fields: dict[str, object], name: str = "User") -> SchemaRecord:
    return SchemaRecord(
        SchemaType.AVRO,
        json.dumps({"type": "record", "name": name, "fields": list(fields)}).encode(),
    )


NAME = {"name": "name", "type": "string"}
AGE = {"name": "age", "type": "int"}
AGE_DEFAULT = {"name": "age", "type": "int", "default": 0}
EMAIL_DEFAULT = {"name": "email", "type": ["null", "string"], "default": None}


def registry(**settings: object) -> SchemaRegistry:
    return SchemaRegistry(load_settings(env={}, overrides=settings))


# --- types ------------------------------------------------------------------------------


def test_wire_values_follow_pulsar_api_proto() -> None:
    assert from_wire(4) is SchemaType.AVRO
    assert from_wire(20) is SchemaType.PROTOBUF_NATIVE
    assert from_wire(21) is SchemaType.AUTO_CONSUME  # wire AutoConsume, Java AUTO_CONSUME(-3)
    assert from_wire(22) is SchemaType.EXTERNAL
    assert to_wire(SchemaType.AUTO_CONSUME) == 21
    assert to_wire(SchemaType.BYTES) == 0
    with pytest.raises(UnknownSchemaTypeError, match="99"):
        from_wire(99)


def test_versions_are_eight_byte_big_endian_longs() -> None:
    assert encode_version(3) == b"\x00" * 7 + b"\x03"
    assert decode_version(encode_version(2**40)) == 2**40
    with pytest.raises(SchemaNotFoundError):
        decode_version(b"\x01")


def test_partitions_and_domains_share_one_schema_id() -> None:
    # TopicName.getSchemaName: tenant/namespace/local name of the partitioned parent.
    assert schema_id("persistent://t/ns/x-partition-3") == "t/ns/x"
    assert schema_id("non-persistent://t/ns/x") == "t/ns/x"
    with pytest.raises(ValueError, match="invalid topic"):
        schema_id("persistent://t/x")


def test_default_strategy_is_full_as_pulsar_service_configuration() -> None:
    policies = schema_policies(load_settings(env={}))
    assert policies.compatibility is Strategy.FULL
    assert policies.allow_auto_update is True
    assert policies.validation_enforced is False


def test_namespace_policies_override_the_broker_and_fall_back_in_pulsar_order() -> None:
    settings = load_settings(env={})
    assert (
        schema_policies(settings, {"schema_compatibility_strategy": "BACKWARD"}).compatibility
        is Strategy.BACKWARD
    )
    # UNDEFINED falls to the deprecated auto-update policy, then to the broker.
    legacy = {
        "schema_compatibility_strategy": "UNDEFINED",
        "schema_auto_update_compatibility_strategy": "AutoUpdateDisabled",
    }
    assert schema_policies(settings, legacy).compatibility is Strategy.ALWAYS_INCOMPATIBLE
    assert (
        schema_policies(settings, {"schema_compatibility_strategy": "UNDEFINED"}).compatibility
        is Strategy.FULL
    )
    flags = schema_policies(
        settings, {"is_allow_auto_update_schema": False, "schema_validation_enforced": True}
    )
    assert (flags.allow_auto_update, flags.validation_enforced) == (False, True)


# --- versions ---------------------------------------------------------------------------


def test_first_schema_is_version_zero_and_the_same_schema_keeps_its_version() -> None:
    reg = registry()
    assert reg.put_if_absent(TOPIC, avro(NAME)) == 0
    # Avro-defined schemas compare as Avro: layout and docs do not make a new version.
    relaid = SchemaRecord(
        SchemaType.AVRO,
        b'{"name": "User", "type": "record", "doc": "x",\n "fields": [{"type": "string", '
        b'"name": "name"}]}',
    )
    assert reg.put_if_absent(TOPIC, relaid) == 0
    assert len(reg.history(TOPIC)) == 1


def test_compatible_evolution_adds_a_version_and_partitions_see_it() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, avro(NAME))
    assert reg.put_if_absent(TOPIC + "-partition-1", avro(NAME, AGE_DEFAULT)) == 1
    assert [s.version for s in reg.history(TOPIC)] == [0, 1]
    latest = reg.get(TOPIC)
    assert latest is not None
    assert latest.version == 1
    assert latest.record.timestamp_ms > 0


@pytest.mark.parametrize(
    ("strategy", "new", "compatible"),
    [
        # Adding a field without a default: new readers cannot read old data.
        (Strategy.BACKWARD, avro(NAME, AGE), False),
        (Strategy.FORWARD, avro(NAME, AGE), True),
        (Strategy.FULL, avro(NAME, AGE), False),
        (Strategy.FULL, avro(NAME, AGE_DEFAULT), True),
        # Removing a field without a default: old readers cannot read new data.
        (Strategy.BACKWARD, avro(), True),
        (Strategy.FORWARD, avro(), False),
        (Strategy.ALWAYS_COMPATIBLE, avro({"name": "name", "type": "int"}), True),
        (Strategy.ALWAYS_INCOMPATIBLE, avro(NAME, AGE_DEFAULT), False),
    ],
)
def test_avro_strategies(strategy: Strategy, new: SchemaRecord, compatible: bool) -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, avro(NAME))
    if compatible:
        assert reg.put_if_absent(TOPIC, new, strategy) == 1
    else:
        with pytest.raises(IncompatibleSchemaError, match=strategy.name):
            reg.put_if_absent(TOPIC, new, strategy)
        assert len(reg.history(TOPIC)) == 1  # nothing registered


def test_transitive_strategies_check_every_version_not_only_the_latest() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, avro(NAME, AGE), Strategy.BACKWARD)
    reg.put_if_absent(TOPIC, avro(NAME), Strategy.BACKWARD)  # drops age: BACKWARD ok
    # Adding age back without a default: compatible with v1 (no age) under FORWARD...
    back = avro(NAME, {"name": "age", "type": "string"})
    assert reg.find_version(TOPIC, back) is None
    with pytest.raises(IncompatibleSchemaError):
        # ...but v0 had age as an int, which a string reader cannot read: BACKWARD_TRANSITIVE.
        reg.put_if_absent(TOPIC, back, Strategy.BACKWARD_TRANSITIVE)
    assert reg.put_if_absent(TOPIC, back, Strategy.FORWARD) == 2


def test_a_type_change_is_refused_unless_always_compatible() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, avro(NAME))
    string = SchemaRecord(SchemaType.STRING, b"")
    with pytest.raises(IncompatibleSchemaError, match="exists schema type AVRO, new schema type"):
        reg.put_if_absent(TOPIC, string, Strategy.FULL)
    assert reg.put_if_absent(TOPIC, string, Strategy.ALWAYS_COMPATIBLE) == 1


def test_primitives_and_protobuf_use_the_default_check() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, SchemaRecord(SchemaType.STRING, b"null"))
    other = SchemaRecord(SchemaType.STRING, b"", {"k": "v"})
    assert reg.put_if_absent(TOPIC, other, Strategy.FULL) == 1
    with pytest.raises(IncompatibleSchemaError, match="ALWAYS_INCOMPATIBLE"):
        reg.put_if_absent(
            TOPIC, SchemaRecord(SchemaType.STRING, b"x"), Strategy.ALWAYS_INCOMPATIBLE
        )


def test_json_schemas_defined_in_avro_get_avro_rules() -> None:
    reg = registry()
    old = SchemaRecord(SchemaType.JSON, avro(NAME).data)
    reg.put_if_absent(TOPIC, old)
    with pytest.raises(IncompatibleSchemaError):
        reg.put_if_absent(TOPIC, SchemaRecord(SchemaType.JSON, avro(NAME, AGE).data))
    assert (
        reg.put_if_absent(TOPIC, SchemaRecord(SchemaType.JSON, avro(NAME, AGE_DEFAULT).data)) == 1
    )


def _kv(key: SchemaRecord, value: SchemaRecord) -> SchemaRecord:
    return encode_halves(key, value)


def test_key_value_checks_each_half_with_its_own_rules() -> None:
    reg = registry()
    string = SchemaRecord(SchemaType.STRING, b"")
    reg.put_if_absent(TOPIC, _kv(string, avro(NAME)))
    with pytest.raises(IncompatibleSchemaError, match="KEY_VALUE value schema"):
        reg.put_if_absent(TOPIC, _kv(string, avro(NAME, AGE)))
    assert reg.put_if_absent(TOPIC, _kv(string, avro(NAME, EMAIL_DEFAULT))) == 1
    with pytest.raises(IncompatibleSchemaError, match="different schema type"):
        reg.put_if_absent(TOPIC, _kv(SchemaRecord(SchemaType.JSON, avro(AGE).data), avro(NAME)))
    # Pulsar's SchemaHash covers type and data only, so a KEY_VALUE that differs in its
    # properties alone (here the key's type) is the same version.
    assert reg.put_if_absent(TOPIC, _kv(SchemaRecord(SchemaType.INT32, b""), avro(NAME))) == 0


def test_key_value_encoding_round_trips_and_its_rest_form() -> None:
    record = _kv(SchemaRecord(SchemaType.STRING, b""), avro(NAME))
    assert record.data[:4] == b"\x00\x00\x00\x00"  # empty key definition, length-prefixed
    key, value = decode_halves(record)
    assert (key.type, value.type, value.data) == (
        SchemaType.STRING,
        SchemaType.AVRO,
        avro(NAME).data,
    )
    rest = json.loads(to_rest_data(record))
    assert rest["key"] == ""
    assert rest["value"]["name"] == "User"
    assert (
        decode_halves(
            SchemaRecord(SchemaType.KEY_VALUE, from_rest_data(json.dumps(rest)), record.properties)
        )[1].type
        is SchemaType.AVRO
    )


def _protobuf_native(root: str) -> SchemaRecord:
    file = descriptor_pb2.FileDescriptorProto(name="shop.proto", package="shop")
    file.message_type.add(name="Order")
    file.message_type.add(name="Invoice")
    descriptors = descriptor_pb2.FileDescriptorSet(file=[file])
    document = {
        "fileDescriptorSet": base64.b64encode(descriptors.SerializeToString()).decode(),
        "rootMessageTypeName": root,
        "rootFileDescriptorName": "shop.proto",
    }
    return SchemaRecord(SchemaType.PROTOBUF_NATIVE, json.dumps(document).encode())


def test_protobuf_native_root_message_may_not_change() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, _protobuf_native("shop.Order"))
    with pytest.raises(IncompatibleSchemaError, match="root message"):
        reg.put_if_absent(TOPIC, _protobuf_native("shop.Invoice"))
    with pytest.raises(InvalidSchemaError, match=r"no message shop\.Missing"):
        reg.put_if_absent(TOPIC, _protobuf_native("shop.Missing"))


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (SchemaRecord(SchemaType.AVRO, b"{not json"), "Invalid schema definition data for AVRO"),
        (SchemaRecord(SchemaType.AVRO, b'{"type": "recrod"}'), "AVRO"),
        (SchemaRecord(SchemaType.JSON, b"[1, 2]"), "Invalid schema definition data for JSON"),
        (SchemaRecord(SchemaType.INT32, b"x"), "length of schema data should be zero"),
        (SchemaRecord(SchemaType.AUTO_PUBLISH, b""), "client-side schema type"),
        (SchemaRecord(SchemaType.KEY_VALUE, b"\x00\x00"), "KEY_VALUE schema data ends"),
        (
            _kv(SchemaRecord(SchemaType.STRING, b""), SchemaRecord(SchemaType.AVRO, b"{broken")),
            "KEY_VALUE value schema: Invalid schema definition data for AVRO",
        ),
        (
            SchemaRecord(
                SchemaType.KEY_VALUE, _kv(avro(NAME), avro(NAME)).data, {"key.schema.type": "NOPE"}
            ),
            "KEY_VALUE key schema: unknown schema type 'NOPE'",
        ),
        (SchemaRecord(SchemaType.STRING, b"x" * (10 * 1024 * 1024)), "exceeds the limit"),
    ],
)
def test_bad_definitions_are_refused_by_name_and_nothing_is_registered(
    record: SchemaRecord, reason: str
) -> None:
    reg = registry()
    with pytest.raises(InvalidSchemaError, match=reason):
        reg.put_if_absent(TOPIC, record)
    with pytest.raises(InvalidSchemaError):
        reg.check_compatible(TOPIC, record)
    assert reg.history(TOPIC) == []


# --- deletion ---------------------------------------------------------------------------


def test_delete_leaves_a_marker_and_a_new_history_starts_after_it() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, avro(NAME))
    assert reg.delete(TOPIC) == 1
    assert reg.get(TOPIC) is None
    assert reg.get(TOPIC, 0) is None
    with pytest.raises(SchemaNotFoundError):
        reg.delete(TOPIC)
    # The old version no longer constrains: an incompatible schema starts afresh at 2.
    assert reg.put_if_absent(TOPIC, SchemaRecord(SchemaType.STRING, b"")) == 2
    reg.delete_all(TOPIC)
    assert reg.put_if_absent(TOPIC, avro(NAME)) == 0


def test_deleting_a_topic_drops_its_history_but_a_partition_keeps_the_shared_one() -> None:
    reg = registry()
    reg.put_if_absent(TOPIC, avro(NAME))
    assert reg.topic_deleted(TOPIC + "-partition-0") is False
    assert reg.get(TOPIC) is not None
    assert reg.topic_deleted(TOPIC) is True
    assert reg.history(TOPIC) == []
    assert reg.put_if_absent(TOPIC, SchemaRecord(SchemaType.STRING, b"")) == 0  # no marker


# --- admission --------------------------------------------------------------------------


def test_producers_without_schema_are_refused_only_when_validation_is_enforced() -> None:
    reg = registry()
    assert reg.admit_producer(TOPIC, None) is None
    reg.admit_producer(TOPIC, avro(NAME))
    assert reg.admit_producer(TOPIC, None) is None
    enforced = registry(isSchemaValidationEnforced=True)
    assert enforced.admit_producer(TOPIC, None) is None  # no schema yet: fine
    enforced.admit_producer(TOPIC, avro(NAME))
    with pytest.raises(IncompatibleSchemaError, match="without a schema"):
        enforced.admit_producer(TOPIC, None)


def test_without_auto_update_only_known_schemas_are_admitted() -> None:
    reg = registry(isAllowAutoUpdateSchemaEnabled=False)
    with pytest.raises(IncompatibleSchemaError, match="auto updating is disabled"):
        reg.admit_producer(TOPIC, avro(NAME))
    reg.put_if_absent(TOPIC, avro(NAME))  # the admin API still registers
    assert reg.admit_producer(TOPIC, avro(NAME)) == 0


def test_consumers_check_backward_against_the_latest_and_register_only_on_idle_topics() -> None:
    reg = registry()
    # Idle topic without a schema: the consumer's schema is registered.
    reg.admit_consumer(TOPIC, avro(NAME, AGE), lambda: True)
    assert reg.get(TOPIC) is not None
    # A reader schema that can read the latest is fine and registers nothing.
    reg.admit_consumer(TOPIC, avro(NAME), lambda: pytest.fail("not asked"))
    assert len(reg.history(TOPIC)) == 1
    with pytest.raises(IncompatibleSchemaError):
        reg.admit_consumer(
            TOPIC,
            avro(
                NAME,
                AGE,
                EMAIL_DEFAULT | {"name": "x", "default": None},
                {"name": "y", "type": "int"},
            ),
            lambda: True,
        )
    # A busy topic without a schema has nothing to check against.
    other = "persistent://public/default/busy"
    with pytest.raises(
        IncompatibleSchemaError,
        match=r"active topic with empty\(BYTES\) schema: new schema type AVRO",
    ):
        reg.admit_consumer(other, avro(NAME), lambda: False)
    # AUTO_CONSUME is never checked.
    reg.admit_consumer(other, SchemaRecord(SchemaType.AUTO_CONSUME, b""), lambda: False)


# --- storage ----------------------------------------------------------------------------


def test_table_storage_survives_reopening_the_metadata_store(tmp_path: Path) -> None:
    settings = load_settings(env={})
    store = MetadataStore.in_directory(str(tmp_path))
    first = SchemaRegistry(settings, TableSchemaStorage(store))
    first.put_if_absent(TOPIC, SchemaRecord(SchemaType.AVRO, avro(NAME).data, {"a": "1"}))
    first.put_if_absent(TOPIC, avro(NAME, AGE_DEFAULT))
    store.close()
    store = MetadataStore.in_directory(str(tmp_path))
    try:
        again = SchemaRegistry(settings, TableSchemaStorage(store))
        history = again.history(TOPIC)
        assert [s.version for s in history] == [0, 1]
        assert history[0].record.properties == {"a": "1"}
        assert again.put_if_absent(TOPIC, avro(NAME)) == 0
        # The rows are in the metadata store's own file, beside its tenants and namespaces.
        assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".sqlite") == []
        rows = store.read(lambda db: db.execute("SELECT COUNT(*) FROM schema_versions").fetchone())
        assert rows == (2,)
    finally:
        store.close()


class _FailingWrites:
    """A database whose every write fails, as a full disk would make it."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute(
            "CREATE TABLE schema_versions (schema_id TEXT, version INTEGER, type INTEGER,"
            " data BLOB, properties TEXT, timestamp_ms INTEGER, deleted INTEGER)"
        )

    def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        return query(self.db)

    def write(self, change: Callable[[sqlite3.Connection], T]) -> T:
        raise sqlite3.OperationalError("database or disk is full")


def test_table_storage_changes_its_copy_only_after_the_write() -> None:
    storage = TableSchemaStorage(_FailingWrites())
    with pytest.raises(sqlite3.OperationalError):
        storage.put("t/ns/a", SchemaRecord(SchemaType.STRING, b""))
    assert storage.versions("t/ns/a") == []
    assert storage.schema_ids() == []


def test_table_storage_deletes_every_version_of_one_schema() -> None:
    store = MetadataStore(None)
    try:
        storage = TableSchemaStorage(store)
        assert storage.put("t/ns/a", SchemaRecord(SchemaType.STRING, b"")) == 0
        assert storage.put("t/ns/a", SchemaRecord(SchemaType.STRING, b"x")) == 1
        assert storage.put("t/ns/b", SchemaRecord(SchemaType.STRING, b"")) == 0
        storage.delete("t/ns/a")
        assert storage.versions("t/ns/a") == []
        assert storage.schema_ids() == ["t/ns/b"]
        assert TableSchemaStorage(store).schema_ids() == ["t/ns/b"]  # as stored
        assert storage.put("t/ns/a", SchemaRecord(SchemaType.STRING, b"")) == 0
    finally:
        store.close()


def test_memory_storage_numbers_versions_from_zero_per_schema() -> None:
    storage = MemorySchemaStorage()
    assert storage.put("a/b/c", SchemaRecord(SchemaType.STRING, b"")) == 0
    assert storage.put("a/b/d", SchemaRecord(SchemaType.STRING, b"")) == 0
    assert storage.put("a/b/c", SchemaRecord(SchemaType.STRING, b"")) == 1


def test_schema_errors_share_one_base() -> None:
    assert issubclass(IncompatibleSchemaError, SchemaError)
    assert issubclass(InvalidSchemaError, SchemaError)


# --- the narrowed Avro check agrees with the whole one ----------------------------------

_FIELD_TYPES: list[tuple[object, object]] = [
    ("int", 0),
    ("long", 0),
    ("string", ""),
    (["null", "string"], None),
    (["null", "int"], None),
    ({"type": "array", "items": "int"}, []),
    ({"type": "map", "values": "long"}, {}),
    ({"type": "long", "logicalType": "timestamp-millis"}, 0),
]


@st.composite
def _record_pair(draw: st.DrawFn) -> tuple[bytes, bytes]:
    names = [f"f{i}" for i in range(draw(st.integers(1, 6)))]

    def fields() -> list[dict[str, object]]:
        chosen = []
        for name in names:
            if draw(st.booleans()):
                kind, default = draw(st.sampled_from(_FIELD_TYPES))
                field: dict[str, object] = {"name": name, "type": kind}
                if draw(st.booleans()):
                    field["default"] = default
                chosen.append(field)
        return chosen

    base = fields()
    other = [f for f in base if draw(st.booleans())] + fields()
    seen: set[object] = set()
    other = [f for f in other if not (f["name"] in seen or seen.add(f["name"]))]
    return (
        json.dumps({"type": "record", "name": "R", "fields": base}).encode(),
        json.dumps({"type": "record", "name": "R", "fields": other}).encode(),
    )


@settings(max_examples=300, deadline=None)
@given(_record_pair())
def test_narrowing_shared_fields_never_changes_the_verdict(pair: tuple[bytes, bytes]) -> None:
    reader, writer = pair
    whole = ReaderWriterCompatibilityChecker().get_compatibility(
        avro_schema.parse(reader.decode()), avro_schema.parse(writer.decode())
    )
    assert (_can_read(reader, writer) is None) == (
        whole.compatibility is SchemaCompatibilityType.compatible
    )


def test_the_codec_keeps_a_schema_type_it_does_not_know() -> None:
    # Schema.type is int32 in our proto: a newer type value still parses, so the registry can
    # refuse the producer by name instead of the codec dropping the connection.
    command = pb.BaseCommand(
        type=pb.BaseCommand.PRODUCER,
        producer=pb.CommandProducer(
            topic=TOPIC,
            producer_id=1,
            request_id=2,
            schema=pb.Schema(name="x", schema_data=b"", type=99),
        ),
    )
    (frame,) = FrameDecoder(1 << 20).feed(encode_command(command))
    assert frame.command.producer.schema.type == 99
