"""The public names: what users import from ``brokerlet`` stays there."""

from __future__ import annotations

import brokerlet
from brokerlet import client


def test_the_top_level_exports_exactly_its_public_api() -> None:
    assert sorted(brokerlet.__all__) == [
        "Broker",
        "Client",
        "ConsumerType",
        "InitialPosition",
        "MessageId",
        "Settings",
        "SettingsError",
        "__version__",
        "load_settings",
    ]
    for name in brokerlet.__all__:
        assert hasattr(brokerlet, name), name


def test_the_client_names_are_the_client_modules() -> None:
    assert brokerlet.Client is client.Client
    assert brokerlet.MessageId is client.MessageId
