"""A typed Python client for Pulsar's admin REST API (v2), for brokerlet and Apache Pulsar.

Paths, bodies and answers are Pulsar's (``/admin/v2/...``), so the same code manages a
brokerlet and a Pulsar cluster::

    from brokerlet.admin import AdminClient, Conflict

    admin = AdminClient("http://127.0.0.1:8080")
    admin.create_tenant("acme")
    admin.create_namespace("acme/orders")
    admin.create_partitioned_topic("persistent://acme/orders/placed", 4)
    print(admin.topic_stats("persistent://acme/orders/placed-partition-0")["msgInCounter"])

Every answer of 400 or more raises an :class:`AdminError` subclass carrying the status and
Pulsar's ``reason``; a broker that does not answer raises :class:`AdminUnavailable`.

HTTP goes through urllib3 alone: it is already pinned (Locust and requests depend on it),
gives a thread-safe connection pool with keep-alive reuse and separate connect and read
timeouts, and needs none of what requests adds (sessions, cookies, charset detection).
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

__all__ = [
    "AdminClient",
    "AdminError",
    "AdminUnavailable",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotFound",
    "PeekedMessage",
    "PreconditionFailed",
    "ServerError",
    "TopicName",
    "Unauthorized",
    "parse_relative_time",
]

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"


# -- errors ------------------------------------------------------------------------------


class AdminError(Exception):
    """The admin API answered with an error.

    Attributes:
        status: the HTTP status (None when no answer came).
        reason: Pulsar's ``reason`` from the error body, or the body's text.
        method: the request's method.
        path: the request's path.
    """

    def __init__(self, status: int | None, reason: str, method: str = "", path: str = "") -> None:
        self.status = status
        self.reason = reason
        self.method = method
        self.path = path
        where = f" ({method} {path})" if method else ""
        super().__init__(f"{status} {reason}{where}" if status is not None else reason + where)


class BadRequest(AdminError):  # noqa: N818 -- named after the HTTP status
    """400."""


class Unauthorized(AdminError):  # noqa: N818 -- named after the HTTP status
    """401: not authenticated."""


class Forbidden(AdminError):  # noqa: N818 -- named after the HTTP status
    """403: not authorized."""


class NotFound(AdminError):  # noqa: N818 -- named after the HTTP status
    """404: no such tenant, namespace, topic or subscription (or route)."""


class MethodNotAllowed(AdminError):  # noqa: N818 -- named after the HTTP status
    """405: the operation does not apply (a non-persistent topic, a forced delete refused)."""


class NotAcceptable(AdminError):  # noqa: N818 -- named after the HTTP status
    """406: a value out of range (a partition count, say)."""


class Conflict(AdminError):  # noqa: N818 -- named after the HTTP status
    """409: it exists already, or is in use."""


class PreconditionFailed(AdminError):  # noqa: N818 -- named after the HTTP status
    """412: a bad name, a policy conflict, or active producers or consumers."""


class ServerError(AdminError):
    """5xx."""


class AdminUnavailable(AdminError):  # noqa: N818 -- named after the HTTP status
    """No answer: the broker is not running, not reachable, or too slow."""


_BY_STATUS: dict[int, type[AdminError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    406: NotAcceptable,
    409: Conflict,
    412: PreconditionFailed,
}


def _error_for(status: int, body: bytes, method: str, path: str) -> AdminError:
    reason = body.decode("utf-8", "replace").strip()
    try:
        document = json.loads(reason)
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("reason"), str):
        reason = document["reason"]
    if not reason:
        reason = _phrase(status)
    kind = _BY_STATUS.get(status, ServerError if status >= 500 else AdminError)
    return kind(status, reason, method, path)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


# -- names and values --------------------------------------------------------------------


@dataclass(frozen=True)
class TopicName:
    """A topic's full name, parsed as Pulsar does (``x`` means ``persistent://public/default/x``)."""

    domain: str
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse ``[persistent|non-persistent]://tenant/namespace/topic`` or a short form."""
        domain = "persistent"
        rest = name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain not in ("persistent", "non-persistent"):
                raise ValueError(f"invalid topic domain {domain!r} in {name!r}")
        parts = rest.split("/", 2)
        if len(parts) == 1:
            parts = ["public", "default", parts[0]]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"invalid topic name {name!r}: expected tenant/namespace/topic")
        return cls(domain, parts[0], parts[1], parts[2])

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def path(self) -> str:
        """The admin path of the topic, below ``/admin/v2``."""
        return f"/{self.domain}/{_seg(self.tenant)}/{_seg(self.namespace)}/{_seg(self.local)}"


