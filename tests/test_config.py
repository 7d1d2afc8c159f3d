"""Settings: defaults, the four sources and their order, aliases, and every kind of bad value."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from brokerlet.config import (
    Settings,
    SettingsError,
    add_arguments,
    describe_settings,
    load_settings,
    settings_from_args,
)
from brokerlet.config._fields import FieldSpec, Rule


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "brokerlet.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_one(tmp_path: Path, source: str, key: str, value: int) -> Settings:
    """Load settings with one key set through the named source."""
    if source == "toml":
        return load_settings(toml_path=write_toml(tmp_path, f"{key} = {value}\n"), env={})
    if source == "env":
        return load_settings(env={f"BROKERLET_{key.upper()}": str(value)})
    return load_settings(env={}, overrides={key: value})


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


# --- defaults -------------------------------------------------------------------------------


def test_defaults_match_the_documented_table() -> None:
    settings = load_settings(env={})
    assert settings == Settings()
    assert settings.host == "127.0.0.1"
    assert settings.port == 6650
    assert settings.advertised_url == ""
    assert settings.web_service_port == 8080
    assert settings.web_service_enabled is True
    assert settings.max_message_size == 5 * 1024 * 1024
    assert (settings.high_watermark, settings.low_watermark) == (65536, 32768)
    assert settings.tcp_notsent_lowat == 16384
    assert settings.dispatcher_max_read_batch_size == 100
    assert settings.dispatcher_read_failure_backoff_max_time_ms == 60000
    assert settings.max_unacked_messages_per_subscription == 200000
    assert settings.key_shared_look_ahead_msg_in_replay_threshold_per_subscription == 40000
    assert settings.storage == "memory"
    assert settings.log_level == "INFO"


def test_every_field_carries_help_and_settings_are_frozen() -> None:
    for field in dataclasses.fields(Settings):
        rule = field.metadata["brokerlet.config.rule"]
        assert rule.help, field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


def test_describe_settings_lists_every_key_alias_default_and_rule() -> None:
    table = describe_settings()
    lines = table.splitlines()
    assert lines[0].split() == ["key", "alias", "default", "allowed"]
    assert len(lines) == 2 + len(dataclasses.fields(Settings))
    port_line = next(line for line in lines if line.startswith("port "))
    assert port_line.split()[:3] == ["port", "brokerServicePort", "6650"]
    assert "an integer in 0..65535" in port_line
    storage_line = next(line for line in lines if line.startswith("storage "))
    assert re.search(r'storage\s+-\s+"memory"\s+one of \'memory\', \'disk\'', storage_line)


# --- sources and their order ----------------------------------------------------------------


def test_toml_overrides_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'port = 6651\nhost = "0.0.0.0"\ntcp_nodelay = false\n')
    settings = load_settings(toml_path=path, env={})
    assert (settings.port, settings.host, settings.tcp_nodelay) == (6651, "0.0.0.0", False)
    assert settings.max_message_size == Settings().max_message_size


def test_env_overrides_toml_and_ignores_other_variables(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = 6651\nevent_loops = 2\n")
    env = {"BROKERLET_PORT": "6652", "PORT": "1", "HOME": "/root"}
    settings = load_settings(toml_path=path, env=env)
    assert settings.port == 6652
    assert settings.event_loops == 2


def test_overrides_beat_env(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = 6651\n")
    settings = load_settings(toml_path=path, env={"BROKERLET_PORT": "6652"}, overrides={"port": 0})
    assert settings.port == 0


def test_flags_beat_env_and_toml_and_absent_flags_hide_nothing(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = 6651\nevent_loops = 3\nlog_level = 'DEBUG'\n")
    env = {"BROKERLET_PORT": "6652", "BROKERLET_EVENT_LOOPS": "4"}
    ns = parse_flags("--config", str(path), "--port", "6653")
    settings = settings_from_args(ns, env=env)
    assert settings.port == 6653
    assert settings.event_loops == 4
    assert settings.log_level == "DEBUG"


def test_env_is_read_from_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKERLET_KEEP_ALIVE_INTERVAL_SECONDS", "5")
    assert load_settings().keep_alive_interval_seconds == 5


def test_brokerlet_config_names_the_toml_file_unless_a_path_is_given(tmp_path: Path) -> None:
    named = write_toml(tmp_path, "port = 6651\n")
    explicit = tmp_path / "explicit.toml"
    explicit.write_text("port = 6655\n", encoding="utf-8")
    env = {"BROKERLET_CONFIG": str(named)}
    assert load_settings(env=env).port == 6651
    assert load_settings(toml_path=explicit, env=env).port == 6655
    assert settings_from_args(parse_flags("--config", str(explicit)), env=env).port == 6655


# --- aliases --------------------------------------------------------------------------------


def test_pulsar_aliases_in_toml(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        "brokerServicePort = 6651\ndispatcherMaxReadBatchSize = 50\n"
        "subscriptionKeySharedUseConsistentHashing = false\n",
    )
    settings = load_settings(toml_path=path, env={})
    assert settings.port == 6651
    assert settings.dispatcher_max_read_batch_size == 50
    assert settings.subscription_key_shared_use_consistent_hashing is False


def test_pulsar_aliases_in_env() -> None:
    env = {"BROKERLET_DISPATCHERMAXREADBATCHSIZE": "60", "BROKERLET_numIOThreads": "8"}
    settings = load_settings(env=env)
    assert settings.dispatcher_max_read_batch_size == 60
    assert settings.event_loops == 8


def test_pulsar_aliases_in_overrides_and_replace() -> None:
    settings = load_settings(env={}, overrides={"port": 0, "dispatcherMaxReadBatchSize": 50})
    assert (settings.port, settings.dispatcher_max_read_batch_size) == (0, 50)
    changed = settings.replace(maxMessageSize=2048, low_watermark="100")
    assert (changed.max_message_size, changed.low_watermark) == (2048, 100)
    assert settings.max_message_size == 5 * 1024 * 1024  # the original is untouched


def test_a_setting_given_twice_in_one_source_is_an_error(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = 1\nbrokerServicePort = 2\n")
    with pytest.raises(SettingsError, match=r"port given twice: 'port' .* 'brokerServicePort'"):
        load_settings(toml_path=path, env={})


# --- parsing text -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True), ("TRUE", True), ("1", True), ("yes", True), (" Yes ", True),
        ("false", False), ("False", False), ("0", False), ("no", False),
    ],
)  # fmt: skip
def test_bools_from_strings(text: str, expected: bool) -> None:
    assert load_settings(env={"BROKERLET_TCP_NODELAY": text}).tcp_nodelay is expected
    assert load_settings(env={}, overrides={"web_service_enabled": text}).web_service_enabled is (
        expected
    )


def test_numbers_and_choices_from_strings() -> None:
    env = {"BROKERLET_PORT": " 7000 ", "BROKERLET_MAX_MESSAGE_SIZE": "1_048_576"}
    settings = load_settings(env=env, overrides={"log_level": "debug", "storage": "Disk"})
    assert settings.port == 7000
    assert settings.max_message_size == 1048576
    assert (settings.log_level, settings.storage) == ("DEBUG", "disk")


def test_float_settings_parse_and_reject_non_finite_numbers() -> None:
    # No shipped setting is a float yet; this pins the rule for the first one.
    ratio = FieldSpec("ratio", float, 0.5, Rule("A fraction.", minimum=0, maximum=1))
    assert ratio.convert("0.25") == 0.25
    assert ratio.convert(1) == 1.0
    assert isinstance(ratio.convert(1), float)
    for bad in ("nan", "1.5", "half", True):
        with pytest.raises(SettingsError, match=r"must be a number in 0\.\.1"):
            ratio.convert(bad)


# --- command-line flags -----------------------------------------------------------------------


def test_flags_are_generated_for_every_setting() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = parser.format_help()
    for field in dataclasses.fields(Settings):
        assert "--" + field.name.replace("_", "-") in help_text
    assert "--config PATH" in help_text


def test_flag_values_are_parsed_per_type() -> None:
    ns = parse_flags(
        "--max-message-size", "2048",
        "--tcp-nodelay", "false",
        "--web-service-enabled",
        "--storage", "disk",
        "--advertised-url", "pulsar://broker.example:6650",
    )  # fmt: skip
    settings = settings_from_args(ns, env={"BROKERLET_WEB_SERVICE_ENABLED": "false"})
    assert settings.max_message_size == 2048
    assert settings.tcp_nodelay is False
    assert settings.web_service_enabled is True  # a bare boolean flag means true
    assert settings.storage == "disk"
    assert settings.advertised_url == "pulsar://broker.example:6650"


def test_a_bad_flag_value_names_the_flag() -> None:
    ns = parse_flags("--port", "http")
    with pytest.raises(SettingsError) as caught:
        settings_from_args(ns, env={})
    assert str(caught.value) == "port = 'http': must be an integer in 0..65535 (from --port)"
    assert caught.value.key == "port"


# --- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # range
        ({"dispatcher_max_read_batch_size": -3},
         "dispatcher_max_read_batch_size = -3: must be an integer >= 1"),
        ({"port": 65536}, "port = 65536: must be an integer in 0..65535"),
        ({"max_message_size": 1023},
         "max_message_size = 1023: must be an integer in 1024..104857600"),
        ({"event_loops": 65}, "event_loops = 65: must be an integer in 1..64"),
        ({"so_sndbuf": -1}, "so_sndbuf = -1: must be an integer >= 0"),
        # type
        ({"port": "abc"}, "port = 'abc': must be an integer in 0..65535"),
        ({"port": 1.5}, "port = 1.5: must be an integer in 0..65535"),
        ({"port": True}, "port = True: must be an integer in 0..65535"),
        ({"port": None}, "port = None: must be an integer in 0..65535"),
        ({"tcp_nodelay": "maybe"},
         "tcp_nodelay = 'maybe': must be a boolean (true/false, 1/0, yes/no)"),
        ({"tcp_nodelay": 1}, "tcp_nodelay = 1: must be a boolean (true/false, 1/0, yes/no)"),
        ({"host": 127}, "host = 127: must be a non-empty string"),
        ({"host": " "}, "host = ' ': must be a non-empty string"),
        # choice and format
        ({"storage": "tape"}, "storage = 'tape': must be one of 'memory', 'disk'"),
        ({"log_level": "TRACE"},
         "log_level = 'TRACE': must be one of 'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
        ({"advertised_url": "http://x:6650"},
         "advertised_url = 'http://x:6650': must be '' or a URL starting with pulsar:// or pulsar+ssl://"),
        # an alias is named as given
        ({"dispatcherMaxReadBatchSize": 0},
         "dispatcher_max_read_batch_size = 0: must be an integer >= 1 "
         "(given as 'dispatcherMaxReadBatchSize')"),
    ],
)  # fmt: skip
def test_bad_values_name_key_value_and_what_is_allowed(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={}, overrides=overrides)
    assert str(caught.value) == message
    with pytest.raises(SettingsError) as caught:
        Settings().replace(**overrides)
    assert str(caught.value) == message


def test_bad_values_from_env_and_toml_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={"BROKERLET_PORT": "-1"})
    assert str(caught.value) == "port = -1: must be an integer in 0..65535 (from BROKERLET_PORT)"

    path = write_toml(tmp_path, 'storage = "tape"\n')
    with pytest.raises(SettingsError) as caught:
        load_settings(toml_path=path, env={})
    assert str(caught.value) == f"storage = 'tape': must be one of 'memory', 'disk' (from {path})"


def test_a_bad_value_is_rejected_even_when_a_stronger_source_overrides_it(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = -5\n")
    with pytest.raises(SettingsError, match=r"port = -5"):
        load_settings(toml_path=path, env={}, overrides={"port": 6650})


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(SettingsError, match=r"^event_loops = 0: must be an integer in 1\.\.64$"):
        Settings(event_loops=0)
    assert Settings(log_level="warning").log_level == "WARNING"


@pytest.mark.parametrize(
    ("source", "key", "suggestion"),
    [
        ("toml", "prot", "port"),
        ("toml", "dispatcherMaxReadBatchSise", "dispatcherMaxReadBatchSize"),
        ("env", "max_mesage_size", "max_message_size"),
        ("overrides", "low_watermak", "low_watermark"),
    ],
)
def test_unknown_keys_are_errors_with_a_suggestion(
    tmp_path: Path, source: str, key: str, suggestion: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_one(tmp_path, source, key, 1)
    message = str(caught.value)
    assert message.startswith(f"unknown setting {key!r}")
    assert message.endswith(f"; did you mean {suggestion!r}?")


def test_unknown_keys_far_from_any_setting_get_no_suggestion() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={}, overrides={"foo": 1})
    assert str(caught.value) == "unknown setting 'foo'"
    with pytest.raises(SettingsError, match=r"^unknown setting 'bar' \(from BROKERLET_BAR\)$"):
        load_settings(env={"BROKERLET_BAR": "1"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"low_watermark": 65536},
         "low_watermark = 65536: must be < high_watermark (65536)"),
        ({"high_watermark": 1000, "low_watermark": 2000},
         "low_watermark = 2000: must be < high_watermark (1000)"),
        ({"dispatcherMinReadBatchSize": 101},
         "dispatcher_min_read_batch_size = 101: must be <= dispatcher_max_read_batch_size (100)"),
        ({"dispatcher_retry_backoff_initial_time_ms": 11},
         "dispatcher_retry_backoff_initial_time_ms = 11: "
         "must be <= dispatcher_retry_backoff_max_time_ms (10)"),
        ({"dispatcher_read_failure_backoff_max_time_ms": 100},
         "dispatcher_read_failure_backoff_initial_time_ms = 15000: "
         "must be <= dispatcher_read_failure_backoff_max_time_ms (100)"),
    ],
)  # fmt: skip
def test_cross_field_rules(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env={}, overrides=overrides)
    assert str(caught.value) == message


def test_cross_field_rules_see_the_merged_sources(tmp_path: Path) -> None:
    # Neither source alone is inconsistent; only together do they break low < high.
    path = write_toml(tmp_path, "low_watermark = 50000\n")
    with pytest.raises(SettingsError, match=r"^low_watermark = 50000: must be < high_watermark"):
        load_settings(toml_path=path, env={"BROKERLET_HIGH_WATERMARK": "40000"})
    edges = load_settings(env={}, overrides={"dispatcher_min_read_batch_size": 100})
    assert edges.dispatcher_min_read_batch_size == edges.dispatcher_max_read_batch_size


def test_unreadable_or_malformed_toml_is_a_settings_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(SettingsError, match=r"cannot read settings file .*missing\.toml"):
        load_settings(toml_path=missing, env={})
    broken = write_toml(tmp_path, "port = \n")
    with pytest.raises(SettingsError, match=r"is not valid TOML"):
        load_settings(toml_path=broken, env={})
