"""Pulsar's security model: authentication providers and authorization.

* :mod:`~brokerlet.security.providers`: the token (JWT), TLS client-certificate and Basic
  (htpasswd) providers, by Pulsar's class names.
* :class:`~brokerlet.security.authentication.Authentication`: the configured providers,
  anonymous role, CONNECT and HTTP credentials.
* :mod:`~brokerlet.security.session`: one connection's authentication, with token refresh
  through AUTH_CHALLENGE / AUTH_RESPONSE.
* :mod:`~brokerlet.security.authorization`: super users, tenant admins and namespace
  permissions over a :class:`~brokerlet.security.authorization.PolicySource`.

Credentials never reach a log record: messages name the peer, the method and the reason.
"""

from brokerlet.security.authentication import Authentication, AuthenticationFailed
from brokerlet.security.authorization import (
    AuthAction,
    Authorizer,
    InMemoryPolicies,
    PolicySource,
    PolicyStore,
)
from brokerlet.security.providers import AuthResult

__all__ = [
    "AuthAction",
    "AuthResult",
    "Authentication",
    "AuthenticationFailed",
    "Authorizer",
    "InMemoryPolicies",
    "PolicySource",
    "PolicyStore",
]
