"""The books of a run: what was published, what each subscription saw, and the verdict.

Producers number their messages 0, 1, 2, ... (per producer) and put producer, key and number
in the body. The ledger marks each send as pending, receipted or failed, and counts, per
subscription, how often the application was handed each message. From that it decides:

* **delivered**: every receipted message reached every subscription at least once;
  receipted messages a subscription has not seen by the end are *in flight* (after the drain
  period they count against the run);
* **duplicates**: a message handed over again with ``redelivery_count == 0``. A message
  handed over again with a redelivery count above zero is a *redelivery*, which the broker
  announces and the contract allows, so it is reported separately and not a violation;
* **order**: per subscription, per producer and key, the numbers of first deliveries must
  increase. Checked only for subscription types that promise per-key order (Key_Shared,
  Failover, Exclusive); Shared does not.

A subscription added while messages are being published (:meth:`Ledger.add_subscription`)
is held only to the messages sent after it was added.

All of it runs on the load generator's one gevent hub, so no locks are needed. Used by
:mod:`brokerlet.locust` and by our ``loadtests/``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Ledger", "SubscriptionVerdict", "Verdict"]

_PENDING, _RECEIPTED, _FAILED = 0, 1, 2
_MAX_EXAMPLES = 5


class _SubscriptionBook:
    """What one subscription's consumers were handed."""

    def __init__(self, ordered: bool, start: list[int] | None = None) -> None:
        self.ordered = ordered
        self.start = start or []  # per producer: the first number this subscription must see
        self.expected = 0  # receipted messages it must see
        self.expected_seen = 0  # of those, how many it has seen
        self.seen: list[bytearray] = []  # per producer: times each number was handed over
        self.last_first: dict[int, int] = {}  # (producer << 32 | key) -> last first delivery
        self.deliveries = 0
        self.unique = 0
        self.duplicates = 0
        self.redelivered = 0  # deliveries carrying redelivery_count > 0
        self.seen_again_redelivered = 0  # of those, messages the application had seen before
        self.order_violations = 0
        self.examples: list[str] = []

    def record(self, producer: int, key: int, sequence: int, redelivery_count: int) -> bool:
        """Count one delivery; True if it is the first of this message."""
        self.deliveries += 1
        if redelivery_count > 0:
            self.redelivered += 1
        seen = self.seen
        while len(seen) <= producer:
            seen.append(bytearray())
        counts = seen[producer]
        if len(counts) <= sequence:
            counts.extend(bytes(sequence + 1 - len(counts) + 1024))
        times = counts[sequence]
        if times < 255:
            counts[sequence] = times + 1
        if times:
            if redelivery_count > 0:
                self.seen_again_redelivered += 1
            else:
                self.duplicates += 1
                self._example(f"duplicate p{producer}#{sequence} key {key}")
            return False
        self.unique += 1
        if self.must_see(producer, sequence):
            self.expected_seen += 1
        if self.ordered:
            slot = producer << 32 | key
            last = self.last_first.get(slot, -1)
            if sequence < last:
                self.order_violations += 1
                self._example(f"order p{producer} key {key}: #{sequence} after #{last}")
            else:
                self.last_first[slot] = sequence
        return True

    def must_see(self, producer: int, sequence: int) -> bool:
        """Whether the message was sent after this subscription joined the books."""
        start = self.start
        return producer >= len(start) or sequence >= start[producer]

    def _example(self, text: str) -> None:
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(text)


@dataclass
class SubscriptionVerdict:
    """One subscription's part of the verdict."""

    deliveries: int
    unique: int
    in_flight: int
    duplicates: int
    redelivered: int
    seen_again_redelivered: int
    order_violations: int
    order_checked: bool
    not_receipted_but_delivered: int
    examples: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """The verdict of a run.

    Attributes:
        passed: no violation (see :attr:`violations`).
        violations: why it failed, one line each; empty when it passed.
        sent: sends attempted.
        published: sends the broker receipted.
        publish_failed: sends that failed (timeout, error).
        publish_pending: sends with no outcome when the run ended.
        in_flight: receipted messages some subscription had not received at the end, summed
            over subscriptions.
        duplicates: summed over subscriptions.
        redelivered: deliveries with ``redelivery_count > 0``, summed over subscriptions.
        order_violations: summed over subscriptions.
        errors: errors outside sends (a consumer that could not subscribe, say).
        subscriptions: the per-subscription detail.
    """

    passed: bool
    violations: list[str]
    sent: int
    published: int
    publish_failed: int
    publish_pending: int
    in_flight: int
    duplicates: int
    redelivered: int
    order_violations: int
    errors: list[str]
    subscriptions: dict[str, SubscriptionVerdict]

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return asdict(self)


