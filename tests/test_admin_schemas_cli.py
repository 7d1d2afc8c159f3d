"""``brokerlet admin schemas get / upload / delete`` and the admin client's schema calls,
against a running brokerlet.

Verbs, flags and output follow pulsar-admin's CmdSchemas: ``get`` prints a
SchemaInfoWithVersion (``--version`` a SchemaInfo, ``--all-version`` a list of them),
``upload -f`` reads a PostSchemaPayload file, ``delete [-f]`` marks the schema deleted (or
removes every version).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, Record, String

from brokerlet import Broker
from brokerlet.admin import cli as admin_cli
from brokerlet.admin.client import AdminClient, Conflict, NotFound

User: object = type("User", (Record,), {"name": String(), "age": Integer()})
USER = json.loads(AvroSchema(User).schema_info().schema())
# Adds a field with a default: FULL-compatible with USER.
USER_V2 = {**USER, "fields": [*USER["fields"], {"name": "email", "type": "string", "default": ""}]}
# Adds a field without a default: a reader of it cannot read USER data (not FULL).
USER_BROKEN = {**USER, "fields": [*USER["fields"], {"name": "zip", "type": "string"}]}


@pytest.fixture(scope="module")
def running() -> Iterator[Broker]:
    with Broker(port=0) as broker:
        yield broker


def run(broker: Broker, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    real_err = sys.stderr
    sys.stderr = err
    try:
        code = admin_cli.main(["--admin-url", str(broker.web_service_url), *argv], out=out)
    finally:
        sys.stderr = real_err
    return code, out.getvalue(), err.getvalue()


def payload_file(tmp_path: Path, name: str, definition: object, **extra: object) -> str:
    path = tmp_path / name
    # The definition as a string, as pulsar-admin's PostSchemaPayload files hold it.
    path.write_text(json.dumps({"type": "AVRO", "schema": json.dumps(definition), **extra}))
    return str(path)


def test_upload_get_and_delete_through_the_command_line(running: Broker, tmp_path: Path) -> None:
    topic = "persistent://public/default/cli-schema"
    first = payload_file(tmp_path, "v1.json", USER, properties={"owner": "billing"})
    assert run(running, "schemas", "upload", topic, "-f", first) == (0, "", "")
    assert (
        run(running, "schemas", "upload", topic, "-f", payload_file(tmp_path, "v2.json", USER_V2))[
            0
        ]
        == 0
    )

    code, out, err = run(running, "schemas", "get", topic)
    assert code == 0, err
    latest = json.loads(out)
    assert latest["version"] == 1
    info = latest["schemaInfo"]
    assert (info["name"], info["type"], info["schema"]) == ("cli-schema", "AVRO", USER_V2)
    assert isinstance(info["timestamp"], int)
    assert info["timestamp"] > 0

    code, out, _err = run(running, "schemas", "get", topic, "--version", "0")
    assert code == 0
    assert json.loads(out)["properties"] == {"owner": "billing"}
    code, out, _err = run(running, "schemas", "get", topic, "-a")
    assert code == 0
    assert [i["schema"] for i in json.loads(out)] == [USER, USER_V2]

    # An incompatible upload is refused with Pulsar's 409 and changes nothing.
    broken = payload_file(tmp_path, "broken.json", USER_BROKEN)
    code, out, err = run(running, "schemas", "upload", topic, "-f", broken)
    assert (code, out) == (1, "")
    assert err.startswith("409 Conflict\n\nReason: ")
    assert json.loads(run(running, "schemas", "get", topic)[1])["version"] == 1

    # The official client's producer gets the matching version.
    client = pulsar.Client(running.service_url, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic, schema=AvroSchema(User))
        producer.send(User(name="ada", age=36))  # type: ignore[operator]
    finally:
        client.close()

    assert run(running, "schemas", "delete", topic) == (0, "", "")
    code, out, err = run(running, "schemas", "get", topic)
    assert (code, out) == (1, "")
    assert err.startswith("404 Not Found")


def test_a_forced_delete_removes_every_version(running: Broker, tmp_path: Path) -> None:
    topic = "persistent://public/default/cli-schema-forced"
    assert (
        run(running, "schemas", "upload", topic, "-f", payload_file(tmp_path, "s.json", USER))[0]
        == 0
    )
    assert run(running, "schemas", "delete", topic, "--force")[0] == 0
    assert running.schemas is not None
    assert running.schemas.history(topic) == []  # no marker left: gone entirely
    # With no history left, an incompatible schema is a new version 0.
    with AdminClient(str(running.web_service_url)) as admin:
        assert admin.upload_schema(topic, "AVRO", json.dumps(USER_BROKEN)) == 0


def test_the_admin_client_schema_calls(running: Broker) -> None:
    topic = "public/default/client-schema"  # pulsar-admin's short form works too
    with AdminClient(str(running.web_service_url)) as admin:
        with pytest.raises(NotFound):
            admin.schema(topic)
        assert admin.upload_schema(topic, "STRING") == 0
        assert admin.upload_schema(topic, "STRING") == 0  # the same schema: the same version
        assert admin.schema(topic)["type"] == "STRING"
        assert admin.schema(topic, 0)["version"] == 0
        assert [r["version"] for r in admin.schemas(topic)] == [0]
        with pytest.raises(Conflict):  # a change of type is never compatible
            admin.upload_schema(topic, "AVRO", json.dumps(USER))
        admin.delete_schema(topic)
        with pytest.raises(NotFound):
            admin.schema(topic)


def test_bad_schema_commands_exit_with_a_message(running: Broker, tmp_path: Path) -> None:
    topic = "persistent://public/default/cli-schema-bad"
    code, _out, err = run(running, "schemas", "upload", topic, "-f", str(tmp_path / "missing"))
    assert code == 2
    assert "is not found" in err
    not_json = tmp_path / "bad.json"
    not_json.write_text("type: AVRO")
    code, _out, err = run(running, "schemas", "upload", topic, "-f", str(not_json))
    assert code == 2
    assert "cannot be read" in err
    code, _out, err = run(running, "schemas", "get", topic, "-v", "0", "-a")
    assert code == 2
    assert "Only one or neither of --version and --all-version" in err
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"type": "AVRO", "schema": "{not avro"}))
    code, _out, err = run(running, "schemas", "upload", topic, "-f", str(invalid))
    assert code == 1
    assert err.startswith("422 ")
    assert running.schemas is not None
    assert running.schemas.history(topic) == []
