"""Pulsar's paused-consumer diagnostic, with writability gating on and off.

One producer and one Shared consumer on a persistent topic, both raw-socket clients
(:mod:`brokerlet.testing.rawclient`) against a broker in this process on a thread of its own,
whose sockets have a 16 KiB SO_SNDBUF; the consumer's socket has a 16 KiB SO_RCVBUF. The
producer stores 2,048 unbatched 8 KiB messages; then the consumer grants 8,192 permits and
reads nothing. Once the broker's channel to the consumer turns unwritable, the pause is held one
second and the consumer's stats are sampled: permits consumed (8,192 minus the permits left)
and the bytes waiting in the channel. With gating, dispatch stops at the flip (give or take
the read in flight); without it, the broker keeps feeding the paused socket. The consumer
then resumes reading, and every message must arrive, in order.

Ungated is a Pulsar dispatcher without writability gating: ``DispatchOptions(
writability_gating=False, read_after_dispatch=True)`` (brokerlet otherwise reads again only
when a batch's write completes, which alone bounds what one paused socket gets). The consumer
grants its permits once everything is stored, so the first read is a full batch, more than
the socket buffers hold, and the flip to unwritable is certain ("seconds to unwritable" counts
from the grant).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.plan import Plan, SectionResult
from bench.report import Row, format_bytes
from brokerlet import Broker
from brokerlet.dispatch.options import DispatchOptions
from brokerlet.testing.rawclient import RawClient
from brokerlet.transport.protocol import pb

__all__ = ["MESSAGES", "PERMITS", "SIZE", "BackpressureResult", "run_diagnostic"]

MESSAGES = 2048
SIZE = 8 * 1024
PERMITS = 8192
SOCKET_BUFFER = 16 * 1024
HOLD_S = 1.0
_ENTRY_OVERHEAD = 200  # bytes a MESSAGE frame adds to its payload, generously
_POLL_S = 0.005
_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BackpressureResult:
    """What one run of the diagnostic saw.

    Attributes:
        gated: Whether writability gating was on.
        seconds_to_unwritable: From the last receipt until the channel was seen unwritable.
        consumed_at_flip: Messages dispatched to the consumer when the flip was seen.
        permits_consumed: ``PERMITS - availablePermits`` after the one-second hold.
        pending_outbound_bytes: Bytes waiting in the broker's channel after the hold.
        writable_after_hold: Whether the channel was writable again after the hold (it
            should not be: nothing was read).
        bound_consumed: Most permits gating may consume: the dispatched count at the flip
            plus one read batch (the read in flight when the flip happened).
        bound_pending_bytes: Most bytes gating may leave pending: the high watermark plus
            one read batch of messages.
        delivered: Messages the consumer received once it resumed reading.
        in_order: Whether they were every message, in the order sent, payloads intact.
        error: Why the run did not complete, or None.
    """

    gated: bool
    seconds_to_unwritable: float = math.nan
    consumed_at_flip: int = -1
    permits_consumed: int = -1
    pending_outbound_bytes: int = -1
    writable_after_hold: bool = False
    bound_consumed: int = -1
    bound_pending_bytes: int = -1
    delivered: int = 0
    in_order: bool = False
    error: str | None = None

    @property
    def bounded(self) -> bool:
        """Whether dispatch stopped at the flip, as gating promises."""
        return (
            self.error is None
            and 0 <= self.permits_consumed <= self.bound_consumed
            and self.permits_consumed < MESSAGES
            and 0 <= self.pending_outbound_bytes <= self.bound_pending_bytes
        )


def run_diagnostic(gated: bool) -> BackpressureResult:
    """Run the diagnostic once, with writability gating on or off."""
    try:
        with Broker(
            port=0,
            so_sndbuf=SOCKET_BUFFER,
            web_service_enabled=False,
            dispatch_options=DispatchOptions()
            if gated
            else DispatchOptions(writability_gating=False, read_after_dispatch=True),
        ) as broker:
            return _diagnose(broker, gated)
    except (OSError, TimeoutError, AssertionError) as error:
        return BackpressureResult(gated, error=repr(error))


def _diagnose(broker: Broker, gated: bool) -> BackpressureResult:
    topic = f"persistent://public/default/bench-paused-{'gated' if gated else 'ungated'}"
    read_batch = broker.settings.dispatcher_max_read_batch_size
    payload = b"p" * SIZE
    with RawClient(broker.address, timeout=_TIMEOUT_S) as producer:
        producer.handshake()
        producer.create_producer(topic, 1)
        with RawClient(broker.address, timeout=_TIMEOUT_S, rcvbuf=SOCKET_BUFFER) as consumer:
            consumer.handshake()
            consumer.subscribe(topic, "bench", 1, sub_type=pb.CommandSubscribe.Shared)
            for sequence_id in range(MESSAGES):
                producer.send_raw(producer.send_frame(1, sequence_id, payload))
            for _ in range(MESSAGES):
                producer.expect(pb.BaseCommand.SEND_RECEIPT)
            stored = time.monotonic()
            consumer.flow(1, PERMITS)  # then nothing is read until the hold is over
            _wait_until(lambda: not _consumer_stats(broker, topic)["writable"])
            at_flip = _consumer_stats(broker, topic)
            flipped = time.monotonic()
            time.sleep(HOLD_S)  # the observation window: the broker may keep feeding
            held = _consumer_stats(broker, topic)
            received = consumer.receive(1, MESSAGES, timeout=_TIMEOUT_S)
    in_order = [message.sequence_id for message in received] == list(range(MESSAGES)) and all(
        message.payload == payload for message in received
    )
    return BackpressureResult(
        gated=gated,
        seconds_to_unwritable=flipped - stored,
        consumed_at_flip=int(at_flip["msgOutCounter"]),
        permits_consumed=PERMITS - int(held["availablePermits"]),
        pending_outbound_bytes=int(held["pendingOutboundBytes"]),
        writable_after_hold=bool(held["writable"]),
        bound_consumed=int(at_flip["msgOutCounter"]) + read_batch,
        bound_pending_bytes=broker.settings.high_watermark + read_batch * (SIZE + _ENTRY_OVERHEAD),
        delivered=len(received),
        in_order=in_order,
    )


def _consumer_stats(broker: Broker, topic: str) -> dict[str, Any]:
    stats = broker.topic_stats(topic)
    if stats is None:
        raise AssertionError(f"the broker has no stats for {topic}")
    (consumer,) = stats["subscriptions"]["bench"]["consumers"]
    result: dict[str, Any] = consumer
    return result


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the consumer's channel never became unwritable")
        time.sleep(_POLL_S)  # polling the broker's stats from this thread


# The section: ``--only backpressure``.


def run_backpressure(plan: Plan) -> SectionResult:
    """Pulsar's paused-consumer diagnostic, gated and ungated, on brokers in this process."""
    section = SectionResult()
    print(
        f"backpressure: {MESSAGES:,} unbatched 8 KiB messages, 8,192 permits, consumer "
        "socket paused, 16 KiB SO_SNDBUF / SO_RCVBUF; hold 1 s after the flip to "
        "unwritable",
        flush=True,
    )
    results = {"gated": run_diagnostic(gated=True), "ungated": run_diagnostic(gated=False)}
    for label, result in results.items():
        print(f"  {label}: {_describe_backpressure(result)}", flush=True)
        section.data[label] = dataclasses.asdict(result) | {"bounded": result.bounded}
        section.rows.extend(_backpressure_rows(label, result))
        section.failed |= result.error is not None
    return section


