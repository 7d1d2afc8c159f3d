"""Schemas end to end with the official client's schema classes (pulsar-client 3.13).

Admission follows Pulsar's ServerCnx.handleProducer/handleSubscribe (tryAddSchema,
addSchemaIfIdleOrCheckCompatible), GET_SCHEMA its handleGetSchema; admin shapes follow
SchemasResource. Namespaces here get their schema policies through the registry's
namespace hook, the way the metadata store will supply them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import requests
from pulsar.schema import AvroSchema, BytesSchema, Integer, JsonSchema, Record, String, StringSchema

from brokerlet import Broker
from brokerlet.schema import decode_version, encode_version
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import pb

pytestmark = pytest.mark.official

T = pb.BaseCommand

# Namespaces with schema policies, set through the admin API's namespace policy routes
# (stored in the metadata store, which the registry reads).
POLICIES: dict[str, tuple[str, str, object]] = {
    "backward": ("PUT", "schemaCompatibilityStrategy", "BACKWARD"),
    "always": ("PUT", "schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE"),
    "enforced": ("POST", "schemaValidationEnforced", True),
    "legacy": ("PUT", "schemaAutoUpdateCompatibilityStrategy", "AlwaysCompatible"),
    "frozen": ("POST", "isAllowAutoUpdateSchema", False),
}

UserV1: Any = type("User", (Record,), {"name": String(), "age": Integer()})
# Adds a field with a default: readable both ways, so FULL (the default) accepts it.
UserV2: Any = type(
    "User",
    (Record,),
    {"name": String(), "age": Integer(), "email": String(default=None, required_default=True)},
)
# Adds a field without a default: a reader of it cannot read UserV1 data (not BACKWARD).
UserBroken: Any = type("User", (Record,), {"name": String(), "age": Integer(), "zip": String()})


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with Broker(port=0) as running:
        base = f"{running.web_service_url}/admin/v2/namespaces/public"
        for namespace, (method, policy, value) in POLICIES.items():
            requests.put(f"{base}/{namespace}", timeout=10).raise_for_status()
            answer = requests.request(
                method, f"{base}/{namespace}/{policy}", json=value, timeout=10
            )
            assert answer.status_code == 204, answer.text
        yield running


_numbers = iter(range(10**6))


def version_of(message: pulsar.Message) -> int:
    """The message's schema version (the client hands the 8 bytes over as a str)."""
    return decode_version(message.schema_version().encode("latin-1"))


def fresh(namespace: str = "default") -> str:
    return f"persistent://public/{namespace}/schema-{next(_numbers)}"


def test_compatible_evolution_registers_a_version_that_messages_carry(
    client: pulsar.Client,
) -> None:
    topic = fresh()
    first = client.create_producer(topic, schema=AvroSchema(UserV1))
    first.send(UserV1(name="ada", age=36))
    second = client.create_producer(topic, schema=AvroSchema(UserV2))
    second.send(UserV2(name="bob", age=40, email="b@x"))
    again = client.create_producer(topic, schema=AvroSchema(UserV1))  # a known version
    again.send(UserV1(name="cy", age=5))
    consumer = client.subscribe(
        topic, "s", schema=AvroSchema(UserV2), initial_position=pulsar.InitialPosition.Earliest
    )
    versions = []
    values = []
    for _ in range(3):
        message = consumer.receive(timeout_millis=10_000)
        versions.append(version_of(message))
        values.append(message.value())
        consumer.acknowledge(message)
    assert versions == [0, 1, 0]
    assert [(v.name, v.email) for v in values] == [("ada", None), ("bob", "b@x"), ("cy", None)]


def test_the_consumers_schema_registers_on_an_idle_topic(client: pulsar.Client) -> None:
    topic = fresh()
    consumer = client.subscribe(
        topic, "s", schema=AvroSchema(UserV2), initial_position=pulsar.InitialPosition.Earliest
    )
    # UserV1 drops a field that has a default: FULL accepts it as version 1.
    client.create_producer(topic, schema=AvroSchema(UserV1)).send(UserV1(name="ada", age=3))
    message = consumer.receive(timeout_millis=10_000)
    assert version_of(message) == 1
    assert message.value().name == "ada"


