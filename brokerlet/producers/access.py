"""Producer access modes and the topic epoch, as Pulsar's AbstractTopic applies them.

- ``Shared``: any number of producers, refused (ProducerBusy) while an exclusive producer
  holds the topic or waits for it.
- ``Exclusive``: refused (ProducerFenced, as Pulsar) while any producer is there or waits.
- ``WaitForExclusive``: queued, in arrival order, until it is the only producer.
- ``ExclusiveWithFencing``: takes the topic; every current producer is fenced, every waiting
  one refused.

Each exclusive producer's admission moves the topic epoch on (or sets it to the epoch the
producer presents); a producer presenting an epoch older than the topic's is fenced: a newer
exclusive producer came in between. The epoch starts at 0 on a topic's first exclusive
producer, as in Pulsar (``incrementTopicEpoch`` of an absent epoch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from brokerlet.actors.errors import BrokerError
from brokerlet.transport.protocol import pb

__all__ = ["SHARED", "Admission", "ProducerAccess", "ProducerEntry", "mode_name"]

SHARED = pb.Shared
EXCLUSIVE = pb.Exclusive
WAIT_FOR_EXCLUSIVE = pb.WaitForExclusive
EXCLUSIVE_WITH_FENCING = pb.ExclusiveWithFencing

_MODE_NAMES: dict[int, str] = {
    SHARED: "Shared",
    EXCLUSIVE: "Exclusive",
    WAIT_FOR_EXCLUSIVE: "WaitForExclusive",
    EXCLUSIVE_WITH_FENCING: "ExclusiveWithFencing",
}


def mode_name(mode: int) -> str:
    name = _MODE_NAMES.get(mode)
    return str(mode) if name is None else name


@dataclass(slots=True, eq=False)
class ProducerEntry:
    """One producer as its topic knows it; ``key`` is its identity across connections."""

    name: str
    peer: str
    connection: Any  # the connection actor: told when the producer is ready or fenced
    producer_id: int
    access_mode: int = SHARED
    topic_epoch: int | None = None  # the epoch the producer presented
    connected_since: str = ""

    @property
    def key(self) -> tuple[int, int]:
        return id(self.connection), self.producer_id


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to a producer's arrival.

    ``ready`` False: it waits (WaitForExclusive); it is handed back by `remove` once it holds
    the topic. ``fenced``: producers it displaced (ExclusiveWithFencing), to be closed.
    ``refused``: waiting producers it displaced, to be failed with ProducerFenced.
    """

    ready: bool
    epoch: int | None
    fenced: tuple[ProducerEntry, ...] = ()
    refused: tuple[ProducerEntry, ...] = ()


