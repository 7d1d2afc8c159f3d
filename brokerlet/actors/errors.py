"""Errors that travel back to a client as a Pulsar ServerError."""

from __future__ import annotations

from brokerlet.transport.protocol import pb

__all__ = ["BrokerError"]


class BrokerError(Exception):
    """A refused request: ``code`` is a ``ServerError`` value, ``message`` goes to the client."""

    def __init__(self, code: pb.ServerError.ValueType, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def consumer_busy(cls, message: str) -> BrokerError:
        return cls(pb.ConsumerBusy, message)

    @classmethod
    def not_allowed(cls, message: str) -> BrokerError:
        return cls(pb.NotAllowedError, message)
