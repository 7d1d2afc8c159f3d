"""What the metadata route modules share: the store, broker asks, and error mapping.

Metadata exceptions become Pulsar's statuses: missing 404, exists or not empty 409, busy
412, a bad name 412 (``PulsarWebResource`` answers invalid names with PRECONDITION_FAILED).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from brokerlet.actors.broker import TopicBusy
from brokerlet.actors.errors import BrokerError
from brokerlet.admin.rest import AdminRequest, RestError
from brokerlet.metadata import MetadataStore, TopicName
from brokerlet.metadata.naming import InvalidName, check_entity_name
from brokerlet.metadata.policies import PolicyError
from brokerlet.metadata.store import AlreadyExists, NotEmpty, NotFound

__all__ = [
    "ask_broker",
    "metadata_errors",
    "namespace_of",
    "store_of",
    "tenant_of",
    "topic_of",
]


@contextlib.contextmanager
def metadata_errors() -> Iterator[None]:
    """Answer the metadata layer's refusals with Pulsar's status codes."""
    try:
        yield
    except NotFound as error:
        raise RestError(404, str(error)) from None
    except (AlreadyExists, NotEmpty) as error:
        raise RestError(409, str(error)) from None
    except TopicBusy as error:
        raise RestError(412, str(error)) from None
    except PolicyError as error:
        raise RestError(error.status, error.reason) from None
    except InvalidName as error:
        raise RestError(412, str(error)) from None
    except BrokerError as error:
        raise RestError(412, error.message) from None


def store_of(request: AdminRequest) -> MetadataStore:
    store = request.context.metadata
    if store is None:
        raise RestError(503, "Metadata store not available")
    assert isinstance(store, MetadataStore)
    return store


def ask_broker(request: AdminRequest, message: object) -> Any:
    """Ask the broker actor (topic creation and deletion are serialised there)."""
    broker = request.context.broker
    if broker is None:
        raise RestError(503, "Broker not available")
    with metadata_errors():
        return broker.ask(message)


def tenant_of(request: AdminRequest, tenant: str) -> dict[str, Any]:
    """The tenant's info; 412 for a bad name, 404 when missing."""
    with metadata_errors():
        check_entity_name("tenant", tenant)
    info = store_of(request).tenants.get(tenant)
    if info is None:
        raise RestError(404, "Tenant does not exist")
    return info


def namespace_of(request: AdminRequest, tenant: str, namespace: str) -> str:
    """``tenant/namespace`` after checking both exist (404) and are well named (412)."""
    tenant_of(request, tenant)
    with metadata_errors():
        check_entity_name("namespace", namespace)
    name = f"{tenant}/{namespace}"
    if name not in store_of(request).namespaces:
        raise RestError(404, "Namespace does not exist")
    return name


def topic_of(
    request: AdminRequest, domain: str, tenant: str, namespace: str, topic: str
) -> TopicName:
    """The topic's checked name, in a namespace that exists."""
    with metadata_errors():
        name = TopicName.of(domain, tenant, namespace, topic)
    namespace_of(request, tenant, namespace)
    return name
