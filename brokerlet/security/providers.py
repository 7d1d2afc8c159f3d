"""The authentication providers, each named after the Pulsar class it stands in for.

A provider turns one credential into a role, or raises :class:`AuthenticationFailed` with a
reason that is safe to log (it never repeats the credential).
"""

from __future__ import annotations

import base64
import binascii
import functools
import ssl
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from brokerlet.config import Settings, SettingsError
from brokerlet.security._keys import read_key_value

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

# PyJWT and cryptography take ~35 ms to import: only a broker with token authentication
# imports them, when its TokenProvider is made (start-up time of every other broker).

__all__ = [
    "AuthResult",
    "AuthenticationFailed",
    "AuthenticationProvider",
    "BasicProvider",
    "Credentials",
    "TlsProvider",
    "TokenProvider",
]

PeerCert = dict[str, Any]
"""A verified peer certificate as :meth:`ssl.SSLSocket.getpeercert` returns it."""


class AuthenticationFailed(Exception):  # noqa: N818 - reads as an outcome, like Pulsar's
    """A credential was refused; ``str(error)`` is the reason, safe to log and to send."""


@dataclass(frozen=True, slots=True)
class AuthResult:
    """Who a credential says the client is.

    Attributes:
        role: The role authorization checks.
        method: The provider's auth method name (``token``, ``tls``, ``basic``, ``none``).
        expires_at: When the credential expires (epoch seconds), or None if it does not.
    """

    role: str
    method: str
    expires_at: float | None = None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at


@dataclass(frozen=True, slots=True)
class Credentials:
    """One credential as a client presented it.

    Attributes:
        data: The credential bytes (CONNECT/AUTH_RESPONSE ``auth_data``, or the text after
            the HTTP scheme), or None.
        peer_cert: The client's verified TLS certificate, or None.
    """

    data: bytes | None = None
    peer_cert: PeerCert | None = None


class AuthenticationProvider(Protocol):
    method: ClassVar[str]
    class_name: ClassVar[str]

    def authenticate(self, credentials: Credentials) -> AuthResult: ...


_RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_EC_ALGORITHMS = ("ES256", "ES384", "ES512")


