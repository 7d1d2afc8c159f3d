"""Topic operations over the admin API, on Pulsar's paths (admin/v2/PersistentTopics.java,
NonPersistentTopics.java; PersistentTopicsBase for the semantics and reasons).

Every route is relative to ``/admin/v2/{domain}/{tenant}/{namespace}/{topic}``, except
``/admin/v2/broker-stats/topics``. Handlers call :mod:`brokerlet.topicops.api` and turn its
errors into :class:`RestError` with the same status and reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brokerlet.admin.rest import AdminRequest, Reply, RestError, Route
from brokerlet.topicops import api
from brokerlet.topicops.entries import StoredMessage
from brokerlet.topicops.errors import TopicOpError

__all__ = ["broker_stats_topics", "routes", "stats"]

TOPIC = "/admin/v2/<domain:domain>/<seg:tenant>/<seg:namespace>/<seg:topic>"
SUBSCRIPTION = TOPIC + "/subscription/<seg:subscription>"


def _name(domain: str, tenant: str, namespace: str, topic: str) -> str:
    return f"{domain}://{tenant}/{namespace}/{topic}"


def _guarded(handler: Callable[..., object]) -> Callable[..., object]:
    """Topic-operation errors become REST errors with Pulsar's status and reason."""

    def run(request: AdminRequest, **args: Any) -> object:
        try:
            return handler(request, **args)
        except TopicOpError as error:
            raise RestError(error.status, error.reason) from None

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


# Validation: every 400 names the field.


