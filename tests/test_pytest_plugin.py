"""brokerlet's pytest plugin, used the way a user's project uses it.

Each test writes a small project into a temporary directory and runs pytest on it in a
subprocess (``-W error``, so any warning fails it), where the plugin is loaded through its
``pytest11`` entry point exactly as after ``pip install brokerlet``. The project's conftest
records the process's threads and file descriptors at session start and after every fixture
was torn down, so the outer test can check nothing was left behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from brokerlet import Broker

LEAK_CONFTEST = """
import json, os, threading
import gevent

def _fds():
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return sorted(names)

def _threads():
    return len(os.listdir("/proc/self/task")), threading.active_count()

def pytest_sessionstart(session):
    # The main thread's hub and its thread pool (gevent resolves names on it) belong to the
    # process, not to the plugin: they live as long as it does.
    gevent.get_hub().threadpool.apply(int)
    session.config._leak_before = (_fds(), _threads())

def pytest_unconfigure(config):
    before = getattr(config, "_leak_before", None)
    if before is None or hasattr(config, "workerinput"):
        return
    import gc
    gc.collect()
    after = (_fds(), _threads())
    path = os.environ.get("LEAK_REPORT")
    if path:
        with open(path, "w") as report:
            json.dump({"fds_before": before[0], "fds_after": after[0],
                       "threads_before": before[1], "threads_after": after[1]}, report)
"""

USER_TESTS = """
import os
import pytest
from brokerlet.testing.helpers import (
    assert_payloads, assert_received, read_all, wait_for_backlog,
)

SEEN = {}

def _produce(client, topic, payloads):
    producer = client.create_producer(topic)
    for payload in payloads:
        producer.send(payload)
    producer.close()

def test_publish_and_consume(pulsar_client, pulsar_topic, pulsar_admin_url):
    SEEN["topic"] = pulsar_topic
    consumer = pulsar_client.subscribe(pulsar_topic, "billing")
    _produce(pulsar_client, pulsar_topic, [b"a", b"b", b"c"])
    wait_for_backlog(pulsar_admin_url, pulsar_topic, "billing", 3)
    assert read_all(pulsar_client, pulsar_topic) == [b"a", b"b", b"c"]
    assert_received(consumer, [b"a", b"b", b"c"])
    wait_for_backlog(pulsar_admin_url, pulsar_topic, "billing", 0)
    consumer.close()

def test_topics_are_unique_per_test(pulsar_topic):
    assert pulsar_topic.startswith("persistent://public/default/test_topics_are_unique")
    assert pulsar_topic != SEEN["topic"]

def test_failure_messages_show_expected_and_received(pulsar_client, pulsar_topic,
                                                     pulsar_admin_url):
    consumer = pulsar_client.subscribe(pulsar_topic, "s")
    _produce(pulsar_client, pulsar_topic, [b"x", b"z"])
    with pytest.raises(AssertionError) as failure:
        assert_received(consumer, [b"x", b"y"], timeout=5)
    text = str(failure.value)
    assert "expected (2): [b'x', b'y']" in text, text
    assert "received (2): [b'x', b'z']" in text, text
    assert "missing: [b'y']" in text and "unexpected: [b'z']" in text, text
    with pytest.raises(AssertionError, match="out of order from index 0"):
        assert_payloads([b"2", b"1"], [b"1", b"2"])
    assert_payloads([b"2", b"1"], [b"1", b"2"], ordered=False)
    with pytest.raises(AssertionError, match="backlog of subscription 'nobody'.*does not exist"):
        wait_for_backlog(pulsar_admin_url, pulsar_topic, "nobody", 1, timeout=0.3)
    consumer.close()

@pytest.mark.brokerlet(dispatcherMaxReadBatchSize=7)
def test_marker_gives_a_broker_of_its_own(brokerlet_test_broker, brokerlet_broker,
                                          pulsar_service_url, pulsar_client, pulsar_topic):
    assert brokerlet_test_broker is not brokerlet_broker
    assert pulsar_service_url == brokerlet_test_broker.service_url
    assert pulsar_service_url != brokerlet_broker.service_url
    assert brokerlet_test_broker.settings.dispatcher_max_read_batch_size == 7
    _produce(pulsar_client, pulsar_topic, [b"own"])
    assert read_all(pulsar_client, pulsar_topic) == [b"own"]

def test_factory_starts_disk_brokers_and_cleans_up(brokerlet_broker_factory):
    broker = brokerlet_broker_factory(storage="disk", dispatcherMaxReadBatchSize=10)
    SEEN["data_dir"] = broker.settings.data_dir
    assert os.path.isdir(broker.settings.data_dir)
    assert broker.settings.dispatcher_max_read_batch_size == 10

def test_factory_data_dir_is_gone():
    assert not os.path.exists(SEEN["data_dir"])
