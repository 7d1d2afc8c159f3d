"""What a topic tells a producer's connection about access modes (brokerlet.producers.access)."""

from __future__ import annotations

from dataclasses import dataclass

from brokerlet.transport.protocol import pb

__all__ = ["ProducerAdmitted", "ProducerFenced", "ProducerReady", "ProducerRefused"]


@dataclass(frozen=True, slots=True)
class ProducerAdmitted:
    """AddProducer's answer: ``ready`` False means queued (WaitForExclusive)."""

    ready: bool
    topic_epoch: int | None
    last_sequence_id: int


@dataclass(frozen=True, slots=True)
class ProducerReady:
    """A queued WaitForExclusive producer now holds the topic: its second PRODUCER_SUCCESS."""

    producer_id: int
    topic_epoch: int | None
    last_sequence_id: int


@dataclass(frozen=True, slots=True)
class ProducerFenced:
    """An ExclusiveWithFencing producer took the topic: close this one the broker's way;
    its later SENDs are answered with ProducerFenced."""

    producer_id: int


@dataclass(frozen=True, slots=True)
class ProducerRefused:
    """A queued producer will never get the topic: fail its PRODUCER request."""

    producer_id: int
    code: pb.ServerError.ValueType
    message: str
