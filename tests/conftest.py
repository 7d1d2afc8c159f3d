"""Shared pytest fixtures."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import gevent
import gevent.event
import pulsar
import pykka
import pytest

from brokerlet import Broker, _compiled
from brokerlet.actors._runtime import GeventActor, GeventFuture
from tests.tlscerts import Pki, make_pki


class EventLike(Protocol):
    """What tests use of `threading.Event` and `gevent.event.Event`."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class TaskLike(Protocol):
    """What tests use of a started `threading.Thread` or `gevent.Greenlet`."""

    def join(self, timeout: float | None = None) -> Any: ...


@dataclass(frozen=True)
class Runtime:
    """One way to run actors, so a test can run under each of them.

    Attributes:
        name: test id.
        actor_class: the actor base class to subclass.
        future_class: the future type its refs hand out.
        sleep: a sleep that lets the runtime's other tasks run.
        event_class: makes an event that tasks of this runtime can wait on.
        spawn: starts `func(*args)` concurrently (a greenlet for gevent, a
            thread for threading) and returns something with `join(timeout)`.
    """

    name: str
    actor_class: type[pykka.Actor]
    future_class: type[pykka.Future[Any]]
    sleep: Callable[[float], None]
    event_class: Callable[[], EventLike]
    spawn: Callable[..., TaskLike]


def pytest_report_header() -> str:
    return f"brokerlet hot modules: {_compiled.STATUS}"


def _spawn_thread(func: Callable[..., object], *args: object) -> threading.Thread:
    thread = threading.Thread(target=func, args=args, daemon=True)
    thread.start()
    return thread


RUNTIMES = [
    Runtime(
        name="threading",
        actor_class=pykka.ThreadingActor,
        future_class=pykka.ThreadingFuture,
        sleep=time.sleep,
        event_class=threading.Event,
        spawn=_spawn_thread,
    ),
    Runtime(
        name="gevent",
        actor_class=GeventActor,
        future_class=GeventFuture,
        sleep=gevent.sleep,
        event_class=gevent.event.Event,
        spawn=gevent.spawn,
    ),
]


@pytest.fixture(params=RUNTIMES, ids=[runtime.name for runtime in RUNTIMES])
def runtime(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    """Each actor runtime in turn; stops every actor left running afterwards."""
    yield request.param
    pykka.ActorRegistry.stop_all(block=True, timeout=5)


# A broker and the official client, for the conformance modules. A module-scoped broker
# starts in milliseconds; each test gets its own client and topic.

_topic_numbers = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """A broker on an ephemeral port, on its own thread (modules may override this)."""
    with Broker(port=0) as running:
        yield running


@pytest.fixture
def client(broker: Broker) -> Iterator[pulsar.Client]:
    """The official pulsar-client, connected to ``broker``."""
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    yield client
    client.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic no other test uses."""
    return f"persistent://public/default/{request.node.name[:40]}-{next(_topic_numbers)}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with broker and client certificates, made for this session (tests/tlscerts.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"))