class ProducerAccess:
    """Who produces on one topic: the connected producers, the waiting ones, the epoch."""

    def __init__(self, epoch: int | None = None, max_producers: int = 0) -> None:
        self.epoch = epoch
        self.max_producers = max_producers
        self.producers: dict[str, ProducerEntry] = {}  # name -> producer, in arrival order
        self.waiting: deque[ProducerEntry] = deque()
        self.exclusive: str | None = None  # the name of the exclusive holder
        self._by_key: dict[tuple[int, int], ProducerEntry] = {}
        self._fenced: set[tuple[int, int]] = set()

    def __len__(self) -> int:
        return len(self.producers) + len(self.waiting)

    def get(self, key: tuple[int, int]) -> ProducerEntry | None:
        return self._by_key.get(key)

    def is_fenced(self, key: tuple[int, int]) -> bool:
        return key in self._fenced

    def add(self, producer: ProducerEntry) -> Admission:
        """Admit ``producer`` or raise BrokerError with Pulsar's code and reason."""
        name = producer.name
        if name in self.producers or any(w.name == name for w in self.waiting):
            raise BrokerError(pb.ProducerBusy, f"Producer with name {name!r} is already connected")
        if self.max_producers and len(self) >= self.max_producers:
            raise BrokerError(
                pb.ProducerBusy,
                f"Topic reached max producers limit ({self.max_producers})",
            )
        mode = producer.access_mode
        held = self.exclusive is not None
        if mode == SHARED:
            if held or self.waiting:
                raise BrokerError(
                    pb.ProducerBusy,
                    f"Topic has an existing exclusive producer: {self._holder()}",
                )
            self._register(producer)
            return Admission(True, self.epoch)
        self._check_epoch(producer)
        fenced: tuple[ProducerEntry, ...] = ()
        refused: tuple[ProducerEntry, ...] = ()
        if mode == EXCLUSIVE:
            if held or self.waiting:
                raise BrokerError(
                    pb.ProducerFenced,
                    f"Topic has an existing exclusive producer: {self._holder()}",
                )
            if self.producers:
                raise BrokerError(pb.ProducerFenced, "Topic has existing shared producers")
        elif mode == WAIT_FOR_EXCLUSIVE:
            if held or self.producers or self.waiting:
                self.waiting.append(producer)
                self._by_key[producer.key] = producer
                return Admission(False, None)
        elif mode == EXCLUSIVE_WITH_FENCING:
            fenced = tuple(self.producers.values())
            refused = tuple(self.waiting)
            for displaced in (*fenced, *refused):
                self._fence(displaced)
            self.producers.clear()
            self.waiting.clear()
            self.exclusive = None
        else:
            raise BrokerError(pb.NotAllowedError, f"Unknown producer access mode {mode}")
        self._take(producer)
        return Admission(True, self.epoch, fenced, refused)

    def remove(self, key: tuple[int, int]) -> tuple[ProducerEntry | None, list[ProducerEntry]]:
        """Forget a producer (closed or disconnected).

        Returns it (None if it was not here, or was fenced) and the waiters that now hold
        the topic.
        """
        self._fenced.discard(key)
        producer = self._by_key.pop(key, None)
        if producer is None:
            return None, []
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
            if self.exclusive == producer.name:
                self.exclusive = None
        else:
            self.waiting = deque(w for w in self.waiting if w is not producer)
        return producer, self._promote()

    def find(self, name: str) -> ProducerEntry | None:
        producer = self.producers.get(name)
        if producer is None:
            producer = next((w for w in self.waiting if w.name == name), None)
        return producer

    def clear(self) -> list[ProducerEntry]:
        """Forget every producer (the topic closes its clients); return them all."""
        everyone = [*self.producers.values(), *self.waiting]
        self.producers.clear()
        self.waiting.clear()
        self._by_key.clear()
        self._fenced.clear()
        self.exclusive = None
        return everyone

    def _promote(self) -> list[ProducerEntry]:
        if self.producers or self.exclusive is not None or not self.waiting:
            return []
        candidate = self.waiting.popleft()
        self._take(candidate)  # as Pulsar's handleProducerRemoved: its epoch, or the next
        return [candidate]

    def _take(self, producer: ProducerEntry) -> None:
        if producer.topic_epoch is not None:
            self.epoch = producer.topic_epoch
        else:
            self.epoch = 0 if self.epoch is None else self.epoch + 1
        self.exclusive = producer.name
        self._register(producer)

    def _register(self, producer: ProducerEntry) -> None:
        self.producers[producer.name] = producer
        self._by_key[producer.key] = producer

    def _fence(self, producer: ProducerEntry) -> None:
        self._by_key.pop(producer.key, None)
        self._fenced.add(producer.key)

    def _check_epoch(self, producer: ProducerEntry) -> None:
        presented = producer.topic_epoch
        if presented is not None and self.epoch is not None and presented < self.epoch:
            raise BrokerError(
                pb.ProducerFenced,
                f"Topic epoch has already moved. Current epoch: {self.epoch}, "
                f"Producer epoch: {presented}",
            )

    def _holder(self) -> str:
        if self.exclusive is not None:
            return self.exclusive
        return self.waiting[0].name if self.waiting else ""