class Ledger:
    """Publish and delivery books of one run.

    Args:
        subscriptions: the subscriptions' names.
        ordered: whether to check per-key order.
    """

    def __init__(self, subscriptions: list[str], *, ordered: bool) -> None:
        self._status: list[bytearray] = []
        self._ordered = ordered
        self._books = {name: _SubscriptionBook(ordered) for name in subscriptions}
        self.sent = 0
        self.receipted = 0
        self.failed = 0
        self.errors: list[str] = []

    @property
    def subscriptions(self) -> list[str]:
        """The subscriptions the books are kept for."""
        return list(self._books)

    def add_subscription(self, name: str, *, ordered: bool | None = None) -> None:
        """Keep books for one more subscription (nothing if kept already); it must see
        every message sent from now on. ``ordered`` defaults to the ledger's."""
        if name in self._books:
            return
        self._books[name] = _SubscriptionBook(
            self._ordered if ordered is None else ordered,
            start=[len(status) for status in self._status],
        )

    # -- producers -----------------------------------------------------------------------

    def new_producer(self) -> int:
        """Register a producer; returns its number (what goes into its messages)."""
        self._status.append(bytearray())
        return len(self._status) - 1

    def sending(self, producer: int, sequence: int) -> None:
        """A producer is about to send message ``sequence`` (numbers go up by one)."""
        status = self._status[producer]
        if sequence != len(status):
            raise ValueError(f"producer {producer} sent #{sequence}, expected #{len(status)}")
        status.append(_PENDING)
        self.sent += 1

    def receipted_send(self, producer: int, sequence: int) -> None:
        """The broker stored message ``sequence`` of ``producer``."""
        self._status[producer][sequence] = _RECEIPTED
        self.receipted += 1
        for book in self._books.values():
            if book.must_see(producer, sequence):
                book.expected += 1

    def failed_send(self, producer: int, sequence: int) -> None:
        """Sending message ``sequence`` of ``producer`` failed."""
        self._status[producer][sequence] = _FAILED
        self.failed += 1

    @property
    def pending_sends(self) -> int:
        """Sends without an outcome yet."""
        return self.sent - self.receipted - self.failed

    # -- consumers -----------------------------------------------------------------------

    def delivered(
        self, subscription: str, producer: int, key: int, sequence: int, redelivery_count: int
    ) -> bool:
        """Count one message handed to the application; True on its first delivery."""
        return self._books[subscription].record(producer, key, sequence, redelivery_count)

    def unique(self, subscription: str) -> int:
        """Distinct messages ``subscription`` has seen."""
        return self._books[subscription].unique

    def total_unique(self) -> int:
        """Distinct messages seen, summed over subscriptions."""
        return sum(book.unique for book in self._books.values())

    def total_deliveries(self) -> int:
        """Every message handed to the application, redeliveries included."""
        return sum(book.deliveries for book in self._books.values())

    def caught_up(self) -> bool:
        """Whether no send is pending and every subscription saw as many distinct messages
        as were receipted (a cheap test; :meth:`verdict` checks message by message)."""
        return self.pending_sends == 0 and all(
            book.expected_seen >= book.expected for book in self._books.values()
        )

    def in_flight(self) -> int:
        """Receipted messages not yet seen, summed over subscriptions (approximate while
        sends are pending)."""
        return sum(max(0, book.expected - book.expected_seen) for book in self._books.values())

    # -- verdict -------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        """Check every message against every subscription and decide."""
        subscriptions: dict[str, SubscriptionVerdict] = {}
        for name, book in self._books.items():
            missing, unexpected = self._compare(book)
            subscriptions[name] = SubscriptionVerdict(
                deliveries=book.deliveries,
                unique=book.unique,
                in_flight=missing,
                duplicates=book.duplicates,
                redelivered=book.redelivered,
                seen_again_redelivered=book.seen_again_redelivered,
                order_violations=book.order_violations,
                order_checked=book.ordered,
                not_receipted_but_delivered=unexpected,
                examples=list(book.examples),
            )
        in_flight = sum(s.in_flight for s in subscriptions.values())
        duplicates = sum(s.duplicates for s in subscriptions.values())
        order = sum(s.order_violations for s in subscriptions.values())
        violations: list[str] = []
        if self.receipted == 0:
            violations.append("nothing was published")
        if in_flight:
            violations.append(f"{in_flight} receipted message(s) not delivered by the end")
        if duplicates:
            violations.append(f"{duplicates} duplicate deliveries (redelivery_count 0)")
        if order:
            violations.append(f"{order} per-key ordering violation(s)")
        if self.failed:
            violations.append(f"{self.failed} send(s) failed")
        if self.pending_sends:
            violations.append(f"{self.pending_sends} send(s) still waiting for a receipt")
        violations.extend(f"error: {error}" for error in self.errors)
        return Verdict(
            passed=not violations,
            violations=violations,
            sent=self.sent,
            published=self.receipted,
            publish_failed=self.failed,
            publish_pending=self.pending_sends,
            in_flight=in_flight,
            duplicates=duplicates,
            redelivered=sum(s.redelivered for s in subscriptions.values()),
            order_violations=order,
            errors=list(self.errors),
            subscriptions=subscriptions,
        )

    def _compare(self, book: _SubscriptionBook) -> tuple[int, int]:
        """(receipted messages never seen, seen messages that were never receipted)."""
        missing = unexpected = 0
        for producer, status in enumerate(self._status):
            seen = book.seen[producer] if producer < len(book.seen) else bytearray()
            first = book.start[producer] if producer < len(book.start) else 0
            for sequence, state in enumerate(status):
                was_seen = sequence < len(seen) and seen[sequence] > 0
                if state == _RECEIPTED and not was_seen and sequence >= first:
                    missing += 1
                elif state != _RECEIPTED and was_seen:
                    unexpected += 1
        return missing, unexpected
