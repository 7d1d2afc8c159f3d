"""Authorization rules, HTTP credentials and TLS settings, without a broker (issue 17)."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import jwt
import pytest
from passlib.hash import apr_md5_crypt

from brokerlet import Broker
from brokerlet.admin.rest import RestError, Route
from brokerlet.config import Settings, SettingsError
from brokerlet.security import AuthAction, Authentication, AuthenticationFailed, Authorizer
from brokerlet.security.authorization import (
    InMemoryPolicies,
    NamespaceNotFound,
    PulsarShapedPolicies,
)
from brokerlet.security.http import RouteRefused, admin_guard, check_route
from brokerlet.security.service import Security
from brokerlet.testing.rawclient import ConnectionClosed, RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.tls import server_context
from tests.tlscerts import Pki, tls_listener_address

PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProvider"
SECRET = b"k" * 32


def policies() -> InMemoryPolicies:
    store = InMemoryPolicies()
    store.add_tenant("acme", ["acme-admin"])
    store.add_namespace("acme", "app")
    store.grant("acme", "app", "writer", {AuthAction.PRODUCE})
    store.grant("acme", "app", "reader", {AuthAction.CONSUME})
    return store


def authorizer(enabled: bool = True) -> Authorizer:
    return Authorizer(enabled=enabled, super_user_roles=["root"], policies=policies())


TOPIC = "persistent://acme/app/t"


def test_pulsar_authorization_rules() -> None:
    rules = authorizer()
    assert rules.can_produce("writer", TOPIC)
    assert not rules.can_consume("writer", TOPIC)
    assert rules.can_consume("reader", TOPIC)
    assert not rules.can_produce("reader", TOPIC)
    assert rules.can_lookup("reader", TOPIC), "lookup needs produce or consume"
    assert not rules.can_lookup("stranger", TOPIC)
    assert not rules.can_lookup(None, TOPIC)
    # tenant admins come first in allowTopicOperationAsync; super users may do everything
    assert rules.can_produce("acme-admin", TOPIC)
    assert not rules.can_produce("acme-admin", "persistent://public/default/t")
    assert rules.can_produce("root", "persistent://other/ns/t")
    assert authorizer(enabled=False).can_produce(None, TOPIC)


def test_grants_replace_and_revokes_remove() -> None:
    store = policies()
    store.grant("acme", "app", "writer", {AuthAction.CONSUME})
    assert store.namespace_permissions("acme", "app")["writer"] == {AuthAction.CONSUME}
    store.revoke("acme", "app", "writer")
    assert "writer" not in (store.namespace_permissions("acme", "app") or {})
    with pytest.raises(NamespaceNotFound):
        store.grant("acme", "missing", "x", {AuthAction.PRODUCE})
    assert store.namespace_permissions("acme", "missing") is None


def test_route_levels() -> None:
    security = Security(Authentication(Settings()), authorizer())
    args = {"tenant": "acme", "namespace": "app"}
    check_route(security, "tenant", "acme-admin", args)
    check_route(security, "produce", "writer", args)
    check_route(security, "lookup", "reader", args)
    check_route(security, "none", None, args)
    for level, role in [("tenant", "writer"), ("super", "acme-admin"), ("consume", "writer")]:
        with pytest.raises(RouteRefused):
            check_route(security, level, role, args)


def basic_settings(**extra: object) -> Settings:
    users = f"alice:{apr_md5_crypt.hash('pw')}\n".encode()
    return Settings(
        authentication_enabled=True,
        authentication_providers=f"{PROVIDER}Token,{PROVIDER}Basic",
        token_secret_key="data:;base64," + base64.b64encode(SECRET).decode(),
        basic_auth_conf="data:;base64," + base64.b64encode(users).decode(),
        **extra,  # type: ignore[arg-type]
    )


def test_http_credentials() -> None:
    auth = Authentication(basic_settings())
    token = jwt.encode({"sub": "svc"}, SECRET, "HS256")
    assert auth.authenticate_http({"Authorization": f"Bearer {token}"}, None) == "svc"
    basic = base64.b64encode(b"alice:pw").decode()
    assert auth.authenticate_http({"authorization": f"Basic {basic}"}, None) == "alice"
    for headers, reason in [
        ({"Authorization": f"Basic {base64.b64encode(b'alice:no').decode()}"}, "wrong password"),
        ({"Authorization": "Negotiate abc"}, "unsupported Authorization scheme"),
        ({}, "no credentials, and no anonymous role"),
    ]:
        with pytest.raises(AuthenticationFailed, match=reason):
            auth.authenticate_http(headers, None)
    anonymous = Authentication(basic_settings(anonymous_user_role="guest"))
    assert anonymous.authenticate_http({}, None) == "guest"
    assert Authentication(Settings()).authenticate_http({}, None) is None


def test_basic_conf_from_the_pulsar_system_property(tmp_path: Path) -> None:
    users = tmp_path / "htpasswd"
    users.write_text(f"bob:{apr_md5_crypt.hash('pw')}\n")
    settings = Settings(authentication_enabled=True, authentication_providers=f"{PROVIDER}Basic")
    with pytest.raises(SettingsError, match=r"pulsar\.auth\.basic\.conf"):
        Authentication(settings, environ={})
    auth = Authentication(
        settings, environ={"PULSAR_EXTRA_OPTS": f"-Xmx1g -Dpulsar.auth.basic.conf={users}"}
    )
    assert auth.authenticate("basic", b"bob:pw", None).role == "bob"


def test_tls_settings_errors(pki: Pki) -> None:
    with pytest.raises(SettingsError, match="needs tls_certificate_file_path"):
        server_context(Settings(broker_service_port_tls=0))
    with pytest.raises(SettingsError, match="cannot load"):
        server_context(
            Settings(tls_certificate_file_path=pki.broker.key, tls_key_file_path=pki.broker.key)
        )
    base = {"tls_certificate_file_path": pki.broker.cert, "tls_key_file_path": pki.broker.key}
    with pytest.raises(SettingsError, match="tls_protocols: 'SSLv3'"):
        server_context(Settings(tls_protocols="TLSv1.3,SSLv3", **base))  # type: ignore[arg-type]
    context = server_context(Settings(tls_protocols="TLSv1.2", **base))  # type: ignore[arg-type]
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(SettingsError, match="tls_ciphers"):
        server_context(Settings(tls_ciphers="NO-SUCH-CIPHER", **base))  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="needs tls_certificate_file_path"):
        Broker(port=0, web_service_port_tls=0)


def test_a_required_client_certificate_is_enforced_at_the_handshake(pki: Pki) -> None:
    with Broker(
        port=0,
        tls_trust_certs_file_path=pki.ca,
        tls_require_trusted_client_cert_on_connect=True,
        **pki.tls_listener(),
    ) as broker:
        address = tls_listener_address(broker)
        with RawClient(address, tls=pki.client_context(pki.client)) as trusted:
            trusted.handshake()
        with (
            pytest.raises((ssl.SSLError, OSError, ConnectionClosed)),  # refused at the handshake
            RawClient(address, tls=pki.client_context(), timeout=3) as anonymous,
        ):
            anonymous.handshake()


def test_inline_secrets_stay_out_of_the_settings_repr() -> None:
    settings = Settings(token_secret_key="data:;base64,c2VjcmV0c2VjcmV0", basic_auth_conf="x")
    assert "c2VjcmV0c2VjcmV0" not in repr(settings)
    assert "token_auth_claim='sub'" in repr(settings)


def test_pulsar_shaped_documents_serve_as_a_policy_store() -> None:
    """How the metadata store plugs in: TenantInfo and Policies as the admin API shapes them."""
    tenants = {"acme": {"adminRoles": ["boss"], "allowedClusters": ["standalone"]}}
    namespaces: dict[tuple[str, str], dict[str, object]] = {
        ("acme", "app"): {"auth_policies": {"namespace_auth": {"w": ["produce", "unknown"]}}}
    }

    def update(tenant: str, namespace: str, change: object) -> bool:
        policies = namespaces.get((tenant, namespace))
        if policies is None:
            return False
        change(policies)  # type: ignore[operator]
        return True

    store = PulsarShapedPolicies(tenants.get, lambda t, ns: namespaces.get((t, ns)), update)
    rules = Authorizer(enabled=True, super_user_roles=[], policies=store)
    assert rules.can_produce("w", TOPIC)
    assert rules.can_consume("boss", TOPIC)
    assert not rules.can_consume("r", TOPIC)
    store.grant("acme", "app", "r", {AuthAction.CONSUME})
    assert namespaces[("acme", "app")]["auth_policies"]["namespace_auth"]["r"] == ["consume"]  # type: ignore[index]
    assert rules.can_consume("r", TOPIC)
    store.revoke("acme", "app", "r")
    assert not rules.can_consume("r", TOPIC)
    with pytest.raises(NamespaceNotFound):
        store.grant("acme", "nope", "r", {AuthAction.CONSUME})


def test_the_connection_caps_count_the_tls_listener_too(pki: Pki) -> None:
    with Broker(port=0, broker_max_connections=1, **pki.tls_listener()) as broker:
        listener = tls_listener_address(broker)
        with RawClient(broker.address) as first:
            first.handshake()
            with pytest.raises((ssl.SSLError, OSError, ConnectionClosed)):  # noqa: PT012
                refused = RawClient(listener, tls=pki.client_context(), timeout=3)
                refused.handshake()
            first.ping()  # the first connection is untouched

        # The slot frees once the broker has seen the close: a bounded poll, not a sleep.
        def accepted() -> bool:
            try:
                with RawClient(listener, tls=pki.client_context()) as later:
                    later.handshake()
            except (ssl.SSLError, OSError, ConnectionClosed):
                return False
            return True

        wait_until(accepted, message="the TLS listener to accept again", timeout=5)


def test_the_admin_guard_sets_the_role_and_applies_route_levels() -> None:
    security = Security(Authentication(basic_settings()), authorizer())
    guard = admin_guard(security)

    class Request:
        def __init__(self, headers: dict[str, str], url_args: dict[str, str]) -> None:
            self.headers, self.url_args, self.peer_cert = headers, url_args, None
            self.environ = {"REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "1"}
            self.method, self.path, self.role = "GET", "/x", None

    def route(auth: str) -> Route:
        return Route("/x", ("GET",), lambda request: None, auth=auth)

    token = jwt.encode({"sub": "root"}, SECRET, "HS256")
    request = Request({"Authorization": f"Bearer {token}"}, {})
    guard(request, route("super"))
    assert request.role == "root"
    open_request = Request({}, {})
    guard(open_request, route("none"))  # /metrics: no credentials needed
    assert open_request.role is None
    with pytest.raises(RestError) as refused:
        guard(Request({}, {}), route("super"))
    assert refused.value.status == 401
    writer = jwt.encode({"sub": "writer"}, SECRET, "HS256")
    with pytest.raises(RestError) as forbidden:
        guard(Request({"Authorization": f"Bearer {writer}"}, {"tenant": "acme"}), route("tenant"))
    assert forbidden.value.status == 403