@pytest.mark.parametrize("namespace", ["default", "backward"])  # FULL (default), BACKWARD
def test_an_incompatible_producer_is_refused(client: pulsar.Client, namespace: str) -> None:
    topic = fresh(namespace)
    client.create_producer(topic, schema=AvroSchema(UserV1)).send(UserV1(name="a", age=1))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserBroken))


def test_always_compatible_accepts_an_incompatible_producer(
    client: pulsar.Client, broker: Broker
) -> None:
    topic = fresh("always")
    client.create_producer(topic, schema=AvroSchema(UserV1))
    client.create_producer(topic, schema=AvroSchema(UserBroken)).send(UserBroken(name="z"))
    assert broker.schemas is not None
    assert [s.version for s in broker.schemas.history(topic)] == [0, 1]


def test_a_consumer_with_a_compatible_schema_reads_older_messages(
    client: pulsar.Client, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert broker.schemas is not None
    asked: list[int | None] = []
    lookup = broker.schemas.get

    def spy(topic: str, version: int | None = None) -> Any:
        asked.append(version)
        return lookup(topic, version)

    monkeypatch.setattr(broker.schemas, "get", spy)
    topic = fresh()
    producer = client.create_producer(topic, schema=AvroSchema(UserV1))
    for age in (1, 2):
        producer.send(UserV1(name="old", age=age))
    # UserV2 can read UserV1 data; the client fetches the writer schema with GET_SCHEMA.
    consumer = client.subscribe(
        topic, "s", schema=AvroSchema(UserV2), initial_position=pulsar.InitialPosition.Earliest
    )
    ages = []
    for _ in range(2):
        message = consumer.receive(timeout_millis=10_000)
        assert message.value().email is None
        ages.append(message.value().age)
    assert ages == [1, 2]
    assert 0 in asked  # the writer's version 0, fetched with GET_SCHEMA


def test_a_consumer_that_cannot_read_the_latest_is_refused(client: pulsar.Client) -> None:
    topic = fresh()
    client.create_producer(topic, schema=AvroSchema(UserV1))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "s", schema=AvroSchema(UserBroken))


def test_json_schemas_evolve_with_avro_rules(client: pulsar.Client) -> None:
    topic = fresh()
    client.create_producer(topic, schema=JsonSchema(UserV1)).send(UserV1(name="j", age=1))
    producer = client.create_producer(topic, schema=JsonSchema(UserV2))
    producer.send(UserV2(name="k", age=2, email="e"))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=JsonSchema(UserBroken))
    with pytest.raises(pulsar.IncompatibleSchema):  # a type change
        client.create_producer(topic, schema=AvroSchema(UserV2))


def test_bytes_producers_on_a_topic_with_a_schema(client: pulsar.Client) -> None:
    topic = fresh()
    client.create_producer(topic, schema=StringSchema()).send("text")
    # BytesSchema sends no schema: allowed while schemaValidationEnforced is off.
    client.create_producer(topic, schema=BytesSchema()).send(b"raw")
    enforced = fresh("enforced")
    client.create_producer(enforced, schema=BytesSchema())  # no schema yet: fine
    client.create_producer(enforced, schema=StringSchema())
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(enforced, schema=BytesSchema())


# --- the binary protocol, frame by frame ------------------------------------------------


def _avro_schema(record: Any) -> pb.Schema:
    return pb.Schema(name="User", schema_data=json.dumps(record.schema()).encode(), type=4)


def _producer(raw: RawClient, topic: str, producer_id: int, schema: pb.Schema) -> pb.BaseCommand:
    raw.send_command(
        T(
            type=T.PRODUCER,
            producer=pb.CommandProducer(
                topic=topic, producer_id=producer_id, request_id=100 + producer_id, schema=schema
            ),
        )
    )
    command = raw.recv_frame().command
    assert command.type in (T.PRODUCER_SUCCESS, T.ERROR)
    return command


