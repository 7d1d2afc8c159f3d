"""``brokerlet admin``: pulsar-admin's verbs and flags on :class:`~brokerlet.admin.AdminClient`.

::

    brokerlet admin tenants create acme
    brokerlet admin namespaces create acme/orders
    brokerlet admin topics create-partitioned-topic persistent://acme/orders/placed -p 4
    brokerlet admin topics list acme/orders
    brokerlet admin topics stats persistent://acme/orders/placed-partition-0
    brokerlet admin topics peek-messages persistent://acme/orders/placed -s billing -n 5
    brokerlet admin topics reset-cursor persistent://acme/orders/placed -s billing -t 10m
    brokerlet admin schemas upload persistent://acme/orders/placed -f schema.json

Output follows pulsar-admin: objects as indented JSON, lists one name per line, nothing
for a write that succeeded. An error answer prints Pulsar's reason and exits 1; so does a
broker that does not answer, with a message saying so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any, TextIO

from brokerlet.admin.client import (
    DEFAULT_ADMIN_URL,
    AdminClient,
    AdminError,
    AdminUnavailable,
    PeekedMessage,
    TopicName,
    parse_relative_time,
)

__all__ = ["main"]

Action = Callable[[AdminClient, argparse.Namespace], object]


# -- output ------------------------------------------------------------------------------


class _Lines(list[str]):
    """A result printed one item a line (pulsar-admin prints lists so)."""


class _Text(str):
    """A result printed as it is."""

    __slots__ = ()


def _print(result: object, out: TextIO) -> None:
    if result is None:
        return
    if isinstance(result, _Text):
        print(result, file=out)
    elif isinstance(result, list) and all(isinstance(item, str) for item in result):
        for item in result:
            print(item, file=out)
    else:
        print(json.dumps(result, indent=2), file=out)


def hex_dump(data: bytes) -> str:
    """A hex dump framed as pulsar-admin prints message payloads."""
    rule = "+--------+-------------------------------------------------+----------------+"
    lines = [
        "         +-------------------------------------------------+",
        "         |  0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f |",
        rule,
    ]
    for offset in range(0, len(data), 16):
        row = data[offset : offset + 16]
        hexes = " ".join(f"{byte:02x}" for byte in row)
        text = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in row)
        lines.append(f"|{offset:08x}| {hexes:<47} |{text:<16}|")
    lines.append(rule)
    return "\n".join(lines)


def _format_peeked(messages: list[PeekedMessage]) -> _Text:
    blocks = []
    for message in messages:
        lines = [f"Message ID: {message.message_id}"]
        for header, label in (
            ("X-Pulsar-publish-time", "Publish time"),
            ("X-Pulsar-event-time", "Event time"),
            ("X-Pulsar-partition-key", "Key"),
        ):
            if header in message.headers:
                lines.append(f"{label}: {message.headers[header]}")
        if message.batch_size is not None:
            lines.append(f"Batch: {message.batch_size} messages")
        if message.properties:
            lines.append("Properties:")
            lines.append(json.dumps(message.properties, indent=2))
        lines.append(hex_dump(message.payload))
        blocks.append("\n".join(lines))
    return _Text("\n".join(blocks))


# -- values ------------------------------------------------------------------------------

_SIZE = re.compile(r"^(-?\d+)([kKmMgGtT]?)$")
_SIZE_MB = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _size_mb(text: str) -> int:
    """pulsar-admin's sizes (``10M``, ``2G``, ``-1``) in megabytes."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: expected e.g. 512M, 10G, -1")
    number = int(match.group(1))
    if number < 0:
        return -1
    return int(number * _SIZE_MB[match.group(2).lower()])


