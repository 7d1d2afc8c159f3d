"""Compaction over REST: PUT/GET ``.../{topic}/compaction`` and the namespace's
``compactionThreshold`` (PersistentTopicsBase#internalTriggerCompaction,
internalCompactionStatus; Namespaces#setCompactionThreshold)."""

from __future__ import annotations

from brokerlet.actors.errors import BrokerError
from brokerlet.actors.messages import Compact, CompactionStatus, GetTopic
from brokerlet.admin.rest import AdminRequest, RestError, Route
from brokerlet.admin.routes.namespaces import _policy_routes

__all__ = ["routes"]

TOPIC = "/admin/v2/<domain:domain>/<seg:tenant>/<seg:namespace>/<seg:topic>"


def _topic(request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str) -> object:
    name = f"{domain}://{tenant}/{namespace}/{topic}"
    if domain != "persistent":
        raise RestError(405, "Compaction is not supported on non-persistent topics")
    if name not in request.context.metadata.topics:
        raise RestError(404, "Topic not found")
    try:
        return request.context.broker.ask(GetTopic(name))
    except BrokerError as error:
        raise RestError(404, error.message) from None


def trigger(request: AdminRequest, **path: str) -> None:
    topic = _topic(request, **path)
    try:
        topic.ask(Compact())  # type: ignore[attr-defined]
    except BrokerError as error:
        raise RestError(409, error.message) from None


def status(request: AdminRequest, **path: str) -> object:
    return _topic(request, **path).ask(CompactionStatus())  # type: ignore[attr-defined]


def _threshold(_request: AdminRequest, body: object) -> int:
    if isinstance(body, bool) or not isinstance(body, int):
        raise RestError(400, f"compactionThreshold: must be an integer, got {body!r}")
    if not 0 <= body <= 2**63 - 1:
        raise RestError(412, "compactionThreshold must be 0 or more")
    return body


def routes() -> list[Route]:
    return [
        Route(f"{TOPIC}/compaction", ("PUT",), trigger, auth="tenant"),
        Route(f"{TOPIC}/compaction", ("GET",), status, auth="tenant"),
        # Pulsar's namespace variant is PUT (the topic-level one is POST).
        *_policy_routes(
            "compactionThreshold", "compaction_threshold", _threshold, set_method="PUT"
        ),
    ]