def _get_schema(raw: RawClient, topic: str, version: int | None) -> pb.CommandGetSchemaResponse:
    request = pb.CommandGetSchema(request_id=7, topic=topic)
    if version is not None:
        request.schema_version = encode_version(version)
    raw.send_command(T(type=T.GET_SCHEMA, get_schema=request))
    return raw.expect(T.GET_SCHEMA_RESPONSE).get_schema_response


def test_get_schema_returns_each_version(broker: Broker) -> None:
    topic = fresh()
    with RawClient(broker.address) as raw:
        raw.handshake()
        assert _get_schema(raw, topic, None).error_code == pb.TopicNotFound
        for producer_id, record in enumerate((UserV1, UserV2)):
            success = _producer(raw, topic, producer_id, _avro_schema(record)).producer_success
            assert decode_version(success.schema_version) == producer_id
        for version, record in enumerate((UserV1, UserV2)):
            response = _get_schema(raw, topic + "-partition-0", version)
            assert not response.HasField("error_code")
            assert decode_version(response.schema_version) == version
            assert response.schema.type == 4
            assert json.loads(response.schema.schema_data) == record.schema()
        assert decode_version(_get_schema(raw, topic, None).schema_version) == 1
        missing = _get_schema(raw, topic, 9)
        assert missing.error_code == pb.TopicNotFound


def test_get_or_create_schema(broker: Broker) -> None:
    topic = fresh()
    with RawClient(broker.address) as raw:
        raw.handshake()

        def get_or_create(schema: pb.Schema) -> pb.CommandGetOrCreateSchemaResponse:
            raw.send_command(
                T(
                    type=T.GET_OR_CREATE_SCHEMA,
                    get_or_create_schema=pb.CommandGetOrCreateSchema(
                        request_id=3, topic=topic, schema=schema
                    ),
                )
            )
            return raw.expect(T.GET_OR_CREATE_SCHEMA_RESPONSE).get_or_create_schema_response

        assert get_or_create(_avro_schema(UserV1)).error_code == pb.TopicNotFound
        raw.create_producer(topic, 0)  # the topic exists once used
        assert decode_version(get_or_create(_avro_schema(UserV1)).schema_version) == 0
        assert decode_version(get_or_create(_avro_schema(UserV2)).schema_version) == 1
        refused = get_or_create(_avro_schema(UserBroken))
        assert refused.error_code == pb.IncompatibleSchema
        assert "Incompatible schema under FULL" in refused.error_message


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (pb.Schema(name="x", schema_data=b"", type=99), "Unknown schema type value 99"),
        (
            pb.Schema(name="x", schema_data=b"{nope", type=4),
            "Invalid schema definition data for AVRO",
        ),
        (
            pb.Schema(
                name="kv",
                schema_data=b"\x00\x00\x00\x00\x00\x00\x00\x05{bad}",
                type=15,
                properties=[pb.KeyValue(key="value.schema.type", value="AVRO")],
            ),
            "KEY_VALUE value schema: Invalid schema definition data for AVRO",
        ),
        (pb.Schema(name="x", schema_data=b"", type=-4), "Unknown schema type value"),
    ],
)
def test_bad_schemas_refuse_the_producer_and_keep_the_connection(
    broker: Broker, schema: pb.Schema, reason: str
) -> None:
    topic = fresh()
    with RawClient(broker.address) as raw:
        raw.handshake()
        error = _producer(raw, topic, 0, schema).error
        assert error.error == pb.IncompatibleSchema
        assert reason in error.message
        raw.send_command(
            T(
                type=T.SUBSCRIBE,
                subscribe=pb.CommandSubscribe(
                    topic=topic,
                    subscription="s",
                    sub_type=0,
                    consumer_id=0,
                    request_id=5,
                    schema=schema,
                ),
            )
        )
        assert raw.expect(T.ERROR).error.error == pb.IncompatibleSchema
        raw.ping()  # the connection is still in sync
    assert broker.schemas is not None
    assert broker.schemas.history(topic) == []


