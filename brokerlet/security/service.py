"""One object carrying a broker's authentication and authorization."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from brokerlet.config import Settings
from brokerlet.security.authentication import Authentication
from brokerlet.security.authorization import Authorizer, InMemoryPolicies, PolicySource

__all__ = ["Security"]


@dataclass(frozen=True, slots=True)
class Security:
    """What the listeners and the admin API check.

    Attributes:
        authentication: the providers and the anonymous role.
        authorizer: super users, tenant admins and namespace permissions.
    """

    authentication: Authentication
    authorizer: Authorizer

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        policies: PolicySource | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Security:
        """Build and check both halves.

        Raises:
            SettingsError: an unsupported provider, or a provider's keys are missing.
        """
        return cls(
            Authentication(settings, environ),
            Authorizer.from_settings(settings, policies or InMemoryPolicies()),
        )
