"""The embeddable broker.

:class:`Broker` runs every actor of one broker on one gevent hub. ``start()`` gives that hub a
thread of its own, so a broker can be embedded in any program (threaded, asyncio, or a test
suite using the official C++-based client) without monkey patching it; ``serve_forever()``
runs it on the calling thread instead, as ``brokerlet serve`` does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import gevent
import gevent.event
import pykka

from brokerlet.actors.broker import BrokerActor, GetAllStats, GetTopic, GetTopicStats
from brokerlet.actors.eventloop import EventLoopActor
from brokerlet.admin import AdminServer
from brokerlet.admin.mini_app import schema_admin_app
from brokerlet.config import Settings, load_settings
from brokerlet.schema import SchemaRegistry, SqliteSchemaStorage
from brokerlet.storage import DiskStorage, FileOps
from brokerlet.transport.server import Server

__all__ = ["Broker"]

log = logging.getLogger(__name__)

R = TypeVar("R")


class Broker:
    """A Pulsar-compatible broker.

    Args:
        settings: a complete settings object; defaults to :func:`load_settings` with no file
            and no environment, so an embedded broker is not steered by ``BROKERLET_*``.
        **overrides: individual settings, by snake_case key or Pulsar alias
            (``Broker(port=0, dispatcherMaxReadBatchSize=50)``).

    Example::

        with Broker(port=0) as broker:
            client = pulsar.Client(broker.service_url)
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        storage_file_ops: FileOps | None = None,
        **overrides: object,
    ) -> None:
        if settings is None:
            settings = load_settings(env={}, overrides=overrides)
        elif overrides:
            settings = settings.replace(**overrides)
        # An ephemeral broker gets an ephemeral web service too, unless another port was
        # chosen, so test suites (and several `brokerlet serve --port 0`) run side by side.
        web_port_given = any(k in overrides for k in ("web_service_port", "webServicePort"))
        default_web_port = Settings.__dataclass_fields__["web_service_port"].default
        if (
            settings.port == 0
            and settings.web_service_port == default_web_port
            and not web_port_given
        ):
            settings = settings.replace(web_service_port=0)
        self.settings = settings
        self._file_ops = storage_file_ops
        self._storage: DiskStorage | None = None
        self._thread: threading.Thread | None = None
        self._hub: Any = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stop_event: gevent.event.Event | None = None
        self._done = threading.Event()
        self._server: Server | None = None
        self._admin: AdminServer | None = None
        self._broker_actor: pykka.ActorRef[BrokerActor] | None = None
        self._event_loops: list[pykka.ActorRef[EventLoopActor]] = []
        self.schemas: SchemaRegistry | None = None
        self.started_at: float | None = None
        self.startup_seconds: float | None = None

    # Lifecycle.

    def start(self, timeout: float = 10.0) -> Broker:
        """Start on a thread of its own; return once the broker accepts connections."""
        if self._thread is not None:
            raise RuntimeError("broker already started")
        self._thread = threading.Thread(target=self._thread_main, name="brokerlet", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"broker did not start within {timeout} s")
        if self._start_error is not None:
            raise self._start_error
        return self

    def serve_forever(self, on_ready: Callable[[Broker], object] | None = None) -> None:
        """Run on the calling thread until :meth:`stop` (or SIGINT/SIGTERM via the CLI)."""
        self._run(on_ready)
        if self._start_error is not None:
            raise self._start_error

    def stop(self, timeout: float = 10.0) -> None:
        """Close every connection and actor; idempotent."""
        if self._stop_event is None or self._hub is None:
            return
        if threading.current_thread() is self._thread or self._thread is None:
            self._stop_event.set()
        else:
            self._hub.loop.run_callback_threadsafe(self._stop_event.set)
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # Where to connect.

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) the broker listens on; the port is the real one when 0 was asked."""
        if self._server is None:
            raise RuntimeError("broker not started")
        return self._server.address

    @property
    def web_service_url(self) -> str | None:
        """The stats HTTP endpoint's base URL, or None when the web service is off."""
        if self._admin is None:
            return None
        host, port = self._admin.address
        return f"http://{host}:{port}"

    @property
    def service_url(self) -> str:
        """The ``pulsar://`` URL clients should use (also what lookups answer)."""
        if self.settings.advertised_url:
            return self.settings.advertised_url
        host, port = self.address
        return f"pulsar://{host}:{port}"

    # Observability.

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        """Stats of one topic, shaped like Pulsar's topic stats; None for an unknown topic."""
        stats: dict[str, Any] | None = self._call(
            lambda ref: ref.ask(GetTopicStats(topic), block=True)
        )
        return stats

    def stats(self) -> dict[str, Any]:
        """Stats of every topic, keyed by topic name."""
        stats: dict[str, Any] = self._call(lambda ref: ref.ask(GetAllStats(), block=True))
        return stats

    def _call(self, func: Callable[[pykka.ActorRef[BrokerActor]], R], timeout: float = 10.0) -> R:
        """Run ``func(broker_actor)`` on the broker's hub and return its result to this thread."""
        ref = self._broker_actor
        if ref is None:
            raise RuntimeError("broker not started")
        if self._thread is None or threading.current_thread() is self._thread:
            return func(ref)
        result: concurrent.futures.Future[R] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(func(ref))
            except BaseException as error:
                result.set_exception(error)

        self._hub.loop.run_callback_threadsafe(gevent.spawn, run)
        return result.result(timeout)

    # Running on the hub.

    def _thread_main(self) -> None:
        try:
            self._run(None)
        finally:
            self._done.set()

    def _run(self, on_ready: Callable[[Broker], object] | None) -> None:
        began = time.perf_counter()
        self._hub = gevent.get_hub()
        self._stop_event = gevent.event.Event()
        try:
            self._start_actors()
        except BaseException as error:
            self._start_error = error
            self._shutdown()
            self._ready.set()
            return
        self.started_at = time.time()
        self.startup_seconds = time.perf_counter() - began
        log.info(
            "brokerlet listening on %s, stats on %s (storage %s, %d event loop(s), "
            "started in %.0f ms)",
            self.service_url,
            self.web_service_url or "(off)",
            self.settings.storage,
            self.settings.event_loops,
            self.startup_seconds * 1000,
        )
        self._ready.set()
        if on_ready is not None:
            on_ready(self)
        try:
            self._stop_event.wait()
        finally:
            self._shutdown()
            log.info("brokerlet stopped")

    def _start_actors(self) -> None:
        settings = self.settings
        if settings.storage == "disk":
            self._storage = DiskStorage(
                settings.data_dir,
                settings.sync_policy,
                sync_interval_ms=settings.sync_interval_ms,
                segment_bytes=settings.segment_bytes,
                cache_bytes=settings.cache_bytes,
                cursor_flush_ms=settings.cursor_flush_ms,
                file_ops=self._file_ops,
            )
        self.schemas = self._schema_registry()
        self._broker_actor = BrokerActor.start(self.settings, self._storage)
        if self._storage is not None:
            # Recover every stored topic now: torn tails are repaired and logged at start-up,
            # and retention knows every durable subscription before anyone acks.
            for name in self._storage.topics():
                self._broker_actor.ask(GetTopic(name))
        self._event_loops = [EventLoopActor.start(i) for i in range(self.settings.event_loops)]
        self._server = Server(
            self.settings,
            broker=self._broker_actor,
            event_loops=self._event_loops,
            advertised_url=lambda: self.service_url,
            schemas=self.schemas,
        )
        self._server.start()
        if self.settings.web_service_enabled:
            self._admin = AdminServer(
                self.settings.host,
                self.settings.web_service_port,
                topic_stats=self.topic_stats,
                all_stats=self.stats,
                fallback=schema_admin_app(self.schemas, self.settings),
            )
            self._admin.start()

    def _schema_registry(self) -> SchemaRegistry:
        # Until the metadata store (issue 12) holds them, disk brokers keep schemas in a
        # SQLite file of their own beside the topics; SqliteSchemaStorage also takes the
        # store's connection.
        if self.settings.storage == "disk":
            path = Path(self.settings.data_dir) / "schemas.sqlite"
            return SchemaRegistry(self.settings, SqliteSchemaStorage(path))
        return SchemaRegistry(self.settings)

    def _shutdown(self) -> None:
        if self._admin is not None:
            self._admin.stop()
        if self._server is not None:
            self._server.stop()
        for ref in [self._broker_actor, *self._event_loops]:
            if ref is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.stop(block=True, timeout=5)
        if self._storage is not None:
            self._storage.close()
            self._storage = None
        if self.schemas is not None:
            self.schemas.storage.close()
