"""TLS for the listeners: one server context from Pulsar's TLS settings.

The context is the standard library's; sockets are wrapped with gevent's cooperative
``SSLSocket`` by :func:`wrap_server_socket`, and the handshake runs under a timeout in the
connection's own greenlet, so a client that never finishes it costs one greenlet for a few
seconds and nothing else.

Client certificates: with ``tlsRequireTrustedClientCertOnConnect`` a client must present one
signed by a CA in ``tlsTrustCertsFilePath``; otherwise one is asked for but optional (so the
TLS authentication provider can use it). ``tlsAllowInsecureConnection`` stops asking at all:
Python's ``ssl`` cannot accept an untrusted certificate and still report it, so with that
setting the TLS provider has no certificate to read.
"""

from __future__ import annotations

import ssl
from typing import Any, Final

import gevent
import gevent.ssl

from brokerlet.config import Settings, SettingsError

__all__ = ["TlsHandshakeFailed", "peer_certificate", "server_context", "wrap_server_socket"]

_VERSIONS: Final = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}


class TlsHandshakeFailed(Exception):  # noqa: N818 - an outcome, logged with the peer
    """The TLS handshake failed or timed out; ``str()`` says why."""


def server_context(settings: Settings) -> ssl.SSLContext:
    """A server-side context for both TLS listeners.

    Raises:
        SettingsError: the certificate or key is missing or unreadable, the trust file is
            unreadable, or ``tls_protocols`` / ``tls_ciphers`` name nothing usable.
    """
    if not settings.tls_certificate_file_path or not settings.tls_key_file_path:
        raise SettingsError(
            "a TLS port needs tls_certificate_file_path (tlsCertificateFilePath) and "
            "tls_key_file_path (tlsKeyFilePath)",
            key="tls_certificate_file_path",
        )
    context: ssl.SSLContext = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.tls_certificate_file_path, settings.tls_key_file_path)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(
            f"tls_certificate_file_path / tls_key_file_path: cannot load "
            f"{settings.tls_certificate_file_path!r} with its key: {exc}",
            key="tls_certificate_file_path",
        ) from exc
    if settings.tls_trust_certs_file_path:
        try:
            context.load_verify_locations(settings.tls_trust_certs_file_path)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(
                f"tls_trust_certs_file_path = {settings.tls_trust_certs_file_path!r}: {exc}",
                key="tls_trust_certs_file_path",
            ) from exc
    if settings.tls_allow_insecure_connection:
        context.verify_mode = ssl.CERT_NONE
    elif settings.tls_require_trusted_client_cert_on_connect:
        context.verify_mode = ssl.CERT_REQUIRED
    elif settings.tls_trust_certs_file_path:
        context.verify_mode = ssl.CERT_OPTIONAL
    _apply_protocols(context, settings.tls_protocols)
    if settings.tls_ciphers.strip():
        names = ":".join(c.strip() for c in settings.tls_ciphers.split(",") if c.strip())
        try:
            context.set_ciphers(names)
        except ssl.SSLError as exc:
            raise SettingsError(
                f"tls_ciphers = {settings.tls_ciphers!r}: no usable cipher (OpenSSL names)",
                key="tls_ciphers",
            ) from exc
    return context


def _apply_protocols(context: ssl.SSLContext, protocols: str) -> None:
    names = [p.strip() for p in protocols.split(",") if p.strip()]
    if not names:
        return
    versions = []
    for name in names:
        version = _VERSIONS.get(name.lower())
        if version is None:
            raise SettingsError(
                f"tls_protocols: {name!r} is not one of TLSv1.2, TLSv1.3 (or TLSv1, TLSv1.1)",
                key="tls_protocols",
            )
        versions.append(version)
    context.minimum_version = min(versions)
    context.maximum_version = max(versions)


def wrap_server_socket(context: ssl.SSLContext, sock: Any, timeout: float) -> Any:
    """Wrap an accepted socket and complete the handshake within ``timeout`` seconds.

    Returns:
        The gevent ``SSLSocket``.

    Raises:
        TlsHandshakeFailed: the handshake failed (a plain-text client, an untrusted or
            missing certificate, no shared protocol) or took too long.
    """
    try:
        tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    except (OSError, ValueError) as exc:
        raise TlsHandshakeFailed(f"cannot start TLS: {exc}") from exc
    try:
        with gevent.Timeout(timeout, TlsHandshakeFailed(f"handshake not done in {timeout} s")):
            tls.do_handshake()
    except ssl.SSLError as exc:
        tls.close()
        raise TlsHandshakeFailed(exc.reason or str(exc)) from exc
    except (OSError, TlsHandshakeFailed) as exc:
        tls.close()
        if isinstance(exc, TlsHandshakeFailed):
            raise
        raise TlsHandshakeFailed(f"socket error during handshake: {exc}") from exc
    return tls


def peer_certificate(tls: Any) -> dict[str, Any] | None:
    """The verified client certificate of a handshaken socket, or None."""
    cert = tls.getpeercert()
    return dict(cert) if cert else None
