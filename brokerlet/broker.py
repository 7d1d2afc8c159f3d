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
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import gevent
import gevent.event
import gevent.lock
import pykka

from brokerlet._slice import requested_slice
from brokerlet.actors import stats_reader
from brokerlet.actors.broker import BrokerActor, close_idle_topics
from brokerlet.actors.eventloop import EventLoopActor
from brokerlet.actors.messages import GetTopic
from brokerlet.actors.topic import TopicActor
from brokerlet.config import Settings, SettingsError, load_settings
from brokerlet.dispatch.options import DEFAULT_OPTIONS, DispatchOptions
from brokerlet.metadata import MetadataStore
from brokerlet.metadata.listeners import parse_listeners
from brokerlet.schema import SchemaRegistry, TableSchemaStorage
from brokerlet.security.authorization import PolicySource, PulsarShapedPolicies
from brokerlet.security.service import Security
from brokerlet.storage import DiskStorage, FileOps
from brokerlet.topicops import api as topic_api
from brokerlet.topicops.entries import StoredMessage
from brokerlet.transport.server import Server
from brokerlet.transport.tls import server_context

if TYPE_CHECKING:
    from brokerlet.admin.http import AdminServer

__all__ = ["Broker"]

log = logging.getLogger(__name__)

R = TypeVar("R")


