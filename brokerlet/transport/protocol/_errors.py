"""The one exception the codec raises for bad input."""

from __future__ import annotations

__all__ = ["ProtocolError"]


class ProtocolError(Exception):
    """The peer sent bytes that break the Pulsar wire format.

    The connection that received them cannot be trusted to stay in sync and should be
    closed.

    Attributes:
        reason: Human-readable description naming what was wrong.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
