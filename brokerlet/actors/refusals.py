"""How a connection refuses what it will not serve, and how it says so without flooding logs.

- A request naming something in invalid UTF-8 is answered with ``InvalidTopicName`` (a topic
  field) or ``NotAllowedError`` (any other name), in the request's own response type.
- A known request that brokerlet does not implement yet is answered with
  ``NotAllowedError``, which the official client turns into a prompt failure (a retryable
  error would keep it waiting for its operation timeout).
- A warning a peer can repeat at will (FLOW for an unknown consumer, say) is logged the first
  time, then counted, and the count logged once when the connection closes.
"""

from __future__ import annotations

import logging
from typing import Any

from brokerlet.transport.protocol import command_body, encode_command, pb
from brokerlet.transport.protocol._unsupported import encode_unsupported_reply

__all__ = ["RepeatedWarning", "refuse_invalid_text", "refuse_unsupported", "request_id_of"]

T = pb.BaseCommand


def request_id_of(command: pb.BaseCommand) -> int | None:
    """The request id of a command the client waits an answer for, or None."""
    body = command_body(command)
    if body is None or "request_id" not in body.DESCRIPTOR.fields_by_name:
        return None
    request_id: int = getattr(body, "request_id")  # noqa: B009 - checked to exist above
    return request_id


def refuse_invalid_text(command: pb.BaseCommand, field: str) -> bytes | None:
    """The answer refusing a request whose string ``field`` is not UTF-8; None: disconnect."""
    request_id = request_id_of(command)
    if request_id is None:
        return None
    is_topic = field.rsplit(".", 1)[-1] == "topic"
    code = pb.InvalidTopicName if is_topic else pb.NotAllowedError
    message = f"{'Invalid topic name' if is_topic else 'Invalid name'}: {field} is not UTF-8"
    kind = command.type
    if kind == T.LOOKUP:
        lookup = pb.CommandLookupTopicResponse(
            request_id=request_id,
            response=pb.CommandLookupTopicResponse.Failed,
            error=code,
            message=message,
        )
        return encode_command(T(type=T.LOOKUP_RESPONSE, lookup_response=lookup))
    if kind == T.PARTITIONED_METADATA:
        metadata = pb.CommandPartitionedTopicMetadataResponse(
            request_id=request_id,
            response=pb.CommandPartitionedTopicMetadataResponse.Failed,
            error=code,
            message=message,
        )
        return encode_command(
            T(type=T.PARTITIONED_METADATA_RESPONSE, partitioned_metadata_response=metadata)
        )
    error = pb.CommandError(request_id=request_id, error=code, message=message)
    return encode_command(T(type=T.ERROR, error=error))


def refuse_unsupported(command: pb.BaseCommand) -> bytes | None:
    """The error answering a known, unimplemented request; None if it expects no answer."""
    name = pb.BaseCommand.Type.Name(command.type)
    return encode_unsupported_reply(
        command, pb.NotAllowedError, f"{name} is not supported by brokerlet yet"
    )


class RepeatedWarning:
    """A warning logged once per connection, then counted; the count is logged at close."""

    def __init__(self, log: logging.Logger, peer: str, what: str) -> None:
        self._log = log
        self._peer = peer
        self._what = what
        self.count = 0

    def warn(self, message: str, *args: Any) -> None:
        self.count += 1
        if self.count == 1:
            self._log.warning(message + " (further ones are counted)", *args)
        else:
            self._log.debug(message, *args)

    def summarise(self) -> None:
        """Log the count of the warnings not logged, if any (call once, at close)."""
        if self.count > 1:
            self._log.warning(
                "%s: %d more commands %s were ignored", self._peer, self.count - 1, self._what
            )
        self.count = 0
