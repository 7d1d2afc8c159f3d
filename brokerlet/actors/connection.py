"""The connection actor: protocol state of one client connection.

Its reader greenlet (:mod:`brokerlet.transport.server`) decodes what arrives and sends one
:class:`Received` per chunk of frames; this actor handles the commands in order. Replies go
straight to the connection's channel. SENDs of one chunk become one append message per
producer; FLOWs are completed here, on the consumer's own permit accounting.

Control-plane requests (PRODUCER, SUBSCRIBE, closes) ask the broker, topic and dispatcher
actors and wait for the answer: the client waits for our reply before it uses the producer or
consumer, so nothing behind them is held up that the client has already sent for them. No
other actor ever asks a connection actor, so these waits cannot deadlock.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import operator
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event
import pykka

from brokerlet import __version__
from brokerlet.actors import stats_reader
from brokerlet.actors._loop import take_turn
from brokerlet.actors._runtime import GeventActor
from brokerlet.actors.errors import BrokerError, parsed_topic
from brokerlet.actors.messages import (
    Ack,
    AddConsumer,
    AddProducer,
    Append,
    Appended,
    AppendedAll,
    AppendItem,
    ConnectionLost,
    ConsumerClosedByBroker,
    EndOfTopicReached,
    FindByPublishTime,
    FindTopic,
    GetLastEntry,
    GetMarkDelete,
    GetStats,
    GetTopic,
    PartitionedMetadata,
    Received,
    Redeliver,
    RemoveConsumer,
    RemoveProducer,
    ResolvePosition,
    Seek,
    Subscribe,
    TopicClosedByBroker,
    TopicsOfNamespace,
    UnexpectedMessage,
    WriteAfterMessages,
)
from brokerlet.actors.refusals import (
    RepeatedWarning,
    refuse_invalid_text,
    refuse_unsupported,
    request_id_of,
)
from brokerlet.actors.stats_reader import consumer_figures
from brokerlet.actors.supervision import record_failure, tell_quietly
from brokerlet.config import Settings
from brokerlet.dispatch.consumer import ConnectionHandle, Consumer
from brokerlet.keyshared import KeySharedMeta
from brokerlet.metadata import MetadataStore
from brokerlet.metadata.listeners import Listener, UnknownListener, parse_listeners, pick_listener
from brokerlet.metadata.naming import InvalidName, TopicName
from brokerlet.metadata.policies import deduplication
from brokerlet.metadata.topics import (
    Refused,
    filter_by_pattern,
    known_partitioned_metadata,
    lookup_refusal,
    topics_hash,
)
from brokerlet.producers.appends import plain_appends
from brokerlet.producers.messages import (
    ProducerAdmitted,
    ProducerFenced,
    ProducerReady,
    ProducerRefused,
)
from brokerlet.schema import SchemaError, SchemaRegistry
from brokerlet.schema import wire as schema_wire
from brokerlet.security.session import CheckCredentials, ConnectionAuth
from brokerlet.storage.ledger import NewEntry
from brokerlet.topicops.wire import knows_end_of_topic, reached_end_of_topic
from brokerlet.transport.protocol import (
    PONG_FRAME,
    PROTOCOL_VERSION,
    Frame,
    ProtocolError,
    command_name,
    consumer_stats_request,
    decode_payload,
    encode_ack_response,
    encode_command,
    encode_consumer_stats_response,
    encode_lookup_connect,
    encode_producer_success,
    encode_send_receipt,
    encode_send_receipts,
    encode_success,
    encode_topic_partitions,
    metadata_problem,
    parse_metadata,
    pb,
)

if TYPE_CHECKING:
    from brokerlet.actors.broker import BrokerActor
    from brokerlet.actors.dispatcher import DispatcherActor
    from brokerlet.actors.topic import TopicActor

__all__ = ["ConnectionActor", "valid_topic_name"]

log = logging.getLogger(__name__)

T = pb.BaseCommand
_producer_names = itertools.count()
NO_ID = 2**64 - 1
"""-1 as an unsigned 64-bit id: "no entry" in message ids and request ids."""
SEARCH_TIMEOUT = 30.0  # seconds a seek by publish time may take (a handful of reads)
SEND_SLICE = 64
"""SENDs appended per slice of a received chunk before the handler yields to the hub."""
_SEND_FIELDS = operator.attrgetter("send")  # None for every frame but a SEND


@functools.lru_cache(maxsize=4)
def listeners_of(setting: str) -> dict[str, Listener]:
    """The parsed ``advertised_listeners`` (checked at start-up, so this cannot fail)."""
    return parse_listeners(setting)


def valid_topic_name(topic: str) -> bool:
    """A fully qualified ``persistent://tenant/namespace/topic`` name (the client normalises)."""
    try:
        TopicName.parse(topic)
    except InvalidName:
        return False
    return True


@dataclass(slots=True)
class _Producer:
    producer_id: int
    name: str
    topic: str
    topic_ref: pykka.ActorRef[TopicActor]
    request_id: int = -1  # of its PRODUCER: a WaitForExclusive producer's second answer
    fenced: bool = False  # its SENDs are answered with ProducerFenced by its topic
    schema_version: bytes | None = None


_PRODUCER_NEWS = (ProducerReady, ProducerFenced, ProducerRefused)


