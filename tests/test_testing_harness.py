"""The shared dev harness (brokerlet.testing): one rank rule, one broker-in-a-subprocess."""

from __future__ import annotations

import math
import socket

import pytest

from brokerlet.testing import free_port, percentile
from brokerlet.testing.process import BrokerletProcess
from brokerlet.testing.rawclient import RawClient


def test_percentile_is_nearest_rank_over_the_sorted_samples() -> None:
    hundred = list(range(100, 0, -1))  # 1..100, given in descending order
    assert percentile(hundred, 0.99) == 99  # rank ceil(0.99 * 100) = 99
    assert percentile(hundred, 0.50) == 50
    assert percentile(hundred, 0.07) == 7  # 0.07 * 100 is 7.000000000000001 in floats
    assert percentile(hundred, 1.0) == 100
    assert percentile(hundred, 0.0) == 1  # rank at least 1
    assert percentile(range(1, 1001), 0.99) == 990
    assert percentile(range(1, 11), 0.99) == 10
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], 99)


def test_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_brokerlet_process_serves_and_cleans_up_after_itself() -> None:
    with BrokerletProcess(["--storage", "memory"]) as broker:
        broker.start()
        assert broker.alive()
        with RawClient(broker.address) as client:
            client.handshake()
        directory = broker.directory
        assert directory.is_dir()
        assert broker.stop() == 0  # SIGINT is a clean shutdown
    assert not directory.exists()


def test_brokerlet_process_reports_a_bad_setting_with_the_log() -> None:
    with BrokerletProcess(["--dispatcher-max-read-batch-size", "-3"]) as broker:
        with pytest.raises(RuntimeError, match="did not become ready") as failure:
            broker.start(timeout=30)
        assert "dispatcher" in str(failure.value).lower()
        assert broker.exited()
