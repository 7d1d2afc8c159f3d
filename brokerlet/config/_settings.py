"""The settings table: every broker setting with its default, Pulsar alias and limits."""

from __future__ import annotations

import dataclasses
import difflib
import operator
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from brokerlet.config._fields import RULE_KEY, FieldSpec, Rule, SettingsError, setting

__all__ = ["SPECS", "Entry", "Settings", "collect", "entries_from_mapping"]

_MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """The broker's configuration, checked as a whole whenever one is made.

    Build one with :func:`~brokerlet.config.load_settings` (defaults, TOML, environment,
    overrides) or directly; either way each value is checked against its rule and the
    cross-field orderings, and a bad one raises :class:`SettingsError`.

    Each field's ``metadata`` carries its :class:`Rule`: the Pulsar alias, the allowed
    values and a one-line help. Defaults follow Pulsar 4.x.
    """

    # fmt: off
    # Listener and client-facing addresses.
    host: str = setting(
        "127.0.0.1", "Address the Pulsar protocol listener binds to.",
        alias="bindAddress", non_empty=True,
    )
    port: int = setting(
        6650, "Pulsar protocol port; 0 picks a free port.",
        alias="brokerServicePort", minimum=0, maximum=65535,
    )
    advertised_url: str = setting(
        "", "Service URL given to clients in lookups; empty means pulsar://<host>:<bound port>.",
        url_scheme=("pulsar://", "pulsar+ssl://"),
    )
    web_service_port: int = setting(
        8080, "HTTP port of the web service; 0 picks a free port.",
        alias="webServicePort", minimum=0, maximum=65535,
    )
    web_service_enabled: bool = setting(True, "Run the HTTP web service.")
    max_message_size: int = setting(
        5 * _MIB, "Largest message accepted, in bytes.",
        alias="maxMessageSize", minimum=1024, maximum=100 * _MIB,
    )

    # Connections and sockets.
    event_loops: int = setting(
        1, "Event-loop actors that share the connections.",
        alias="numIOThreads", minimum=1, maximum=64,
    )
    high_watermark: int = setting(
        65536, "Pending outbound bytes at which a connection stops being writable.",
        alias="pulsarChannelWriteBufferHighWaterMark", minimum=1,
    )
    low_watermark: int = setting(
        32768, "Pending outbound bytes a connection must drain below to be writable again.",
        alias="pulsarChannelWriteBufferLowWaterMark", minimum=0,
    )
    tcp_nodelay: bool = setting(True, "Turn off Nagle's algorithm on client sockets.")
    tcp_notsent_lowat: int = setting(
        16384, "TCP_NOTSENT_LOWAT in bytes; 0 leaves the kernel default.", minimum=0
    )
    so_sndbuf: int = setting(
        0, "SO_SNDBUF in bytes; 0 keeps the kernel default and its autotuning.", minimum=0
    )
    so_rcvbuf: int = setting(
        0, "SO_RCVBUF in bytes; 0 keeps the kernel default and its autotuning.", minimum=0
    )
    event_loop_slice_us: int = setting(
        100, "Scheduler slice (µs) the event loop's thread asks Linux (6.12+) for, so that it "
        "runs soon after a wake-up on a busy machine; the kernel raises values under 100 to "
        "100; 0 keeps the kernel's default.",
        minimum=0, maximum=100_000,
    )
    keep_alive_interval_seconds: int = setting(
        30, "Seconds between keep-alive pings on a quiet connection; 0 turns them off.",
        alias="keepAliveIntervalSeconds", minimum=0,
    )
    connection_backlog: int = setting(
        1024, "Listen backlog: connections the kernel queues before accept.", minimum=1
    )

    # Dispatcher reads and retries.
    dispatcher_max_read_batch_size: int = setting(
        100, "Most entries a dispatcher reads at once.",
        alias="dispatcherMaxReadBatchSize", minimum=1,
    )
    dispatcher_min_read_batch_size: int = setting(
        1, "Read batch size a dispatcher falls back to after a failed read.",
        alias="dispatcherMinReadBatchSize", minimum=1,
    )
    dispatcher_max_read_size_bytes: int = setting(
        5 * _MIB, "Most bytes a dispatcher reads at once.",
        alias="dispatcherMaxReadSizeBytes", minimum=1,
    )
    precise_dispatcher_flow_control: bool = setting(
        True, "A read asks for the entries its permits cover at the consumer's average "
        "messages per entry, not one entry per permit (Pulsar's default: false; see "
        "docs/performance.md).",
        alias="preciseDispatcherFlowControl",
    )
    dispatcher_max_round_robin_batch_size: int = setting(
        20, "Most entries one Shared consumer gets per round-robin turn.",
        alias="dispatcherMaxRoundRobinBatchSize", minimum=1,
    )
    active_consumer_failover_consistent_hashing: bool = setting(
        False, "Failover on a partition: pick the active consumer on the hash ring, as on "
        "a plain topic, instead of by the partition's index.",
        alias="activeConsumerFailoverConsistentHashing",
    )
    active_consumer_failover_delay_time_millis: int = setting(
        1000, "Failover: how long (ms) a new active consumer waits before delivery starts, "
        "so the old one's acks land first; 0 switches at once.",
        alias="activeConsumerFailoverDelayTimeMillis", minimum=0,
    )
    dispatcher_retry_backoff_initial_time_ms: int = setting(
        1, "First delay (ms) before reading again after a pass that dispatched nothing.",
        alias="dispatcherRetryBackoffInitialTimeInMs", minimum=0,
    )
    dispatcher_retry_backoff_max_time_ms: int = setting(
        10, "Longest delay (ms) before reading again after a pass that dispatched nothing.",
        alias="dispatcherRetryBackoffMaxTimeInMs", minimum=0,
    )
    dispatcher_read_failure_backoff_initial_time_ms: int = setting(
        15000, "First delay (ms) before retrying a failed read.",
        alias="dispatcherReadFailureBackoffInitialTimeInMs", minimum=0,
    )
    dispatcher_read_failure_backoff_max_time_ms: int = setting(
        60000, "Longest delay (ms) before retrying a failed read.",
        alias="dispatcherReadFailureBackoffMaxTimeInMs", minimum=0,
    )

    # Unacked limits and dispatch rate limits (0 turns each off).
    max_unacked_messages_per_consumer: int = setting(
        50000, "Unacked messages at which a consumer stops receiving; 0 means no limit.",
        alias="maxUnackedMessagesPerConsumer", minimum=0,
    )
    max_unacked_messages_per_subscription: int = setting(
        200000, "Unacked messages at which a subscription stops reading; 0 means no limit.",
        alias="maxUnackedMessagesPerSubscription", minimum=0,
    )
    dispatch_throttling_rate_in_msg: int = setting(
        0, "Broker-wide dispatch limit, messages per second; 0 means none.",
        alias="dispatchThrottlingRateInMsg", minimum=0,
    )
    dispatch_throttling_rate_in_byte: int = setting(
        0, "Broker-wide dispatch limit, bytes per second; 0 means none.",
        alias="dispatchThrottlingRateInByte", minimum=0,
    )
    dispatch_throttling_rate_per_topic_in_msg: int = setting(
        0, "Per-topic dispatch limit, messages per second; 0 means none.",
        alias="dispatchThrottlingRatePerTopicInMsg", minimum=0,
    )
    dispatch_throttling_rate_per_topic_in_byte: int = setting(
        0, "Per-topic dispatch limit, bytes per second; 0 means none.",
        alias="dispatchThrottlingRatePerTopicInByte", minimum=0,
    )
    dispatch_throttling_rate_per_subscription_in_msg: int = setting(
        0, "Per-subscription dispatch limit, messages per second; 0 means none.",
        alias="dispatchThrottlingRatePerSubscriptionInMsg", minimum=0,
    )
    dispatch_throttling_rate_per_subscription_in_byte: int = setting(
        0, "Per-subscription dispatch limit, bytes per second; 0 means none.",
        alias="dispatchThrottlingRatePerSubscriptionInByte", minimum=0,
    )

    # Key_Shared.
    subscription_key_shared_use_consistent_hashing: bool = setting(
        True, "Key_Shared assigns hashes by consistent hashing rather than by splitting ranges.",
        alias="subscriptionKeySharedUseConsistentHashing",
    )
    subscription_key_shared_consistent_hashing_replica_points: int = setting(
        100, "Points per consumer on the Key_Shared consistent-hash ring.",
        alias="subscriptionKeySharedConsistentHashingReplicaPoints", minimum=1,
    )
    key_shared_look_ahead_msg_in_replay_threshold_per_consumer: int = setting(
        4000, "Replay backlog per consumer that pauses Key_Shared normal reads; 0 = no cap.",
        alias="keySharedLookAheadMsgInReplayThresholdPerConsumer", minimum=0,
    )
    key_shared_look_ahead_msg_in_replay_threshold_per_subscription: int = setting(
        40000, "Replay backlog per subscription that pauses Key_Shared normal reads; 0 = no cap.",
        alias="keySharedLookAheadMsgInReplayThresholdPerSubscription", minimum=0,
    )
    key_shared_unblocking_interval_ms: int = setting(
        10, "Delay (ms) before reading again once a Key_Shared hash is unblocked.",
        alias="keySharedUnblockingIntervalMs", minimum=0,
    )

    # Storage and logging.
    storage: str = setting(
        "memory", "Where topic data lives: in memory, or on disk under data_dir.",
        choices=("memory", "disk"),
    )
    data_dir: str = setting("./data", "Directory for disk storage.")
    sync_policy: str = setting(
        "every_batch",
        "When disk appends are forced to disk before their receipt: every_batch loses nothing "
        "receipted on power loss; interval may lose up to sync_interval_ms; never leaves it "
        "to the kernel (a process crash loses nothing under any policy).",
        choices=("every_batch", "interval", "never"),
    )
    sync_interval_ms: int = setting(
        100, "With sync_policy = interval: how often (ms) appends are forced to disk.", minimum=1
    )
    segment_bytes: int = setting(
        64 * 1024 * 1024, "Size at which a topic's log segment is sealed and a new one begun.",
        minimum=4096,
    )
    cache_bytes: int = setting(
        16 * 1024 * 1024, "Recent entries kept in memory per disk topic, for reads.", minimum=0
    )
    cursor_flush_ms: int = setting(
        100, "Longest delay (ms) before a durable subscription's acks are written to disk.",
        minimum=1,
    )
    managed_ledger_max_unacked_ranges_to_persist: int = setting(
        10_000, "Runs of out-of-order acks saved per subscription (the lowest first); acks "
        "past them are kept in memory only, and their entries come again after a restart.",
        alias="managedLedgerMaxUnackedRangesToPersist", minimum=0,
    )
    log_level: str = setting(
        "INFO", "Lowest level of log records emitted.",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    )

    # Security (issue 17): TLS listeners, authentication, authorization. Pulsar leaves the
    # TLS ports unset; -1 means "no TLS listener" here (0 picks a free port, as elsewhere).
    broker_service_port_tls: int = setting(
        -1, "Pulsar protocol TLS (pulsar+ssl) port; -1 means none, 0 picks a free port.",
        alias="brokerServicePortTls", minimum=-1, maximum=65535,
    )
    web_service_port_tls: int = setting(
        -1, "HTTPS port of the web service; -1 means none, 0 picks a free port.",
        alias="webServicePortTls", minimum=-1, maximum=65535,
    )
    advertised_url_tls: str = setting(
        "", "TLS service URL given in lookups; empty means pulsar+ssl://<host>:<bound TLS port>.",
        alias="brokerServiceUrlTls", url_scheme="pulsar+ssl://",
    )
    tls_certificate_file_path: str = setting(
        "", "PEM certificate (chain) of the TLS listeners.", alias="tlsCertificateFilePath"
    )
    tls_key_file_path: str = setting(
        "", "PEM private key of the TLS listeners.", alias="tlsKeyFilePath"
    )
    tls_trust_certs_file_path: str = setting(
        "", "PEM CA certificates that client certificates are checked against.",
        alias="tlsTrustCertsFilePath",
    )
    tls_require_trusted_client_cert_on_connect: bool = setting(
        False, "Refuse TLS clients without a certificate signed by a trusted CA.",
        alias="tlsRequireTrustedClientCertOnConnect",
    )
    tls_allow_insecure_connection: bool = setting(
        False, "Do not ask TLS clients for a certificate at all (TLS authentication is off).",
        alias="tlsAllowInsecureConnection",
    )
    tls_protocols: str = setting(
        "", "Comma-separated TLS versions allowed (TLSv1.2,TLSv1.3); empty: the default set.",
        alias="tlsProtocols",
    )
    tls_ciphers: str = setting(
        "", "Comma-separated OpenSSL cipher names for TLS 1.2; empty: the default set.",
        alias="tlsCiphers",
    )
    tls_handshake_timeout_seconds: float = setting(
        5.0, "Seconds a TLS handshake may take before the connection is closed.",
        minimum=0.1,
    )
    authentication_enabled: bool = setting(
        False, "Authenticate clients with the configured providers.",
        alias="authenticationEnabled",
    )
    authentication_providers: str = setting(
        "", "Comma-separated provider class names (AuthenticationProviderToken, ...Tls, "
        "...Basic).", alias="authenticationProviders",
    )
    authentication_refresh_check_seconds: int = setting(
        60, "How often live connections are checked for expired credentials.",
        alias="authenticationRefreshCheckSeconds", minimum=1,
    )
    anonymous_user_role: str = setting(
        "", "Role of clients that give no credentials; empty refuses them.",
        alias="anonymousUserRole",
    )
    authorization_enabled: bool = setting(
        False, "Check roles against tenant admins and namespace permissions.",
        alias="authorizationEnabled",
    )
    super_user_roles: str = setting(
        "", "Comma-separated roles that may do everything.", alias="superUserRoles"
    )
    token_secret_key: str = setting(
        "", "HMAC key of the token provider: data:;base64,..., file:///..., a path or base64.",
        alias="tokenSecretKey", secret=True,
    )
    token_public_key: str = setting(
        "", "Public key of the token provider (RSA or EC), given like token_secret_key.",
        alias="tokenPublicKey",
    )
    token_public_alg: str = setting(
        "RS256", "Signature algorithm of tokens checked with token_public_key.",
        alias="tokenPublicAlg",
        choices=("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"),
    )
    token_auth_claim: str = setting(
        "sub", "Token claim that holds the role.", alias="tokenAuthClaim", non_empty=True
    )
    token_audience_claim: str = setting(
        "aud", "Token claim checked against token_audience.", alias="tokenAudienceClaim"
    )
    token_audience: str = setting(
        "", "Audience tokens must name; empty checks none.", alias="tokenAudience"
    )
    basic_auth_conf: str = setting(
        "", "htpasswd users of the Basic provider: data:, file:, a path or base64.",
        alias="basicAuthConf", secret=True,
    )

    # Limits on what peers may hold (issue 10: bad peers must not break topics).
    # Pulsar's defaults are 0 (no limit); brokerlet's are bounded, see README "Bad input".
    broker_max_connections: int = setting(
        4096, "Most open client connections; more are closed at once. 0 = no limit.",
        alias="brokerMaxConnections", minimum=0,
    )
    broker_max_connections_per_ip: int = setting(
        1024, "Most open client connections from one IP address; 0 = no limit.",
        alias="brokerMaxConnectionsPerIp", minimum=0,
    )
    inactive_topic_close_interval_seconds: int = setting(
        60, "Seconds between checks that close (never delete) disk topics with no producer "
        "and no subscription; 0 = never.",
        alias="brokerDeleteInactiveTopicsFrequencySeconds", minimum=0,
    )

    # Metadata, namespaces, partitioned topics and lookups (issue 12).
    cluster_name: str = setting(
        "standalone", "Name of the one cluster this broker forms (GET /admin/v2/clusters).",
        alias="clusterName", non_empty=True,
    )
    allow_auto_topic_creation: bool = setting(
        True, "Create a missing topic when a client uses it (namespaces may override).",
        alias="allowAutoTopicCreation",
    )
    allow_auto_topic_creation_type: str = setting(
        "non-partitioned", "Type of an auto-created topic.",
        alias="allowAutoTopicCreationType", choices=("non-partitioned", "partitioned"),
    )
    default_num_partitions: int = setting(
        1, "Partitions of an auto-created partitioned topic.",
        alias="defaultNumPartitions", minimum=1,
    )
    max_num_partitions_per_partitioned_topic: int = setting(
        0, "Most partitions a partitioned topic may have; 0 means no limit.",
        alias="maxNumPartitionsPerPartitionedTopic", minimum=0,
    )
    advertised_listeners: str = setting(
        "", "Named listeners for lookups: name:pulsar://host:port[,name:pulsar+ssl://...].",
        alias="advertisedListeners",
    )
    internal_listener_name: str = setting(
        "", "Listener answered to lookups that name none; empty means the first listener.",
        alias="internalListenerName",
    )
    enable_broker_side_subscription_pattern_evaluation: bool = setting(
        True, "Filter GET_TOPICS_OF_NAMESPACE answers by the client's regex pattern.",
        alias="enableBrokerSideSubscriptionPatternEvaluation",
    )
    subscription_pattern_max_length: int = setting(
        50, "Longest pattern evaluated broker-side; longer ones are not filtered.",
        alias="subscriptionPatternMaxLength", minimum=0,
    )
    # Producer access modes, deduplication and producer/consumer limits (issue 15).
    broker_deduplication_enabled: bool = setting(
        False, "Drop a SEND whose sequence id a producer of that name already had stored "
        "(namespaces may override with their deduplication policy).",
        alias="brokerDeduplicationEnabled",
    )
    broker_deduplication_max_number_of_producers: int = setting(
        10000, "Most producer names a topic keeps deduplication state for.",
        alias="brokerDeduplicationMaxNumberOfProducers", minimum=1,
    )
    broker_deduplication_producer_inactivity_timeout_minutes: int = setting(
        360, "Minutes after its last disconnect a producer's deduplication state is dropped.",
        alias="brokerDeduplicationProducerInactivityTimeoutMinutes", minimum=1,
    )
    broker_deduplication_entries_interval: int = setting(
        1000, "Stored entries between two snapshots of a topic's deduplication state.",
        alias="brokerDeduplicationEntriesInterval", minimum=1,
    )
    max_producers_per_topic: int = setting(
        0, "Most producers on one topic; 0 means no limit.",
        alias="maxProducersPerTopic", minimum=0,
    )
    max_consumers_per_topic: int = setting(
        0, "Most consumers on one topic; 0 means no limit.",
        alias="maxConsumersPerTopic", minimum=0,
    )
    max_consumers_per_subscription: int = setting(
        0, "Most consumers on one subscription; 0 means no limit.",
        alias="maxConsumersPerSubscription", minimum=0,
    )

    # Consumer semantics (issue 13): delayed delivery, batch-index acknowledgement.
    delayed_delivery_enabled: bool = setting(
        True, "Hold messages with a deliver_at_time on Shared and Key_Shared subscriptions.",
        alias="delayedDeliveryEnabled",
    )
    delayed_delivery_tick_time_millis: int = setting(
        1000, "Resolution of the delay tracker: a message due within this many ms of its "
        "read is delivered at once.",
        alias="delayedDeliveryTickTimeMillis", minimum=1,
    )
    acknowledgment_at_batch_index_level_enabled: bool = setting(
        True, "Keep acks of single messages of a batch; redeliveries skip them "
        "(Pulsar 4.2 and 5.0 default).",
        alias="acknowledgmentAtBatchIndexLevelEnabled",
    )

    # Data rules (issue 14): retention, message TTL, backlog quotas, compaction.
    default_retention_time_in_minutes: int = setting(
        0, "How long consumed data is kept (namespaces may override); -1 = forever, "
        "0 = deleted once every durable subscription has consumed it.",
        alias="defaultRetentionTimeInMinutes", minimum=-1, maximum=10**9,
    )
    default_retention_size_in_mb: int = setting(
        0, "How much consumed data is kept per topic (MB); -1 = no limit, 0 = none.",
        alias="defaultRetentionSizeInMB", minimum=-1, maximum=10**12,
    )
    retention_check_interval_in_seconds: float = setting(
        120.0, "How often the storage side trims segments that retention lets go.",
        alias="retentionCheckIntervalInSeconds", minimum=0.01,
    )
    ttl_duration_default_in_seconds: int = setting(
        0, "Messages older than this (by publish time) are acknowledged on every "
        "subscription; 0 = never (namespaces may override with messageTTL).",
        alias="ttlDurationDefaultInSeconds", minimum=0, maximum=10**10,
    )
    message_expiry_check_interval_in_minutes: float = setting(
        5.0, "How often message TTL is applied.",
        alias="messageExpiryCheckIntervalInMinutes", minimum=0.0001,
    )
    backlog_quota_default_limit_bytes: int = setting(
        -1, "Backlog (bytes of the slowest subscription) above which the quota policy "
        "applies; -1 = no limit.", alias="backlogQuotaDefaultLimitBytes", minimum=-1,
    )
    backlog_quota_default_limit_second: int = setting(
        -1, "Age (s) of the oldest unconsumed message above which the quota policy applies; "
        "-1 = no limit.", alias="backlogQuotaDefaultLimitSecond", minimum=-1,
    )
    backlog_quota_default_retention_policy: str = setting(
        "producer_request_hold", "What happens over the backlog quota.",
        alias="backlogQuotaDefaultRetentionPolicy",
        choices=("producer_request_hold", "producer_exception", "consumer_backlog_eviction"),
    )
    backlog_quota_check_enabled: bool = setting(
        True, "Check backlog quotas periodically.", alias="backlogQuotaCheckEnabled",
    )
    backlog_quota_check_interval_in_seconds: float = setting(
        60.0, "How often backlog quotas are checked.",
        alias="backlogQuotaCheckIntervalInSeconds", minimum=0.01,
    )
    broker_service_compaction_threshold_in_bytes: int = setting(
        0, "Compact a topic when its data after the last compaction exceeds this (bytes); "
        "0 = never automatically (namespaces may set compactionThreshold).",
        alias="brokerServiceCompactionThresholdInBytes", minimum=0,
    )
    broker_service_compaction_monitor_interval_in_seconds: float = setting(
        60.0, "How often compaction thresholds are checked.",
        alias="brokerServiceCompactionMonitorIntervalInSeconds", minimum=0.01,
    )
    compaction_cpu_share: float = setting(
        0.25, "Largest share of the broker's event loop a running compaction takes (it "
        "pauses between chunks of 1,000 entries); 1 = no pauses.", minimum=0.01, maximum=1.0,
    )
    topic_compaction_retain_null_key: bool = setting(
        False, "Keep messages without a key when compacting (dropped otherwise, as Pulsar).",
        alias="topicCompactionRetainNullKey",
    )
    # Schema registry (issue 18).
    schema_compatibility_strategy: str = setting(
        "FULL", "Broker-wide schema compatibility strategy (a namespace policy overrides it).",
        alias="schemaCompatibilityStrategy",
        choices=(
            "ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
            "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE",
        ),
    )
    allow_auto_update_schema: bool = setting(
        True, "Producers and idle-topic consumers may register new schema versions.",
        alias="isAllowAutoUpdateSchemaEnabled",
    )
    schema_validation_enforced: bool = setting(
        False, "Refuse producers without a schema on topics that have one.",
        alias="isSchemaValidationEnforced",
    )
    schema_max_size_bytes: int = setting(
        5 * _MIB, "Largest schema definition accepted, in bytes.", minimum=1,
    )
    # fmt: on

    def __post_init__(self) -> None:
        for spec in SPECS:
            given = getattr(self, spec.name)
            value = spec.convert(given)
            if value is not given:
                # Normalising a frozen instance while it is being built is safe.
                object.__setattr__(self, spec.name, value)
        _check_orderings(self)

    def replace(self, **changes: object) -> Settings:
        """Return a copy with some settings changed, checked like any other.

        Args:
            **changes: Values by snake_case name or Pulsar alias; strings are parsed.

        Raises:
            SettingsError: A key is unknown or a value is not allowed.
        """
        updates = collect(entries_from_mapping(changes))
        return dataclasses.replace(self, **updates)