class ConnectionActor(GeventActor):
    """Protocol state of one connection: handshake, producers, consumers, commands."""

    def __init__(
        self,
        *,
        handle: ConnectionHandle,
        broker: pykka.ActorRef[BrokerActor],
        settings: Settings,
        advertised_url: str,
        close_socket: Callable[[str], None],
        advertised_url_tls: str = "",
        security: Any = None,
        peer_cert: dict[str, Any] | None = None,
        metadata: MetadataStore,
        schemas: SchemaRegistry | None = None,
        open_topics: Mapping[str, pykka.ActorRef[TopicActor]] | None = None,
    ) -> None:
        super().__init__()
        self.handle = handle
        self.metadata = metadata  # read by the lookups, as the admin API reads it
        # The broker actor's topics, read-only: a topic that is open is used without asking
        # that actor (two hand-overs; it still creates, reopens and refuses topics).
        self.open_topics: Mapping[str, pykka.ActorRef[TopicActor]] = (
            {} if open_topics is None else open_topics
        )
        self.peer = handle.peer
        self.channel = handle.channel
        self.broker = broker
        self.settings = settings
        self.advertised_url = advertised_url
        self._close_socket = close_socket
        self.schemas = schemas
        self.advertised_url_tls = advertised_url_tls  # set only on TLS connections
        self.auth = ConnectionAuth(
            security,
            self.peer,
            peer_cert,
            send=self._send,
            disconnect=self._disconnect,
            send_then_disconnect=lambda command, reason: self.channel.write(
                encode_command(command), lambda _error: self._disconnect(reason)
            ),
        )
        self.connected = False
        self.protocol_version = 0
        self.client_version = ""
        self.producers: dict[int, _Producer] = {}
        self.consumers: dict[int, Consumer] = {}
        self._unknown_consumer = RepeatedWarning(log, self.peer, "for unknown consumers")
        self._refused = RepeatedWarning(log, self.peer, "refused as malformed")
        self._unsupported_logged: set[int] = set()

    # Actor plumbing.

    def on_receive(self, message: Any) -> None:
        kind = message.__class__
        if kind is Received:
            self._received(message.frames)
        elif kind is AppendedAll:
            self._appended_all(message)
        elif kind is Appended:
            self._appended(message)
        elif kind is ConnectionLost:
            self._lost(message.reason)
        elif kind is ConsumerClosedByBroker:
            self._closed_by_broker(message.consumer)
        elif kind is EndOfTopicReached:
            self._end_of_topic(message.consumer)
        elif kind is CheckCredentials:
            self.auth.check_expiry()
        elif kind is TopicClosedByBroker:
            self._topic_closed(message.topic)
        elif kind in _PRODUCER_NEWS:
            self._producer_news(message)
        else:
            raise UnexpectedMessage(self, message)

    def on_failure(self, exc_type: object, exc: object, _tb: object) -> None:
        # A bug of ours, not the peer's: drop the connection rather than serve it half-broken.
        # The failure is logged already (GeventActor); nothing here may raise again.
        record_failure("connection")
        try:
            self.auth.stop()
            self._release_all()
        finally:
            self._close_socket(f"internal error: {exc!r}")

    def _pong(self, _command: pb.BaseCommand) -> None:
        pass

    def _auth_response(self, command: pb.BaseCommand) -> None:
        self.auth.auth_response(command.auth_response)

    def _send(self, command: pb.BaseCommand) -> None:
        self.channel.write(encode_command(command))

    def _disconnect(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, reason)
        self._close_socket(reason)

    def _lost(self, reason: str) -> None:
        log.info("connection from %s closed: %s", self.peer, reason)
        self.auth.stop()
        self._unknown_consumer.summarise()
        self._refused.summarise()
        self._release_all()
        self.stop()

    def _release_all(self) -> None:
        # Their topic or dispatcher may have failed: a dead one is skipped, never raised.
        self.handle.closed = True
        self.handle.consumers = ()
        for consumer in self.consumers.values():
            tell_quietly(self._dispatcher_of(consumer), RemoveConsumer(consumer))
        self.consumers.clear()
        for producer in self.producers.values():
            self._remove_producer(producer)
        self.producers.clear()

    # Commands.

    def _received(self, frames: list[Frame]) -> None:
        if self.connected and None not in map(_SEND_FIELDS, frames):
            # A producing connection's chunk: SENDs only, screened in C.
            self._send_slices(frames)
            return
        sends: list[Frame] = []
        for frame in frames:
            kind = frame.type
            if not self.connected and kind != T.CONNECT:
                self._disconnect(f"{command_name(kind)} before CONNECT")
                return
            if frame.invalid_text is not None:
                if sends:
                    if not self._send_slices(sends):
                        return
                    sends = []
                reply = refuse_invalid_text(frame.command, frame.invalid_text)
                if reply is None:
                    what = f"{command_name(kind)} with invalid UTF-8 in {frame.invalid_text}"
                    self._disconnect(what)
                    return
                self._refused.warn(
                    "%s sent %s with invalid UTF-8 in %s; refused",
                    self.peer,
                    command_name(kind),
                    frame.invalid_text,
                )
                self.channel.write(reply)
                continue
            if kind == T.SEND:
                # frame.send: the fast decoder's fields; the protobuf command is not built.
                if frame.send is not None:
                    sends.append(frame)
                continue
            if sends:
                if not self._send_slices(sends):
                    return
                sends = []
            if frame.ack is not None:  # the fast decoder's fields: no protobuf object
                self._acked(*frame.ack)
                continue
            handler_name = _HANDLERS.get(kind)
            if handler_name is None:
                self._unsupported(frame.command)
                continue
            try:
                getattr(self, handler_name)(frame.command)
            except _ProtocolViolation as stop:
                self._disconnect(str(stop))
                return
            except pykka.ActorDeadError:
                # The topic or dispatcher asked failed meanwhile; its replacement serves a retry.
                request_id = request_id_of(frame.command)
                if request_id is not None:
                    self._error(request_id, pb.ServiceNotReady, "Topic is restarting, retry")
        if sends:
            self._send_slices(sends)

    def _send_slices(self, sends: list[Frame]) -> bool:
        """`_sends` in slices of `SEND_SLICE`: a 64 KiB chunk holds ~400 small SENDs, ~6 ms
        of work, so the hub runs timers and other connections between slices."""
        if len(sends) <= SEND_SLICE:
            return self._sends(sends)
        for start in range(0, len(sends), SEND_SLICE):
            if start:
                take_turn()
            if not self._sends(sends[start : start + SEND_SLICE]):
                return False
        return True

    def _unsupported(self, command: pb.BaseCommand) -> None:
        """Answer a known request brokerlet does not serve with an error, logged once."""
        kind = command.type
        reply = refuse_unsupported(command)
        if kind not in self._unsupported_logged:
            self._unsupported_logged.add(kind)
            log.warning(
                "%s sent %s, which brokerlet does not support; %s",
                self.peer,
                command_name(kind),
                "answered with an error" if reply is not None else "ignored",
            )
        if reply is not None:
            self.channel.write(reply)

    def _connect(self, command: pb.BaseCommand) -> None:
        if self.connected:
            raise _ProtocolViolation("a second CONNECT")
        connect = command.connect
        if not self.auth.connect(connect, self.actor_ref.tell):
            return  # refused with AuthenticationError; the connection is closing
        self.protocol_version = min(connect.protocol_version, PROTOCOL_VERSION)
        self.client_version = connect.client_version
        self.connected = True
        log.debug(
            "%s connected: %s, protocol %d",
            self.peer,
            connect.client_version,
            connect.protocol_version,
        )
        self.channel.write(_connected(self.protocol_version, self.settings.max_message_size))

    def _ping(self, _command: pb.BaseCommand) -> None:
        self.channel.write(PONG_FRAME)

    def _partitioned_metadata(self, command: pb.BaseCommand) -> None:
        request = command.partitioned_metadata
        try:
            self._may_look_up(request.topic)
            partitions = self._partitions(request.topic)
        except BrokerError as error:
            response = pb.CommandPartitionedTopicMetadataResponse(request_id=request.request_id)
            self._refuse_lookup("partitioned_metadata_response", response, error)
            return
        self.channel.write(encode_topic_partitions(request.request_id, partitions))

    def _lookup(self, command: pb.BaseCommand) -> None:
        request = command.lookup
        try:
            self._may_look_up(request.topic)
            self._check_lookup(request.topic)
            listener = self._listener(request.advertised_listener_name)
        except BrokerError as error:
            response = pb.CommandLookupTopicResponse(request_id=request.request_id)
            self._refuse_lookup("lookup_response", response, error)
            return
        if listener is None:  # the TLS URL is set on TLS connections only
            urls = (self.advertised_url, self.advertised_url_tls)
        else:
            urls = (listener.service_url or "", listener.service_url_tls or "")
        self.channel.write(encode_lookup_connect(request.request_id, *urls))

    def _refuse_lookup(self, field: str, response: Any, error: BrokerError) -> None:
        """Answer a lookup with ``error``: ``response`` (its request id set) is the
        BaseCommand's ``field``, whose name is the answer's type in lower case."""
        response.response = type(response).Failed
        response.error = error.code
        response.message = error.message
        self._send(T(type=T.Type.Value(field.upper()), **{field: response}))

    def _listener(self, name: str) -> Listener | None:
        """The advertised listener a lookup names (None: the broker's own URLs); BrokerError
        ServiceNotReady for a name the broker does not advertise."""
        try:
            return pick_listener(
                listeners_of(self.settings.advertised_listeners),
                name or None,
                self.settings.internal_listener_name,
            )
        except UnknownListener as error:
            raise BrokerError(pb.ServiceNotReady, str(error)) from None

    def _may_look_up(self, topic: str) -> None:
        """BrokerError AuthorizationError unless the role may look ``topic`` up."""
        if not self.auth.allowed("lookup", topic):
            raise BrokerError(
                pb.AuthorizationError, f"Role {self.auth.role!r} may not look up {topic}"
            )

    # The lookups read the metadata store here: a hand-over to the broker actor and back was
    # a quarter of their cost. Only that actor changes which topics exist, so it is asked
    # when auto-creation would make a partitioned topic.

    def _partitions(self, topic: str) -> int:
        """PARTITIONED_METADATA's answer, or BrokerError."""
        try:
            known = known_partitioned_metadata(self.metadata, self.settings, parsed_topic(topic))
        except Refused as refused:
            raise BrokerError.refused(refused) from None
        if known is None:
            created: int = self.broker.ask(PartitionedMetadata(topic), block=True)
            return created
        return known

    def _check_lookup(self, topic: str) -> None:
        """Returns when a binary LOOKUP of ``topic`` may be answered, else BrokerError."""
        refusal = lookup_refusal(self.metadata, parsed_topic(topic))
        if refusal is not None:
            raise BrokerError.refused(refusal)

    def _topics_of_namespace(self, command: pb.BaseCommand) -> None:
        request = command.get_topics_of_namespace
        response = pb.CommandGetTopicsOfNamespaceResponse(request_id=request.request_id)
        names: list[str] = self.broker.ask(
            TopicsOfNamespace(request.namespace, request.mode), block=True
        )
        pattern = request.topics_pattern
        if (
            pattern
            and self.settings.enable_broker_side_subscription_pattern_evaluation
            and len(pattern) <= self.settings.subscription_pattern_max_length
        ):
            try:
                names = filter_by_pattern(names, pattern)
                response.filtered = True
            except re.error:
                pass  # a Java-only regex: the client filters, as it does without a pattern
        digest = topics_hash(names)
        response.topics_hash = digest
        if request.HasField("topics_hash") and request.topics_hash == digest:
            response.changed = False
        else:
            response.topics.extend(names)
        self._send(
            T(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE, get_topics_of_namespace_response=response)
        )

    def _error(self, request_id: int, code: pb.ServerError.ValueType, message: str) -> None:
        self._send(
            T(
                type=T.ERROR,
                error=pb.CommandError(request_id=request_id, error=code, message=message),
            )
        )

    def _success(self, request_id: int) -> None:
        self.channel.write(encode_success(request_id))

    def _topic(self, name: str, *, create: bool = True) -> pykka.ActorRef[TopicActor]:
        topic = self.open_topics.get(name)
        if topic is not None and topic.is_alive():
            return topic
        asked: pykka.ActorRef[TopicActor] = self.broker.ask(
            GetTopic(name, create=create), block=True
        )
        return asked

    # Producers.

    def _producer(self, command: pb.BaseCommand) -> None:
        request = command.producer
        existing = self.producers.get(request.producer_id)
        if existing is not None and existing.fenced:
            # The fenced producer's client reconnects it: ask its topic afresh.
            del self.producers[request.producer_id]
            self._remove_producer(existing)
            existing = None
        if existing is not None:
            if existing.topic == request.topic:
                self._producer_success(request.request_id, existing.name, existing.schema_version)
            else:
                self._error(
                    request.request_id,
                    pb.ProducerBusy,
                    f"Producer id {request.producer_id} is in use on this connection",
                )
            return
        if not valid_topic_name(request.topic):
            self._error(
                request.request_id, pb.InvalidTopicName, f"Invalid topic name {request.topic!r}"
            )
            return
        if not self.auth.allowed("produce", request.topic):
            self._error(
                request.request_id,
                pb.AuthorizationError,
                f"Role {self.auth.role!r} may not produce on {request.topic}",
            )
            return
        try:
            topic_ref = self._topic(request.topic)
        except BrokerError as error:
            self._error(request.request_id, error.code, error.message)
            return
        name = request.producer_name or f"brokerlet-{next(_producer_names)}"
        add = AddProducer(
            name,
            self.peer,
            self.actor_ref,
            request.producer_id,
            request.producer_access_mode,
            request.topic_epoch if request.HasField("topic_epoch") else None,
            deduplication(self.metadata.namespaces.get(parsed_topic(request.topic).namespace)),
        )
        # After the topic's existence rules, so a refused topic registers no schema.
        schema_version = None
        if self.schemas is not None:
            try:
                schema_version = schema_wire.admit_producer(self.schemas, request)
            except SchemaError as error:
                self._error(request.request_id, pb.IncompatibleSchema, str(error))
                return
        try:
            admitted: ProducerAdmitted = topic_ref.ask(add, block=True)
        except BrokerError as error:
            self._error(request.request_id, error.code, error.message)
            return
        if request.initial_subscription_name:
            # A dead-letter producer's: the subscription keeps what it writes for a consumer
            # that subscribes later (Pulsar creates it at Earliest, durable).
            topic_ref.ask(
                Subscribe(
                    request.initial_subscription_name,
                    pb.CommandSubscribe.Shared,
                    True,
                    pb.CommandSubscribe.Earliest,
                ),
                block=True,
            )
        self.producers[request.producer_id] = _Producer(
            request.producer_id,
            name,
            request.topic,
            topic_ref,
            request_id=request.request_id,
            schema_version=schema_version,
        )
        self._producer_success(
            request.request_id,
            name,
            schema_version,
            admitted.last_sequence_id,
            admitted.topic_epoch,
            ready=admitted.ready,
        )

    def _producer_success(
        self,
        request_id: int,
        name: str,
        schema_version: bytes | None = None,
        last_sequence_id: int = -1,
        topic_epoch: int | None = None,
        *,
        ready: bool = True,
    ) -> None:
        self.channel.write(
            encode_producer_success(
                request_id, name, last_sequence_id, schema_version, topic_epoch, ready=ready
            )
        )

    def _remove_producer(self, producer: _Producer) -> None:
        remove = RemoveProducer(producer.name, self.actor_ref, producer.producer_id)
        tell_quietly(producer.topic_ref, remove)

    def _producer_news(self, message: ProducerReady | ProducerFenced | ProducerRefused) -> None:
        """Access-mode news from a topic (brokerlet.producers.messages)."""
        producer = self.producers.get(message.producer_id)
        if producer is None or producer.fenced:
            return
        if isinstance(message, ProducerReady):
            self._producer_success(
                producer.request_id,
                producer.name,
                producer.schema_version,
                message.last_sequence_id,
                message.topic_epoch,
            )
        elif isinstance(message, ProducerFenced):
            # Kept, fenced: SENDs still in flight are answered with ProducerFenced.
            producer.fenced = True
            self._send(
                T(
                    type=T.CLOSE_PRODUCER,
                    close_producer=pb.CommandCloseProducer(
                        producer_id=producer.producer_id, request_id=NO_ID
                    ),
                )
            )
        else:
            del self.producers[message.producer_id]
            self._error(producer.request_id, message.code, message.message)

    def _close_producer(self, command: pb.BaseCommand) -> None:
        request = command.close_producer
        producer = self.producers.pop(request.producer_id, None)
        if producer is not None:
            self._remove_producer(producer)
        self._success(request.request_id)

    def _topic_closed(self, topic_ref: pykka.ActorRef[TopicActor]) -> None:
        """The topic failed, was unloaded or terminated: close its producers, so their clients
        reconnect (to its successor, or to be refused with TopicTerminatedError)."""
        for producer in [p for p in self.producers.values() if p.topic_ref is topic_ref]:
            self._producer_closed_by_broker(producer)

    def _producer_closed_by_broker(self, producer: _Producer) -> None:
        if self.producers.get(producer.producer_id) is not producer:
            return
        del self.producers[producer.producer_id]
        self._send(
            T(
                type=T.CLOSE_PRODUCER,
                close_producer=pb.CommandCloseProducer(
                    producer_id=producer.producer_id, request_id=NO_ID
                ),
            )
        )

    def _sends(self, sends: list[Frame]) -> bool:
        """Append a slice of SENDs: one Append per producer, its SENDs in their order.

        Grouped by producer, not by runs of one producer: a partitioned producer's
        round-robin sends alternate between the partitions' producers on one connection,
        which made every SEND an Append, an Appended and a write of its own. A malformed
        SEND closes the connection and nothing of the slice is appended: none of it was
        receipted, so the client sends it again after reconnecting.
        """
        by_producer, unusual = plain_appends(sends, self.settings.max_message_size)
        runs = []
        for producer_id, items in by_producer.items():
            producer = self.producers.get(producer_id)
            if producer is None:
                self._disconnect(f"SEND for unknown producer {producer_id}")
                return False
            runs.append((producer, items))
        for items, index, frame in unusual:
            item = self._unusual_send(frame)
            if item is None:
                return False  # disconnected
            items[index] = item
        for producer, items in runs:
            self._append(producer, items)
        return True

    def _unusual_send(self, frame: Frame) -> AppendItem | None:
        """The append item of a SEND off the plain path: a checksum mismatch (answered as
        one), a message over the size limit, or metadata of another layout (parsed). None
        when the SEND is malformed: the connection is closed."""
        # frame.send is set: _received collects only SEND frames that have it.
        producer_id, sequence_id, num_messages, highest = frame.send  # type: ignore[misc]
        if num_messages < 1:
            self._disconnect(f"malformed SEND: num_messages {num_messages}")
            return None
        try:
            # The frame decoder split the usual layout already; anything else is here.
            section = frame.section or decode_payload(frame.payload or b"")
        except ProtocolError as error:
            self._disconnect(f"malformed SEND payload: {error.reason}")
            return None
        if highest is None:
            highest = sequence_id
        data, checksum, checksum_ok = section
        max_size = self.settings.max_message_size
        entry: NewEntry | None = None
        refusal = None
        if not checksum_ok:
            log.warning(
                "%s: checksum mismatch on SEND %d of producer %s",
                self.peer,
                sequence_id,
                self.producers[producer_id].name,
            )
        elif len(data) > max_size and not _is_chunk(data):
            # The frame limit leaves room for the command; the message itself may not.
            refusal = (
                pb.NotAllowedError,
                f"Exceed maximum message size: {len(data)} > {max_size} bytes",
            )
        else:
            refusal = _metadata_refusal(data)
            if refusal is None:
                entry = (data, checksum, num_messages, 0)
        if refusal is not None:
            self._refused.warn(
                "%s: refused SEND %d of producer %s: %s",
                self.peer,
                sequence_id,
                self.producers[producer_id].name,
                refusal[1],
            )
        return (sequence_id, highest, entry, refusal)

    def _append(self, producer: _Producer, items: list[AppendItem]) -> None:
        append = Append(self.actor_ref, producer.producer_id, items)
        if not tell_quietly(producer.topic_ref, append):
            self._producer_closed_by_broker(producer)  # its topic failed: reconnect

    def _appended_all(self, message: AppendedAll) -> None:
        if message.producer_id not in self.producers:
            return  # closed meanwhile; the client stopped waiting for receipts
        # One buffer for the whole run of receipts: one channel entry and one send.
        self.channel.write(
            encode_send_receipts(
                message.producer_id, message.ledger_id, message.first_entry_id, message.items
            )
        )

    def _appended(self, message: Appended) -> None:
        if message.producer_id not in self.producers:
            return  # closed meanwhile; the client stopped waiting for receipts
        producer_id = message.producer_id
        frames = []
        for receipt in message.receipts:
            if receipt.error is None:
                frames.append(
                    encode_send_receipt(
                        producer_id,
                        receipt.sequence_id,
                        receipt.highest_sequence_id,
                        receipt.ledger_id,
                        receipt.entry_id,
                    )
                )
            else:
                frames.append(
                    encode_command(
                        T(
                            type=T.SEND_ERROR,
                            send_error=pb.CommandSendError(
                                producer_id=producer_id,
                                sequence_id=receipt.sequence_id,
                                error=receipt.error,
                                message=receipt.message,
                            ),
                        )
                    )
                )
        # One buffer for the whole run of receipts: one channel entry and one send.
        self.channel.write(b"".join(frames))

    # Consumers.

    def _dispatcher_of(self, consumer: Consumer) -> pykka.ActorRef[DispatcherActor]:
        assert consumer.read_gate is not None
        return consumer.read_gate.actor_ref

    def _subscribe(self, command: pb.BaseCommand) -> None:
        request = command.subscribe
        request_id = request.request_id
        if request.consumer_id in self.consumers:
            # As Pulsar's ServerCnx.handleSubscribe: a consumer made already (a client that
            # timed out and asked again) is answered SUCCESS, whatever the request names.
            log.info(
                "%s: consumer %d exists already; SUBSCRIBE answered as done",
                self.peer,
                request.consumer_id,
            )
            self._success(request_id)
            return
        if not valid_topic_name(request.topic):
            self._error(request_id, pb.InvalidTopicName, f"Invalid topic name {request.topic!r}")
            return
        if not self.auth.allowed("consume", request.topic):
            self._error(
                request_id,
                pb.AuthorizationError,
                f"Role {self.auth.role!r} may not consume from {request.topic}",
            )
            return
        durable = request.durable if request.HasField("durable") else True
        start = None
        if request.HasField("start_message_id"):
            start = (request.start_message_id.ledger_id, request.start_message_id.entry_id)
        create = request.force_topic_creation if request.HasField("force_topic_creation") else True
        try:
            topic_ref = self._topic(request.topic, create=create)
        except BrokerError as error:
            self._error(request_id, error.code, error.message)
            return
        if request.start_message_rollback_duration_sec > 0 and not durable:
            # A reader started that far back in publish time (Pulsar resets its cursor).
            since = int(time.time() * 1000) - request.start_message_rollback_duration_sec * 1000
            found = self._find_by_publish_time(topic_ref, since)
            if isinstance(found, str):
                self._error(request_id, pb.UnknownError, found)
                return
            start = found
        if self.schemas is not None:
            try:
                schema_wire.admit_consumer(
                    self.schemas, request, lambda: topic_is_idle(stats_reader.of_topic(topic_ref))
                )
            except SchemaError as error:
                self._error(request_id, pb.IncompatibleSchema, str(error))
                return
        try:
            dispatcher: pykka.ActorRef[DispatcherActor] = topic_ref.ask(
                Subscribe(
                    request.subscription,
                    request.sub_type,
                    durable,
                    request.initial_position,
                    start,
                    read_compacted=request.read_compacted,
                ),
                block=True,
            )
        except BrokerError as error:
            # readCompacted on a Shared subscription, say.
            self._error(request_id, error.code, error.message)
            return
        consumer = Consumer(
            consumer_id=request.consumer_id,
            name=request.consumer_name or f"consumer-{request.consumer_id}",
            topic=request.topic,
            subscription=request.subscription,
            sub_type=request.sub_type,
            priority=request.priority_level,
            connection=self.handle,
            key_shared=KeySharedMeta.from_command(request)
            if request.sub_type == pb.CommandSubscribe.Key_Shared
            else None,
            epoch=request.consumer_epoch
            if request.HasField("consumer_epoch")
            and request.sub_type in (pb.CommandSubscribe.Exclusive, pb.CommandSubscribe.Failover)
            else None,
        )
        try:
            notices: list[bytes] = dispatcher.ask(AddConsumer(consumer), block=True)
        except BrokerError as error:
            self._error(request_id, error.code, error.message)
            return
        except pykka.ActorDeadError:
            self._error(request_id, pb.ServiceNotReady, "Subscription is closing, retry")
            return
        self.consumers[request.consumer_id] = consumer
        self._consumers_changed()
        self._success(request_id)
        if notices:  # Failover's ACTIVE_CONSUMER_CHANGE, after the SUCCESS
            self.handle.event_loop.tell(WriteAfterMessages(self.handle, notices))

    def _consumers_changed(self) -> None:
        """Publish the consumers to the event loop (one assignment; it reads without a lock)."""
        self.handle.consumers = tuple(self.consumers.values())

    def _consumer(self, consumer_id: int, what: str) -> Consumer | None:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            self._unknown_consumer.warn(
                "%s sent %s for unknown consumer %d; ignored", self.peer, what, consumer_id
            )
        return consumer

    def _flow(self, command: pb.BaseCommand) -> None:
        flow = command.flow
        consumer = self._consumer(flow.consumer_id, "FLOW")
        if consumer is not None:
            consumer.flow(flow.message_permits)

    def _ack(self, command: pb.BaseCommand) -> None:
        ack = command.ack
        # An id with an ack_set acknowledges only part of a batch (dispatch/batch_acks.py);
        # without batch-index acks enabled the entry just stays unacked.
        positions: list[tuple[int, int]] = []
        ack_sets: dict[tuple[int, int], tuple[int, ...]] = {}
        for m in ack.message_id:  # one pass: each field read from protobuf costs
            words = m.ack_set
            if not words:
                positions.append((m.ledger_id, m.entry_id))
            elif self.settings.acknowledgment_at_batch_index_level_enabled:
                ack_sets[m.ledger_id, m.entry_id] = tuple(words)
        self._acked(
            ack.consumer_id,
            ack.ack_type == pb.CommandAck.Cumulative,
            positions,
            ack.request_id if ack.HasField("request_id") else None,
            ack_sets,
        )

    def _acked(
        self,
        consumer_id: int,
        cumulative: bool,
        positions: list[tuple[int, int]],
        request_id: int | None,
        ack_sets: dict[tuple[int, int], tuple[int, ...]] | None = None,
    ) -> None:
        """An ACK's whole entries (``positions``) and parts of batches (``ack_sets``)."""
        consumer = self._consumer(consumer_id, "ACK")
        if consumer is None:
            if request_id is not None:  # an ack receipt: the error, not a disconnect
                self.channel.write(
                    encode_ack_response(
                        consumer_id,
                        request_id,
                        pb.ConsumerNotFound,
                        f"Consumer {consumer_id} not found",
                    )
                )
            return
        if positions or ack_sets:
            tell_quietly(
                self._dispatcher_of(consumer),
                Ack(consumer, positions, cumulative, ack_sets or None),
            )
        if request_id is not None:
            # The ack is queued to the dispatcher ahead of anything the client sends after
            # this receipt. An id acked before is acked again harmlessly and answered OK, as
            # Pulsar's cursor does.
            self.channel.write(encode_ack_response(consumer_id, request_id))

    def _consumer_stats(self, command: pb.BaseCommand) -> None:
        request = consumer_stats_request(command)
        if request is None:
            return  # no request id to answer
        request_id, consumer_id = request
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            self.channel.write(
                encode_consumer_stats_response(
                    request_id, None, pb.ConsumerNotFound, f"Consumer {consumer_id} not found"
                )
            )
            return
        figures = consumer_figures(
            self._dispatcher_of(consumer).ask(GetStats(), block=True),
            self._topic(consumer.topic).ask(GetLastEntry(), block=True)[1],
            consumer,
        )
        self.channel.write(encode_consumer_stats_response(request_id, figures))

    def _redeliver(self, command: pb.BaseCommand) -> None:
        request = command.redeliver_unacknowledged_messages
        consumer = self._consumer(request.consumer_id, "REDELIVER_UNACKNOWLEDGED_MESSAGES")
        if consumer is None:
            return
        positions = [(m.ledger_id, m.entry_id) for m in request.message_ids] or None
        epoch = request.consumer_epoch if request.HasField("consumer_epoch") else None
        tell_quietly(self._dispatcher_of(consumer), Redeliver(consumer, positions, epoch))

    def _close_consumer(self, command: pb.BaseCommand) -> None:
        # Answered at once, as a bare request: the removal is queued at the dispatcher before
        # the answer leaves, so whatever the client does next finds it done; and the event
        # loop writes no MESSAGE for a closed consumer (what it was sent goes back for
        # redelivery when the dispatcher removes it).
        request = command.close_consumer
        consumer = self.consumers.pop(request.consumer_id, None)
        self._success(request.request_id)
        if consumer is not None:
            consumer.closed = True
            self._consumers_changed()
            tell_quietly(self._dispatcher_of(consumer), RemoveConsumer(consumer))

    def _unsubscribe(self, command: pb.BaseCommand) -> None:
        request = command.unsubscribe
        consumer = self._requested_consumer(request.consumer_id, request.request_id)
        if consumer is None:
            return
        try:
            with contextlib.suppress(pykka.ActorDeadError):
                self._dispatcher_of(consumer).ask(
                    RemoveConsumer(consumer, unsubscribe=True), block=True
                )
        except BrokerError as error:
            self._error(request.request_id, error.code, error.message)
            return
        del self.consumers[request.consumer_id]
        self._consumers_changed()
        self._success(request.request_id)

    def _requested_consumer(self, consumer_id: int, request_id: int) -> Consumer | None:
        """The consumer a request names, or None after answering ConsumerNotFound."""
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            self._error(request_id, pb.ConsumerNotFound, f"Consumer {consumer_id} not found")
        return consumer

    def _seek(self, command: pb.BaseCommand) -> None:
        request = command.seek
        consumer = self._requested_consumer(request.consumer_id, request.request_id)
        if consumer is None:
            return
        topic = self._topic(consumer.topic)
        if request.HasField("message_id"):
            target = (request.message_id.ledger_id, request.message_id.entry_id)
            entry_id: int = topic.ask(ResolvePosition(target), block=True)
        else:
            found = self._find_by_publish_time(topic, request.message_publish_time)
            if isinstance(found, str):
                self._error(request.request_id, pb.UnknownError, found)
                return
            entry_id = found[1]
        own_consumers: list[Consumer] = self._dispatcher_of(consumer).ask(
            Seek(entry_id, self.handle), block=True
        )
        frames = [frame for own in own_consumers for frame in self._forget_closed(own)]
        success = T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=request.request_id))
        frames.append(encode_command(success))
        # After the MESSAGE frames of the closed consumers, then the answer.
        self.handle.event_loop.tell(WriteAfterMessages(self.handle, frames))

    @staticmethod
    def _find_by_publish_time(
        topic: pykka.ActorRef[TopicActor], publish_time: int
    ) -> tuple[int, int] | str:
        """The first position published at or after ``publish_time``, or why there is none."""
        found: gevent.event.AsyncResult[tuple[int, int] | BaseException] = (
            gevent.event.AsyncResult()
        )
        topic.tell(FindByPublishTime(publish_time, found.set))
        try:
            result: tuple[int, int] | BaseException = found.get(timeout=SEARCH_TIMEOUT)
        except gevent.Timeout:
            return "Seek by publish time timed out"
        if isinstance(result, BaseException):
            return f"Seek by publish time failed: {result}"
        return result

    def _closed_by_broker(self, consumer: Consumer) -> None:
        frames = self._forget_closed(consumer)
        if frames:
            # Through the event loop, so it follows the MESSAGE frames queued there for it.
            self.handle.event_loop.tell(WriteAfterMessages(self.handle, frames))

    def _forget_closed(self, consumer: Consumer) -> list[bytes]:
        """Drop a consumer the broker closed; the CLOSE_CONSUMER frame to send, if it was ours."""
        if self.consumers.get(consumer.consumer_id) is not consumer:
            return []
        del self.consumers[consumer.consumer_id]
        self._consumers_changed()
        close = pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=NO_ID)
        return [encode_command(T(type=T.CLOSE_CONSUMER, close_consumer=close))]

    # End of topic (topic operations: a terminated topic read to its end).

    def _end_of_topic(self, consumer: Consumer) -> None:
        if self.consumers.get(consumer.consumer_id) is not consumer:
            return
        if knows_end_of_topic(self.protocol_version, self.client_version):
            self._send(reached_end_of_topic(consumer.consumer_id))

    def _get_last_message_id(self, command: pb.BaseCommand) -> None:
        request = command.get_last_message_id
        consumer = self._requested_consumer(request.consumer_id, request.request_id)
        if consumer is None:
            return
        ledger_id, last = self._topic(consumer.topic).ask(
            GetLastEntry(consumer.subscription), block=True
        )
        mark_delete: int = self._dispatcher_of(consumer).ask(GetMarkDelete(), block=True)
        response = pb.CommandGetLastMessageIdResponse(request_id=request.request_id)
        # An empty topic answers -1:-1, which the client reads as "nothing there".
        response.last_message_id.ledger_id = ledger_id if last >= 0 else NO_ID
        response.last_message_id.entry_id = last if last >= 0 else NO_ID
        response.consumer_mark_delete_position.ledger_id = ledger_id
        response.consumer_mark_delete_position.entry_id = mark_delete if mark_delete >= 0 else NO_ID
        self._send(T(type=T.GET_LAST_MESSAGE_ID_RESPONSE, get_last_message_id_response=response))

    # Schemas.

    def _get_schema(self, command: pb.BaseCommand) -> None:
        request = command.get_schema
        if self.schemas is None:
            response = pb.CommandGetSchemaResponse(
                request_id=request.request_id,
                error_code=pb.NotAllowedError,
                error_message="This broker has no schema registry",
            )
        else:
            response = schema_wire.answer_get_schema(self.schemas, request)
        self._send(T(type=T.GET_SCHEMA_RESPONSE, get_schema_response=response))

    def _get_or_create_schema(self, command: pb.BaseCommand) -> None:
        request = command.get_or_create_schema
        if self.schemas is None:
            response = pb.CommandGetOrCreateSchemaResponse(
                request_id=request.request_id,
                error_code=pb.NotAllowedError,
                error_message="This broker has no schema registry",
            )
        else:
            # Pulsar answers only for a topic that exists; brokerlet's exist once used.
            exists = valid_topic_name(request.topic) and (
                self.broker.ask(FindTopic(request.topic), block=True) is not None
            )
            response = schema_wire.answer_get_or_create_schema(self.schemas, request, exists)
        self._send(T(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, get_or_create_schema_response=response))


