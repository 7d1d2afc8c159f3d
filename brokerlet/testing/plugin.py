"""brokerlet's pytest plugin: a Pulsar broker for your tests, started in milliseconds.

Installing brokerlet registers it (entry point ``pytest11``, name ``brokerlet``);
``-p no:brokerlet`` turns it off. Fixtures:

``brokerlet_broker`` (session)
    An in-memory :class:`~brokerlet.Broker` on ephemeral ports, one per test process (so one
    per pytest-xdist worker). With ``--brokerlet-url`` it is an :class:`ExternalBroker`
    instead: the given broker, checked to answer.
``brokerlet_test_broker``
    The broker of this test: the session's, or its own under ``@pytest.mark.brokerlet``.
``pulsar_service_url``, ``pulsar_admin_url``
    Where the test's broker listens (``pulsar://...``, ``http://...``).
``pulsar_client``
    The official ``pulsar.Client`` if ``pulsar-client`` is installed, else brokerlet's own
    client; closed after the test. ``--brokerlet-client=official|brokerlet`` chooses.
``pulsar_topic``
    A topic name no other test uses, deleted after the test where the admin API can.
``pulsar_admin``
    An :class:`~brokerlet.admin.AdminClient` on ``pulsar_admin_url``.
``brokerlet_broker_factory``
    ``brokerlet_broker_factory(dispatcherMaxReadBatchSize=10, storage="disk")`` starts a
    broker with those settings (disk data in a temporary directory), stopped after the test.

``@pytest.mark.brokerlet(**settings)`` gives one test a broker of its own with those
settings: ``pulsar_service_url``, ``pulsar_admin_url``, ``pulsar_client`` and ``pulsar_admin``
then point at it.

A broker that cannot start fails the test with the reason (port, data directory); a
``--brokerlet-url`` that does not answer fails the first test that needs it, naming the URL.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    from brokerlet import Broker
    from brokerlet.admin.client import AdminClient

__all__ = ["BrokerFactory", "ExternalBroker", "start_broker"]

log = logging.getLogger(__name__)

_START_TIMEOUT = 10.0
_CONNECT_TIMEOUT = 5.0
_topic_numbers = itertools.count()


@dataclass(frozen=True)
class ExternalBroker:
    """A broker this plugin did not start (``--brokerlet-url``)."""

    service_url: str
    web_service_url: str


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("brokerlet", "brokerlet: a Pulsar broker for tests")
    group.addoption(
        "--brokerlet-url",
        default=None,
        metavar="pulsar://HOST:PORT",
        help="run against this running broker (a Pulsar cluster, say) instead of starting one",
    )
    group.addoption(
        "--brokerlet-admin-url",
        default=None,
        metavar="http://HOST:PORT",
        help="its admin API (default: the --brokerlet-url host, port 8080)",
    )
    group.addoption(
        "--brokerlet-client",
        default="auto",
        choices=("auto", "official", "brokerlet"),
        help="pulsar_client's kind: the official pulsar-client if installed (auto), or one",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "brokerlet(**settings): give this test a broker of its own, with these settings",
    )


# -- starting brokers --------------------------------------------------------------------


def start_broker(**settings: Any) -> Broker:
    """Start an embedded broker on ephemeral ports (in memory unless told otherwise).

    Raises:
        pytest.fail.Exception: it could not start; the message names port and data directory.
    """
    from brokerlet import Broker, SettingsError  # noqa: PLC0415 -- keep plugin loading light

    settings = {"port": 0, **settings}
    try:
        broker = Broker(**settings)
    except SettingsError as error:
        pytest.fail(f"brokerlet: bad setting for the test broker: {error}", pytrace=False)
    try:
        broker.start(timeout=_START_TIMEOUT)
    except Exception as error:
        broker.stop()
        where = f"port {broker.settings.port} on {broker.settings.host}"
        if broker.settings.storage == "disk":
            where += f", data directory {broker.settings.data_dir!r}"
        pytest.fail(
            f"brokerlet: could not start a broker ({where}): {type(error).__name__}: {error}",
            pytrace=False,
        )
    return broker


class BrokerFactory:
    """Starts brokers with given settings; :meth:`stop_all` stops them and removes the
    temporary data directories it made."""

    def __init__(self) -> None:
        self._brokers: list[Broker] = []
        self._directories: list[str] = []

    def __call__(self, **settings: Any) -> Broker:
        if settings.get("storage") == "disk" and not (
            "data_dir" in settings or "dataDir" in settings
        ):
            directory = tempfile.mkdtemp(prefix="brokerlet-test-")
            self._directories.append(directory)
            settings["data_dir"] = directory
        broker = start_broker(**settings)
        self._brokers.append(broker)
        return broker

    def stop_all(self) -> None:
        while self._brokers:
            self._brokers.pop().stop()
        while self._directories:
            shutil.rmtree(self._directories.pop(), ignore_errors=True)


def _check_answers(url: str, default_port: int, what: str) -> None:
    parts = urlsplit(url)
    if not parts.hostname:
        pytest.fail(f"brokerlet: {what} {url!r} has no host", pytrace=False)
    try:
        with socket.create_connection(
            (parts.hostname, parts.port or default_port), timeout=_CONNECT_TIMEOUT
        ):
            pass
    except OSError as error:
        pytest.fail(f"brokerlet: {what} {url} does not answer: {error}", pytrace=False)


def _external(config: pytest.Config) -> ExternalBroker | None:
    url = config.getoption("--brokerlet-url")
    if not url:
        return None
    admin_url = config.getoption("--brokerlet-admin-url")
    if not admin_url:
        admin_url = f"http://{urlsplit(url).hostname}:8080"
    return ExternalBroker(str(url), str(admin_url))


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def brokerlet_broker(pytestconfig: pytest.Config) -> Iterator[Broker | ExternalBroker]:
    """The session's broker: embedded, in memory, on ephemeral ports (or ``--brokerlet-url``)."""
    external = _external(pytestconfig)
    if external is not None:
        _check_answers(external.service_url, 6650, "--brokerlet-url")
        yield external
        return
    broker = start_broker()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def brokerlet_broker_factory() -> Iterator[BrokerFactory]:
    """``brokerlet_broker_factory(**settings)`` starts a broker with those settings."""
    factory = BrokerFactory()
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def brokerlet_test_broker(request: pytest.FixtureRequest) -> Iterator[Broker | ExternalBroker]:
    """The broker of this test: its own for ``@pytest.mark.brokerlet``, else the session's."""
    marker = request.node.get_closest_marker("brokerlet")
    if marker is None:
        yield request.getfixturevalue("brokerlet_broker")
        return
    if marker.args:
        raise pytest.UsageError("@pytest.mark.brokerlet takes settings as keywords only")
    factory = BrokerFactory()
    try:
        yield factory(**marker.kwargs)
    finally:
        factory.stop_all()