def _time_minutes(text: str) -> int:
    """pulsar-admin's retention times (``3h``, ``2d``, ``-1``) in minutes."""
    if text.lstrip("-").isdigit():
        value = int(text)
        return -1 if value < 0 else value
    try:
        return int(parse_relative_time(text) // 60)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return int(parse_relative_time(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _csv(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


# -- the commands ------------------------------------------------------------------------


def _add(
    group: Any, name: str, action: Action, help_text: str, *arguments: tuple[Any, ...]
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text, description=help_text)
    for names, options in arguments:
        parser.add_argument(*names, **options)
    parser.set_defaults(action=action)
    return parser


def _arg(*names: str, **options: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return names, options


TOPIC = _arg("topic", help="persistent://tenant/namespace/topic")
NAMESPACE = _arg("namespace", help="tenant/namespace")
TENANT = _arg("tenant")
SUBSCRIPTION = _arg("-s", "--subscription", required=True, help="the subscription")
FORCE = _arg("-f", "--force", action="store_true", help="even if in use")


def _tenant_commands(group: Any) -> None:
    _add(group, "list", lambda a, n: a.tenants(), "list tenants")
    _add(
        group, "get", lambda a, n: a.tenant(n.tenant), "a tenant's admin roles and clusters", TENANT
    )
    roles = _arg("-r", "--admin-roles", type=_csv, default=None, help="comma-separated roles")
    clusters = _arg(
        "-c", "--allowed-clusters", type=_csv, default=None, help="comma-separated clusters"
    )
    _add(
        group,
        "create",
        lambda a, n: a.create_tenant(
            n.tenant, admin_roles=n.admin_roles or (), allowed_clusters=n.allowed_clusters
        ),
        "create a tenant (allowed on every cluster unless -c)",
        TENANT,
        roles,
        clusters,
    )
    _add(
        group,
        "update",
        lambda a, n: a.update_tenant(
            n.tenant, admin_roles=n.admin_roles, allowed_clusters=n.allowed_clusters
        ),
        "change a tenant's admin roles or clusters",
        TENANT,
        roles,
        clusters,
    )
    _add(
        group,
        "delete",
        lambda a, n: a.delete_tenant(n.tenant, force=n.force),
        "delete a tenant",
        TENANT,
        FORCE,
    )


def _namespace_commands(group: Any) -> None:
    _add(group, "list", lambda a, n: a.namespaces(n.tenant), "list a tenant's namespaces", TENANT)
    _add(
        group,
        "topics",
        lambda a, n: a.namespace_topics(n.namespace),
        "list a namespace's topics",
        NAMESPACE,
    )
    _add(
        group,
        "create",
        lambda a, n: a.create_namespace(n.namespace, bundles=n.bundles, clusters=n.clusters),
        "create a namespace",
        NAMESPACE,
        _arg("-b", "--bundles", type=int, default=None, help="number of bundles"),
        _arg("-c", "--clusters", type=_csv, default=None, help="replication clusters"),
    )
    _add(
        group,
        "delete",
        lambda a, n: a.delete_namespace(n.namespace, force=n.force),
        "delete a namespace",
        NAMESPACE,
        FORCE,
    )
    _add(
        group, "policies", lambda a, n: a.policies(n.namespace), "a namespace's policies", NAMESPACE
    )
    _add(
        group,
        "get-retention",
        lambda a, n: a.retention(n.namespace),
        "the retention policy",
        NAMESPACE,
    )
    _add(
        group,
        "set-retention",
        lambda a, n: a.set_retention(n.namespace, time_minutes=n.time, size_mb=n.size),
        "set the retention policy",
        NAMESPACE,
        _arg("-s", "--size", type=_size_mb, required=True, help="e.g. 10G, 512M, -1 (unlimited)"),
        _arg("-t", "--time", type=_time_minutes, required=True, help="e.g. 3h, 2d, -1"),
    )
    _add(
        group,
        "remove-retention",
        lambda a, n: a.remove_policy(n.namespace, "retention"),
        "remove the retention policy",
        NAMESPACE,
    )
    _add(
        group,
        "get-message-ttl",
        lambda a, n: a.message_ttl(n.namespace),
        "the message TTL in seconds",
        NAMESPACE,
    )
    _add(
        group,
        "set-message-ttl",
        lambda a, n: a.set_message_ttl(n.namespace, n.messageTTL),
        "set the message TTL",
        NAMESPACE,
        _arg("-ttl", "--messageTTL", type=_seconds, required=True, help="seconds, or e.g. 1h"),
    )
    _add(
        group,
        "remove-message-ttl",
        lambda a, n: a.remove_policy(n.namespace, "messageTTL"),
        "remove the message TTL",
        NAMESPACE,
    )
    _add(
        group,
        "get-deduplication",
        lambda a, n: a.deduplication(n.namespace),
        "whether deduplication is on",
        NAMESPACE,
    )
    dedup = _add(
        group,
        "set-deduplication",
        lambda a, n: a.set_deduplication(n.namespace, n.enable),
        "turn deduplication on or off",
        NAMESPACE,
    )
    switch = dedup.add_mutually_exclusive_group(required=True)
    switch.add_argument("-e", "--enable", action="store_true", dest="enable", default=None)
    switch.add_argument("-d", "--disable", action="store_false", dest="enable")
    auto = _add(
        group,
        "set-auto-topic-creation",
        lambda a, n: a.set_auto_topic_creation(
            n.namespace, allow=n.enable, topic_type=n.type, partitions=n.num_partitions
        ),
        "allow or forbid creating topics on first use",
        NAMESPACE,
        _arg(
            "-t",
            "--type",
            default="non-partitioned",
            choices=("partitioned", "non-partitioned"),
        ),
        _arg("-n", "--num-partitions", type=int, default=None),
    )
    switch = auto.add_mutually_exclusive_group(required=True)
    switch.add_argument("-e", "--enable", action="store_true", dest="enable", default=None)
    switch.add_argument("-d", "--disable", action="store_false", dest="enable")
    _add(
        group,
        "set-backlog-quota",
        lambda a, n: a.set_backlog_quota(
            n.namespace,
            limit_size=n.limitSize,
            limit_time=n.limitTime,
            policy=n.policy,
            quota_type=n.type,
        ),
        "set a backlog quota",
        NAMESPACE,
        _arg("-l", "--limitSize", type=lambda t: _size_mb(t) * 1024 * 1024, default=-1),
        _arg("-lt", "--limitTime", type=_seconds, default=-1),
        _arg(
            "-p",
            "--policy",
            required=True,
            choices=("producer_request_hold", "producer_exception", "consumer_backlog_eviction"),
        ),
        _arg(
            "-t",
            "--type",
            default="destination_storage",
            choices=("destination_storage", "message_age"),
        ),
    )
    _add(
        group,
        "get-backlog-quotas",
        lambda a, n: a.backlog_quotas(n.namespace),
        "the backlog quotas",
        NAMESPACE,
    )


def _terminate(admin: AdminClient, args: argparse.Namespace) -> _Text:
    last = admin.terminate(args.topic)
    where = f"{last.get('ledgerId')}:{last.get('entryId')}" if isinstance(last, dict) else last
    return _Text(f"Topic successfully terminated at {where}")


def _reset_cursor(admin: AdminClient, args: argparse.Namespace) -> None:
    if args.messageId is not None:
        admin.reset_cursor_to(args.topic, args.subscription, args.messageId)
    else:
        admin.reset_cursor_by_age(args.topic, args.subscription, args.time)


def _topic_commands(group: Any) -> None:
    _add(group, "list", lambda a, n: a.topics(n.namespace), "list a namespace's topics", NAMESPACE)
    _add(
        group,
        "list-partitioned-topics",
        lambda a, n: a.partitioned_topics(n.namespace),
        "list a namespace's partitioned topics",
        NAMESPACE,
    )
    _add(group, "create", lambda a, n: a.create_topic(n.topic), "create a topic", TOPIC)
    partitions = _arg("-p", "--partitions", type=int, required=True, help="partition count")
    _add(
        group,
        "create-partitioned-topic",
        lambda a, n: a.create_partitioned_topic(n.topic, n.partitions),
        "create a partitioned topic",
        TOPIC,
        partitions,
    )
    _add(
        group,
        "update-partitioned-topic",
        lambda a, n: a.update_partitioned_topic(n.topic, n.partitions),
        "add partitions to a partitioned topic",
        TOPIC,
        partitions,
    )
    _add(
        group,
        "get-partitioned-topic-metadata",
        lambda a, n: a.partitioned_topic_metadata(n.topic),
        "a topic's partition count",
        TOPIC,
    )
    _add(
        group,
        "delete",
        lambda a, n: a.delete_topic(n.topic, force=n.force),
        "delete a topic",
        TOPIC,
        FORCE,
    )
    _add(
        group,
        "delete-partitioned-topic",
        lambda a, n: a.delete_partitioned_topic(n.topic, force=n.force),
        "delete a partitioned topic",
        TOPIC,
        FORCE,
    )
    _add(group, "stats", lambda a, n: a.topic_stats(n.topic), "a topic's stats", TOPIC)
    _add(
        group,
        "partitioned-stats",
        lambda a, n: a.partitioned_stats(n.topic, per_partition=n.per_partition),
        "a partitioned topic's stats",
        TOPIC,
        _arg("--per-partition", action="store_true"),
    )
    _add(
        group,
        "stats-internal",
        lambda a, n: a.internal_stats(n.topic),
        "a topic's internal stats",
        TOPIC,
    )
    _add(
        group,
        "last-message-id",
        lambda a, n: a.last_message_id(n.topic),
        "a topic's last message id",
        TOPIC,
    )
    _add(
        group,
        "subscriptions",
        lambda a, n: a.subscriptions(n.topic),
        "a topic's subscriptions",
        TOPIC,
    )
    _add(
        group,
        "create-subscription",
        lambda a, n: a.create_subscription(n.topic, n.subscription, message_id=n.messageId),
        "create a subscription",
        TOPIC,
        SUBSCRIPTION,
        _arg("-m", "--messageId", default="latest", help="latest, earliest or ledgerId:entryId"),
    )
    _add(
        group,
        "unsubscribe",
        lambda a, n: a.delete_subscription(n.topic, n.subscription, force=n.force),
        "delete a subscription",
        TOPIC,
        SUBSCRIPTION,
        FORCE,
    )
    _add(
        group,
        "peek-messages",
        lambda a, n: _format_peeked(a.peek_messages(n.topic, n.subscription, n.count)),
        "show a subscription's next messages without consuming them",
        TOPIC,
        SUBSCRIPTION,
        _arg("-n", "--count", type=int, default=1, help="how many"),
    )
    reset = _add(
        group,
        "reset-cursor",
        _reset_cursor,
        "move a subscription to a time or a message",
        TOPIC,
        SUBSCRIPTION,
    )
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("-t", "--time", type=_seconds, help="this long ago: 10m, 2h, 1d")
    where.add_argument("-m", "--messageId", help="ledgerId:entryId")
    _add(
        group,
        "skip",
        lambda a, n: a.skip(n.topic, n.subscription, n.count),
        "skip messages of a subscription",
        TOPIC,
        SUBSCRIPTION,
        _arg("-n", "--count", type=int, required=True),
    )
    _add(
        group,
        "clear-backlog",
        lambda a, n: a.clear_backlog(n.topic, n.subscription),
        "skip every message of a subscription",
        TOPIC,
        SUBSCRIPTION,
    )
    _add(
        group,
        "expire-messages",
        lambda a, n: a.expire_messages(n.topic, n.subscription, n.expireTime),
        "expire a subscription's messages older than a time",
        TOPIC,
        SUBSCRIPTION,
        _arg("-t", "--expireTime", type=_seconds, required=True, help="seconds, or e.g. 1h"),
    )
    _add(group, "terminate", _terminate, "terminate a topic (no more messages)", TOPIC)
    _add(group, "unload", lambda a, n: a.unload(n.topic), "unload a topic", TOPIC)
    _add(
        group,
        "examine-message",
        lambda a, n: _format_peeked(
            [a.examine_message(n.topic, initial_position=n.initialPosition, position=n.position)]
        ),
        "show the message at a position from the start or the end",
        TOPIC,
        _arg("-i", "--initialPosition", default="latest", choices=("latest", "earliest")),
        _arg("-m", "--messagePosition", dest="position", type=int, default=1),
    )


def schema_info(topic: str, response: dict[str, Any]) -> dict[str, Any]:
    """A GetSchemaResponse as pulsar-admin prints a SchemaInfo: the topic's local name, the
    definition as JSON where it is JSON (AVRO, JSON, KEY_VALUE's halves), else its text."""
    data = response.get("data", "")
    definition: object = data
    if isinstance(data, str) and data.strip().startswith(("{", "[")):
        try:
            definition = json.loads(data)
        except ValueError:
            definition = data
    return {
        "name": TopicName.parse(topic).local,
        "schema": definition,
        "type": response.get("type"),
        "timestamp": response.get("timestamp"),
        "properties": response.get("properties", {}),
    }


def _get_schema(admin: AdminClient, args: argparse.Namespace) -> object:
    if args.version is not None and args.all_version:
        raise ValueError("Only one or neither of --version and --all-version can be specified.")
    if args.all_version:
        return [schema_info(args.topic, r) for r in admin.schemas(args.topic)]
    if args.version is not None:
        if args.version < 0:
            raise ValueError(f"Option --version must be greater than 0, but found {args.version}")
        return schema_info(args.topic, admin.schema(args.topic, args.version))
    latest = admin.schema(args.topic)
    return {"version": latest.get("version"), "schemaInfo": schema_info(args.topic, latest)}


def _upload_schema(admin: AdminClient, args: argparse.Namespace) -> None:
    try:
        with open(args.filename, encoding="utf-8") as file:
            payload = json.load(file)
    except FileNotFoundError:
        raise ValueError(f"Schema file {args.filename} is not found.") from None
    except (OSError, ValueError) as error:
        raise ValueError(f"Schema file {args.filename} cannot be read: {error}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        raise ValueError(
            f'Schema file {args.filename} must hold a JSON object with a "type" '
            '(PostSchemaPayload: {"type", "schema", "properties"})'
        )
    schema = payload.get("schema") or ""
    if not isinstance(schema, str):  # a definition written as JSON rather than as a string
        schema = json.dumps(schema)
    admin.upload_schema(args.topic, payload["type"], schema, payload.get("properties") or {})


def _schema_commands(group: Any) -> None:
    _add(
        group,
        "get",
        _get_schema,
        "get the schema for a topic",
        TOPIC,
        _arg("-v", "--version", type=int, default=None, help="version"),
        _arg("-a", "--all-version", action="store_true", help="all versions"),
    )
    _add(
        group,
        "upload",
        _upload_schema,
        "update the schema for a topic",
        TOPIC,
        _arg("-f", "--filename", required=True, help="a PostSchemaPayload JSON file"),
    )
    _add(
        group,
        "delete",
        lambda a, n: a.delete_schema(n.topic, force=n.force),
        "delete all versions schema of a topic",
        TOPIC,
        _arg(
            "-f",
            "--force",
            action="store_true",
            help="delete every version, not only mark the schema deleted",
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``brokerlet admin`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="brokerlet admin",
        description="Manage a brokerlet (or an Apache Pulsar cluster) through its admin API.",
    )
    parser.add_argument(
        "--admin-url",
        default=DEFAULT_ADMIN_URL,
        help=f"the admin API (default {DEFAULT_ADMIN_URL})",
    )
    parser.add_argument("--auth-token", default=None, help="sent as Authorization: Bearer")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    groups = parser.add_subparsers(dest="group", required=True, metavar="GROUP")

    def group(name: str, help_text: str) -> Any:
        sub = groups.add_parser(name, help=help_text, description=help_text)
        return sub.add_subparsers(dest="verb", required=True, metavar="VERB")

    clusters = group("clusters", "clusters")
    _add(clusters, "list", lambda a, n: a.clusters(), "list clusters")
    _tenant_commands(group("tenants", "tenants"))
    _namespace_commands(group("namespaces", "namespaces and their policies"))
    _topic_commands(group("topics", "topics, partitions and subscriptions"))
    _schema_commands(group("schemas", "schemas of topics"))
    brokers = group("brokers", "brokers")
    _add(brokers, "healthcheck", lambda a, n: _Text(a.healthcheck()), "check the broker's health")
    stats = group("broker-stats", "broker statistics")
    _add(stats, "topics", lambda a, n: a.broker_topic_stats(), "every topic's stats")
    _add(stats, "metrics", lambda a, n: _Text(a.metrics().rstrip("\n")), "Prometheus metrics")
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run one admin command; 0 on success, 1 on an error answer or no answer."""
    out = out if out is not None else sys.stdout
    args = build_parser().parse_args(argv)
    try:
        admin = AdminClient(args.admin_url, auth=args.auth_token, timeout=args.timeout)
    except ValueError as error:
        print(f"brokerlet admin: {error}", file=sys.stderr)
        return 2
    action: Action = args.action
    try:
        with admin:
            result = action(admin, args)
    except AdminUnavailable as error:
        print(
            f"brokerlet admin: {error.reason} (is the broker running? --admin-url says where "
            "to look)",
            file=sys.stderr,
        )
        return 1
    except AdminError as error:
        phrase = _phrase(error.status)
        print(f"{error.status} {phrase}\n\nReason: {error.reason}", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"brokerlet admin: {error}", file=sys.stderr)
        return 2
    try:
        _print(result, out)
    except BrokenPipeError:  # `| head` stopped reading: not an error
        sys.stderr.close()
    return 0


def _phrase(status: int | None) -> str:
    try:
        return HTTPStatus(status or 0).phrase
    except ValueError:
        return "Error"
