"""Pulsar's security model end to end, with the official client and tests/security/standalone.conf.

The broker loads that file as it is (TLS, token, TLS and Basic providers, authorization, an
anonymous role, super users) from a directory where the test session generated its
certificates, the token secret and the htpasswd file.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import shutil
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest
import requests
from passlib.hash import apr_md5_crypt, des_crypt

from brokerlet import Broker
from brokerlet.testing.rawclient import ConnectionClosed, RawClient
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import pb
from tests.test_bad_input import LogWatch
from tests.tlscerts import Pki, tls_listener_address

CONF = Path(__file__).parent / "security" / "standalone.conf"
PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProvider"
TIMEOUT = 5  # seconds for operations that are expected to fail fast

BASIC_PASSWORD = "open sesame"


class Secured:
    """The running broker and what clients need to talk to it."""

    def __init__(self, broker: Broker, pki: Pki, secret: bytes) -> None:
        self.broker = broker
        self.pki = pki
        self.secret = secret
        assert broker.service_url_tls is not None
        assert broker.web_service_url_tls is not None
        self.tls_url = broker.service_url_tls
        self.plain_url = broker.service_url
        self.https_url = broker.web_service_url_tls

    def token(self, role: str, expires_in: float | None = None, key: bytes | None = None) -> str:
        claims: dict[str, Any] = {"sub": role}
        if expires_in is not None:
            claims["exp"] = int(time.time() + expires_in)
        return jwt.encode(claims, key or self.secret, algorithm="HS256")

    def client(self, url: str | None = None, **kwargs: Any) -> pulsar.Client:
        kwargs.setdefault("operation_timeout_seconds", 10)
        kwargs.setdefault("connection_timeout_ms", 5000)
        return pulsar.Client(
            url or self.tls_url,
            tls_trust_certs_file_path=self.pki.ca,
            tls_validate_hostname=False,
            **kwargs,
        )


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    home = tmp_path_factory.mktemp("standalone")
    (home / "certs").mkdir()
    (home / "keys").mkdir()
    (home / "auth").mkdir()
    shutil.copy(pki.ca, home / "certs" / "ca.cert.pem")
    shutil.copy(pki.broker.cert, home / "certs" / "broker.cert.pem")
    shutil.copy(pki.broker.key, home / "certs" / "broker.key.pem")
    secret = secrets.token_bytes(32)
    (home / "keys" / "secret.key").write_bytes(secret)
    (home / "auth" / "htpasswd").write_text(
        f"basic-user:{apr_md5_crypt.hash(BASIC_PASSWORD)}\n"
        f"des-user:{des_crypt.hash('des-pass')}\n"
        f"basic-admin:{apr_md5_crypt.hash('admin-pass')}\n"
    )
    cwd = os.getcwd()
    os.chdir(home)  # the file's relative paths resolve against the working directory
    try:
        broker = Broker(pulsar_config=CONF)
    finally:
        os.chdir(cwd)
    with broker:
        secured = Secured(broker, pki, secret)
        # Tenants, namespaces and grants through the admin API, as a super user would.
        setup = [
            (
                "PUT",
                "tenants/acme",
                {"adminRoles": ["basic-admin"], "allowedClusters": ["standalone"]},
            ),
            ("PUT", "namespaces/acme/app", None),
            ("PUT", "namespaces/acme/open", None),
            *[
                ("POST", f"namespaces/acme/app/permissions/{role}", ["produce", "consume"])
                for role in ("app-role", "tls-client", "basic-user", "des-user", "refresher")
            ],
            ("POST", "namespaces/acme/open/permissions/anonymous", ["produce", "consume"]),
        ]
        for method, path, body in setup:
            answer = requests.request(
                method,
                f"{secured.https_url}/admin/v2/{path}",
                json=body,
                headers={"Authorization": f"Bearer {secured.token('admin')}"},
                verify=pki.ca,
                timeout=10,
            )
            assert answer.status_code == 204, (path, answer.status_code, answer.text)
        yield secured


@pytest.fixture
def log_watch(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> LogWatch:
    caplog.set_level(logging.INFO, logger="brokerlet")
    return LogWatch(caplog, monkeypatch)


_names = iter(range(10**6))


def app_topic(namespace: str = "app") -> str:
    return f"persistent://acme/{namespace}/t-{next(_names)}"


def round_trip(client: pulsar.Client, topic: str) -> None:
    """Produce one message and consume it back on the same client."""
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    body = f"hello {topic}".encode()
    producer.send(body)
    message = consumer.receive(timeout_millis=5000)
    assert message.data() == body
    consumer.acknowledge(message)


# Authentication that works.


def test_token_auth_with_a_static_token_over_tls(secured: Secured) -> None:
    client = secured.client(authentication=pulsar.AuthenticationToken(secured.token("app-role")))
    try:
        round_trip(client, app_topic())
    finally:
        client.close()


def test_token_auth_through_a_supplier(secured: Secured) -> None:
    calls = []

    def supply() -> str:
        calls.append(1)
        return secured.token("app-role")

    client = secured.client(authentication=pulsar.AuthenticationToken(supply))
    try:
        round_trip(client, app_topic())
    finally:
        client.close()
    assert calls, "the client asked the supplier for its token"


def test_tls_auth_with_a_client_certificate(secured: Secured, log_watch: LogWatch) -> None:
    client = secured.client(
        authentication=pulsar.AuthenticationTLS(secured.pki.client.cert, secured.pki.client.key)
    )
    try:
        round_trip(client, app_topic())
    finally:
        client.close()
    log_watch.assert_logged(logging.INFO, "authenticated as role 'tls-client' by tls")


@pytest.mark.parametrize(
    ("user", "password"), [("basic-user", BASIC_PASSWORD), ("des-user", "des-pass")]
)
def test_basic_auth_with_apr1_and_crypt_hashes(
    secured: Secured, user: str, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = secured.client(authentication=pulsar.AuthenticationBasic(user, password))
    try:
        round_trip(client, app_topic())
    finally:
        client.close()
    assert password not in caplog.text, "credentials never appear in logs"


def test_plain_port_works_with_credentials_too(secured: Secured) -> None:
    client = pulsar.Client(
        secured.plain_url,
        authentication=pulsar.AuthenticationToken(secured.token("app-role")),
        operation_timeout_seconds=10,
    )
    try:
        round_trip(client, app_topic())
    finally:
        client.close()


# Refusals.


def expect_refusal(
    secured: Secured, error: type[Exception], topic: str | None = None, **kwargs: Any
) -> None:
    client = secured.client(operation_timeout_seconds=TIMEOUT, **kwargs)
    try:
        with pytest.raises(error):
            client.create_producer(topic or app_topic())
    finally:
        client.close()


def test_a_role_without_permission_is_refused_with_authorization_error(
    secured: Secured, log_watch: LogWatch
) -> None:
    expect_refusal(
        secured,
        pulsar.AuthorizationError,
        authentication=pulsar.AuthenticationToken(secured.token("nobody")),
    )
    log_watch.assert_logged(logging.WARNING, "authorization refused: role 'nobody' may not")


def test_anonymous_clients_get_only_what_the_namespace_grants_the_anonymous_role(
    secured: Secured,
) -> None:
    client = secured.client()
    try:
        round_trip(client, app_topic("open"))
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(app_topic("app"))
    finally:
        client.close()


def test_an_unknown_auth_method_gets_the_anonymous_role_as_in_pulsar(secured: Secured) -> None:
    """ServerCnx.handleConnect: no provider for the method means anonymousUserRole."""
    bogus = pulsar.AuthenticationBasic("basic-user", BASIC_PASSWORD, method="bogus")
    expect_refusal(secured, pulsar.AuthorizationError, authentication=bogus)


def test_an_unknown_auth_method_without_an_anonymous_role_is_refused(
    log_watch: LogWatch,
) -> None:
    htpasswd = f"basic-user:{apr_md5_crypt.hash(BASIC_PASSWORD)}\n".encode()
    conf = "data:;base64," + base64.b64encode(htpasswd).decode()
    with Broker(
        port=0,
        authentication_enabled=True,
        authentication_providers=PROVIDER + "Basic",
        basic_auth_conf=conf,
    ) as broker:
        with RawClient(broker.address) as raw:
            connect(raw, "bogus", b"basic-user:" + BASIC_PASSWORD.encode())
            assert_refused(raw, log_watch, "no authentication provider for method 'bogus'")
        client = pulsar.Client(
            broker.service_url,
            authentication=pulsar.AuthenticationBasic("basic-user", BASIC_PASSWORD),
            operation_timeout_seconds=10,
        )
        try:
            round_trip(client, "persistent://public/default/basic-only")
        finally:
            client.close()


# Bad credentials on the binary protocol: ERROR AuthenticationError, a close, a log line
# naming the peer and the reason, and nothing else disturbed.


def connect(raw: RawClient, method: str, data: bytes | None) -> None:
    command = pb.CommandConnect(
        client_version="tests", protocol_version=20, auth_method_name=method
    )
    if data is not None:
        command.auth_data = data
    raw.send_command(pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=command))


def assert_refused(raw: RawClient, watch: LogWatch, reason: str) -> None:
    frames = raw.wait_closed(TIMEOUT)
    assert [f.command.type for f in frames] == [pb.BaseCommand.ERROR]
    error = frames[0].command.error
    assert error.error == pb.AuthenticationError
    assert error.request_id == 2**64 - 1
    assert reason in error.message
    watch.assert_logged(logging.WARNING, "authentication failed for", raw.peer, reason)


@pytest.fixture
def witness(secured: Secured) -> Iterator[Callable[[], None]]:
    """A good client with a producer; calling it checks it still works."""
    client = secured.client(authentication=pulsar.AuthenticationToken(secured.token("app-role")))
    producer = client.create_producer(app_topic())
    producer.send(b"before")
    yield lambda: producer.send(b"after") and None
    client.close()


def bad_tokens(secured: Secured) -> dict[str, tuple[bytes, str]]:
    none_token = jwt.encode({"sub": "admin"}, None, algorithm="none")
    return {
        "expired": (secured.token("app-role", expires_in=-30).encode(), "token expired"),
        "malformed": (b"not.a-jwt", "malformed token"),
        "wrongly signed": (
            secured.token("admin", key=b"k" * 32).encode(),
            "token signature does not verify",
        ),
        "alg none": (none_token.encode(), "unsigned token (alg: none) refused"),
    }


@pytest.mark.parametrize("kind", ["expired", "malformed", "wrongly signed", "alg none"])
def test_bad_tokens_are_refused_with_authentication_error(
    secured: Secured,
    witness: Callable[[], None],
    log_watch: LogWatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    token, reason = bad_tokens(secured)[kind]
    with RawClient(secured.broker.address) as raw:
        connect(raw, "token", token)
        assert_refused(raw, log_watch, reason)
    witness()
    assert token.decode() not in caplog.text, "credentials never appear in logs"


def test_an_expired_token_fails_the_official_client(secured: Secured) -> None:
    """The C++ client closes on a pre-CONNECTED ERROR and retries until its timeout."""
    expired = pulsar.AuthenticationToken(secured.token("app-role", expires_in=-30))
    expect_refusal(secured, pulsar.Timeout, authentication=expired)


def test_a_wrong_basic_password_is_refused(
    secured: Secured,
    witness: Callable[[], None],
    log_watch: LogWatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RawClient(secured.broker.address) as raw:
        connect(raw, "basic", b"basic-user:Tr0ub4dor")
        assert_refused(raw, log_watch, "unknown user or wrong password")
    witness()
    assert "Tr0ub4dor" not in caplog.text, "credentials never appear in logs"


def tls_address(secured: Secured) -> tuple[str, int]:
    host, port = secured.tls_url.removeprefix("pulsar+ssl://").rsplit(":", 1)
    return host, int(port)


def test_a_certificate_without_a_cn_is_refused(
    secured: Secured, witness: Callable[[], None], log_watch: LogWatch
) -> None:
    context = secured.pki.client_context(secured.pki.no_cn)
    with RawClient(tls_address(secured), tls=context) as raw:
        connect(raw, "tls", None)
        assert_refused(raw, log_watch, "client certificate has no CN")
    witness()


def test_a_certificate_from_another_ca_fails_the_handshake(
    secured: Secured, witness: Callable[[], None], log_watch: LogWatch
) -> None:
    context = secured.pki.client_context(secured.pki.stranger)
    with RawClient(tls_address(secured), tls=context, timeout=TIMEOUT) as raw:
        # TLS 1.3 reports the refused certificate after the client's side of the handshake.
        with pytest.raises((ssl.SSLError, OSError, ConnectionClosed)):
            raw.handshake()
        log_watch.assert_logged(logging.WARNING, "TLS handshake failed", raw.peer)
    witness()


def test_a_tls_client_on_the_plain_port_is_closed_cleanly(
    secured: Secured, witness: Callable[[], None], log_watch: LogWatch
) -> None:
    context = secured.pki.client_context()
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        RawClient(secured.broker.address, tls=context, timeout=TIMEOUT)
    log_watch.assert_logged(logging.WARNING, "TLS handshake on the plain port")
    witness()


def test_a_plain_client_on_the_tls_port_is_closed_cleanly(
    secured: Secured, witness: Callable[[], None], log_watch: LogWatch
) -> None:
    with RawClient(tls_address(secured), timeout=TIMEOUT) as raw:
        connect(raw, "none", None)
        assert raw.wait_closed(TIMEOUT) == []
        log_watch.assert_logged(logging.WARNING, "TLS handshake failed", raw.peer)
    witness()


def test_official_clients_with_protocol_mismatches_fail_and_others_carry_on(
    secured: Secured, witness: Callable[[], None]
) -> None:
    tls_on_plain = secured.client(
        secured.plain_url.replace("pulsar://", "pulsar+ssl://"),
        operation_timeout_seconds=3,
    )
    plain_on_tls = pulsar.Client(
        secured.tls_url.replace("pulsar+ssl://", "pulsar://"), operation_timeout_seconds=3
    )
    try:
        for client in (tls_on_plain, plain_on_tls):
            with pytest.raises((pulsar.ConnectError, pulsar.Timeout)):
                client.create_producer(app_topic("open"))
    finally:
        tls_on_plain.close()
        plain_on_tls.close()
    witness()


def test_a_stalled_tls_handshake_is_closed_after_the_timeout(pki: Pki, log_watch: LogWatch) -> None:
    with (
        Broker(port=0, tls_handshake_timeout_seconds=0.3, **pki.tls_listener()) as broker,
        RawClient(tls_listener_address(broker), timeout=TIMEOUT) as silent,
    ):
        assert silent.wait_closed(TIMEOUT) == []  # it never sent a ClientHello
        log_watch.assert_logged(logging.WARNING, silent.peer, "handshake not done in 0.3 s")


# Lookups.


def lookup(raw: RawClient, topic: str) -> pb.CommandLookupTopicResponse:
    raw.send_command(
        pb.BaseCommand(
            type=pb.BaseCommand.LOOKUP,
            lookup=pb.CommandLookupTopic(topic=topic, request_id=7),
        )
    )
    return raw.expect(pb.BaseCommand.LOOKUP_RESPONSE).lookup_response


def test_lookup_answers_the_tls_url_to_tls_clients(secured: Secured) -> None:
    topic = app_topic("open")
    with RawClient(tls_address(secured), tls=secured.pki.client_context()) as raw:
        raw.handshake()  # anonymous
        response = lookup(raw, topic)
        assert response.response == pb.CommandLookupTopicResponse.Connect
        assert response.broker_service_url_tls == secured.tls_url
        assert response.broker_service_url == secured.plain_url
    with RawClient(secured.broker.address) as raw:
        raw.handshake()
        response = lookup(raw, topic)
        assert response.broker_service_url == secured.plain_url
        assert not response.HasField("broker_service_url_tls")
        refused = lookup(raw, app_topic("app"))
        assert refused.response == pb.CommandLookupTopicResponse.Failed
        assert refused.error == pb.AuthorizationError


# Token refresh on a live connection.


def wait_logged(watch: LogWatch, level: int, *fragments: str, timeout: float = 10) -> None:
    """Like LogWatch.assert_logged, for events seconds away (a token's expiry)."""

    def missing() -> str | None:
        try:
            watch.assert_logged(level, *fragments)
        except AssertionError as error:
            return str(error)  # what was logged instead, shown if the wait fails
        return None

    wait_until(
        missing,
        predicate=lambda error: error is None,
        message=f"a log line with {fragments}",
        timeout=timeout,
    )


def test_an_expiring_token_is_refreshed_through_auth_challenge(
    secured: Secured, log_watch: LogWatch
) -> None:
    issued: list[str] = []

    def supply() -> str:
        issued.append(secured.token("refresher", expires_in=2))
        return issued[-1]

    client = secured.client(authentication=pulsar.AuthenticationToken(supply))
    try:
        producer = client.create_producer(app_topic())
        wait_logged(log_watch, logging.INFO, "refreshed the credential of role 'refresher'")
        producer.send(b"still connected")  # the same connection, no reconnect needed
        assert len(issued) >= 2
    finally:
        client.close()


def test_a_connection_that_cannot_renew_its_token_is_closed(
    secured: Secured, log_watch: LogWatch
) -> None:
    static = pulsar.AuthenticationToken(secured.token("refresher", expires_in=2))
    client = secured.client(authentication=static)
    try:
        client.create_producer(app_topic())
        wait_logged(
            log_watch,
            logging.WARNING,
            "authentication failed for",
            "refresh refused: token expired",
        )
    finally:
        client.close()


# The admin API over HTTPS with each kind of credential.


def admin(secured: Secured, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(
        method,
        f"{secured.https_url}/admin/v2/namespaces/acme/app/{path}",
        verify=secured.pki.ca,
        timeout=10,
        **kwargs,
    )


def test_admin_over_https_takes_each_credential_type(secured: Secured) -> None:
    bearer = {"Authorization": f"Bearer {secured.token('admin')}"}
    answer = admin(secured, "POST", "permissions/granted-role", headers=bearer, json=["consume"])
    assert answer.status_code == 204, answer.text
    expected = {"granted-role": ["consume"]}

    by_token = admin(secured, "GET", "permissions", headers=bearer)
    by_basic = admin(secured, "GET", "permissions", auth=("basic-admin", "admin-pass"))
    by_cert = admin(
        secured, "GET", "permissions", cert=(secured.pki.superuser.cert, secured.pki.superuser.key)
    )
    for answer in (by_token, by_basic, by_cert):
        assert answer.status_code == 200, answer.text
        assert expected.items() <= answer.json().items()
        assert answer.json()["app-role"] == ["consume", "produce"]

    assert admin(secured, "DELETE", "permissions/granted-role", headers=bearer).status_code == 204
    assert "granted-role" not in admin(secured, "GET", "permissions", headers=bearer).json()


def test_admin_refusals_are_401_and_403(secured: Secured, log_watch: LogWatch) -> None:
    wrong_password = admin(secured, "GET", "permissions", auth=("basic-admin", "nope"))
    assert wrong_password.status_code == 401
    assert "reason" in wrong_password.json()
    not_admin = admin(
        secured, "GET", "permissions", cert=(secured.pki.client.cert, secured.pki.client.key)
    )
    assert not_admin.status_code == 403
    log_watch.assert_logged(logging.WARNING, "role 'tls-client' may not")
    anonymous = admin(secured, "POST", "permissions/x", json=["produce"])
    assert anonymous.status_code == 403
    bad_action = admin(
        secured,
        "POST",
        "permissions/x",
        json=["fly"],
        headers={"Authorization": f"Bearer {secured.token('admin')}"},
    )
    assert bad_action.status_code == 400
    assert "actions" in bad_action.json()["reason"]


def test_the_plain_web_port_checks_credentials_too(secured: Secured) -> None:
    base = secured.broker.web_service_url
    url = f"{base}/admin/v2/namespaces/acme/app/permissions"
    assert requests.get(url, timeout=10).status_code == 403
    token = {"Authorization": f"Bearer {secured.token('admin')}"}
    assert requests.get(url, headers=token, timeout=10).status_code == 200


def test_stats_need_the_tenant_admin_or_a_super_user(secured: Secured) -> None:
    topic_stats = f"{secured.https_url}/admin/v2/persistent/acme/app/some-topic/stats"
    broker_stats = f"{secured.https_url}/admin/v2/broker-stats/topics"
    admin_token = {"Authorization": f"Bearer {secured.token('admin')}"}
    app_token = {"Authorization": f"Bearer {secured.token('app-role')}"}
    get = lambda url, **kw: requests.get(url, verify=secured.pki.ca, timeout=10, **kw)  # noqa: E731
    assert get(topic_stats, headers=app_token).status_code == 403
    assert get(topic_stats, auth=("basic-admin", "admin-pass")).status_code == 404  # allowed
    assert get(broker_stats, auth=("basic-admin", "admin-pass")).status_code == 403
    assert get(broker_stats, headers=admin_token).status_code == 200
    assert get(f"{secured.https_url}/metrics").status_code == 200  # open, as in Pulsar


def test_topic_operations_need_consume_or_the_tenant_admin(secured: Secured) -> None:
    """PulsarAuthorizationProvider#allowTopicOperationAsync: SKIP, PEEK_MESSAGES,
    RESET_CURSOR, GET_SUBSCRIPTIONS, ... need the consume permission; TERMINATE and UNLOAD
    the tenant's admin. A 404 (no such topic) means the guard let the request through."""
    topic = f"{secured.https_url}/admin/v2/persistent/acme/app/ops-topic"
    app_token = {"Authorization": f"Bearer {secured.token('app-role')}"}
    admin_token = {"Authorization": f"Bearer {secured.token('admin')}"}

    def call(method: str, path: str, **kw: Any) -> int:
        answer = requests.request(method, topic + path, verify=secured.pki.ca, timeout=10, **kw)
        return answer.status_code

    consume_level = [
        ("GET", "/subscriptions"),
        ("GET", "/subscription/s/position/1"),
        ("POST", "/subscription/s/skip/1"),
        ("POST", "/subscription/s/resetcursor/0"),
        ("POST", "/all_subscription/expireMessages/10"),
        ("GET", "/examinemessage"),
    ]
    for method, path in consume_level:
        assert call(method, path, headers=app_token) == 404, path  # allowed: no such topic
        assert call(method, path) == 403, path  # anonymous has nothing on acme/app
    for method, path in [("POST", "/terminate"), ("PUT", "/unload"), ("GET", "/internalStats")]:
        assert call(method, path, headers=app_token) == 403, path
        assert call(method, path, headers=admin_token) == 404, path


def test_schema_routes_take_the_levels_of_pulsars_schemas_resource(secured: Secured) -> None:
    # SchemasResourceBase: GET = TopicOperation.GET_METADATA (produce or consume on the
    # namespace), POST = PRODUCE, DELETE and /compatibility = the tenant's admin.
    base = f"{secured.https_url}/admin/v2/schemas/acme/app/schema-auth"
    app = {"Authorization": f"Bearer {secured.token('app-role')}"}
    stranger = {"Authorization": f"Bearer {secured.token('stranger')}"}
    payload = {"type": "STRING", "schema": "", "properties": {}}

    def call(method: str, path: str, headers: dict[str, str] | None = None, **kw: Any) -> int:
        answer = requests.request(
            method, base + path, headers=headers, verify=secured.pki.ca, timeout=10, **kw
        )
        return answer.status_code

    assert call("POST", "/schema", stranger, json=payload) == 403
    assert call("POST", "/schema", app, json=payload) == 202
    assert call("GET", "/schema", stranger) == 403
    assert call("GET", "/schema", app) == 200
    assert call("GET", "/schemas", app) == 200
    assert call("POST", "/compatibility", app, json=payload) == 403
    assert call("POST", "/compatibility", auth=("basic-admin", "admin-pass"), json=payload) == 202
    assert call("DELETE", "/schema", app) == 403
    assert call("DELETE", "/schema", auth=("basic-admin", "admin-pass")) == 200


def test_http_lookup_is_authorized_and_answers_the_tls_urls(secured: Secured) -> None:
    base = f"{secured.https_url}/lookup/v2/topic/persistent/acme"
    get = lambda url: requests.get(url, verify=secured.pki.ca, timeout=10)  # noqa: E731
    answer = get(f"{base}/open/looked-up")  # anonymous is granted acme/open
    assert answer.status_code == 200, answer.text
    assert answer.json()["brokerUrlTls"] == secured.tls_url
    assert answer.json()["httpUrlTls"] == secured.https_url
    assert get(f"{base}/app/looked-up").status_code == 403
