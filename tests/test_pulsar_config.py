"""A Pulsar broker.conf / standalone.conf as a settings source (issue 17)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from brokerlet import Broker
from brokerlet.config import SettingsError, load_settings


def write(tmp_path: Path, text: str, name: str = "standalone.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_known_keys_apply_under_their_pulsar_names_and_empty_values_keep_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = write(
        tmp_path,
        "# Pulsar's comment style\n"
        "! and the other properties one\n"
        "\n"
        "brokerServicePort=6651\n"
        "dispatcherMaxReadBatchSize = 50\n"
        "managedLedgerMaxUnackedRangesToPersist=500\n"
        "maxMessageSize=\n"  # empty: unset in Pulsar, so brokerlet's default stays
        "zookeeperServers=\n"  # unknown but empty: not worth a notice
        "managedLedgerDefaultEnsembleSize=1\n"
        "bookkeeperClientTimeoutInSeconds=30\n"
        "authenticationEnabled=false\n"
        "authorizationProvider=org.apache.pulsar.broker.authorization.PulsarAuthorizationProvider\n"
        "tlsEnabledWithKeyStore=false\n",
    )
    with caplog.at_level(logging.INFO, logger="brokerlet.config"):
        settings = load_settings(env={}, pulsar_config=conf)
    assert settings.port == 6651
    assert settings.dispatcher_max_read_batch_size == 50
    assert settings.managed_ledger_max_unacked_ranges_to_persist == 500
    assert settings.max_message_size == 5 * 1024 * 1024
    notices = [r.getMessage() for r in caplog.records if "does not implement" in r.getMessage()]
    assert len(notices) == 1, "listed once"
    assert "managedLedgerDefaultEnsembleSize, bookkeeperClientTimeoutInSeconds" in notices[0]
    assert "zookeeperServers" not in notices[0]
    assert "authorizationProvider" not in notices[0], "what brokerlet does anyway"
    assert "tlsEnabledWithKeyStore" not in notices[0]


def test_the_file_is_weaker_than_environment_and_overrides(tmp_path: Path) -> None:
    conf = write(tmp_path, "brokerServicePort=6651\ndispatcherMaxReadBatchSize=50\n")
    settings = load_settings(
        env={"BROKERLET_PORT": "7000"},
        overrides={"dispatcher_max_read_batch_size": 7},
        pulsar_config=conf,
    )
    assert (settings.port, settings.dispatcher_max_read_batch_size) == (7000, 7)


def test_relative_paths_resolve_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    conf = write(tmp_path, "tlsCertificateFilePath=certs/broker.pem\ntlsKeyFilePath=/abs/k.pem\n")
    settings = load_settings(env={}, pulsar_config=conf.name)
    assert settings.tls_certificate_file_path == str(tmp_path / "certs" / "broker.pem")
    assert settings.tls_key_file_path == "/abs/k.pem"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("maxMessageSize=lots\n", "max_message_size = 'lots'"),
        ("brokerServicePort 6650\n", "expected key=value"),
        ("tlsEnabledWithKeyStore=true\n", "Java key stores are not supported"),
        (
            "authorizationProvider=com.example.Custom\n",
            "only org.apache.pulsar.broker.authorization.PulsarAuthorizationProvider",
        ),
    ],
)
def test_bad_values_and_dangerous_unimplemented_keys_stop_start_up(
    tmp_path: Path, text: str, expected: str
) -> None:
    conf = write(tmp_path, text)
    with pytest.raises(SettingsError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        load_settings(env={}, pulsar_config=conf)


def test_an_unsupported_authentication_provider_stops_the_broker(tmp_path: Path) -> None:
    conf = write(
        tmp_path,
        "authenticationEnabled=true\n"
        "authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderSasl\n",
    )
    with pytest.raises(SettingsError, match="AuthenticationProviderSasl' is not supported"):
        Broker(pulsar_config=conf, port=0)


def test_broker_reads_a_pulsar_config(tmp_path: Path) -> None:
    conf = write(tmp_path, "brokerServicePort=0\ndispatcherMaxReadBatchSize=42\n")
    broker = Broker(pulsar_config=conf)
    assert broker.settings.dispatcher_max_read_batch_size == 42
    assert broker.settings.port == 0


def test_brokerlet_serve_refuses_a_dangerous_pulsar_config(tmp_path: Path) -> None:
    conf = write(tmp_path, "authenticationEnabled=true\nauthenticationProviders=x.Y\n")
    result = subprocess.run(
        [sys.executable, "-m", "brokerlet", "serve", "--pulsar-config", str(conf), "--port", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert result.returncode == 2
    assert "authentication_providers: 'x.Y' is not supported" in result.stderr
