"""Test helpers for code that talks to a Pulsar broker (brokerlet or Apache Pulsar).

They work with the official ``pulsar.Client`` and with brokerlet's own client, and fail with
messages that show what was expected and what came::

    from brokerlet.testing.helpers import assert_received, read_all, wait_for_backlog

    wait_for_backlog(pulsar_admin_url, pulsar_topic, "billing", 3)
    assert_received(consumer, [b"a", b"b", b"c"])
    assert read_all(pulsar_client, pulsar_topic) == [b"a", b"b", b"c"]

Waiting is a bounded poll with a deadline, never an open-ended sleep: every wait goes
through :func:`~brokerlet.testing.waiting.wait_until` (exported here too), which polls with
``gevent.sleep``, so brokerlet's client (whose greenlets run on the caller's hub) keeps
acknowledging and receiving while a helper waits.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from brokerlet.admin.client import AdminClient, AdminError, NotFound
from brokerlet.testing.waiting import wait_until

__all__ = [
    "assert_payloads",
    "assert_received",
    "backlog",
    "read_all",
    "receive_payloads",
    "wait_for_backlog",
    "wait_until",
]


def backlog(admin: AdminClient | str, topic: str, subscription: str) -> int | None:
    """A subscription's ``msgBacklog`` from the topic's stats; None if topic or
    subscription does not exist (yet)."""
    client = AdminClient(admin) if isinstance(admin, str) else admin
    try:
        stats = client.topic_stats(topic)
    except NotFound:
        return None
    finally:
        if isinstance(admin, str):
            client.close()
    sub = stats.get("subscriptions", {}).get(subscription)
    return None if sub is None else int(sub.get("msgBacklog", 0))


def wait_for_backlog(
    admin: AdminClient | str, topic: str, subscription: str, count: int, *, timeout: float = 10.0
) -> None:
    """Wait until ``subscription`` of ``topic`` has exactly ``count`` messages in its backlog.

    Args:
        admin: an :class:`AdminClient` or the admin URL (``pulsar_admin_url``).
    """
    client = AdminClient(admin) if isinstance(admin, str) else admin

    def current() -> int | None:
        try:
            return backlog(client, topic, subscription)
        except AdminError as error:
            raise AssertionError(f"cannot read the stats of {topic}: {error}") from error

    try:
        wait_until(
            current,
            predicate=lambda seen: seen == count,
            timeout=timeout,
            message=(
                f"backlog of subscription {subscription!r} on {topic} to be {count} "
                "(None: the subscription does not exist)"
            ),
        )
    finally:
        if isinstance(admin, str):
            client.close()


def _payload(message: Any) -> bytes:
    data = message.data()
    return bytes(data)


def receive_payloads(
    consumer: Any, count: int, *, timeout: float = 10.0, acknowledge: bool = True
) -> list[bytes]:
    """Receive up to ``count`` messages within ``timeout`` seconds (acknowledging them)."""
    payloads: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(payloads) < count:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        try:
            message = consumer.receive(timeout_millis=left_ms)
        except Exception as error:
            if _is_timeout(error):
                break
            raise
        payloads.append(_payload(message))
        if acknowledge:
            consumer.acknowledge(message)
    return payloads


def _is_timeout(error: BaseException) -> bool:
    return type(error).__name__ == "Timeout"


def _show(payloads: Sequence[bytes], limit: int = 20) -> str:
    shown = ", ".join(repr(p) for p in payloads[:limit])
    more = f", ... ({len(payloads) - limit} more)" if len(payloads) > limit else ""
    return f"[{shown}{more}]"


def assert_payloads(
    received: Sequence[bytes], expected: Sequence[bytes], *, ordered: bool = True
) -> None:
    """Fail, showing expected against received, unless they match (in order if ``ordered``)."""
    received = [bytes(p) for p in received]
    expected = [bytes(p) for p in expected]
    if (received == expected) if ordered else (Counter(received) == Counter(expected)):
        return
    missing = Counter(expected) - Counter(received)
    unexpected = Counter(received) - Counter(expected)
    lines = [
        f"messages differ ({'in order' if ordered else 'in any order'}):",
        f"  expected ({len(expected)}): {_show(expected)}",
        f"  received ({len(received)}): {_show(received)}",
    ]
    if missing:
        lines.append(f"  missing: {_show(list(missing.elements()))}")
    if unexpected:
        lines.append(f"  unexpected: {_show(list(unexpected.elements()))}")
    if not missing and not unexpected:
        first = next(i for i, (a, b) in enumerate(zip(received, expected, strict=True)) if a != b)
        lines.append(f"  same messages, out of order from index {first}")
    raise AssertionError("\n".join(lines))


def assert_received(
    consumer: Any,
    expected: Sequence[bytes],
    *,
    timeout: float = 10.0,
    ordered: bool = True,
    acknowledge: bool = True,
) -> list[bytes]:
    """Receive as many messages as ``expected`` has and assert they are those payloads."""
    received = receive_payloads(consumer, len(expected), timeout=timeout, acknowledge=acknowledge)
    assert_payloads(received, expected, ordered=ordered)
    return received


def read_all(client: Any, topic: str, *, timeout: float = 10.0, idle_ms: int = 300) -> list[bytes]:
    """Every message stored on ``topic``, oldest first, without consuming them for anyone.

    With the official client this is a reader from the earliest message until
    ``has_message_available()`` is false. brokerlet's client has no readers: it subscribes
    with a fresh subscription from the earliest message, reads until nothing comes for
    ``idle_ms``, and unsubscribes.
    """
    if hasattr(client, "create_reader"):
        import pulsar  # noqa: PLC0415 -- only when the official client is in use

        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        try:
            payloads: list[bytes] = []
            deadline = time.monotonic() + timeout
            while reader.has_message_available():
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise AssertionError(f"reading {topic} took longer than {timeout:g} s")
                payloads.append(_payload(reader.read_next(timeout_millis=left_ms)))
            return payloads
        finally:
            reader.close()
    from brokerlet import InitialPosition  # noqa: PLC0415

    consumer = client.subscribe(
        topic, f"read-all-{uuid.uuid4().hex[:12]}", initial_position=InitialPosition.Earliest
    )
    try:
        payloads = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=idle_ms)
            except Exception as error:
                if _is_timeout(error):
                    return payloads
                raise
            payloads.append(_payload(message))
            consumer.acknowledge(message)
        raise AssertionError(f"reading {topic} took longer than {timeout:g} s")
    finally:
        consumer.unsubscribe()