def _specs() -> tuple[FieldSpec, ...]:
    hints = typing.get_type_hints(Settings)
    specs = []
    for field in dataclasses.fields(Settings):
        rule = field.metadata[RULE_KEY]
        assert isinstance(rule, Rule)
        specs.append(FieldSpec(field.name, hints[field.name], field.default, rule))
    return tuple(specs)


SPECS: Final[tuple[FieldSpec, ...]] = _specs()

_NAMES: Final = frozenset(spec.name for spec in SPECS)


def _key_index() -> dict[str, tuple[FieldSpec, str]]:
    """Map the lower-cased name and alias of every setting to it and to that key's spelling."""
    index: dict[str, tuple[FieldSpec, str]] = {}
    for spec in SPECS:
        for key in (spec.name, spec.rule.alias):
            if key is None:
                continue
            if key.lower() in index:  # a mistake in the table above, caught at import
                raise AssertionError(f"settings key {key!r} is not unique")
            index[key.lower()] = (spec, key)
    return index


_KEY_INDEX: Final = _key_index()

# Pairs that must keep this order once all sources are merged: (smaller, relation, larger).
_ORDERINGS: Final = (
    ("low_watermark", "<", "high_watermark"),
    ("dispatcher_min_read_batch_size", "<=", "dispatcher_max_read_batch_size"),
    ("dispatcher_retry_backoff_initial_time_ms", "<=", "dispatcher_retry_backoff_max_time_ms"),
    (
        "dispatcher_read_failure_backoff_initial_time_ms",
        "<=",
        "dispatcher_read_failure_backoff_max_time_ms",
    ),
)
_RELATIONS: Final[dict[str, Callable[[Any, Any], bool]]] = {"<": operator.lt, "<=": operator.le}


