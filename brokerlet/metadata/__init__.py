"""Clusters, tenants, namespaces with policies, and topic metadata (partition counts).

:class:`MetadataStore` keeps them in SQLite beside the data (or in memory);
:mod:`~brokerlet.metadata.topics` holds the rules for which topics exist and may be created,
:mod:`~brokerlet.metadata.policies` the namespace policies, :mod:`~brokerlet.metadata.naming`
the names, :mod:`~brokerlet.metadata.listeners` the advertised listeners.
"""

from brokerlet.metadata.naming import InvalidName, TopicName
from brokerlet.metadata.store import (
    AlreadyExists,
    MetadataError,
    MetadataStore,
    NotEmpty,
    NotFound,
    TopicMeta,
)

__all__ = [
    "AlreadyExists",
    "InvalidName",
    "MetadataError",
    "MetadataStore",
    "NotEmpty",
    "NotFound",
    "TopicMeta",
    "TopicName",
]