"""


def _run_pytest(
    project: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 50
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    environment.pop("PYTEST_ADDOPTS", None)
    environment.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _project(tmp_path: Path, tests: str, conftest: str = LEAK_CONFTEST) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(conftest)
    (project / "test_user.py").write_text(textwrap.dedent(tests))
    # No pytest.ini: pytest must not pick up our pyproject's settings.
    (project / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    return project


def _leaks(report_path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(report_path.read_text())
    new_fds = list(report["fds_after"])
    for name in report["fds_before"]:
        if name in new_fds:
            new_fds.remove(name)
    return {"new_fds": new_fds, "threads": (report["threads_before"], report["threads_after"])}


@pytest.mark.parametrize("client_kind", ["official", "brokerlet"])
def test_fixtures_work_in_a_user_project_and_leave_nothing_behind(
    tmp_path: Path, client_kind: str
) -> None:
    project = _project(tmp_path, USER_TESTS)
    report = tmp_path / "leaks.json"
    result = _run_pytest(
        project, f"--brokerlet-client={client_kind}", env={"LEAK_REPORT": str(report)}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout, result.stdout
    leaks = _leaks(report)
    assert leaks["new_fds"] == [], leaks
    before, after = leaks["threads"]
    assert after == before, leaks


def test_the_same_tests_run_against_an_external_broker(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """
        def test_uses_the_given_broker(pulsar_service_url, pulsar_admin_url, brokerlet_broker,
                                       pulsar_client):
            import os
            assert pulsar_service_url == os.environ["URL"]
            assert pulsar_admin_url == os.environ["ADMIN"]
            producer = pulsar_client.create_producer(os.environ["TOPIC"])
            producer.send(b"to the external broker")
            producer.close()
        """,
    )
    with Broker(port=0) as external:
        url, admin = external.service_url, str(external.web_service_url)
        topic = "persistent://public/default/external-broker-witness"
        result = _run_pytest(
            project,
            f"--brokerlet-url={url}",
            f"--brokerlet-admin-url={admin}",
            env={"URL": url, "ADMIN": admin, "TOPIC": topic},
        )
        assert result.returncode == 0, result.stdout + result.stderr
        # The message went to the external broker, not to one the plugin started.
        assert external.topic_stats(topic)["msgInCounter"] == 1


def test_an_external_url_that_does_not_answer_fails_naming_it(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    project = _project(
        tmp_path,
        """
        def test_one(pulsar_client):
            pass

        def test_two(pulsar_service_url):
            pass
        """,
    )
    result = _run_pytest(project, f"--brokerlet-url=pulsar://127.0.0.1:{port}", "-x")
    assert result.returncode != 0
    assert f"--brokerlet-url pulsar://127.0.0.1:{port} does not answer" in result.stdout, (
        result.stdout
    )
    assert "1 error" in result.stdout, result.stdout


def test_a_broker_that_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the data directory should be")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        project = _project(
            tmp_path,
            f"""
            import pytest

            @pytest.mark.brokerlet(port={port})
            def test_port_taken(pulsar_service_url):
                pass

            @pytest.mark.brokerlet(storage="disk", data_dir={str(blocker / "data")!r})
            def test_bad_data_dir(pulsar_service_url):
                pass

            @pytest.mark.brokerlet(dispatcherMaxReadBatchSize=-3)
            def test_bad_setting(pulsar_service_url):
                pass
            """,
        )
        result = _run_pytest(project, timeout=40)
    out = result.stdout
    assert "3 error" in out, out
    assert f"could not start a broker (port {port} on 127.0.0.1)" in out, out
    assert f"data directory {str(blocker / 'data')!r}" in out, out
    assert "bad setting for the test broker: dispatcher_max_read_batch_size = -3" in out, out


def test_no_brokerlet_turns_the_plugin_off(tmp_path: Path) -> None:
    project = _project(tmp_path, "def test_x(pulsar_topic):\n    pass\n", conftest="")
    result = _run_pytest(project, "-p", "no:brokerlet")
    assert result.returncode != 0
    assert "fixture 'pulsar_topic' not found" in result.stdout, result.stdout


def test_each_xdist_worker_gets_its_own_broker(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    out_dir = tmp_path / "urls"
    out_dir.mkdir()
    tests = "".join(
        f"""
def test_{number}(pulsar_client, pulsar_topic, brokerlet_broker):
    import os
    worker = os.environ["PYTEST_XDIST_WORKER"]
    with open(os.path.join({str(out_dir)!r}, worker + "-{number}"), "w") as f:
        f.write(brokerlet_broker.service_url)
    producer = pulsar_client.create_producer(pulsar_topic)
    producer.send(b"x")
    producer.close()
"""
        for number in range(4)
    )
    project = _project(tmp_path, tests)
    result = _run_pytest(project, "-n", "2", "-p", "xdist", timeout=55)
    assert result.returncode == 0, result.stdout + result.stderr
    urls: dict[str, set[str]] = {}
    for path in out_dir.iterdir():
        urls.setdefault(path.name.split("-")[0], set()).add(path.read_text())
    assert len(urls) == 2, urls  # both workers ran tests
    # One broker per worker (session scope), on different ephemeral ports.
    assert all(len(seen) == 1 for seen in urls.values()), urls
    assert len(set.union(*urls.values())) == 2, urls