def test_a_schema_over_the_size_limit_is_refused_by_name() -> None:
    with Broker(port=0, schema_max_size_bytes=4096) as small, RawClient(small.address) as raw:
        raw.handshake()
        huge = pb.Schema(name="s", schema_data=b"x" * 10_000, type=1)
        error = _producer(raw, fresh(), 0, huge).error
        assert error.error == pb.IncompatibleSchema
        assert "10000 bytes exceeds the limit of 4096 bytes" in error.message


# --- admin REST -------------------------------------------------------------------------


def test_admin_upload_read_and_delete(broker: Broker) -> None:
    local = f"admin-{next(_numbers)}"
    base = f"{broker.web_service_url}/admin/v2/schemas/public/default/{local}"
    v1 = {"type": "AVRO", "schema": json.dumps(UserV1.schema()), "properties": {"a": "1"}}
    assert requests.get(f"{base}/schema", timeout=10).status_code == 404
    posted = requests.post(f"{base}/schema", json=v1, timeout=10)
    assert (posted.status_code, posted.json()) == (202, {"version": {"version": 0}})
    latest = requests.get(f"{base}/schema", timeout=10).json()
    assert latest["version"] == 0
    assert latest["type"] == "AVRO"
    assert json.loads(latest["data"]) == UserV1.schema()
    assert latest["properties"] == {"a": "1"}
    assert latest["timestamp"] > 0

    broken = {"type": "AVRO", "schema": json.dumps(UserBroken.schema())}
    check = requests.post(f"{base}/compatibility", json=broken, timeout=10)
    assert check.status_code == 202
    assert check.json() == {"isCompatibility": False, "schemaCompatibilityStrategy": "FULL"}
    assert requests.post(f"{base}/schema", json=broken, timeout=10).status_code == 409
    bad = requests.post(f"{base}/schema", json={"type": "AVRO", "schema": "{x"}, timeout=10)
    assert bad.status_code == 422
    assert "Invalid schema definition data for AVRO" in bad.json()["reason"]
    unknown = requests.post(f"{base}/schema", json={"type": "NOPE", "schema": ""}, timeout=10)
    assert (unknown.status_code, "unknown schema type" in unknown.json()["reason"]) == (400, True)
    huge = {"type": "STRING", "schema": "x" * (10 * 1024 * 1024)}
    too_big = requests.post(f"{base}/schema", json=huge, timeout=30)
    assert too_big.status_code == 422
    assert "exceeds the limit" in too_big.json()["reason"]

    v2 = {"type": "AVRO", "schema": json.dumps(UserV2.schema())}
    assert requests.post(f"{base}/schema", json=v2, timeout=10).json() == {
        "version": {"version": 1}
    }
    assert requests.get(f"{base}/schema/0", timeout=10).json()["version"] == 0
    every = requests.get(f"{base}/schemas", timeout=10).json()["getSchemaResponses"]
    assert [s["version"] for s in every] == [0, 1]
    # A producer with the uploaded schema gets its version, on a partition too.
    with RawClient(broker.address) as raw:
        raw.handshake()
        partition = f"persistent://public/default/{local}-partition-2"
        success = _producer(raw, partition, 0, _avro_schema(UserV2)).producer_success
        assert decode_version(success.schema_version) == 1

    deleted = requests.delete(f"{base}/schema", timeout=10)
    assert (deleted.status_code, deleted.json()) == (200, {"version": 2})
    assert requests.get(f"{base}/schema", timeout=10).status_code == 404
    assert requests.delete(f"{base}/schema", timeout=10).status_code == 404
    assert requests.put(f"{base}/schema", json=v1, timeout=10).status_code == 405


def test_admin_refuses_a_bytes_upload_as_pulsar_does(broker: Broker) -> None:
    # SchemasResourceBase.postSchemaAsync: 406, BYTES is the default schema type.
    base = f"{broker.web_service_url}/admin/v2/schemas/public/default/bytes-{next(_numbers)}"
    answer = requests.post(f"{base}/schema", json={"type": "BYTES", "schema": ""}, timeout=10)
    assert answer.status_code == 406
    assert "BYTES" in answer.json()["reason"]
    assert requests.get(f"{base}/schema", timeout=10).status_code == 404


