"""``brokerlet tokens``, and the token provider reading the keys it writes (issue 17)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from brokerlet.cli import main
from brokerlet.config import Settings, SettingsError
from brokerlet.security.providers import AuthenticationFailed, Credentials, TokenProvider
from brokerlet.security.tokens_cli import parse_relative_time


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["tokens", *argv])
    captured = capsys.readouterr()
    return status, captured.out.strip(), captured.err.strip()


def test_secret_key_tokens_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "secret.key"
    assert run(capsys, "create-secret-key", "--output", str(key))[0] == 0
    assert len(key.read_bytes()) == 32, "raw HS256 key bytes, as pulsar tokens writes"
    status, token, _ = run(
        capsys, "create", "--subject", "app", "--expiry-time", "1h", "--secret-key", f"file://{key}"
    )
    assert status == 0
    claims = jwt.decode(token, key.read_bytes(), algorithms=["HS256"])
    assert claims["sub"] == "app"
    assert 3590 <= claims["exp"] - time.time() <= 3600
    status, out, _ = run(capsys, "validate", token, "--secret-key", f"file://{key}")
    assert (status, json.loads(out)["sub"]) == (0, "app")
    provider = TokenProvider(Settings(token_secret_key=f"file://{key}"))
    assert provider.authenticate(Credentials(token.encode())).role == "app"


def test_base64_secret_key_is_accepted_as_a_data_url(capsys: pytest.CaptureFixture[str]) -> None:
    status, encoded, _ = run(capsys, "create-secret-key", "--base64")
    assert status == 0
    assert len(base64.b64decode(encoded)) == 32
    status, token, _ = run(capsys, "create", "-s", "r", "-sk", f"data:;base64,{encoded}")
    provider = TokenProvider(Settings(token_secret_key=f"data:;base64,{encoded}"))
    assert provider.authenticate(Credentials(token.encode())).role == "r"
    raw_base64 = TokenProvider(Settings(token_secret_key=encoded))  # Pulsar's last fallback
    assert raw_base64.authenticate(Credentials(token.encode())).role == "r"


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_key_pairs_are_der_and_the_provider_checks_their_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    status = run(
        capsys,
        "create-key-pair",
        "-a",
        algorithm,
        "--output-private-key",
        str(private),
        "--output-public-key",
        str(public),
    )[0]
    assert status == 0
    serialization.load_der_public_key(public.read_bytes())  # DER, as Pulsar's tool writes
    status, token, _ = run(capsys, "create", "-s", "svc", "-pk", f"file://{private}")
    assert jwt.get_unverified_header(token)["alg"] == algorithm
    provider = TokenProvider(
        Settings(token_public_key=f"file://{public}", token_public_alg=algorithm)
    )
    assert provider.authenticate(Credentials(token.encode())).role == "svc"
    assert run(capsys, "validate", token, "-pk", str(public))[0] == 0


def test_validate_refuses_bad_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "k"
    key.write_bytes(b"s" * 32)
    expired = jwt.encode({"sub": "a", "exp": int(time.time()) - 10}, b"s" * 32, "HS256")
    status, _, err = run(capsys, "validate", expired, "-sk", str(key))
    assert status == 1
    assert "expired" in err
    unsigned = jwt.encode({"sub": "a"}, None, algorithm="none")
    status, _, err = run(capsys, "validate", unsigned, "-sk", str(key))
    assert status == 1
    assert "alg: none" in err


def test_relative_times_follow_pulsar() -> None:
    assert [parse_relative_time(t) for t in ("30", "30s", "10m", "1h", "2d", "1w", "1y")] == [
        30,
        30,
        600,
        3600,
        172800,
        604800,
        31536000,
    ]
    with pytest.raises(ValueError, match="relative time"):
        parse_relative_time("1 fortnight")


def test_the_provider_checks_claim_audience_and_key_mismatch(tmp_path: Path) -> None:
    secret = b"x" * 32
    encoded = base64.b64encode(secret).decode()
    provider = TokenProvider(
        Settings(
            token_secret_key=f"data:;base64,{encoded}",
            token_auth_claim="role",
            token_audience="brokerlet",
        )
    )
    good = jwt.encode({"role": "r", "aud": ["other", "brokerlet"]}, secret, "HS256")
    assert provider.authenticate(Credentials(good.encode())).role == "r"
    for claims, reason in [
        ({"role": "r", "aud": "other"}, "not for this audience"),
        ({"sub": "r", "aud": "brokerlet"}, "no 'role' claim"),
    ]:
        with pytest.raises(AuthenticationFailed, match=reason):
            provider.authenticate(Credentials(jwt.encode(claims, secret, "HS256").encode()))
    with pytest.raises(SettingsError, match="needs token_secret_key"):
        TokenProvider(Settings())
    with pytest.raises(SettingsError, match="cannot read"):
        TokenProvider(Settings(token_secret_key=f"file://{tmp_path}/missing"))