@pytest.fixture
def pulsar_service_url(brokerlet_test_broker: Broker | ExternalBroker) -> str:
    """The test broker's ``pulsar://`` URL."""
    return brokerlet_test_broker.service_url


@pytest.fixture
def pulsar_admin_url(
    brokerlet_test_broker: Broker | ExternalBroker, pytestconfig: pytest.Config
) -> str:
    """The test broker's admin API base URL (``http://host:port``)."""
    url = brokerlet_test_broker.web_service_url
    if url is None:
        pytest.fail("brokerlet: the test broker runs without its web service", pytrace=False)
    if isinstance(brokerlet_test_broker, ExternalBroker):
        _check_answers(url, 8080, "--brokerlet-admin-url")
    return url


@pytest.fixture
def pulsar_admin(pulsar_admin_url: str) -> Iterator[AdminClient]:
    """An admin client for the test broker, closed after the test."""
    from brokerlet.admin.client import AdminClient  # noqa: PLC0415

    admin = AdminClient(pulsar_admin_url, timeout=10)
    try:
        yield admin
    finally:
        admin.close()


def _official_client_class() -> Callable[..., Any] | None:
    try:
        import pulsar  # noqa: PLC0415
    except ImportError:
        return None
    client_class: Callable[..., Any] = pulsar.Client
    return client_class


@pytest.fixture
def pulsar_client(pulsar_service_url: str, pytestconfig: pytest.Config) -> Iterator[Any]:
    """A client on the test broker: the official ``pulsar.Client`` when installed, else
    brokerlet's gevent-native ``brokerlet.Client``; closed after the test."""
    kind = pytestconfig.getoption("--brokerlet-client")
    official = None if kind == "brokerlet" else _official_client_class()
    if official is None and kind == "official":
        pytest.fail("brokerlet: --brokerlet-client=official, but pulsar-client is not installed")
    if official is not None:
        client = official(pulsar_service_url, operation_timeout_seconds=10)
    else:
        from brokerlet import Client  # noqa: PLC0415

        client = Client(pulsar_service_url, operation_timeout_seconds=10)
    try:
        yield client
    finally:
        client.close()
        if official is None:
            import gevent  # noqa: PLC0415

            # brokerlet's client closes its sockets on its greenlets: give them their turn.
            gevent.sleep(0)


def _topic_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:48] or "test"


@pytest.fixture
def pulsar_topic(request: pytest.FixtureRequest, brokerlet_test_broker: Any) -> Iterator[str]:
    """``persistent://public/default/<test name>-<unique>``, deleted after the test where the
    broker's admin API deletes topics (brokers without that route keep it)."""
    name = (
        f"persistent://public/default/{_topic_part(request.node.name)}"
        f"-{next(_topic_numbers)}-{uuid.uuid4().hex[:8]}"
    )
    yield name
    admin_url = brokerlet_test_broker.web_service_url
    if admin_url is not None:
        _delete_topic(admin_url, name)


def _delete_topic(admin_url: str, topic: str) -> None:
    from brokerlet.admin.client import AdminClient, AdminError  # noqa: PLC0415

    with AdminClient(admin_url, timeout=5) as admin, contextlib.suppress(AdminError):
        # Not found, not supported (404/405/501) or unreachable: nothing to clean up.
        admin.delete_topic(topic, force=True)
