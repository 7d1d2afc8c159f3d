"""One connection's authentication: CONNECT, and refresh through AUTH_CHALLENGE.

As in Pulsar's ``ServerCnx``: every ``authenticationRefreshCheckSeconds`` the connection
checks whether its credential has expired. If so, a client that advertised
``supports_auth_refresh`` gets an AUTH_CHALLENGE (``auth_data`` = ``PulsarAuthRefresh``) and
must answer with a fresh credential for the same role before the next check; a client that
cannot refresh, or does not answer, is disconnected. A refused AUTH_RESPONSE gets ERROR
AuthenticationError and the connection closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import gevent

from brokerlet import __version__
from brokerlet.security.authentication import AuthenticationFailed
from brokerlet.security.authorization import Authorizer
from brokerlet.security.providers import AuthResult, PeerCert
from brokerlet.security.service import Security
from brokerlet.transport.protocol import PROTOCOL_VERSION, pb

__all__ = ["REFRESH_CHALLENGE", "CheckCredentials", "ConnectionAuth"]

log = logging.getLogger(__name__)

T = pb.BaseCommand
REFRESH_CHALLENGE: Final = b"PulsarAuthRefresh"
NO_REQUEST: Final = 2**64 - 1


class CheckCredentials:
    """Told to the connection actor by the refresh timer."""

    __slots__ = ()


CHECK_CREDENTIALS: Final = CheckCredentials()


class ConnectionAuth:
    """Authentication state of one connection.

    Args:
        security: the broker's security, or None when it has none configured.
        peer: the peer's address, for logs.
        peer_cert: the client's verified TLS certificate, or None.
        send: writes a command on the connection.
        disconnect: closes the connection, with a reason for the log.
        send_then_disconnect: writes a command and closes the connection once it is out.
    """

    def __init__(
        self,
        security: Security | None,
        peer: str,
        peer_cert: PeerCert | None,
        *,
        send: Callable[[pb.BaseCommand], None],
        disconnect: Callable[[str], None],
        send_then_disconnect: Callable[[pb.BaseCommand, str], None],
    ) -> None:
        self.security = security
        self._send_then_disconnect = send_then_disconnect
        self.peer = peer
        self.peer_cert = peer_cert
        self._send = send
        self._disconnect = disconnect
        self.result: AuthResult | None = None
        self._supports_refresh = False
        self._challenge_pending = False
        self._timer: gevent.Greenlet | None = None

    @property
    def role(self) -> str | None:
        return None if self.result is None or not self.result.role else self.result.role

    @property
    def authorizer(self) -> Authorizer | None:
        return None if self.security is None else self.security.authorizer

    def allowed(self, action: str, topic: str) -> bool:
        """Whether this connection's role may ``produce``, ``consume`` or ``lookup`` the
        topic; a refusal is logged with the role, the action and the peer."""
        authorizer = self.authorizer
        if authorizer is None or not authorizer.enabled:
            return True
        role = self.role
        checks = {
            "produce": authorizer.can_produce,
            "consume": authorizer.can_consume,
            "lookup": authorizer.can_lookup,
        }
        return authorizer.check(checks[action](role, topic), role, action, topic, self.peer)

    def connect(self, connect: pb.CommandConnect, tell: Callable[[Any], None]) -> bool:
        """Authenticate a CONNECT; on refusal answer ERROR AuthenticationError and close.

        Returns:
            Whether the connection may proceed to CONNECTED.
        """
        if self.security is None or not self.security.authentication.enabled:
            return True
        method = connect.auth_method_name or ""
        data = connect.auth_data if connect.HasField("auth_data") else None
        try:
            result = self.security.authentication.authenticate(method, data, self.peer_cert)
            if result.expired():
                raise AuthenticationFailed("credential expired")
        except AuthenticationFailed as error:
            self._refuse(method, str(error))
            return False
        self.result = result
        self._supports_refresh = connect.feature_flags.supports_auth_refresh
        log.info("%s authenticated as role %r by %s", self.peer, result.role, result.method)
        if result.expires_at is not None:
            interval = self.security.authentication.refresh_check_seconds
            self._timer = gevent.spawn(_tick, interval, tell)
        return True

    def check_expiry(self) -> None:
        """The refresh timer's tick: challenge or close a connection whose credential expired."""
        result = self.result
        if result is None or not result.expired():
            return
        if not self._supports_refresh:
            self._close("credential expired and the client cannot refresh it")
            return
        if self._challenge_pending:
            self._close("credential expired and the client did not refresh it in time")
            return
        self._challenge_pending = True
        log.info("%s: credential of role %r expired; asking for a new one", self.peer, result.role)
        self._send(
            T(
                type=T.AUTH_CHALLENGE,
                auth_challenge=pb.CommandAuthChallenge(
                    server_version=f"brokerlet-{__version__}",
                    challenge=pb.AuthData(
                        auth_method_name=result.method, auth_data=REFRESH_CHALLENGE
                    ),
                    protocol_version=PROTOCOL_VERSION,
                ),
            )
        )

    def auth_response(self, response: pb.CommandAuthResponse) -> None:
        """A client's answer to AUTH_CHALLENGE."""
        current = self.result
        if self.security is None or current is None:
            log.warning("%s sent AUTH_RESPONSE without being challenged; ignored", self.peer)
            return
        data = response.response.auth_data if response.HasField("response") else None
        method = response.response.auth_method_name or current.method
        try:
            renewed = self.security.authentication.authenticate(method, data, self.peer_cert)
            if renewed.expired():
                raise AuthenticationFailed("refreshed credential already expired")
        except AuthenticationFailed as error:
            self._refuse(method, f"refresh refused: {error}")
            return
        if renewed.role != current.role:
            self._refuse(method, f"refresh changed the role from {current.role!r}")
            return
        self.result = renewed
        self._challenge_pending = False
        log.info("%s refreshed the credential of role %r", self.peer, renewed.role)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.kill(block=False)
            self._timer = None

    def _refuse(self, method: str, reason: str) -> None:
        log.warning(
            "authentication failed for %s (method %r): %s", self.peer, method or "none", reason
        )
        self.stop()
        error = pb.CommandError(
            request_id=NO_REQUEST,
            error=pb.AuthenticationError,
            message=f"Unable to authenticate: {reason}",
        )
        self._send_then_disconnect(T(type=T.ERROR, error=error), f"authentication failed: {reason}")

    def _close(self, reason: str) -> None:
        self.stop()
        self._disconnect(reason)


def _tick(interval: float, tell: Callable[[Any], None]) -> None:
    while True:
        gevent.sleep(interval)
        try:
            tell(CHECK_CREDENTIALS)
        except Exception:  # the connection actor is gone (pykka.ActorDeadError): so are we
            return