def _describe_backpressure(result: BackpressureResult) -> str:
    if result.error is not None:
        return f"FAILED: {result.error}"
    return (
        f"{result.consumed_at_flip} dispatched at the flip; after the hold "
        f"{result.permits_consumed} permits consumed, "
        f"{result.pending_outbound_bytes:,} bytes pending "
        f"({'writable' if result.writable_after_hold else 'still unwritable'}); "
        f"resumed: {result.delivered} delivered, "
        f"{'in order' if result.in_order else 'NOT in order'}"
    )


def _backpressure_rows(label: str, result: BackpressureResult) -> list[Row]:
    if result.error is not None:
        return [Row(f"backpressure, {label}", "n/a", result.error[:60], "", "FAILED")]
    if label == "gated":
        target = f"<= {result.bound_consumed} / <= {format_bytes(result.bound_pending_bytes)}"
        status = "MET" if result.bounded else "MISSED"
    else:
        target, status = "comparison", ""
    return [
        Row(
            f"backpressure, {label}: permits consumed / pending out",
            f"{result.permits_consumed} / {format_bytes(result.pending_outbound_bytes)}",
            f"{result.consumed_at_flip} dispatched at the flip",
            target,
            status,
        ),
        Row(
            f"  resumed, {label}: delivered in order",
            f"{result.delivered:,}",
            "in order" if result.in_order else "NOT in order",
            f"all {MESSAGES:,} in order",
            "MET" if result.in_order and result.delivered == MESSAGES else "MISSED",
        ),
    ]
