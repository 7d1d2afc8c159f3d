"""The configured authentication providers and how a credential picks one.

As in Pulsar's ``ServerCnx.handleConnect``: the CONNECT's ``auth_method_name`` names the
provider; a method no provider serves (or none at all) gets ``anonymousUserRole`` when that
is set and is refused otherwise. Over HTTP, ``Authorization: Bearer`` goes to the token
provider, ``Basic`` to the Basic provider, and a verified client certificate to the TLS one.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping
from typing import Final

from brokerlet.config import Settings, SettingsError
from brokerlet.security.providers import (
    AuthenticationFailed,
    AuthenticationProvider,
    AuthResult,
    BasicProvider,
    Credentials,
    PeerCert,
    TlsProvider,
    TokenProvider,
    decode_basic_header,
)

__all__ = ["Authentication", "AuthenticationFailed", "system_properties"]

log = logging.getLogger(__name__)

_PROVIDERS: Final[dict[str, type]] = {
    cls.class_name: cls for cls in (TokenProvider, TlsProvider, BasicProvider)
}


def system_properties(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``-Dkey=value`` pairs from ``PULSAR_EXTRA_OPTS`` (how Pulsar users pass JVM properties)."""
    text = (os.environ if environ is None else environ).get("PULSAR_EXTRA_OPTS", "")
    properties: dict[str, str] = {}
    for word in shlex.split(text):
        if word.startswith("-D"):
            key, _, value = word[2:].partition("=")
            properties[key] = value
    return properties


class Authentication:
    """The authentication a broker applies, built from its settings.

    Raises:
        SettingsError: at construction, for a provider brokerlet does not implement, a
            provider whose keys are missing or unreadable, or authentication enabled with no
            provider and no anonymous role.
    """

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        self.enabled = settings.authentication_enabled
        self.anonymous_role = settings.anonymous_user_role or None
        self.refresh_check_seconds = settings.authentication_refresh_check_seconds
        self.providers: dict[str, AuthenticationProvider] = {}
        if not self.enabled:
            return
        names = [n.strip() for n in settings.authentication_providers.split(",") if n.strip()]
        for name in names:
            cls = _PROVIDERS.get(name)
            if cls is None:
                allowed = ", ".join(sorted(_PROVIDERS))
                raise SettingsError(
                    f"authentication_providers: {name!r} is not supported "
                    f"(authentication is enabled; supported: {allowed})",
                    key="authentication_providers",
                )
            provider: AuthenticationProvider
            if cls is BasicProvider:
                provider = BasicProvider(settings, system_properties(environ))
            elif cls is TokenProvider:
                provider = TokenProvider(settings)
            else:
                provider = TlsProvider(settings)
            self.providers[provider.method] = provider
        if not self.providers and self.anonymous_role is None:
            raise SettingsError(
                "authentication_enabled = true with no authentication_providers and no "
                "anonymous_user_role would refuse every client",
                key="authentication_providers",
            )

    def authenticate(
        self, method: str, data: bytes | None, peer_cert: PeerCert | None
    ) -> AuthResult:
        """Check one binary-protocol credential.

        Raises:
            AuthenticationFailed: the provider refused it, or no provider serves ``method``
                and there is no anonymous role.
        """
        if not self.enabled:
            return AuthResult("", "none")
        provider = self.providers.get(method)
        if provider is None:
            if self.anonymous_role is not None:
                return AuthResult(self.anonymous_role, "none")
            shown = method or "none"
            raise AuthenticationFailed(
                f"no authentication provider for method {shown!r}, and no anonymous role"
            )
        return provider.authenticate(Credentials(data, peer_cert))

    def authenticate_http(
        self, headers: Mapping[str, str], peer_cert: PeerCert | None
    ) -> str | None:
        """The role of one HTTP request; None when authentication is off.

        Args:
            headers: The request headers (any mapping whose keys match case-insensitively
                or are title-cased, like Werkzeug's).
            peer_cert: The verified client certificate of an HTTPS request, or None.

        Raises:
            AuthenticationFailed: the credentials are refused, or there are none and no
                anonymous role.
        """
        if not self.enabled:
            return None
        header = _header(headers, "Authorization")
        if header:
            scheme, _, value = header.strip().partition(" ")
            scheme = scheme.lower()
            if scheme == "bearer" and "token" in self.providers:
                return self.providers["token"].authenticate(Credentials(value.encode())).role
            if scheme == "basic" and "basic" in self.providers:
                data = decode_basic_header(value)
                return self.providers["basic"].authenticate(Credentials(data)).role
            raise AuthenticationFailed(f"unsupported Authorization scheme {scheme!r}")
        if peer_cert and "tls" in self.providers:
            return self.providers["tls"].authenticate(Credentials(None, peer_cert)).role
        if self.anonymous_role is not None:
            return self.anonymous_role
        raise AuthenticationFailed("no credentials, and no anonymous role")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        for key, candidate in headers.items():
            if key.lower() == lowered:
                return candidate
    return value