# The command handlers' names, one table for every connection: a dict of bound methods built
# for each was 36,000 of the 475,000 instructions a connection's set-up and close cost. Looked
# up by name per command, so a subclass or a test's patch of a handler still takes effect.
_HANDLERS: dict[int, str] = {
    T.CONNECT: "_connect",
    T.PING: "_ping",
    T.PONG: "_pong",
    T.PARTITIONED_METADATA: "_partitioned_metadata",
    T.LOOKUP: "_lookup",
    T.PRODUCER: "_producer",
    T.CLOSE_PRODUCER: "_close_producer",
    T.SUBSCRIBE: "_subscribe",
    T.FLOW: "_flow",
    T.ACK: "_ack",
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: "_redeliver",
    T.CLOSE_CONSUMER: "_close_consumer",
    T.UNSUBSCRIBE: "_unsubscribe",
    T.GET_LAST_MESSAGE_ID: "_get_last_message_id",
    T.SEEK: "_seek",
    T.CONSUMER_STATS: "_consumer_stats",
    T.AUTH_RESPONSE: "_auth_response",
    T.GET_TOPICS_OF_NAMESPACE: "_topics_of_namespace",
    T.GET_SCHEMA: "_get_schema",
    T.GET_OR_CREATE_SCHEMA: "_get_or_create_schema",
}


