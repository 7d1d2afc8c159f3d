# ruff: noqa: N818 -- the official client's names, so users can switch without renaming
"""The client's exceptions, named like the official Python client's.

Every failure a client call reports is a :class:`PulsarError`. Errors the broker sent carry
its ``ServerError`` value in ``code``; errors the client detects itself (a timeout, a lost
connection, a full queue) have ``code`` None. Catching ``ConsumerBusy`` or ``Timeout`` works
the same way as catching ``pulsar.ConsumerBusy`` or ``pulsar.Timeout`` in the official client.
"""

from __future__ import annotations

from brokerlet.transport.protocol import pb

__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "ChecksumError",
    "ConnectError",
    "ConsumerAssignError",
    "ConsumerBusy",
    "ConsumerNotFound",
    "CumulativeAcknowledgementNotAllowedError",
    "IncompatibleSchema",
    "InvalidConfiguration",
    "InvalidTopicName",
    "MessageTooBig",
    "NotAllowedError",
    "NotConnected",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerQueueIsFull",
    "PulsarError",
    "ServiceUnitNotReady",
    "SubscriptionNotFound",
    "Timeout",
    "TooManyLookupRequestException",
    "TopicNotFound",
    "TopicTerminated",
    "UnknownError",
    "UnsupportedVersionError",
    "error_for_code",
]


class PulsarError(Exception):
    """Base of every error the client raises or passes to a callback.

    Attributes:
        code: the broker's ``ServerError`` value, or None for errors found by the client.
        message: a human-readable description.
    """

    code: int | None = None

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message
        if code is not None:
            self.code = code


# Errors the broker reports (``code`` is their ServerError value).


class UnknownError(PulsarError):
    code = pb.UnknownError


class BrokerMetadataError(PulsarError):
    code = pb.MetadataError


class BrokerPersistenceError(PulsarError):
    code = pb.PersistenceError


class AuthenticationError(PulsarError):
    code = pb.AuthenticationError


class AuthorizationError(PulsarError):
    code = pb.AuthorizationError


class ConsumerBusy(PulsarError):
    """An Exclusive subscription already has a consumer, or the subscription type differs."""

    code = pb.ConsumerBusy


class ServiceUnitNotReady(PulsarError):
    """The broker is not (yet) serving the topic; retrying later usually works."""

    code = pb.ServiceNotReady


class ProducerBlockedQuotaExceededError(PulsarError):
    code = pb.ProducerBlockedQuotaExceededError


class ProducerBlockedQuotaExceededException(PulsarError):
    code = pb.ProducerBlockedQuotaExceededException


class ChecksumError(PulsarError):
    """The broker found the message corrupted; only that message failed."""

    code = pb.ChecksumError


class UnsupportedVersionError(PulsarError):
    code = pb.UnsupportedVersionError


class TopicNotFound(PulsarError):
    code = pb.TopicNotFound


class SubscriptionNotFound(PulsarError):
    code = pb.SubscriptionNotFound


class ConsumerNotFound(PulsarError):
    code = pb.ConsumerNotFound


class TooManyLookupRequestException(PulsarError):
    code = pb.TooManyRequests


class TopicTerminated(PulsarError):
    code = pb.TopicTerminatedError


class ProducerBusy(PulsarError):
    code = pb.ProducerBusy


class InvalidTopicName(PulsarError):
    code = pb.InvalidTopicName


class IncompatibleSchema(PulsarError):
    code = pb.IncompatibleSchema


class ConsumerAssignError(PulsarError):
    code = pb.ConsumerAssignError


class NotAllowedError(PulsarError):
    code = pb.NotAllowedError


class ProducerFenced(PulsarError):
    code = pb.ProducerFenced


# Errors the client finds itself.


class Timeout(PulsarError):
    """A request, a send or a receive did not complete in time."""


class ConnectError(PulsarError):
    """The connection to a broker could not be made, or was lost."""


class NotConnected(PulsarError):
    """The producer or consumer has no connection right now."""


class AlreadyClosed(PulsarError):
    """The client, producer or consumer is closed."""


class InvalidConfiguration(PulsarError):
    """An argument is out of range or a URL cannot be used."""


class ProducerQueueIsFull(PulsarError):
    """``max_pending_messages`` are already waiting for receipts."""


class MessageTooBig(PulsarError):
    """The message is larger than the broker's ``max_message_size``."""


class CumulativeAcknowledgementNotAllowedError(PulsarError):
    """Cumulative acks are refused for Shared and Key_Shared subscriptions."""


_BY_CODE: dict[int, type[PulsarError]] = {
    cls.code: cls
    for cls in (
        UnknownError,
        BrokerMetadataError,
        BrokerPersistenceError,
        AuthenticationError,
        AuthorizationError,
        ConsumerBusy,
        ServiceUnitNotReady,
        ProducerBlockedQuotaExceededError,
        ProducerBlockedQuotaExceededException,
        ChecksumError,
        UnsupportedVersionError,
        TopicNotFound,
        SubscriptionNotFound,
        ConsumerNotFound,
        TooManyLookupRequestException,
        TopicTerminated,
        ProducerBusy,
        InvalidTopicName,
        IncompatibleSchema,
        ConsumerAssignError,
        NotAllowedError,
        ProducerFenced,
    )
    if cls.code is not None
}


def error_for_code(code: int, message: str) -> PulsarError:
    """The exception for a ``ServerError`` the broker sent.

    Args:
        code: the ``ServerError`` value.
        message: the broker's message.

    Returns:
        An instance of the matching subclass, or of :class:`PulsarError` with ``code`` set
        for values without a class of their own (the transaction errors, say).
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        return PulsarError(message, code)
    return cls(message)