def _seg(value: str) -> str:
    return quote(value, safe="")


def _namespace_path(namespace: str) -> str:
    parts = namespace.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"invalid namespace {namespace!r}: expected tenant/namespace")
    return f"{_seg(parts[0])}/{_seg(parts[1])}"


_RELATIVE = re.compile(r"^(\d+)([smhdwy])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_relative_time(text: str) -> float:
    """Seconds in a pulsar-admin relative time (``30s``, ``10m``, ``2h``, ``1d``, ``1w``, ``1y``).

    Raises:
        ValueError: not one of those forms.
    """
    match = _RELATIVE.match(text.strip())
    if match is None:
        raise ValueError(
            f"invalid relative time {text!r}: expected a number and one of s m h d w y"
        )
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _message_id_body(message_id: str | Mapping[str, int]) -> dict[str, Any]:
    """A MessageIdImpl body from ``ledger:entry[:partition]`` or a mapping."""
    if isinstance(message_id, Mapping):
        return dict(message_id)
    parts = message_id.split(":")
    if len(parts) not in (2, 3) or not all(p.lstrip("-").isdigit() for p in parts):
        raise ValueError(f"invalid message id {message_id!r}: expected ledgerId:entryId")
    body = {"ledgerId": int(parts[0]), "entryId": int(parts[1]), "partitionIndex": -1}
    if len(parts) == 3:
        body["partitionIndex"] = int(parts[2])
    return body


@dataclass
class PeekedMessage:
    """One message as the admin API returns it (peek, examine).

    Attributes:
        message_id: ``ledger:entry`` from ``X-Pulsar-Message-ID``.
        payload: the entry's payload (the whole batch for a batch entry).
        properties: the message's properties (either header form).
        headers: every ``X-Pulsar-*`` header, as sent.
    """

    message_id: str
    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def batch_size(self) -> int | None:
        """Messages in the batch, or None when the entry is a single message."""
        value = self.headers.get("X-Pulsar-num-batch-message")
        return int(value) if value is not None else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (payload in base64)."""
        return {
            "messageId": self.message_id,
            "properties": self.properties,
            "headers": self.headers,
            "payload": base64.b64encode(self.payload).decode(),
        }


def _peeked(message_id_fallback: str, headers: Mapping[str, str], body: bytes) -> PeekedMessage:
    pulsar_headers = {k: v for k, v in headers.items() if k.lower().startswith("x-pulsar-")}
    properties: dict[str, str] = {}
    for key, value in pulsar_headers.items():
        if key.lower() == "x-pulsar-property":
            # One header with a JSON object (apache/pulsar PR #20627).
            try:
                decoded = json.loads(value)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict):
                properties.update({str(k): str(v) for k, v in decoded.items()})
        elif key.lower().startswith("x-pulsar-property-"):
            properties[key[len("X-Pulsar-PROPERTY-") :]] = value
    normalised = {_canonical_header(k): v for k, v in pulsar_headers.items()}
    message_id = normalised.get("X-Pulsar-Message-ID", message_id_fallback)
    return PeekedMessage(message_id, body, properties, normalised)


_CANONICAL = {
    name.lower(): name
    for name in (
        "X-Pulsar-Message-ID",
        "X-Pulsar-publish-time",
        "X-Pulsar-event-time",
        "X-Pulsar-producer-name",
        "X-Pulsar-sequence-id",
        "X-Pulsar-partition-key",
        "X-Pulsar-null-value",
        "X-Pulsar-num-batch-message",
        "X-Pulsar-compression",
        "X-Pulsar-uncompressed-size",
        "X-Pulsar-PROPERTY",
    )
}


def _canonical_header(name: str) -> str:
    return _CANONICAL.get(name.lower(), name)


# -- the client --------------------------------------------------------------------------


class AdminClient:
    """Pulsar's admin REST API over one pooled HTTP connection set.

    Args:
        url: the admin base URL (``http://host:8080``); a trailing ``/admin/v2`` is accepted.
        auth: a token (sent as ``Authorization: Bearer ...``) or a mapping of extra headers.
        timeout: seconds for connecting and for each read.
        max_connections: connections kept open for reuse per host.

    Thread-safe (urllib3's pool is). Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        url: str = DEFAULT_ADMIN_URL,
        *,
        auth: str | Mapping[str, str] | None = None,
        timeout: float = 30.0,
        max_connections: int = 4,
    ) -> None:
        base = url.rstrip("/")
        base = base.removesuffix("/admin/v2")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"invalid admin URL {url!r}: expected http://host:port")
        self.url = base
        self.timeout = timeout
        self._headers: dict[str, str] = {"Accept": "application/json"}
        if isinstance(auth, str):
            self._headers["Authorization"] = f"Bearer {auth}"
        elif auth is not None:
            self._headers.update(auth)
        self._pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=max_connections,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
            retries=False,
        )

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.clear()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, object] | None = None,
        content_type: str = "application/json",
    ) -> urllib3.BaseHTTPResponse:
        """Send one request to ``/admin/v2`` + ``path`` (or to ``path`` if it starts with
        ``/metrics`` or ``/admin``); raise on a status of 400 or more."""
        full = path if path.startswith(("/admin/", "/metrics", "/lookup/")) else "/admin/v2" + path
        if query:
            pairs = {k: _query_value(v) for k, v in query.items() if v is not None}
            if pairs:
                full += "?" + urlencode(pairs)
        headers = dict(self._headers)
        data: bytes | None = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            response = self._pool.request(
                method, self.url + full, body=data, headers=headers, redirect=True
            )
        except urllib3.exceptions.HTTPError as error:
            raise AdminUnavailable(
                None, f"no answer from the admin API at {self.url}: {_cause(error)}", method, full
            ) from error
        if response.status >= 400:
            raise _error_for(response.status, response.data, method, full)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        if not response.data:
            return None
        return json.loads(response.data)

    def _get(self, path: str, **query: object) -> Any:
        return self._json("GET", path, query=query)

    def _topic(self, topic: str) -> TopicName:
        return TopicName.parse(topic)

    # -- clusters and brokers ------------------------------------------------------------

    def clusters(self) -> list[str]:
        """``GET /clusters``: the cluster names."""
        names: list[str] = self._get("/clusters")
        return names

    def healthcheck(self) -> str:
        """``GET /brokers/health``: ``ok`` when the broker is healthy."""
        return self.request("GET", "/brokers/health").data.decode()

    def broker_topic_stats(self) -> dict[str, Any]:
        """``GET /broker-stats/topics``: every topic's stats in Pulsar's nesting, namespace ->
        bundle (``0x00000000_0xffffffff``) -> domain -> topic name -> TopicStats."""
        stats: dict[str, Any] = self._get("/broker-stats/topics")
        return stats

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self.request("GET", "/metrics").data.decode()

    # -- tenants -------------------------------------------------------------------------

    def tenants(self) -> list[str]:
        """``GET /tenants``."""
        names: list[str] = self._get("/tenants")
        return names

    def tenant(self, tenant: str) -> dict[str, Any]:
        """``GET /tenants/{t}``: TenantInfo (``adminRoles``, ``allowedClusters``)."""
        info: dict[str, Any] = self._get(f"/tenants/{_seg(tenant)}")
        return info

    def create_tenant(
        self,
        tenant: str,
        *,
        admin_roles: Sequence[str] = (),
        allowed_clusters: Sequence[str] | None = None,
    ) -> None:
        """``PUT /tenants/{t}``; ``allowed_clusters`` defaults to every cluster, as
        pulsar-admin does."""
        clusters = list(allowed_clusters) if allowed_clusters is not None else self.clusters()
        self._json(
            "PUT",
            f"/tenants/{_seg(tenant)}",
            body={"adminRoles": list(admin_roles), "allowedClusters": clusters},
        )

    def update_tenant(
        self,
        tenant: str,
        *,
        admin_roles: Sequence[str] | None = None,
        allowed_clusters: Sequence[str] | None = None,
    ) -> None:
        """``POST /tenants/{t}``; what is not given keeps its current value."""
        current = self.tenant(tenant)
        body = {
            "adminRoles": list(admin_roles)
            if admin_roles is not None
            else current.get("adminRoles", []),
            "allowedClusters": list(allowed_clusters)
            if allowed_clusters is not None
            else current.get("allowedClusters", []),
        }
        self._json("POST", f"/tenants/{_seg(tenant)}", body=body)

    def delete_tenant(self, tenant: str, *, force: bool = False) -> None:
        """``DELETE /tenants/{t}``."""
        self._json("DELETE", f"/tenants/{_seg(tenant)}", query={"force": force})

    # -- namespaces ----------------------------------------------------------------------

    def namespaces(self, tenant: str) -> list[str]:
        """``GET /namespaces/{t}``: ``["t/ns", ...]``."""
        names: list[str] = self._get(f"/namespaces/{_seg(tenant)}")
        return names

    def create_namespace(
        self,
        namespace: str,
        *,
        bundles: int | None = None,
        clusters: Sequence[str] | None = None,
        policies: Mapping[str, Any] | None = None,
    ) -> None:
        """``PUT /namespaces/{t}/{ns}``, with optional Policies."""
        body: dict[str, Any] | None = dict(policies) if policies else None
        if bundles is not None:
            body = body or {}
            body["bundles"] = {"numBundles": bundles}
        if clusters is not None:
            body = body or {}
            body["replication_clusters"] = list(clusters)
        self._json("PUT", f"/namespaces/{_namespace_path(namespace)}", body=body)

    def delete_namespace(self, namespace: str, *, force: bool = False) -> None:
        """``DELETE /namespaces/{t}/{ns}``."""
        self._json("DELETE", f"/namespaces/{_namespace_path(namespace)}", query={"force": force})

    def policies(self, namespace: str) -> dict[str, Any]:
        """``GET /namespaces/{t}/{ns}``: the namespace's Policies."""
        policies: dict[str, Any] = self._get(f"/namespaces/{_namespace_path(namespace)}")
        return policies

    def namespace_topics(self, namespace: str, *, mode: str = "PERSISTENT") -> list[str]:
        """``GET /namespaces/{t}/{ns}/topics?mode=``: full names (partitions listed)."""
        names: list[str] = self._get(f"/namespaces/{_namespace_path(namespace)}/topics", mode=mode)
        return names

    def get_policy(self, namespace: str, policy: str) -> Any:
        """``GET /namespaces/{t}/{ns}/{policy}`` (``retention``, ``messageTTL``, ...)."""
        return self._get(f"/namespaces/{_namespace_path(namespace)}/{policy}")

    def set_policy(
        self, namespace: str, policy: str, value: object, *, method: str = "POST"
    ) -> None:
        """``POST /namespaces/{t}/{ns}/{policy}`` with ``value`` as the JSON body."""
        self._json(method, f"/namespaces/{_namespace_path(namespace)}/{policy}", body=value)

    def remove_policy(self, namespace: str, policy: str) -> None:
        """``DELETE /namespaces/{t}/{ns}/{policy}``."""
        self._json("DELETE", f"/namespaces/{_namespace_path(namespace)}/{policy}")

    def retention(self, namespace: str) -> dict[str, Any] | None:
        """``GET .../retention``: ``{"retentionTimeInMinutes", "retentionSizeInMB"}``."""
        value: dict[str, Any] | None = self.get_policy(namespace, "retention")
        return value

    def set_retention(self, namespace: str, *, time_minutes: int, size_mb: int) -> None:
        """``POST .../retention`` (-1 unlimited, 0 none)."""
        self.set_policy(
            namespace,
            "retention",
            {"retentionTimeInMinutes": time_minutes, "retentionSizeInMB": size_mb},
        )

    def message_ttl(self, namespace: str) -> int | None:
        """``GET .../messageTTL`` in seconds (None when unset)."""
        value: int | None = self.get_policy(namespace, "messageTTL")
        return value

    def set_message_ttl(self, namespace: str, seconds: int) -> None:
        """``POST .../messageTTL``."""
        self.set_policy(namespace, "messageTTL", seconds)

    def deduplication(self, namespace: str) -> bool | None:
        """``GET .../deduplication``."""
        value: bool | None = self.get_policy(namespace, "deduplication")
        return value

    def set_deduplication(self, namespace: str, enabled: bool) -> None:
        """``POST .../deduplication``."""
        self.set_policy(namespace, "deduplication", enabled)

    def set_auto_topic_creation(
        self,
        namespace: str,
        *,
        allow: bool,
        topic_type: str = "non-partitioned",
        partitions: int | None = None,
    ) -> None:
        """``POST .../autoTopicCreation``."""
        body: dict[str, Any] = {"allowAutoTopicCreation": allow, "topicType": topic_type}
        if partitions is not None:
            body["defaultNumPartitions"] = partitions
        self.set_policy(namespace, "autoTopicCreation", body)

    def set_backlog_quota(
        self,
        namespace: str,
        *,
        limit_size: int = -1,
        limit_time: int = -1,
        policy: str = "producer_request_hold",
        quota_type: str = "destination_storage",
    ) -> None:
        """``POST .../backlogQuota?backlogQuotaType=``."""
        self._json(
            "POST",
            f"/namespaces/{_namespace_path(namespace)}/backlogQuota",
            body={"limitSize": limit_size, "limitTime": limit_time, "policy": policy},
            query={"backlogQuotaType": quota_type},
        )

    def backlog_quotas(self, namespace: str) -> dict[str, Any]:
        """``GET .../backlogQuotaMap``."""
        value: dict[str, Any] = self.get_policy(namespace, "backlogQuotaMap")
        return value

    # -- topics --------------------------------------------------------------------------

    def topics(self, namespace: str) -> list[str]:
        """Every topic of a namespace, persistent then non-persistent, as pulsar-admin's
        ``topics list`` gets them (``GET /{domain}/{t}/{ns}``)."""
        path = _namespace_path(namespace)
        names: list[str] = []
        for domain in ("persistent", "non-persistent"):
            names.extend(self._get(f"/{domain}/{path}"))
        return names

    def partitioned_topics(self, namespace: str) -> list[str]:
        """``GET /persistent/{t}/{ns}/partitioned``."""
        names: list[str] = self._get(f"/persistent/{_namespace_path(namespace)}/partitioned")
        return names

    def create_topic(self, topic: str, *, properties: Mapping[str, str] | None = None) -> None:
        """``PUT /{topic}``: a non-partitioned topic."""
        self._json("PUT", self._topic(topic).path, body=dict(properties) if properties else None)

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """``PUT /{topic}/partitions`` with the count as the body."""
        self._json("PUT", self._topic(topic).path + "/partitions", body=partitions)

    def update_partitioned_topic(self, topic: str, partitions: int) -> None:
        """``POST /{topic}/partitions``: grow the partition count."""
        self._json("POST", self._topic(topic).path + "/partitions", body=partitions)

    def partitioned_topic_metadata(self, topic: str) -> dict[str, Any]:
        """``GET /{topic}/partitions``: ``{"partitions": n}`` (0 for non-partitioned)."""
        value: dict[str, Any] = self._get(self._topic(topic).path + "/partitions")
        return value

    def delete_topic(self, topic: str, *, force: bool = False) -> None:
        """``DELETE /{topic}``."""
        self._json("DELETE", self._topic(topic).path, query={"force": force})

    def delete_partitioned_topic(self, topic: str, *, force: bool = False) -> None:
        """``DELETE /{topic}/partitions``."""
        self._json("DELETE", self._topic(topic).path + "/partitions", query={"force": force})

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """``GET /{topic}/stats``: TopicStats."""
        stats: dict[str, Any] = self._get(self._topic(topic).path + "/stats")
        return stats

    def partitioned_stats(self, topic: str, *, per_partition: bool = False) -> dict[str, Any]:
        """``GET /{topic}/partitioned-stats``."""
        stats: dict[str, Any] = self._get(
            self._topic(topic).path + "/partitioned-stats", perPartition=per_partition
        )
        return stats

    def internal_stats(self, topic: str) -> dict[str, Any]:
        """``GET /{topic}/internalStats``."""
        stats: dict[str, Any] = self._get(self._topic(topic).path + "/internalStats")
        return stats

    def last_message_id(self, topic: str) -> dict[str, Any]:
        """``GET /{topic}/lastMessageId``."""
        value: dict[str, Any] = self._get(self._topic(topic).path + "/lastMessageId")
        return value

    def terminate(self, topic: str) -> dict[str, Any]:
        """``POST /{topic}/terminate``: the last message id."""
        value: dict[str, Any] = self._json("POST", self._topic(topic).path + "/terminate")
        return value

    def unload(self, topic: str) -> None:
        """``PUT /{topic}/unload``."""
        self._json("PUT", self._topic(topic).path + "/unload")

    # -- subscriptions -------------------------------------------------------------------

    def subscriptions(self, topic: str) -> list[str]:
        """``GET /{topic}/subscriptions``."""
        names: list[str] = self._get(self._topic(topic).path + "/subscriptions")
        return names

    def _subscription(self, topic: str, subscription: str) -> str:
        return f"{self._topic(topic).path}/subscription/{_seg(subscription)}"

    def create_subscription(
        self, topic: str, subscription: str, *, message_id: str | Mapping[str, int] = "latest"
    ) -> None:
        """``PUT /{topic}/subscription/{sub}`` at ``latest``, ``earliest`` or ``ledger:entry``."""
        if message_id == "latest":
            body: dict[str, Any] = {"ledgerId": 2**63 - 1, "entryId": 2**63 - 1}
        elif message_id == "earliest":
            body = {"ledgerId": -1, "entryId": -1}
        else:
            body = _message_id_body(message_id)
        self._json("PUT", self._subscription(topic, subscription), body=body)

    def delete_subscription(self, topic: str, subscription: str, *, force: bool = False) -> None:
        """``DELETE /{topic}/subscription/{sub}`` (pulsar-admin's ``unsubscribe``)."""
        self._json("DELETE", self._subscription(topic, subscription), query={"force": force})

    def reset_cursor(self, topic: str, subscription: str, timestamp_ms: int) -> None:
        """``POST .../resetcursor/{timestamp}``: to the first message published at or after."""
        self._json("POST", f"{self._subscription(topic, subscription)}/resetcursor/{timestamp_ms}")

    def reset_cursor_to(self, topic: str, subscription: str, message_id: str) -> None:
        """``POST .../resetcursor`` to ``ledger:entry``."""
        self._json(
            "POST",
            f"{self._subscription(topic, subscription)}/resetcursor",
            body=_message_id_body(message_id),
        )

    def reset_cursor_by_age(self, topic: str, subscription: str, age_seconds: float) -> None:
        """Reset to ``age_seconds`` ago (pulsar-admin's ``reset-cursor -t 10m``)."""
        self.reset_cursor(topic, subscription, int((time.time() - age_seconds) * 1000))

    def skip(self, topic: str, subscription: str, count: int) -> None:
        """``POST .../skip/{n}``."""
        self._json("POST", f"{self._subscription(topic, subscription)}/skip/{count}")

    def clear_backlog(self, topic: str, subscription: str) -> None:
        """``POST .../skip_all``."""
        self._json("POST", f"{self._subscription(topic, subscription)}/skip_all")

    def expire_messages(self, topic: str, subscription: str, seconds: int) -> None:
        """``POST .../expireMessages/{s}``."""
        self._json("POST", f"{self._subscription(topic, subscription)}/expireMessages/{seconds}")

    def peek_messages(self, topic: str, subscription: str, count: int = 1) -> list[PeekedMessage]:
        """The next ``count`` messages of a subscription, without consuming them
        (``GET .../position/{n}`` for n = 1..count, as pulsar-admin does). Stops early at the
        end of the backlog."""
        messages: list[PeekedMessage] = []
        for position in range(1, count + 1):
            try:
                response = self.request(
                    "GET", f"{self._subscription(topic, subscription)}/position/{position}"
                )
            except NotFound:
                if messages:
                    break
                raise
            messages.append(_peeked("", dict(response.headers), response.data))
        return messages

    def examine_message(
        self, topic: str, *, initial_position: str = "latest", position: int = 1
    ) -> PeekedMessage:
        """``GET /{topic}/examinemessage``."""
        response = self.request(
            "GET",
            self._topic(topic).path + "/examinemessage",
            query={"initialPosition": initial_position, "messagePosition": position},
        )
        return _peeked("", dict(response.headers), response.data)

    # -- schemas -------------------------------------------------------------------------

    def _schema_path(self, topic: str) -> str:
        name = self._topic(topic)
        return f"/schemas/{_seg(name.tenant)}/{_seg(name.namespace)}/{_seg(name.local)}"

    def schema(self, topic: str, version: int | None = None) -> dict[str, Any]:
        """The latest (or ``version``'s) GetSchemaResponse: ``{"version", "type",
        "timestamp", "data", "properties"}``. A partition reaches its parent's schema."""
        path = self._schema_path(topic) + "/schema"
        if version is not None:
            path += f"/{version}"
        answer: dict[str, Any] = self._get(path)
        return answer

    def schemas(self, topic: str) -> list[dict[str, Any]]:
        """Every version's GetSchemaResponse, oldest first."""
        answer = self._get(self._schema_path(topic) + "/schemas")
        responses: list[dict[str, Any]] = answer.get("getSchemaResponses", [])
        return responses

    def upload_schema(
        self,
        topic: str,
        schema_type: str,
        schema: str = "",
        properties: Mapping[str, str] | None = None,
    ) -> int:
        """Register a schema (Pulsar's PostSchemaPayload); returns its version. Raises
        :class:`Conflict` when incompatible, an :class:`AdminError` of 422 when invalid."""
        payload = {"type": schema_type, "schema": schema, "properties": dict(properties or {})}
        answer = self._json("POST", self._schema_path(topic) + "/schema", body=payload)
        version = answer.get("version") if isinstance(answer, dict) else None
        if isinstance(version, dict):  # a LongSchemaVersion: {"version": n}
            version = version.get("version")
        return int(version) if version is not None else -1

    def delete_schema(self, topic: str, *, force: bool = False) -> None:
        """Delete the topic's schema: a deletion marker, or with ``force`` every version."""
        self.request("DELETE", self._schema_path(topic) + "/schema", query={"force": force})


def _query_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cause(error: BaseException) -> str:
    """The innermost reason of a urllib3 error, without urllib3's connection repr."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, BaseException):
        return _cause(reason)
    text = str(error)
    if text.startswith(("HTTPConnection(", "HTTPSConnection(")) and "): " in text:
        text = text.split("): ", 1)[1]
    return text
