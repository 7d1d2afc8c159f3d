"""The load tests: their verdict logic, parsers and tables, and a smoke run of each scenario.

Locust monkey-patches the process it is imported into, so it is never imported here: each
smoke run is a ``python -m loadtests run <scenario> --smoke`` subprocess that starts its own
broker, and the test checks the exit code and the ``summary.json`` it wrote. The pure parts
(ledger, scenarios, stats parsing, profile reading, comparison table) are tested
directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from brokerlet.delivery.ledger import Ledger
from loadtests import compare, profile, report
from loadtests.brokers import normalize_stats, stats_from_prometheus
from loadtests.scenarios import SCENARIOS, get_scenario

REPO_ROOT = Path(__file__).resolve().parent.parent

# -- ledger ----------------------------------------------------------------------------------


def _published(ledger: Ledger, messages: int) -> int:
    producer = ledger.new_producer()
    for sequence in range(messages):
        ledger.sending(producer, sequence)
        ledger.receipted_send(producer, sequence)
    return producer


def test_ledger_passes_when_every_subscription_saw_everything_once() -> None:
    ledger = Ledger(["a", "b"], ordered=True)
    producer = _published(ledger, 3)
    for name in ("a", "b"):
        for sequence in range(3):
            assert ledger.delivered(
                name, producer, key=sequence % 2, sequence=sequence, redelivery_count=0
            )
    verdict = ledger.verdict()
    assert verdict.passed, verdict.violations
    assert verdict.published == 3
    assert ledger.caught_up()


def test_ledger_counts_undelivered_messages_as_in_flight() -> None:
    ledger = Ledger(["a", "b"], ordered=False)
    producer = _published(ledger, 3)
    for sequence in range(3):
        ledger.delivered("a", producer, 0, sequence, 0)
    ledger.delivered("b", producer, 0, 1, 0)
    verdict = ledger.verdict()
    assert not verdict.passed
    assert verdict.in_flight == 2
    assert verdict.subscriptions["b"].in_flight == 2
    assert not ledger.caught_up()


def test_ledger_tells_duplicates_from_redeliveries() -> None:
    ledger = Ledger(["a"], ordered=False)
    producer = _published(ledger, 2)
    ledger.delivered("a", producer, 0, 0, 0)
    ledger.delivered("a", producer, 0, 1, 0)
    assert not ledger.delivered("a", producer, 0, 0, redelivery_count=1)
    verdict = ledger.verdict()
    assert verdict.passed, verdict.violations
    assert verdict.redelivered == 1
    assert not ledger.delivered("a", producer, 0, 1, redelivery_count=0)
    verdict = ledger.verdict()
    assert verdict.duplicates == 1
    assert not verdict.passed


def test_ledger_checks_order_per_key_and_producer_only_when_ordered() -> None:
    for ordered in (True, False):
        ledger = Ledger(["a"], ordered=ordered)
        producer = _published(ledger, 4)
        ledger.delivered("a", producer, key=7, sequence=2, redelivery_count=0)
        ledger.delivered("a", producer, key=8, sequence=0, redelivery_count=0)  # another key
        ledger.delivered("a", producer, key=7, sequence=1, redelivery_count=0)  # out of order
        ledger.delivered("a", producer, key=7, sequence=3, redelivery_count=0)
        verdict = ledger.verdict()
        assert verdict.order_violations == (1 if ordered else 0)
        assert verdict.passed is not ordered


def test_ledger_fails_failed_and_unanswered_sends() -> None:
    ledger = Ledger(["a"], ordered=False)
    producer = ledger.new_producer()
    ledger.sending(producer, 0)
    ledger.failed_send(producer, 0)
    ledger.sending(producer, 1)
    ledger.delivered("a", producer, 0, 0, 0)  # stored although the send failed
    verdict = ledger.verdict()
    assert verdict.publish_failed == 1
    assert verdict.publish_pending == 1
    assert verdict.subscriptions["a"].not_receipted_but_delivered == 1
    assert not verdict.passed
    with pytest.raises(ValueError, match="expected #2"):
        ledger.sending(producer, 5)


def test_ledger_fails_a_run_that_published_nothing() -> None:
    assert Ledger(["a"], ordered=False).verdict().violations == ["nothing was published"]


# -- scenarios -------------------------------------------------------------------------------


def test_every_scenario_has_a_smoke_version_and_fits_its_pause() -> None:
    assert set(SCENARIOS) == {"key-shared-500x20", "telemetry-high-rate", "slow-consumer", "churn"}
    for scenario in SCENARIOS.values():
        smoke = scenario.smoke().with_overrides(duration=4.0)
        assert smoke.producers <= scenario.producers
        assert smoke.pause_at + smoke.pause_seconds <= smoke.duration
    slow = get_scenario("slow-consumer").with_overrides(duration=10.0)
    assert (slow.pause_at, slow.pause_seconds) == (3.5, 3.5)
    assert get_scenario("key-shared-500x20").with_overrides(rate=None).rate == 1500
    assert get_scenario("telemetry-high-rate").ordered is False
    with pytest.raises(KeyError, match="known"):
        get_scenario("nope")


# -- broker stats, profiles, tables ----------------------------------------------------------


def test_stats_from_prometheus_picks_the_topic_and_its_subscriptions() -> None:
    text = "\n".join(
        [
            "# HELP pulsar_rate_in Accepted message rate",
            'pulsar_rate_in{cluster="c",namespace="public/default",topic="t"} 120.5',
            'pulsar_rate_in{cluster="c",namespace="public/default",topic="other"} 9',
            'pulsar_subscription_back_log{namespace="public/default",subscription="s",topic="t"} 7',
            'pulsar_subscription_msg_rate_out{subscription="s",topic="t"} 100',
            'pulsar_subscription_msg_rate_out{subscription="r",topic="t"} 20',
        ]
    )
    stats = stats_from_prometheus(text, "t")
    assert stats["msgRateIn"] == 120.5
    assert stats["msgRateOut"] == 120
    assert stats["subscriptions"]["s"] == {"msgBacklog": 7, "msgRateOut": 100}


def test_normalize_stats_sums_consumers() -> None:
    raw: dict[str, Any] = {
        "msgRateIn": 5.0,
        "subscriptions": {
            "s": {
                "msgBacklog": 3,
                "unackedMessages": 2,
                "msgRateOut": 4.0,
                "consumers": [
                    {"availablePermits": 10, "writable": False, "pendingOutboundBytes": 70000},
                    {"availablePermits": 5, "writable": True, "pendingOutboundBytes": 0},
                ],
            }
        },
    }
    sub = normalize_stats(raw)["subscriptions"]["s"]
    assert sub["availablePermits"] == 15
    assert sub["unwritableConsumers"] == 1
    assert sub["pendingOutboundBytes"] == 70000


def test_top_functions_reads_py_spy_raw_stacks(tmp_path: Path) -> None:
    collapsed = tmp_path / "profile.txt"
    collapsed.write_text(
        "run (a.py:1);work (brokerlet/x.py:5);encode (brokerlet/codec.py:9) 6\n"
        "run (a.py:1);work (brokerlet/x.py:5) 2\n"
        "run (a.py:1) 2\n"
    )
    total, own = profile.top_functions(collapsed, by="own")
    assert total == 10
    assert own[0][0] == "encode (brokerlet/codec.py)"
    assert own[0][1] == pytest.approx(0.6)
    _, inclusive = profile.top_functions(collapsed, by="inclusive")
    assert inclusive[0][0] == "run (a.py)"
    assert inclusive[0][2] == pytest.approx(1.0)


def test_table_aligns_columns() -> None:
    text = report.table([["a", "1"], ["long name", "1,000"]], ["name", "n"])
    assert text.splitlines() == [
        "name           n",
        "---------  -----",
        "a              1",
        "long name  1,000",
    ]


def _run(
    broker: str,
    level: str,
    code: int,
    delivered: float,
    p99: int,
    cpu: float,
    violations: list[str] | None = None,
) -> dict[str, Any]:
    summary = {
        "throughput": {"published_msg_s": delivered, "delivered_msg_s": delivered},
        "latency_us": {
            "publish": {"p50_us": 1, "p99_us": 2},
            "e2e": {"p50_us": 1, "p99_us": p99, "p99.9_us": p99},
            "loadgen_loop_lag": {"p99_us": 5},
        },
        "cpu": {
            "broker_cpu_us_per_delivered": cpu,
            "broker_cpu_pct": 50.0,
            "loadgen_cpu_pct": 90.0,
        },
        "verdict": {
            "violations": violations or [],
            "published": 10,
            "subscriptions": {"a": {"unique": 10}},
        },
    }
    return {
        "scenario": "churn",
        "level": level,
        "broker": broker,
        "repeat": 0,
        "code": code,
        "load_average_before": 1.0,
        "summary": summary,
        "log_tail": ["done"],
    }


def test_comparison_table_shows_ratios_failures_and_targets() -> None:
    runs = [
        _run("brokerlet", "below", 0, 1000, 500, 30.0),
        _run("pulsar-lite", "below", 0, 1000, 1000, 10.0),
        _run("brokerlet", "saturation", 0, 5000, 900, 20.0),
        _run("pulsar-lite", "saturation", 1, 2000, 900, 20.0, ["5 receipted message(s) lost"]),
    ]
    text = compare.format_comparison(runs, ["churn"], ["below", "saturation"], 20, 1, 8, [])
    assert "e2e p99 us                            500        1,000   0.50" in text
    assert "pulsar-lite FAIL 1/1: 5 receipted message(s) lost" in text
    assert (
        "delivered throughput at saturation >= pulsar-lite's: met (5,000 vs 2,000) "
        "[pulsar-lite failed the verdict at saturation]"
    ) in text
    assert "e2e p99 below saturation <= pulsar-lite's: met (500 vs 1,000)" in text
    assert "CPU per delivered msg (below) <= 2x pulsar-lite's: NOT met (30.0 vs 10.0)" in text
    assert "load generator bound" in text
    # A Key_Shared subscription that received under half of what was published is called out.
    runs[3]["summary"]["verdict"]["subscriptions"]["a"]["unique"] = 2
    assert "pulsar-lite: Key_Shared does not work" in compare.format_comparison(
        runs, ["churn"], ["below", "saturation"], 20, 1, 8, []
    )


def test_importing_the_load_tests_does_not_import_locust() -> None:
    code = (
        "import sys, loadtests.cli, loadtests.compare, brokerlet.delivery, loadtests.report; "
        "sys.exit('locust' in sys.modules)"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, check=False, timeout=30
        ).returncode
        == 0
    )


# -- smoke runs ------------------------------------------------------------------------------


def _smoke(scenario: str, tmp_path: Path) -> dict[str, Any]:
    output = tmp_path / scenario
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests",
            "run",
            scenario,
            "--smoke",
            "--duration",
            "4",
            "--output",
            str(output),
            "--quiet",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=40,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in (
        "locust_stats.csv",
        "locust_stats_history.csv",
        "locust_failures.csv",
        "report.html",
    ):
        assert (output / name).stat().st_size > 0, name
    summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    verdict = summary["verdict"]
    assert verdict["passed"], verdict["violations"]
    subscriptions = summary["scenario"]["subscriptions"]
    assert verdict["published"] > 100
    assert summary["latency_us"]["e2e"]["count"] == verdict["published"] * subscriptions
    assert summary["latency_us"]["publish"]["p99_us"] is not None
    locust_stats = summary["locust"]
    assert locust_stats[f"publish {summary['topic']}"]["requests"] == verdict["published"]
    assert any(sample["broker"] for sample in summary["broker_stats_samples"])
    return summary


@pytest.mark.timeout(45)
def test_smoke_key_shared_500x20(tmp_path: Path) -> None:
    summary = _smoke("key-shared-500x20", tmp_path)
    assert summary["scenario"]["producers"] == 100
    assert summary["verdict"]["order_violations"] == 0


@pytest.mark.timeout(45)
def test_smoke_telemetry_high_rate(tmp_path: Path) -> None:
    summary = _smoke("telemetry-high-rate", tmp_path)
    assert len(summary["throughput"]["per_subscription_msg_s"]) == 5


@pytest.mark.timeout(45)
def test_smoke_slow_consumer(tmp_path: Path) -> None:
    summary = _smoke("slow-consumer", tmp_path)
    pause = summary["reports"]["slow_consumer"]
    assert pause["others_rate_before_msg_s"] > 0
    assert pause["others_rate_during_msg_s"] > 0


@pytest.mark.timeout(45)
def test_smoke_churn(tmp_path: Path) -> None:
    summary = _smoke("churn", tmp_path)
    assert summary["reports"]["churn"]["rejoins_done"] >= 3
