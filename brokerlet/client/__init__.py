"""brokerlet's gevent-native Pulsar client.

The official ``pulsar-client`` is a C++ extension: its calls block the whole gevent hub, so
it cannot drive load from inside Locust. This client speaks the same binary protocol in pure
Python on gevent sockets, needs no monkey patching, and works against brokerlet and against
an Apache Pulsar cluster alike. Its API follows the official Python client's names::

    from brokerlet.client import Client, ConsumerType

    client = Client("pulsar://127.0.0.1:6650")
    producer = client.create_producer("my-topic")
    consumer = client.subscribe("my-topic", "my-sub", consumer_type=ConsumerType.Shared)
    producer.send(b"hello", partition_key="k", properties={"a": "b"})
    message = consumer.receive(timeout_millis=1000)
    consumer.acknowledge(message)
    client.close()

How it behaves on the wire, as the official client does:

* Topics are looked up over the binary protocol: PARTITIONED_METADATA, then LOOKUP,
  following ``Redirect`` answers (with their ``authoritative`` flag) until one says
  ``Connect``. A partitioned topic gets one producer or consumer per partition.
* One connection per broker address, shared by every producer and consumer placed there.
  Broker PINGs are answered; an idle connection is pinged every
  ``keep_alive_interval_seconds`` and dropped if nothing comes back by the next tick.
* A lost connection, or a broker closing a producer or consumer (a topic unload), makes
  it look the topic up again and re-register, with backoff. Producers resend what was not
  yet acknowledged; consumers resubscribe and start their flow afresh.

Threading: a client and everything it creates belong to the gevent hub (the thread) that
created the client. Callbacks run on the client's greenlets and must not block.

Not supported: TLS and authentication, compression other than ZLIB on receive (producers
never compress), chunked messages, schemas, readers, seek, multi-topic and regex
subscriptions, transactions, and consumer epochs.
"""

from __future__ import annotations

import logging
import uuid
from types import TracebackType

from brokerlet.client.connection import Connection, ConnectionOptions
from brokerlet.client.consumer import Consumer, ConsumerConfig, Message
from brokerlet.client.errors import (
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BrokerMetadataError,
    BrokerPersistenceError,
    ChecksumError,
    ConnectError,
    ConsumerAssignError,
    ConsumerBusy,
    ConsumerNotFound,
    CumulativeAcknowledgementNotAllowedError,
    IncompatibleSchema,
    InvalidConfiguration,
    InvalidTopicName,
    MessageTooBig,
    NotAllowedError,
    NotConnected,
    ProducerBlockedQuotaExceededError,
    ProducerBlockedQuotaExceededException,
    ProducerBusy,
    ProducerFenced,
    ProducerQueueIsFull,
    PulsarError,
    ServiceUnitNotReady,
    SubscriptionNotFound,
    Timeout,
    TooManyLookupRequestException,
    TopicNotFound,
    TopicTerminated,
    UnknownError,
    UnsupportedVersionError,
    error_for_code,
)
from brokerlet.client.producer import Producer, ProducerConfig, SendCallback
from brokerlet.client.types import (
    ConsumerType,
    InitialPosition,
    MessageId,
    format_url,
    normalize_topic,
    parse_service_url,
    partition_topic,
)
from brokerlet.transport.protocol import pb

__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "ChecksumError",
    "Client",
    "ConnectError",
    "Consumer",
    "ConsumerAssignError",
    "ConsumerBusy",
    "ConsumerNotFound",
    "ConsumerType",
    "CumulativeAcknowledgementNotAllowedError",
    "IncompatibleSchema",
    "InitialPosition",
    "InvalidConfiguration",
    "InvalidTopicName",
    "Message",
    "MessageId",
    "MessageTooBig",
    "NotAllowedError",
    "NotConnected",
    "Producer",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerQueueIsFull",
    "PulsarError",
    "SendCallback",
    "ServiceUnitNotReady",
    "SubscriptionNotFound",
    "Timeout",
    "TooManyLookupRequestException",
    "TopicNotFound",
    "TopicTerminated",
    "UnknownError",
    "UnsupportedVersionError",
]