class TokenProvider:
    """``AuthenticationProviderToken``: JWTs checked with PyJWT.

    Signed with ``tokenSecretKey`` (HMAC) or ``tokenPublicKey`` (RSA or EC, DER or PEM, the
    formats ``pulsar tokens`` writes). ``alg: none`` is refused by construction: PyJWT only
    accepts the algorithms listed, and none is never listed. ``exp`` is checked when present
    (Pulsar does not require it); the role is the ``tokenAuthClaim`` claim.
    """

    method: ClassVar[str] = "token"
    class_name: ClassVar[str] = (
        "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
    )

    def __init__(self, settings: Settings) -> None:
        self._claim = settings.token_auth_claim
        self._audience_claim = settings.token_audience_claim or "aud"
        self._audience = settings.token_audience or None
        self._key: Any
        if settings.token_secret_key:
            self._key = read_key_value(settings.token_secret_key, "token_secret_key")
            self._algorithms = ["HS256", "HS384", "HS512"]
        elif settings.token_public_key:
            raw = read_key_value(settings.token_public_key, "token_public_key")
            from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

            self._key = _public_key(raw)
            is_ec = isinstance(self._key, ec.EllipticCurvePublicKey)
            family: tuple[str, ...] = _EC_ALGORITHMS if is_ec else _RSA_ALGORITHMS
            if settings.token_public_alg not in family:
                raise SettingsError(
                    f"token_public_alg = {settings.token_public_alg!r}: does not match the "
                    f"key in token_public_key (allowed: {', '.join(family)})",
                    key="token_public_alg",
                )
            self._algorithms = [settings.token_public_alg]
        else:
            raise SettingsError(
                "AuthenticationProviderToken needs token_secret_key (tokenSecretKey) or "
                "token_public_key (tokenPublicKey)",
                key="token_secret_key",
            )

    def authenticate(self, credentials: Credentials) -> AuthResult:
        if not credentials.data:
            raise AuthenticationFailed("no token given")
        token = credentials.data.decode("ascii", "replace").strip()
        token = token.removeprefix("Bearer ").strip()
        import jwt  # noqa: PLC0415 - see the note on the imports

        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as error:
            raise AuthenticationFailed(f"malformed token: {error}") from None
        algorithm = str(header.get("alg", ""))
        if algorithm.lower() == "none":
            raise AuthenticationFailed("unsigned token (alg: none) refused")
        if algorithm not in self._algorithms:
            raise AuthenticationFailed(f"token algorithm {algorithm!r} not accepted")
        try:
            # The audience is checked below, against the configured claim name.
            claims = jwt.decode(
                token, self._key, algorithms=self._algorithms, options={"verify_aud": False}
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("token expired") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationFailed("token signature does not verify") from None
        except jwt.InvalidTokenError as error:
            raise AuthenticationFailed(f"invalid token: {error}") from None
        if self._audience is not None:
            audience = claims.get(self._audience_claim)
            names = audience if isinstance(audience, list) else [audience]
            if self._audience not in names:
                raise AuthenticationFailed("token is not for this audience")
        role = claims.get(self._claim)
        if not isinstance(role, str) or not role:
            raise AuthenticationFailed(f"token has no {self._claim!r} claim")
        expiry = claims.get("exp")
        expires_at = float(expiry) if isinstance(expiry, int | float) else None
        return AuthResult(role, self.method, expires_at)


def _public_key(raw: bytes) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec, rsa  # noqa: PLC0415

    try:
        key = (
            serialization.load_pem_public_key(raw)
            if raw.lstrip().startswith(b"-----")
            else serialization.load_der_public_key(raw)
        )
    except ValueError as exc:
        raise SettingsError(
            "token_public_key: not a PEM or DER public key", key="token_public_key"
        ) from exc
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise SettingsError(
            "token_public_key: only RSA and EC keys are supported", key="token_public_key"
        )
    return key


class TlsProvider:
    """``AuthenticationProviderTls``: the role is the client certificate's common name."""

    method: ClassVar[str] = "tls"
    class_name: ClassVar[str] = "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"

    def __init__(self, settings: Settings) -> None:
        del settings

    def authenticate(self, credentials: Credentials) -> AuthResult:
        cert = credentials.peer_cert
        if not cert:
            raise AuthenticationFailed("no trusted client certificate")
        for rdn in cert.get("subject", ()):
            for name, value in rdn:
                if name == "commonName" and value:
                    return AuthResult(str(value), self.method, _not_after(cert))
        raise AuthenticationFailed("client certificate has no CN")


def _not_after(cert: PeerCert) -> float | None:
    text = cert.get("notAfter")
    return float(ssl.cert_time_to_seconds(text)) if isinstance(text, str) else None


@functools.cache
def _hashes() -> tuple[Any, Any]:
    """passlib's MD5-crypt and DES-crypt, imported on first use.

    passlib imports the standard library's ``crypt``, deprecated since Python 3.11: importing
    it at module level would warn in every program that imports brokerlet (and fail test
    suites run with ``-W error``), although only a broker with Basic authentication needs it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from passlib.hash import apr_md5_crypt, des_crypt  # noqa: PLC0415 - see above
    return apr_md5_crypt, des_crypt


class BasicProvider:
    """``AuthenticationProviderBasic``: ``user:password`` against an htpasswd file.

    As in Pulsar, a hash starting ``$apr1`` is Apache's MD5-crypt and anything else is
    traditional ``crypt(3)`` (DES, two-character salt). Both are checked by passlib.
    """

    method: ClassVar[str] = "basic"
    class_name: ClassVar[str] = (
        "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic"
    )

    SYSTEM_PROPERTY: ClassVar[str] = "pulsar.auth.basic.conf"

    def __init__(self, settings: Settings, system_properties: dict[str, str]) -> None:
        source = settings.basic_auth_conf or system_properties.get(self.SYSTEM_PROPERTY, "")
        if not source:
            raise SettingsError(
                "AuthenticationProviderBasic needs basic_auth_conf (basicAuthConf) or the "
                f"{self.SYSTEM_PROPERTY} system property",
                key="basic_auth_conf",
            )
        text = read_key_value(source, "basic_auth_conf").decode("utf-8", "replace")
        self._users: dict[str, str] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, colon, hashed = line.partition(":")
            if not colon or not user or not hashed:
                raise SettingsError(
                    f"basic_auth_conf line {number}: expected user:hash", key="basic_auth_conf"
                )
            self._users[user] = hashed

    def authenticate(self, credentials: Credentials) -> AuthResult:
        if not credentials.data:
            raise AuthenticationFailed("no user:password given")
        text = credentials.data.decode("utf-8", "replace")
        user, colon, password = text.partition(":")
        if not colon:
            raise AuthenticationFailed("credentials are not user:password")
        hashed = self._users.get(user)
        if hashed is None or not _password_matches(password, hashed):
            # One reason for both, so the answer does not reveal which users exist.
            raise AuthenticationFailed("unknown user or wrong password")
        return AuthResult(user, self.method)


def _password_matches(password: str, hashed: str) -> bool:
    apr_md5_crypt, des_crypt = _hashes()
    try:
        if hashed.startswith("$apr1"):
            return bool(apr_md5_crypt.verify(password, hashed))
        return bool(des_crypt.verify(password, hashed))
    except (ValueError, TypeError):
        return False  # a malformed hash in the file matches nothing


def decode_basic_header(value: str) -> bytes:
    """The ``user:password`` bytes of an ``Authorization: Basic`` value (after the scheme)."""
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("malformed Basic credentials") from None
