"""Topic name parsing (`brokerlet.metadata.naming`): what Pulsar's ``TopicName`` accepts."""

from __future__ import annotations

import pytest

from brokerlet.metadata.naming import InvalidName, TopicName


def test_a_name_parsed_again_is_the_same_checked_name() -> None:
    name = "persistent://public/default/orders-partition-3"
    first = TopicName.parse(name)
    assert (first.namespace, first.local) == ("public/default", "orders-partition-3")
    assert first.partition_index == 3
    assert TopicName.parse(name) is first  # kept parsed, not parsed again


@pytest.mark.parametrize(
    "name",
    [
        "orders",
        "persistent://public/default",
        "persistent://pub lic/default/orders",
        "persistent://public/default/a//b",
        "persistent://public/default/\x07bell",
    ],
)
def test_a_malformed_name_is_refused_every_time(name: str) -> None:
    for _ in range(2):  # a refusal is never kept in place of a parse
        with pytest.raises(InvalidName):
            TopicName.parse(name)