def test_admin_key_value_schemas_use_pulsars_json_form(broker: Broker) -> None:
    base = f"{broker.web_service_url}/admin/v2/schemas/public/default/kv-{next(_numbers)}"
    document = {"key": "", "value": UserV1.schema()}
    payload = {
        "type": "KEY_VALUE",
        "schema": json.dumps(document),
        "properties": {"key.schema.type": "STRING", "value.schema.type": "AVRO"},
    }
    assert requests.post(f"{base}/schema", json=payload, timeout=10).status_code == 202
    answer = requests.get(f"{base}/schema", timeout=10).json()
    assert answer["type"] == "KEY_VALUE"
    assert json.loads(answer["data"]) == document


def test_namespace_schema_policies_over_the_admin_api(broker: Broker) -> None:
    # Pulsar's Namespaces resource: each policy reads back what was set; an unset
    # isAllowAutoUpdateSchema answers the broker's isAllowAutoUpdateSchemaEnabled.
    base = f"{broker.web_service_url}/admin/v2/namespaces/public"
    assert requests.get(f"{base}/backward/schemaCompatibilityStrategy", timeout=10).json() == (
        "BACKWARD"
    )
    assert requests.get(f"{base}/enforced/schemaValidationEnforced", timeout=10).json() is True
    assert requests.get(f"{base}/default/schemaValidationEnforced", timeout=10).json() is False
    legacy = requests.get(f"{base}/legacy/schemaAutoUpdateCompatibilityStrategy", timeout=10)
    assert legacy.json() == "AlwaysCompatible"
    assert requests.get(f"{base}/frozen/isAllowAutoUpdateSchema", timeout=10).json() is False
    assert requests.get(f"{base}/default/isAllowAutoUpdateSchema", timeout=10).json() is True
    bad = requests.put(
        f"{base}/default/schemaAutoUpdateCompatibilityStrategy", json="Sideways", timeout=10
    )
    assert bad.status_code == 400
    assert "schemaAutoUpdateCompatibilityStrategy" in bad.json()["reason"]
    bad = requests.post(f"{base}/default/isAllowAutoUpdateSchema", json="yes", timeout=10)
    assert bad.status_code == 400


def test_the_legacy_auto_update_strategy_applies_when_set(client: pulsar.Client) -> None:
    # schemaAutoUpdateCompatibilityStrategy=AlwaysCompatible with the strategy UNDEFINED:
    # fromAutoUpdatePolicy gives ALWAYS_COMPATIBLE, so an incompatible producer is accepted.
    topic = fresh("legacy")
    client.create_producer(topic, schema=AvroSchema(UserV1))
    client.create_producer(topic, schema=AvroSchema(UserBroken))


def test_without_auto_update_only_known_schemas_are_admitted(
    client: pulsar.Client, broker: Broker
) -> None:
    # isAllowAutoUpdateSchema=false: producers may not register, not even a first version
    # (AbstractTopic.addSchema); an admin upload may, and then that schema is admitted.
    topic = fresh("frozen")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(UserV1))
    local = topic.rsplit("/", 1)[1]
    upload = requests.post(
        f"{broker.web_service_url}/admin/v2/schemas/public/frozen/{local}/schema",
        json={"type": "AVRO", "schema": AvroSchema(UserV1).schema_info().schema()},
        timeout=10,
    )
    assert upload.status_code == 202, upload.text
    client.create_producer(topic, schema=AvroSchema(UserV1))  # known: fine
    with pytest.raises(pulsar.IncompatibleSchema):  # compatible, but not known
        client.create_producer(topic, schema=AvroSchema(UserV2))
    assert broker.schemas is not None
    assert [s.version for s in broker.schemas.history(topic)] == [0]


