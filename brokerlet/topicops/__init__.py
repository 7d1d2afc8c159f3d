"""Topic-level operations, as Pulsar's admin API does them.

Terminate, unload, delete, skip, reset cursor, expire, peek, examine, internal stats and
subscription management run inside the topic and dispatcher actors, through their group of
messages in :mod:`brokerlet.actors.messages`; :mod:`brokerlet.topicops.api` drives them from
the broker (the Python methods of :class:`brokerlet.Broker` and the admin REST routes both call it).
Non-persistent topics' delivery rule is :mod:`brokerlet.topicops.nonpersistent`.
"""

from brokerlet.topicops.errors import TopicOpError

__all__ = ["TopicOpError"]
