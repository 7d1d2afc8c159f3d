"""Greenlets that act on a running scenario: the paused consumer, the churn, the sampler.

Each is spawned by the runner once publishing starts and writes what it saw into
``context.reports`` (the pause and churn) or a list of samples.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
import psutil

from loadtests.brokers import BrokerProcess
from loadtests.context import RunContext

__all__ = ["churn_consumers", "measure_loop_lag", "pause_one_consumer", "sample_stats"]

_LAG_TICK = 0.01


def pause_one_consumer(context: RunContext) -> None:
    """Consumer 0 stops reading its socket for ``pause_seconds``, ``pause_at`` seconds in.

    The other consumers' delivery rate is measured over the second half of the time before
    the pause (after the start-up) and over the pause itself.
    """
    scenario = context.scenario
    counts = context.delivered_by_slot

    def others() -> int:
        return sum(counts) - counts[0]

    gevent.sleep(scenario.pause_at / 2)
    before_start, before_count = time.perf_counter(), others()
    gevent.sleep(scenario.pause_at / 2)
    paused_user = context.consumer_users[0]
    pause_start, pause_count = time.perf_counter(), others()
    paused_before = counts[0]
    paused_user.client.pause_reading()
    try:
        gevent.sleep(scenario.pause_seconds)
    finally:
        pause_end, end_count = time.perf_counter(), others()
        paused_user.client.resume_reading()
    rate_before = (pause_count - before_count) / (pause_start - before_start)
    rate_during = (end_count - pause_count) / (pause_end - pause_start)
    context.reports["slow_consumer"] = {
        "paused_consumer": paused_user.consumer.consumer_name,
        "pause_at_s": scenario.pause_at,
        "pause_s": round(pause_end - pause_start, 3),
        "others_rate_before_msg_s": round(rate_before, 1),
        "others_rate_during_msg_s": round(rate_during, 1),
        "during_over_before": round(rate_during / rate_before, 3) if rate_before else None,
        # What the paused consumer still took from its client-side queue while paused.
        "paused_consumer_received_during_pause": counts[0] - paused_before,
    }


def churn_consumers(context: RunContext) -> None:
    """Every ``churn_interval`` seconds one consumer leaves and rejoins as a new consumer,
    taking the consumers in turn, until publishing stops."""
    scenario = context.scenario
    requested = 0
    while True:
        gevent.sleep(scenario.churn_interval)
        if context.publishing_over:
            break
        user = context.consumer_users[requested % scenario.consumers]
        user.rejoin_requested = True
        requested += 1
    context.reports["churn"] = {
        "interval_s": scenario.churn_interval,
        "rejoins_requested": requested,
        "rejoins_done": sum(user.rejoins for user in context.consumer_users.values()),
    }


def sample_stats(
    context: RunContext,
    broker: BrokerProcess | None,
    samples: list[dict[str, Any]],
    interval: float = 1.0,
) -> None:
    """Append one sample per ``interval``: the broker's topic stats, its CPU and memory, and
    the load generator's own counts and CPU. Runs until killed."""
    own = psutil.Process()
    last_time = time.perf_counter()
    last_broker_cpu = broker.cpu_seconds() if broker else 0.0
    last_own_cpu = _cpu(own)
    while True:
        gevent.sleep(interval)
        now = time.perf_counter()
        stats = broker.topic_stats(context.topic) if broker else None
        elapsed = now - last_time
        broker_cpu = broker.cpu_seconds() if broker else 0.0
        own_cpu = _cpu(own)
        started = context.publishing_started
        ledger = context.ledger
        samples.append({
            "t": round(now - started, 2) if started else None,
            "published": ledger.receipted,
            "delivered": ledger.total_unique(),
            "in_flight": ledger.in_flight(),
            "broker_cpu_pct": round(100 * (broker_cpu - last_broker_cpu) / elapsed, 1)
            if broker else None,
            "broker_rss_mb": round(broker.rss_bytes() / 2**20, 1) if broker else None,
            "loadgen_cpu_pct": round(100 * (own_cpu - last_own_cpu) / elapsed, 1),
            "broker": stats,
        })
        last_time, last_broker_cpu, last_own_cpu = now, broker_cpu, own_cpu


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def measure_loop_lag(context: RunContext) -> None:
    """Record how late a 10 ms sleep wakes up, into ``context.loop_lag``, until killed.

    A late wake-up means the load generator's hub was busy elsewhere; every latency measured
    meanwhile includes that delay. A large p99 here says the generator, not the broker, is
    the bottleneck.
    """
    while True:
        before = time.perf_counter_ns()
        gevent.sleep(_LAG_TICK)
        context.loop_lag.record_ns(time.perf_counter_ns() - before - int(_LAG_TICK * 1e9))
