"""HTTP lookup (``lookup/v2/TopicLookup.java``, ``TopicLookupBase``), so a client given an
``http://`` service URL finds the broker: the C++ client's ``HTTPLookupService`` reads
``brokerUrl`` and ``brokerUrlTls`` (or ``brokerUrlSsl``), then asks the topic's
``/partitions`` and the namespace's ``/topics`` admin routes.
"""

from __future__ import annotations

from collections.abc import Callable

from brokerlet.admin.rest import AdminRequest, RestError, Route
from brokerlet.admin.routes._common import store_of, topic_of
from brokerlet.metadata.listeners import UnknownListener, parse_listeners, pick_listener
from brokerlet.metadata.policies import auto_creation
from brokerlet.metadata.topics import exists

__all__ = ["routes"]


def lookup(request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str) -> object:
    name = topic_of(request, domain, tenant, namespace, topic)
    store = store_of(request)
    settings = request.context.settings
    allowed = auto_creation(store.namespaces.get(name.namespace), settings).allow
    # Non-persistent non-partitioned topics count as existing, as in TopicLookupBase.
    if not (allowed or exists(store, name) or not name.persistent):
        raise RestError(404, "Topic not found.")
    requested = request.args.get("listenerName") or request.headers.get("X-Pulsar-ListenerName")
    try:
        listener = pick_listener(
            parse_listeners(settings.advertised_listeners),
            requested or None,
            settings.internal_listener_name,
        )
    except UnknownListener as error:
        raise RestError(500, str(error)) from None
    context = request.context
    broker_url = context.service_url() if context.service_url else ""
    service_url_tls = getattr(context, "service_url_tls", None)  # set with a TLS listener
    broker_url_tls = (service_url_tls() or "") if service_url_tls else ""
    if listener is not None:
        broker_url = listener.service_url or ""
        broker_url_tls = listener.service_url_tls or ""
    http_url = context.web_service_url() if context.web_service_url else ""
    return {
        "brokerUrl": broker_url,
        "brokerUrlTls": broker_url_tls,
        "httpUrl": http_url,
        "httpUrlTls": _call(getattr(context, "web_service_url_tls", None)),
        "nativeUrl": broker_url,
        "brokerUrlSsl": broker_url_tls,
    }


def routes() -> list[Route]:
    return [
        Route(
            "/lookup/v2/topic/<domain:domain>/<seg:tenant>/<seg:namespace>/<seg:topic>",
            ("GET",),
            lookup,
            auth="lookup",
        ),
    ]


def _call(url: Callable[[], str | None] | None) -> str:
    return (url() or "") if url is not None else ""