def topic_is_idle(stats: dict[str, Any]) -> bool:
    """No producers, no consumers and no data: a consumer's schema may be registered."""
    return (
        not stats["publishers"]
        and stats["lastEntryId"] < 0
        and not any(sub.get("consumers") for sub in stats["subscriptions"].values())
    )


@functools.lru_cache(maxsize=64)
def _connected(protocol_version: int, max_message_size: int) -> bytes:
    """The CONNECTED frame: the same few bytes for every client of a protocol version."""
    connected = pb.CommandConnected(
        server_version=f"brokerlet-{__version__}",
        protocol_version=protocol_version,
        max_message_size=max_message_size,
    )
    return encode_command(T(type=T.CONNECTED, connected=connected))


def _is_chunk(entry: bytes) -> bool:
    """Whether ``entry`` is one chunk of a chunked message.

    Clients cut chunks of max_message_size payload bytes, so a chunk's metadata takes it just
    past the limit; Pulsar skips the message-size check for chunks
    (AbstractTopic.isExceedMaximumMessageSize) and only the frame limit holds.
    """
    try:
        return parse_metadata(entry).num_chunks_from_msg > 1
    except ProtocolError:
        return False


def _metadata_refusal(entry: bytes) -> tuple[pb.ServerError.ValueType, str] | None:
    """Why a SEND's entry must not be stored, or None: its metadata must decode.

    Consumers and the Key_Shared dispatcher parse every stored entry, so an undecodable one
    is refused before it is receipted, as Pulsar refuses a message it cannot parse.
    """
    problem = metadata_problem(entry)
    if problem is None:
        return None
    return pb.NotAllowedError, f"Invalid message metadata: {problem}"


class _ProtocolViolation(Exception):  # noqa: N818 - a signal, not an error to report
    """Raised by a command handler when the peer broke the protocol."""
