"""Run one scenario through Locust's LocalRunner, then write and print its results.

Importing this module imports Locust, which monkey-patches the whole process; run it in a
process of its own (``python -m loadtests run ...``, whose ``__main__`` imports Locust before
anything else), never inside pytest or the broker.

A run goes through these phases:

1. start the broker in its own process (unless a service URL was given);
2. create the subscriptions (so no message is published before they exist);
3. spawn every user; each connects, and producers wait until all are connected;
4. publish for ``duration`` seconds (with the pause or churn controller if the scenario has
   one), sampling the broker's stats every second;
5. stop publishing and give the consumers ``drain_timeout`` seconds to receive the rest;
6. stop Locust, close the clients, stop the broker; write the Locust CSV files and HTML
   report, ``summary.json``, and print the tables.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gevent
import psutil
from locust.env import Environment
from locust.html import get_html_report
from locust.log import setup_logging
from locust.stats import (
    CSV_STATS_INTERVAL_SEC,
    PERCENTILES_TO_REPORT,
    StatsCSVFileWriter,
    stats_history,
)

from brokerlet.client import Client, ConsumerType, InitialPosition, PulsarError
from brokerlet.locust import install_tracker
from loadtests.brokers import BrokerProcess, make_broker
from loadtests.context import RunContext, use_process_unique_consumer_ids
from loadtests.controllers import (
    churn_consumers,
    measure_loop_lag,
    pause_one_consumer,
    sample_stats,
)
from loadtests.profile import Profiler
from loadtests.report import format_header, format_profile, format_samples, format_summary
from loadtests.scenarios import Scenario
from loadtests.users import user_classes

__all__ = ["RunOptions", "run"]

log = logging.getLogger("loadtests")

_SPAWN_RATE = 100  # users per second; Locust warns that faster spawning misbehaves
_CONNECT_GRACE = 30.0  # seconds for every user to connect, on top of the spawn time
_CLOSE_TIMEOUT = 15.0


@dataclass
class RunOptions:
    """How to run a scenario (the scenario itself says what to run).

    Attributes:
        output: the directory for this run's files (created).
        broker: ``brokerlet`` or ``pulsar-lite``; ignored when ``service_url`` is set.
        service_url: use this already running broker instead of starting one (no CPU figures).
        brokerlet_args: extra ``brokerlet serve`` flags.
        brokerlet_source: run brokerlet from this source tree.
        seed: seeds the key choices.
        label: a free-form label stored in the summary (the comparison's load level, say).
        quiet: print only the one-line verdict, not the tables.
        profile: sample the broker with py-spy during the publishing phase and print its
            top functions (written to ``broker-profile.txt``).
        stats_interval: seconds between samples of the broker's stats; 0 samples only the
            load generator's own counts (no HTTP requests to the broker).
    """

    output: Path
    broker: str = "brokerlet"
    service_url: str | None = None
    brokerlet_args: list[str] = field(default_factory=list)
    brokerlet_source: Path | None = None
    seed: int = 1
    label: str = ""
    quiet: bool = False
    profile: bool = False
    stats_interval: float = 1.0


def run(scenario: Scenario, options: RunOptions) -> int:
    """Run ``scenario``; return the exit code (0 passed, 1 a violation, 2 could not run)."""
    setup_logging("WARNING")  # type: ignore[no-untyped-call]
    use_process_unique_consumer_ids()
    options.output.mkdir(parents=True, exist_ok=True)
    broker: BrokerProcess | None = None
    if options.service_url is None:
        broker = make_broker(options.broker, brokerlet_args=options.brokerlet_args,
                             brokerlet_source=options.brokerlet_source)
    broker_info: dict[str, object] = (
        {"name": "external", "service_url": options.service_url} if broker is None else {}
    )
    try:
        if broker is not None:
            broker.start()
            broker_info = broker.describe()
        service_url = options.service_url or (broker.service_url if broker else "")
        print(format_header(scenario.describe(), broker_info), flush=True)
        summary = _run_started(scenario, options, broker, service_url, broker_info)
    except (RuntimeError, PulsarError) as error:
        print(f"loadtest {scenario.name}: could not run: {error}", file=sys.stderr, flush=True)
        return 2
    finally:
        if broker is not None:
            broker.close()
    _write_summary(options.output / "summary.json", summary)
    if not options.quiet:
        print(format_samples(summary["broker_stats_samples"]))
        print(format_summary(summary))
    profile_path = options.output / "broker-profile.txt"
    if options.profile and profile_path.exists():
        print(format_profile(profile_path))
    verdict = summary["verdict"]
    print(f"{scenario.name} on {broker_info.get('name')}: "
          f"{'PASS' if verdict['passed'] else 'FAIL'}; results in {options.output}", flush=True)
    return 0 if verdict["passed"] else 1


def _run_started(
    scenario: Scenario,
    options: RunOptions,
    broker: BrokerProcess | None,
    service_url: str,
    broker_info: dict[str, object],
) -> dict[str, Any]:
    topic = f"{scenario.name}-{random.Random().getrandbits(32):08x}"
    _create_subscriptions(scenario, service_url, topic)
    context = RunContext(scenario, service_url, topic, options.seed)
    environment = Environment(user_classes=user_classes(context), host=service_url)
    context.fire_request = environment.events.request.fire
    install_tracker(environment, context.tracker)
    runner = environment.create_local_runner()
    csv_writer = StatsCSVFileWriter(environment, PERCENTILES_TO_REPORT,
                                    str(options.output / "locust"), full_history=True)
    background = [gevent.spawn(csv_writer.stats_writer), gevent.spawn(stats_history, runner)]
    samples: list[dict[str, Any]] = []
    users = scenario.producers + scenario.consumers
    spawn_started = time.perf_counter()
    runner.start(users, spawn_rate=min(users, _SPAWN_RATE))
    connect_timeout = users / _SPAWN_RATE + _CONNECT_GRACE
    if not context.all_connected.wait(connect_timeout):
        context.ledger.errors.append(
            f"only {context._connected} of {users} users connected within {connect_timeout:.0f} s"
        )
    spawn_seconds = time.perf_counter() - spawn_started

    own = psutil.Process()
    broker_cpu_start = broker.cpu_seconds() if broker else 0.0
    own_cpu_start = _cpu_seconds(own)
    context.publishing_started = time.perf_counter()
    context.publishing.set()
    lag_monitor = gevent.spawn(measure_loop_lag, context)
    sampler = gevent.spawn(sample_stats, context, broker if options.stats_interval else None,
                           samples, options.stats_interval or 1.0)
    profiler = None
    if options.profile and broker is not None:
        profiler = Profiler(broker.pid, options.output / "broker-profile.txt")
    controllers = []
    if scenario.pause_seconds:
        controllers.append(gevent.spawn(pause_one_consumer, context))
    if scenario.churn_interval:
        controllers.append(gevent.spawn(churn_consumers, context))
    gevent.sleep(scenario.duration)  # the publishing phase itself

    context.stop_publishing()
    if profiler is not None:
        errors = profiler.stop()
        if errors.strip():
            log.warning("py-spy: %s", errors.strip())
    gevent.joinall(controllers, timeout=scenario.pause_seconds + 5)
    for controller in controllers:
        if not controller.successful():
            context.ledger.errors.append(f"controller failed: {controller.exception!r}")
    context.caught_up.wait(scenario.drain_timeout)
    finished = time.perf_counter()
    gevent.killall([sampler, lag_monitor])
    broker_cpu = broker.cpu_seconds() - broker_cpu_start if broker else None
    own_cpu = _cpu_seconds(own) - own_cpu_start
    if broker is not None and not broker.alive():
        context.ledger.errors.append(f"the broker exited:\n{broker.log_tail()}")

    context.finished.set()
    runner.quit()
    _close_clients(context.clients)
    gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)  # let the CSV writer write its last rows
    gevent.killall(background)
    csv_writer.close_files()
    (options.output / "report.html").write_text(
        get_html_report(environment, show_download_link=False),  # type: ignore[no-untyped-call]
        encoding="utf-8",
    )
    return _summary(scenario, options, context, environment, broker_info, samples, {
        "spawn_s": spawn_seconds,
        "publishing_s": context.publishing_stopped - context.publishing_started,
        "drain_s": finished - context.publishing_stopped,
        "measured_s": finished - context.publishing_started,
        "broker_cpu_s": broker_cpu,
        "loadgen_cpu_s": own_cpu,
    })


def _create_subscriptions(scenario: Scenario, service_url: str, topic: str) -> None:
    """Subscribe once to every subscription and leave, so they exist (durable) before
    anything is published."""
    client = Client(service_url)
    try:
        for name in scenario.subscription_names():
            client.subscribe(
                topic, name, consumer_type=ConsumerType[scenario.subscription_type],
                initial_position=InitialPosition.Earliest,
            ).close()
    finally:
        client.close()


def _close_clients(clients: list[Client]) -> None:
    def close(client: Client) -> None:
        try:
            client.close()
        except PulsarError as error:
            log.warning("closing a client failed: %s", error)

    gevent.joinall([gevent.spawn(close, client) for client in list(clients)],
                   timeout=_CLOSE_TIMEOUT)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _summary(
    scenario: Scenario,
    options: RunOptions,
    context: RunContext,
    environment: Environment,
    broker_info: dict[str, object],
    samples: list[dict[str, Any]],
    timing: dict[str, Any],
) -> dict[str, Any]:
    ledger = context.ledger
    verdict = ledger.verdict()
    broker_cpu: float | None = timing["broker_cpu_s"]
    started = context.publishing_started
    publish_window = max(context.last_receipt - started, 1e-9)
    delivery_window = max(context.last_delivery - started, 1e-9)
    delivered = ledger.total_unique()
    per_subscription = {
        name: round(ledger.unique(name) / delivery_window, 1)
        for name in scenario.subscription_names()
    }
    locust_stats = {}
    for (name, method), entry in environment.stats.entries.items():
        locust_stats[f"{method} {name}"] = {
            "requests": entry.num_requests,
            "failures": entry.num_failures,
            "median_ms": entry.median_response_time,
            "p99_ms": entry.get_response_time_percentile(0.99),
            "avg_ms": round(entry.avg_response_time, 3),
        }
    return {
        "scenario": {**scenario.describe(), "ordered": scenario.ordered},
        "broker": broker_info,
        "label": options.label,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "topic": context.topic,
        "timing_s": {key: round(value, 3) for key, value in timing.items()
                     if not key.endswith("cpu_s")},
        "throughput": {
            "published_msg_s": round(ledger.receipted / publish_window, 1)
            if ledger.receipted else 0.0,
            "delivered_msg_s": round(delivered / delivery_window, 1) if delivered else 0.0,
            "per_subscription_msg_s": per_subscription,
        },
        "latency_us": {
            "publish": context.publish_latency.summary(),
            "e2e": context.e2e_latency.summary(),
            "loadgen_loop_lag": context.loop_lag.summary(),
            "e2e_by_subscription": {
                name: histogram.summary()
                for name, histogram in context.e2e_by_subscription.items()
            },
        },
        "locust": locust_stats,
        "cpu": {
            "broker_cpu_s": None if broker_cpu is None else round(broker_cpu, 3),
            "broker_cpu_us_per_delivered": round(1e6 * broker_cpu / delivered, 2)
            if broker_cpu is not None and delivered else None,
            "broker_cpu_pct": None if broker_cpu is None
            else round(100 * broker_cpu / timing["measured_s"], 1),
            "loadgen_cpu_s": round(timing["loadgen_cpu_s"], 3),
            "loadgen_cpu_pct": round(100 * timing["loadgen_cpu_s"] / timing["measured_s"], 1),
        },
        "verdict": verdict.to_dict(),
        "reports": context.reports,
        "broker_stats_samples": samples,
        "results_dir": str(options.output),
    }


def _write_summary(path: Path, summary: dict[str, Any]) -> None:
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
