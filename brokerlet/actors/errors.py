"""Errors that travel back to a client as a Pulsar ServerError."""

from __future__ import annotations

from brokerlet.metadata.naming import TopicName
from brokerlet.metadata.topics import Refused
from brokerlet.transport.protocol import pb

__all__ = ["BrokerError", "parsed_topic"]


class BrokerError(Exception):
    """A refused request: ``code`` is a ``ServerError`` value, ``message`` goes to the client."""

    def __init__(self, code: pb.ServerError.ValueType, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def refused(cls, refusal: Refused) -> BrokerError:
        """A metadata rule's refusal (its code is a ServerError name)."""
        return cls(pb.ServerError.Value(refusal.code), refusal.message)

    @classmethod
    def consumer_busy(cls, message: str) -> BrokerError:
        return cls(pb.ConsumerBusy, message)

    @classmethod
    def not_allowed(cls, message: str) -> BrokerError:
        return cls(pb.NotAllowedError, message)


def parsed_topic(name: str) -> TopicName:
    """``name`` parsed; BrokerError InvalidTopicName when it is malformed."""
    try:
        return TopicName.parse(name)
    except ValueError as error:
        raise BrokerError(pb.InvalidTopicName, str(error)) from None