class Broker:
    """A Pulsar-compatible broker.

    Args:
        settings: a complete settings object; defaults to :func:`load_settings` with no file
            and no environment, so an embedded broker is not steered by ``BROKERLET_*``.
        storage_file_ops: file operations for disk storage (tests inject failures).
        dispatch_options: switches that turn dispatch rules off, for tests and diagnostics
            that show what a rule prevents (see :class:`DispatchOptions`).
        pulsar_config: a Pulsar ``broker.conf`` / ``standalone.conf`` read under the
            overrides (only without ``settings``).
        policies: where tenants' admin roles and namespace permissions come from; defaults
            to the broker's metadata store (see :attr:`policies`).
        **overrides: individual settings, by snake_case key or Pulsar alias
            (``Broker(port=0, dispatcherMaxReadBatchSize=50)``).

    Raises:
        SettingsError: a bad setting, an unsupported authentication provider, or TLS or
            key files that cannot be loaded.

    Example::

        with Broker(port=0) as broker:
            client = pulsar.Client(broker.service_url)
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        storage_file_ops: FileOps | None = None,
        dispatch_options: DispatchOptions = DEFAULT_OPTIONS,
        pulsar_config: str | os.PathLike[str] | None = None,
        policies: PolicySource | None = None,
        **overrides: object,
    ) -> None:
        if settings is None:
            settings = load_settings(env={}, overrides=overrides, pulsar_config=pulsar_config)
        elif pulsar_config is not None:
            raise TypeError("pass pulsar_config or settings, not both")
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
        listeners = parse_listeners(settings.advertised_listeners)
        internal = settings.internal_listener_name
        if internal and internal not in listeners:
            raise SettingsError(
                f"internal_listener_name = {internal!r}: must name one of advertised_listeners "
                f"({', '.join(listeners) or 'none configured'})",
                key="internal_listener_name",
            )
        self.settings = settings
        # Tenants and namespace permissions come from the metadata store (made at start).
        self.security = Security.from_settings(
            settings, policies if policies is not None else self._metadata_policies()
        )
        self.policies = self.security.authorizer.policies
        uses_tls = settings.broker_service_port_tls >= 0 or settings.web_service_port_tls >= 0
        self._tls_context = server_context(settings) if uses_tls else None
        self._tls_server: Server | None = None
        self._https: Any = None
        self._file_ops = storage_file_ops
        self._dispatch_options = dispatch_options
        self.metadata: MetadataStore | None = None
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
        self._idle_check: gevent.Greenlet | None = None
        self._open_topics: Mapping[str, pykka.ActorRef[TopicActor]] = {}
        self.schemas: SchemaRegistry | None = None
        self.started_at: float | None = None
        self.startup_seconds: float | None = None

    def _metadata_policies(self) -> PulsarShapedPolicies:
        def tenant_info(tenant: str) -> Any:
            return None if self.metadata is None else self.metadata.tenants.get(tenant)

        def namespace_policies(tenant: str, namespace: str) -> Any:
            store = self.metadata
            return None if store is None else store.namespaces.get(f"{tenant}/{namespace}")

        def update(tenant: str, namespace: str, change: Callable[[dict[str, Any]], None]) -> bool:
            store = self.metadata
            if store is None or f"{tenant}/{namespace}" not in store.namespaces:
                return False

            def changed(policies: dict[str, Any]) -> dict[str, Any]:
                change(policies)
                return policies

            store.update_policies(f"{tenant}/{namespace}", changed)
            return True

        return PulsarShapedPolicies(tenant_info, namespace_policies, update)

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
        if self.settings.advertised_url.startswith("pulsar://"):
            return self.settings.advertised_url
        host, port = self.address
        return f"pulsar://{host}:{port}"

    @property
    def service_url_tls(self) -> str | None:
        """The ``pulsar+ssl://`` URL, or None without a TLS listener."""
        if self._tls_server is None:
            return None
        if self.settings.advertised_url_tls:
            return self.settings.advertised_url_tls
        if self.settings.advertised_url.startswith("pulsar+ssl://"):
            return self.settings.advertised_url
        host, port = self._tls_server.address
        return f"pulsar+ssl://{host}:{port}"

    @property
    def web_service_url_tls(self) -> str | None:
        """The HTTPS base URL, or None without an HTTPS listener."""
        if self._https is None:
            return None
        host, port = self._https.address[:2]
        return f"https://{host}:{port}"

    # Observability.

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        """Stats of one topic, shaped like Pulsar's topic stats; None for an unknown topic."""
        return self._call(lambda ref: stats_reader.topic_stats(ref, topic))

    def stats(self) -> dict[str, Any]:
        """Stats of every topic, keyed by topic name."""
        return self._call(stats_reader.all_stats)

    # Topic operations (as Pulsar's admin API does them; the REST routes call the same code).
    # Each raises brokerlet.topicops.TopicOpError with Pulsar's HTTP status and reason.

    def close_idle_topics(self) -> list[str]:
        """Run the inactive-topic check now (it runs every
        ``inactive_topic_close_interval_seconds`` on disk): close the topics with no
        producer, subscription or waiting read, keeping their data; returns their names.
        In memory nothing closes: a memory topic's data would go with it."""
        if self._storage is None:
            return []
        return self._call(lambda ref: close_idle_topics(ref, self._open_topics), 60)

    def terminate_topic(self, topic: str) -> tuple[int, int]:
        """Refuse later producers and messages; returns the last message id (ledger, entry)."""
        return self._call(lambda ref: topic_api.terminate_topic(ref, topic), 60)

    def unload_topic(self, topic: str) -> None:
        """Close the topic's producers and consumers (they reconnect); nothing is lost."""
        self._call(lambda ref: topic_api.unload_topic(ref, topic), 60)

    def delete_topic(self, topic: str, force: bool = False) -> None:
        """Delete a topic and its subscriptions; with clients connected only with ``force``."""
        self._call(lambda ref: topic_api.delete_topic(ref, topic, force=force), 60)

    def skip(self, topic: str, subscription: str, count: int) -> None:
        """Acknowledge the subscription's next ``count`` unacknowledged entries."""
        self._call(lambda ref: topic_api.skip(ref, topic, subscription, count), 60)

    def skip_all(self, topic: str, subscription: str) -> None:
        """Clear the subscription's backlog."""
        self._call(lambda ref: topic_api.skip_all(ref, topic, subscription), 60)

    def reset_cursor(
        self,
        topic: str,
        subscription: str,
        *,
        timestamp_ms: int | None = None,
        message_id: tuple[int, int] | None = None,
    ) -> None:
        """Move the subscription to a publish time or a message id; its consumers reconnect."""
        self._call(
            lambda ref: topic_api.reset_cursor(
                ref, topic, subscription, timestamp_ms=timestamp_ms, message_id=message_id
            ),
            60,
        )

    def expire_messages(self, topic: str, subscription: str | None, seconds: int) -> None:
        """Acknowledge messages older than ``seconds`` (every subscription when None)."""
        self._call(lambda ref: topic_api.expire_messages(ref, topic, subscription, seconds), 60)

    def peek_messages(self, topic: str, subscription: str, position: int = 1) -> StoredMessage:
        """The ``position``-th entry after the subscription's mark-delete position."""
        return self._call(lambda ref: topic_api.peek_messages(ref, topic, subscription, position))

    def get_message_by_id(self, topic: str, ledger_id: int, entry_id: int) -> StoredMessage:
        return self._call(lambda ref: topic_api.get_message_by_id(ref, topic, ledger_id, entry_id))

    def examine_message(
        self, topic: str, initial_position: str = "latest", position: int = 1
    ) -> StoredMessage:
        return self._call(
            lambda ref: topic_api.examine_message(ref, topic, initial_position, position)
        )

    def internal_stats(self, topic: str) -> dict[str, Any]:
        return self._call(lambda ref: topic_api.internal_stats(ref, topic))

    def create_subscription(
        self, topic: str, subscription: str, position: str | tuple[int, int] = "latest"
    ) -> None:
        """A durable subscription at ``latest``, ``earliest`` or a message id (ledger, entry)."""
        self._call(lambda ref: topic_api.create_subscription(ref, topic, subscription, position))

    def delete_subscription(self, topic: str, subscription: str, force: bool = False) -> None:
        self._call(
            lambda ref: topic_api.delete_subscription(ref, topic, subscription, force=force), 60
        )

    def subscriptions(self, topic: str) -> list[str]:
        return self._call(lambda ref: topic_api.list_subscriptions(ref, topic))

    def last_message_id(self, topic: str) -> dict[str, int]:
        return self._call(lambda ref: topic_api.last_message_id(ref, topic))

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
            # The hub is this thread's alone: destroy it with its loop and thread pool, so a
            # stopped broker leaves no file descriptors or native threads behind.
            hub, self._hub = self._hub, None
            if hub is not None:
                hub.destroy(destroy_loop=True)
            self._done.set()

    def _run(self, on_ready: Callable[[Broker], object] | None) -> None:
        with requested_slice(self.settings.event_loop_slice_us):
            self._serve(on_ready)

    def _serve(self, on_ready: Callable[[Broker], object] | None) -> None:
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
                max_unacked_ranges_to_persist=settings.managed_ledger_max_unacked_ranges_to_persist,
                file_ops=self._file_ops,
            )
            # The metadata lives beside the topics, in the directory the storage has locked.
            self.metadata = MetadataStore.in_directory(
                settings.data_dir, cluster=settings.cluster_name
            )
        else:
            self.metadata = MetadataStore(None, cluster=settings.cluster_name)
        self.schemas = self._schema_registry(self.metadata)
        open_topics: dict[str, pykka.ActorRef[TopicActor]] = {}
        open_topics_view = MappingProxyType(open_topics)  # the connections only read it
        self._open_topics = open_topics_view
        self._broker_actor = BrokerActor.start(
            self.settings,
            self._storage,
            self.metadata,
            self._dispatch_options,
            topic_deleted=self.schemas.topic_deleted,
            topics=open_topics,
        )
        if self._storage is not None:
            # Recover every stored topic now: torn tails are repaired and logged at start-up,
            # and retention knows every durable subscription before anyone acks.
            for name in self._storage.topics():
                self._broker_actor.ask(GetTopic(name, recovering=True))
        self._event_loops = [EventLoopActor.start(i) for i in range(self.settings.event_loops)]
        if self._storage is not None and settings.inactive_topic_close_interval_seconds:
            self._idle_check = gevent.spawn(
                self._close_idle_topics, settings.inactive_topic_close_interval_seconds
            )
        self._server = Server(
            self.settings,
            broker=self._broker_actor,
            event_loops=self._event_loops,
            advertised_url=lambda: self.service_url,
            metadata=self.metadata,
            security=self.security,
            schemas=self.schemas,
            open_topics=open_topics_view,
        )
        self._server.start()
        if self._tls_context is not None and self.settings.broker_service_port_tls >= 0:
            self._tls_server = Server(
                self.settings,
                broker=self._broker_actor,
                event_loops=self._event_loops,
                advertised_url=lambda: self.service_url,
                metadata=self.metadata,
                tls_context=self._tls_context,
                advertised_url_tls=lambda: self.service_url_tls or "",
                security=self.security,
                limits_shared_with=self._server,
                schemas=self.schemas,
                open_topics=open_topics_view,
            )
            self._tls_server.start()
        if self.settings.web_service_enabled:
            # Imported here: the web service's libraries cost ~150 ms of start-up.
            from brokerlet.admin.http import AdminServer  # noqa: PLC0415
            from brokerlet.admin.rest import AdminContext  # noqa: PLC0415
            from brokerlet.security.http import admin_guard, start_https  # noqa: PLC0415

            context = AdminContext(
                broker=self._broker_actor,
                settings=self.settings,
                metadata=self.metadata,
                service_url=lambda: self.service_url,
                service_url_tls=lambda: self.service_url_tls,
                web_service_url_tls=lambda: self.web_service_url_tls,
                security=self.security,
                schemas=self.schemas,
            )
            self._admin = AdminServer(
                self.settings.host,
                self.settings.web_service_port,
                topic_stats=self.topic_stats,
                all_stats=self.stats,
                cluster=self.settings.cluster_name,
                context=context,
                guards=[admin_guard(self.security)],
            )
            self._admin.start()
            if self._tls_context is not None and self.settings.web_service_port_tls >= 0:
                self._https = start_https(
                    self.settings.host,
                    self.settings.web_service_port_tls,
                    self._admin.application,
                    self._tls_context,
                )

    def _close_idle_topics(self, interval: float) -> None:
        while True:
            gevent.sleep(interval)
            try:
                self.close_idle_topics()  # on the hub: runs here, not through a callback
            except pykka.ActorDeadError:
                return  # stopping
            except Exception:
                log.exception("the inactive-topic check failed; it runs again in %s s", interval)

    def _schema_registry(self, store: MetadataStore) -> SchemaRegistry:
        # Versions live in the metadata store's database (its migration 2), so a disk
        # broker's schemas survive a restart with its namespaces and topics. Its writes wait
        # for the commit cooperatively, so the registry's lock must be a gevent one.
        def namespace_policies(namespace: str) -> dict[str, Any] | None:
            return store.namespaces.get(namespace)

        return SchemaRegistry(
            self.settings,
            TableSchemaStorage(store),
            namespace_policies=namespace_policies,
            lock=gevent.lock.Semaphore(),
        )

    def _shutdown(self) -> None:
        if self._https is not None:
            self._https.stop(timeout=1.0)
        if self._idle_check is not None:
            self._idle_check.kill(block=False)
        if self._admin is not None:
            self._admin.stop()
        if self._tls_server is not None:
            self._tls_server.stop()
        if self._server is not None:
            self._server.stop()
        for ref in [self._broker_actor, *self._event_loops]:
            if ref is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.stop(block=True, timeout=5)
        if self.metadata is not None:
            self.metadata.close()
        if self._storage is not None:
            self._storage.close()
            self._storage = None
        if self.schemas is not None:
            self.schemas.storage.close()