def _check_orderings(settings: Settings) -> None:
    for smaller, relation, larger in _ORDERINGS:
        low, high = getattr(settings, smaller), getattr(settings, larger)
        if not _RELATIONS[relation](low, high):
            message = f"{smaller} = {low!r}: must be {relation} {larger} ({high!r})"
            raise SettingsError(message, key=smaller)


@dataclass(frozen=True, slots=True)
class Entry:
    """One value from one source, before it is checked.

    Attributes:
        key: The key as written: snake_case name or Pulsar alias, in any case.
        value: The raw value; strings are parsed per the setting's type.
        origin: Where it came from, for messages, e.g. ``"from BROKERLET_PORT"``.
    """

    key: str
    value: object
    origin: str | None = None


def collect(entries: Iterable[Entry]) -> dict[str, Any]:
    """Resolve and check the entries of one source.

    Returns:
        The checked values by snake_case name.

    Raises:
        SettingsError: An unknown key (with a suggestion when one is close), a setting given
            twice under different keys, or a value that is not allowed.
    """
    values: dict[str, Any] = {}
    first: dict[str, Entry] = {}
    for entry in entries:
        if entry.key.lower() not in _KEY_INDEX:
            raise SettingsError(f"unknown setting {_where(entry)}{_suggest(entry.key)}")
        spec = _KEY_INDEX[entry.key.lower()][0]
        if spec.name in first:
            message = f"{spec.name} given twice: {_where(first[spec.name])} and {_where(entry)}"
            raise SettingsError(message, key=spec.name)
        values[spec.name] = spec.convert(entry.value, entry.origin)
        first[spec.name] = entry
    return values


def entries_from_mapping(values: Mapping[str, object]) -> list[Entry]:
    """Entries for keyword overrides; messages mention the key only when it is an alias."""
    return [Entry(key, value, _alias_note(key)) for key, value in values.items()]


def _alias_note(key: str) -> str | None:
    known = key.lower() in _KEY_INDEX
    return f"given as {key!r}" if known and key not in _NAMES else None


def _where(entry: Entry) -> str:
    return f"{entry.key!r} ({entry.origin})" if entry.origin else repr(entry.key)


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key.lower(), _KEY_INDEX, n=1)
    return f"; did you mean {_KEY_INDEX[close[0]][1]!r}?" if close else ""