def _int(value: str, field: str, *, minimum: int | None = None) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise RestError(400, f"{field} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise RestError(400, f"{field} must be >= {minimum}, got {number}")
    return number


def _bool(request: AdminRequest, field: str) -> bool:
    value = str(request.args.get(field, "false")).lower()
    if value not in ("true", "false"):
        raise RestError(400, f"{field} must be true or false, got {value!r}")
    return value == "true"


def _message_id(request: AdminRequest) -> tuple[tuple[int, int], bool] | None:
    """A ResetCursorData / MessageIdImpl body: ``{"ledgerId", "entryId", ...}``; None if empty."""
    body = request.json(None)
    if body is None:
        return None
    if not isinstance(body, dict):
        raise RestError(400, "body must be a JSON object with ledgerId and entryId")
    ids = []
    for field in ("ledgerId", "entryId"):
        value = body.get(field)
        if not isinstance(value, int) or isinstance(value, bool):
            raise RestError(400, f"{field} must be an integer, got {value!r}")
        ids.append(value)
    excluded = body.get("isExcluded", body.get("excluded", False))
    if not isinstance(excluded, bool):
        raise RestError(400, f"isExcluded must be true or false, got {excluded!r}")
    return (ids[0], ids[1]), excluded


def _raw(message: StoredMessage) -> Reply:
    return Reply(200, message.payload, message.headers, "application/octet-stream")


# Partition count: the one call into the metadata store (issue 12a).


def _partitions(request: AdminRequest, name: str) -> int:
    return api.partition_count(request.context, name)


# Handlers.


@_guarded
def stats(request: AdminRequest, **path: str) -> object:
    return api.topic_stats(request.context.broker, _name(**path))


@_guarded
def partitioned_stats(request: AdminRequest, **path: str) -> object:
    name = _name(**path)
    per_partition = request.args.get("perPartition", "true").lower() != "false"
    return api.partitioned_stats(
        request.context.broker, name, _partitions(request, name), per_partition=per_partition
    )


@_guarded
def internal_stats(request: AdminRequest, **path: str) -> object:
    return api.internal_stats(request.context.broker, _name(**path))


@_guarded
def last_message_id(request: AdminRequest, **path: str) -> object:
    return api.last_message_id(request.context.broker, _name(**path))


@_guarded
def subscriptions(request: AdminRequest, **path: str) -> object:
    return api.list_subscriptions(request.context.broker, _name(**path))


@_guarded
def create_subscription(request: AdminRequest, subscription: str, **path: str) -> object:
    given = _message_id(request)
    position: str | tuple[int, int] = "latest" if given is None else given[0]
    api.create_subscription(request.context.broker, _name(**path), subscription, position)
    return None


@_guarded
def delete_subscription(request: AdminRequest, subscription: str, **path: str) -> object:
    force = _bool(request, "force")
    api.delete_subscription(request.context.broker, _name(**path), subscription, force=force)
    return None


@_guarded
def reset_cursor_to_time(
    request: AdminRequest, subscription: str, timestamp: str, **path: str
) -> object:
    time_ms = _int(timestamp, "timestamp", minimum=0)
    api.reset_cursor(request.context.broker, _name(**path), subscription, timestamp_ms=time_ms)
    return None


@_guarded
def reset_cursor_to_id(request: AdminRequest, subscription: str, **path: str) -> object:
    given = _message_id(request)
    if given is None:
        raise RestError(400, "body must carry the message id (ledgerId, entryId)")
    message_id, excluded = given
    api.reset_cursor(
        request.context.broker,
        _name(**path),
        subscription,
        message_id=message_id,
        excluded=excluded,
    )
    return None


@_guarded
def skip(request: AdminRequest, subscription: str, count: str, **path: str) -> object:
    number = _int(count, "numMessages", minimum=0)
    api.skip(request.context.broker, _name(**path), subscription, number)
    return None


@_guarded
def skip_all(request: AdminRequest, subscription: str, **path: str) -> object:
    api.skip_all(request.context.broker, _name(**path), subscription)
    return None


@_guarded
def expire(request: AdminRequest, subscription: str, seconds: str, **path: str) -> object:
    number = _int(seconds, "expireTimeInSeconds", minimum=0)
    api.expire_messages(request.context.broker, _name(**path), subscription, number)
    return None


@_guarded
def expire_all(request: AdminRequest, seconds: str, **path: str) -> object:
    number = _int(seconds, "expireTimeInSeconds", minimum=0)
    api.expire_messages(request.context.broker, _name(**path), None, number)
    return None


@_guarded
def peek(request: AdminRequest, subscription: str, position: str, **path: str) -> object:
    number = _int(position, "messagePosition", minimum=1)
    return _raw(api.peek_messages(request.context.broker, _name(**path), subscription, number))


@_guarded
def examine(request: AdminRequest, **path: str) -> object:
    initial = request.args.get("initialPosition", "latest").lower()
    if initial not in ("earliest", "latest"):
        raise RestError(400, f"initialPosition must be earliest or latest, got {initial!r}")
    number = _int(request.args.get("messagePosition", "1"), "messagePosition", minimum=1)
    return _raw(api.examine_message(request.context.broker, _name(**path), initial, number))


@_guarded
def message_by_id(request: AdminRequest, ledger: str, entry: str, **path: str) -> object:
    ledger_id = _int(ledger, "ledgerId")
    entry_id = _int(entry, "entryId")
    return _raw(api.get_message_by_id(request.context.broker, _name(**path), ledger_id, entry_id))


@_guarded
def terminate(request: AdminRequest, **path: str) -> object:
    name = _name(**path)
    if _partitions(request, name) > 0:
        raise RestError(405, "Termination of a partitioned topic is not allowed")
    ledger_id, entry_id = api.terminate_topic(request.context.broker, name)
    return {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1}


@_guarded
def unload(request: AdminRequest, **path: str) -> object:
    name = _name(**path)
    count = _partitions(request, name)
    if count > 0:
        for index in range(count):
            partition = f"{name}-partition-{index}"
            if api.exists(request.context.broker, partition):
                api.unload_topic(request.context.broker, partition)
        return None
    api.unload_topic(request.context.broker, name)
    return None


def broker_stats_topics(request: AdminRequest) -> object:
    return api.broker_topic_stats(api.every_topic_stats(request.context.broker))


def routes() -> list[Route]:
    # Auth levels after Pulsar's PulsarAuthorizationProvider#allowTopicOperationAsync: the
    # subscription and message operations (GET_SUBSCRIPTIONS, SUBSCRIBE, UNSUBSCRIBE, SKIP,
    # EXPIRE_MESSAGES, PEEK_MESSAGES, RESET_CURSOR) need the consume permission; TERMINATE
    # and UNLOAD the tenant's admin (or a super user). Stats are "tenant" like GET /stats in
    # routes/stats.py. Tenant admins and super users pass every level.
    return [
        Route(TOPIC + "/partitioned-stats", ("GET",), partitioned_stats, auth="tenant"),
        Route(TOPIC + "/internalStats", ("GET",), internal_stats, auth="tenant"),
        Route(TOPIC + "/lastMessageId", ("GET",), last_message_id, auth="consume"),
        Route(TOPIC + "/subscriptions", ("GET",), subscriptions, auth="consume"),
        Route(SUBSCRIPTION, ("PUT",), create_subscription, auth="consume"),
        Route(SUBSCRIPTION, ("DELETE",), delete_subscription, auth="consume"),
        Route(
            SUBSCRIPTION + "/resetcursor/<seg:timestamp>",
            ("POST",),
            reset_cursor_to_time,
            auth="consume",
        ),
        Route(SUBSCRIPTION + "/resetcursor", ("POST",), reset_cursor_to_id, auth="consume"),
        Route(SUBSCRIPTION + "/skip/<seg:count>", ("POST",), skip, auth="consume"),
        Route(SUBSCRIPTION + "/skip_all", ("POST",), skip_all, auth="consume"),
        Route(SUBSCRIPTION + "/expireMessages/<seg:seconds>", ("POST",), expire, auth="consume"),
        Route(
            TOPIC + "/all_subscription/expireMessages/<seg:seconds>",
            ("POST",),
            expire_all,
            auth="consume",
        ),
        Route(SUBSCRIPTION + "/position/<seg:position>", ("GET",), peek, auth="consume"),
        Route(TOPIC + "/examinemessage", ("GET",), examine, auth="consume"),
        Route(
            TOPIC + "/ledger/<seg:ledger>/entry/<seg:entry>",
            ("GET",),
            message_by_id,
            auth="consume",
        ),
        Route(TOPIC + "/terminate", ("POST",), terminate, auth="tenant"),
        Route(TOPIC + "/unload", ("PUT",), unload, auth="tenant"),
    ]


# GET /stats and /admin/v2/broker-stats/topics are mounted by routes/stats.py, which calls
# stats() and broker_stats_topics() here when the app has a broker actor. DELETE /{topic}
# is routes/topics.py's (the broker actor's DeleteTopic).