def test_deleting_a_topic_drops_its_schema(client: pulsar.Client, broker: Broker) -> None:
    # Pulsar deletes a topic's schema with the topic (AbstractTopic.deleteSchema).
    topic = fresh()
    local = topic.rsplit("/", 1)[1]
    producer = client.create_producer(topic, schema=AvroSchema(UserV1))
    producer.close()
    schema_url = f"{broker.web_service_url}/admin/v2/schemas/public/default/{local}/schema"
    assert requests.get(schema_url, timeout=10).status_code == 200
    deleted = requests.delete(
        f"{broker.web_service_url}/admin/v2/persistent/public/default/{local}", timeout=10
    )
    assert deleted.status_code == 204, deleted.text
    assert requests.get(schema_url, timeout=10).status_code == 404
    # A new topic of that name starts a new history: an incompatible schema is version 0.
    client.create_producer(topic, schema=AvroSchema(UserBroken))
    assert broker.schemas is not None
    assert [s.version for s in broker.schemas.history(topic)] == [0]


def test_deleting_a_partitioned_topic_drops_the_shared_schema(
    client: pulsar.Client, broker: Broker
) -> None:
    local = f"parted-{next(_numbers)}"
    topic = f"persistent://public/default/{local}"
    admin = f"{broker.web_service_url}/admin/v2/persistent/public/default/{local}"
    requests.put(f"{admin}/partitions", json=2, timeout=10).raise_for_status()
    client.create_producer(topic, schema=AvroSchema(UserV1)).close()
    assert broker.schemas is not None
    assert broker.schemas.has_schema(f"{topic}-partition-1")  # partitions share it
    deleted = requests.delete(f"{admin}/partitions", timeout=10)
    assert deleted.status_code == 204, deleted.text
    assert not broker.schemas.has_schema(topic)


# --- restart ----------------------------------------------------------------------------


def test_the_registry_survives_a_restart(tmp_path: Path) -> None:
    settings: dict[str, Any] = {"port": 0, "storage": "disk", "data_dir": str(tmp_path)}
    topic = fresh()
    with Broker(**settings) as first:
        client = pulsar.Client(first.service_url, operation_timeout_seconds=10)
        client.create_producer(topic, schema=AvroSchema(UserV1)).send(UserV1(name="a", age=1))
        client.create_producer(topic, schema=AvroSchema(UserV2))
        client.close()
    with Broker(**settings) as second:
        client = pulsar.Client(second.service_url, operation_timeout_seconds=10)
        with pytest.raises(pulsar.IncompatibleSchema):  # checked against the stored history
            client.create_producer(topic, schema=AvroSchema(UserBroken))
        consumer = client.subscribe(
            topic, "s", schema=AvroSchema(UserV1), initial_position=pulsar.InitialPosition.Earliest
        )
        message = consumer.receive(timeout_millis=10_000)
        assert version_of(message) == 0
        client.close()
        with RawClient(second.address) as raw:
            raw.handshake()
            assert decode_version(_get_schema(raw, topic, None).schema_version) == 1
    # Kept in the metadata store's database, not in a file of the registry's own.
    assert not (tmp_path / "schemas.sqlite").exists()


def test_auto_consume_and_schemaless_consumers_are_not_checked(broker: Broker) -> None:
    topic = fresh()
    with RawClient(broker.address) as raw:
        raw.handshake()
        _producer(raw, topic, 0, _avro_schema(UserV1))
        for consumer_id, schema in enumerate(
            (pb.Schema(name="auto", schema_data=b"", type=21), None)  # wire AutoConsume
        ):
            subscribe = pb.CommandSubscribe(
                topic=topic,
                subscription="s",
                sub_type=1,
                consumer_id=consumer_id,
                request_id=10 + consumer_id,
            )
            if schema is not None:
                subscribe.schema.CopyFrom(schema)
            raw.send_command(T(type=T.SUBSCRIBE, subscribe=subscribe))
            assert raw.expect(T.SUCCESS).success.request_id == 10 + consumer_id
    assert broker.schemas is not None
    assert len(broker.schemas.history(topic)) == 1


def test_a_typed_consumer_on_an_active_topic_without_a_schema_is_refused(
    client: pulsar.Client,
) -> None:
    # AbstractTopic.addSchemaIfIdleOrCheckCompatible: data but no schema to check against.
    topic = fresh()
    client.create_producer(topic).send(b"untyped")
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "s", schema=StringSchema())
    client.subscribe(topic, "plain")  # without a schema: fine