log = logging.getLogger("brokerlet.client")

T = pb.BaseCommand
_LOOKUP = pb.CommandLookupTopicResponse
_METADATA = pb.CommandPartitionedTopicMetadataResponse
_MAX_REDIRECTS = 20


class Client:
    """A connection pool to a Pulsar service, and the factory of producers and consumers.

    Creating a client opens nothing; the first lookup connects.

    Args:
        service_url: ``pulsar://host:port``, or several hosts as
            ``pulsar://host1:port1,host2:port2`` (tried in order).
        operation_timeout_seconds: how long lookups, PRODUCER, SUBSCRIBE and closes wait
            for the broker.
        connection_timeout_seconds: how long a TCP connect plus the handshake may take.
        keep_alive_interval_seconds: seconds between keep-alive PINGs; 0 turns them off.
        so_rcvbuf: a fixed SO_RCVBUF for every connection, set before connect (Linux
            doubles it); 0 keeps the kernel's autotuning. Small values make
            :meth:`pause_reading` push back on the broker quickly.

    Raises:
        InvalidConfiguration: the URL is not ``pulsar://`` or a value is out of range.
    """

    def __init__(
        self,
        service_url: str,
        *,
        operation_timeout_seconds: float = 30,
        connection_timeout_seconds: float = 10,
        keep_alive_interval_seconds: float = 30,
        so_rcvbuf: int = 0,
    ) -> None:
        self._addresses = parse_service_url(service_url)
        if operation_timeout_seconds <= 0 or connection_timeout_seconds <= 0:
            raise InvalidConfiguration("timeouts must be positive")
        if keep_alive_interval_seconds < 0 or so_rcvbuf < 0:
            raise InvalidConfiguration("keep_alive_interval_seconds and so_rcvbuf must be >= 0")
        self.service_url = service_url
        self._options = ConnectionOptions(
            connection_timeout=connection_timeout_seconds,
            operation_timeout=operation_timeout_seconds,
            keep_alive_interval=keep_alive_interval_seconds,
            so_rcvbuf=so_rcvbuf,
        )
        self._connections: dict[tuple[str, str], Connection] = {}
        self._owners: list[Producer | Consumer] = []
        self._service_index = 0
        self._paused = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<Client {self.service_url} connections={len(self._connections)}>"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def operation_timeout(self) -> float:
        """Seconds a request waits for its response."""
        return self._options.operation_timeout

    # -- producers and consumers ---------------------------------------------------------

    def create_producer(
        self,
        topic: str,
        *,
        producer_name: str | None = None,
        batching_enabled: bool = False,
        batching_max_messages: int = 1000,
        batching_max_publish_delay_ms: int = 10,
        batching_max_allowed_size_in_bytes: int = 131072,
        max_pending_messages: int = 1000,
        block_if_queue_full: bool = False,
        send_timeout_millis: int = 30000,
    ) -> Producer:
        """Create a producer on a topic (auto-created by the broker on first use).

        Args:
            topic: a short (``my-topic``) or fully qualified topic name.
            producer_name: a name to use; by default the broker assigns one.
            batching_enabled: collect messages into batched entries (one SEND each).
            batching_max_messages: send a batch once it has this many messages.
            batching_max_publish_delay_ms: send a batch this long after its first message.
            batching_max_allowed_size_in_bytes: send a batch once its payloads reach this.
            max_pending_messages: messages that may await receipts at once; 0 for no limit.
            block_if_queue_full: when the limit is reached, wait for room instead of
                failing with ProducerQueueIsFull.
            send_timeout_millis: fail a send with Timeout if no receipt came within this;
                0 waits forever.

        Returns:
            The producer, registered with the broker.

        Raises:
            PulsarError: the lookup or the broker refused (ProducerBusy, TopicNotFound,
                ConnectError, Timeout, ...).
        """
        self._check_open()
        if batching_max_messages < 1 or batching_max_allowed_size_in_bytes < 1:
            raise InvalidConfiguration("batch limits must be at least 1")
        if batching_max_publish_delay_ms < 0 or max_pending_messages < 0:
            raise InvalidConfiguration("delays and queue sizes must be >= 0")
        if send_timeout_millis < 0:
            raise InvalidConfiguration("send_timeout_millis must be >= 0")
        topic = normalize_topic(topic)
        config = ProducerConfig(
            producer_name=producer_name,
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            max_pending_messages=max_pending_messages,
            block_if_queue_full=block_if_queue_full,
            send_timeout_millis=send_timeout_millis,
        )
        producer = Producer(self, topic, self._partitions_of(topic), config)
        producer._start()
        self._owners.append(producer)
        return producer

    def subscribe(
        self,
        topic: str,
        subscription_name: str,
        *,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        consumer_name: str | None = None,
        receiver_queue_size: int = 1000,
        initial_position: InitialPosition = InitialPosition.Latest,
        negative_ack_redelivery_delay_ms: int = 60000,
        priority_level: int = 0,
    ) -> Consumer:
        """Subscribe to a topic (creating the topic and the subscription if needed).

        Args:
            topic: a short or fully qualified topic name.
            subscription_name: the subscription.
            consumer_type: Exclusive, Shared, Failover or KeyShared.
            consumer_name: a name for this consumer; random by default.
            receiver_queue_size: messages the broker may push ahead of ``receive()``
                (at least 1).
            initial_position: where a new subscription starts: Latest or Earliest.
            negative_ack_redelivery_delay_ms: how long a negatively acknowledged message
                waits before it is redelivered.
            priority_level: the consumer's priority (lower is preferred by the broker).

        Returns:
            The consumer, subscribed and with its initial permits granted.

        Raises:
            PulsarError: the lookup or the broker refused (ConsumerBusy, ...).
        """
        self._check_open()
        if receiver_queue_size < 1:
            raise InvalidConfiguration("receiver_queue_size must be at least 1")
        if negative_ack_redelivery_delay_ms < 0 or priority_level < 0:
            raise InvalidConfiguration("delays and priority levels must be >= 0")
        topic = normalize_topic(topic)
        config = ConsumerConfig(
            subscription_name=subscription_name,
            consumer_name=consumer_name or uuid.uuid4().hex[:10],
            consumer_type=consumer_type,
            receiver_queue_size=receiver_queue_size,
            initial_position=initial_position,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            priority_level=priority_level,
        )
        consumer = Consumer(self, topic, self._partitions_of(topic), config)
        consumer._start()
        self._owners.append(consumer)
        return consumer

    def get_topic_partitions(self, topic: str) -> list[str]:
        """The partition topics of a topic: just the topic itself if it is not partitioned."""
        self._check_open()
        topic = normalize_topic(topic)
        partitions = self._partitions_of(topic)
        if partitions == 0:
            return [topic]
        return [partition_topic(topic, index) for index in range(partitions)]

    # -- flow control and closing --------------------------------------------------------

    def pause_reading(self) -> None:
        """Stop reading every connection of this client (and new ones, until resumed).

        Messages already received stay available to ``receive()``; nothing more is read
        from the sockets, so the kernel's buffers fill and the broker sees its writes
        back up (its consumers turn unwritable). Receipts and responses wait as well.
        """
        self._paused = True
        for connection in list(self._connections.values()):
            connection.pause_reading()

    def resume_reading(self) -> None:
        """Read every connection again."""
        self._paused = False
        for connection in list(self._connections.values()):
            connection.resume_reading()

    def close(self) -> None:
        """Close every producer and consumer (as their ``close()`` does), then the
        connections. Idempotent; errors from the broker while closing are logged."""
        if self._closed:
            return
        self._closed = True
        for owner in list(self._owners):
            try:
                owner.close()
            except PulsarError as error:
                log.warning("closing %r failed: %s", owner, error)
        self._owners.clear()
        for connection in list(self._connections.values()):
            connection.close(AlreadyClosed("client closed"))
        self._connections.clear()

    # -- the ClientContext that producers and consumers use ------------------------------

    def forget(self, owner: object) -> None:
        """Drop a closed producer or consumer from the client's books."""
        if owner in self._owners:
            self._owners.remove(owner)

    def connection_for(self, topic: str) -> Connection:
        """Look a topic up and return a ready connection to the broker that serves it.

        Follows Redirect answers, each to the broker it names, up to 20 times.

        Raises:
            PulsarError: the error inside a Failed lookup answer, or ConnectError /
                Timeout on the way.
        """
        self._check_open()
        connection = self._service_connection()
        service = connection
        authoritative = False
        for _ in range(_MAX_REDIRECTS):
            request_id = connection.new_request_id()
            command = T(
                type=T.LOOKUP,
                lookup=pb.CommandLookupTopic(
                    topic=topic, request_id=request_id, authoritative=authoritative
                ),
            )
            answer = connection.request(command, request_id).lookup_response
            if answer.HasField("response") and answer.response == _LOOKUP.Failed:
                raise error_for_code(answer.error, answer.message or f"lookup of {topic} failed")
            url = answer.broker_service_url
            if not url:
                raise ConnectError(f"lookup of {topic} named no broker URL")
            if answer.proxy_through_service_url:
                connection = self._connection(url, service.address, proxy_to_broker_url=url)
            else:
                connection = self._connection(url, _address_of(url), proxy_to_broker_url=None)
            if answer.HasField("response") and answer.response == _LOOKUP.Redirect:
                authoritative = answer.authoritative
                continue
            return connection
        raise ConnectError(f"lookup of {topic} redirected more than {_MAX_REDIRECTS} times")

    # -- connections ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("client is closed")

    def _partitions_of(self, topic: str) -> int:
        connection = self._service_connection()
        request_id = connection.new_request_id()
        command = T(
            type=T.PARTITIONED_METADATA,
            partitioned_metadata=pb.CommandPartitionedTopicMetadata(
                topic=topic, request_id=request_id
            ),
        )
        answer = connection.request(command, request_id).partitioned_metadata_response
        if answer.HasField("response") and answer.response == _METADATA.Failed:
            raise error_for_code(answer.error, answer.message or f"metadata of {topic} failed")
        return answer.partitions

    def _service_connection(self) -> Connection:
        """A ready connection to one of the service URL's hosts, trying each in turn."""
        addresses = self._addresses
        error: PulsarError = ConnectError(f"cannot connect to {self.service_url}")
        for attempt in range(len(addresses)):
            index = (self._service_index + attempt) % len(addresses)
            host, port = addresses[index]
            try:
                connection = self._connection(format_url(host, port), (host, port), None)
            except ConnectError as failed:
                error = failed
                continue
            self._service_index = index
            return connection
        raise error

    def _connection(
        self, logical_url: str, address: tuple[str, int], proxy_to_broker_url: str | None
    ) -> Connection:
        key = (logical_url, format_url(*address))
        connection = self._connections.get(key)
        if connection is None or connection.closed:
            connection = Connection(
                logical_url=logical_url,
                address=address,
                proxy_to_broker_url=proxy_to_broker_url,
                options=self._options,
                paused=self._paused,
                on_closed=self._connection_closed,
            )
            self._connections[key] = connection
        connection.wait_ready(self._options.connection_timeout)
        return connection

    def _connection_closed(self, connection: Connection) -> None:
        for key, known in list(self._connections.items()):
            if known is connection:
                del self._connections[key]


def _address_of(url: str) -> tuple[str, int]:
    try:
        return parse_service_url(url)[0]
    except InvalidConfiguration:
        raise ConnectError(f"the broker URL {url!r} from a lookup cannot be used") from None
