"""Compaction: the compaction rate on a large keyed topic, and produce throughput while a
compaction runs against the same load without one, on one broker in one run.

The topic is filled by the official client (batched, keys ``k0..k{keys-1}`` round-robin),
then compacted over the admin API (``PUT .../compaction``, status polled). The produce
runs are :func:`bench.throughput.run_once` (unbatched, fresh topics), alternating "quiet"
and "compacting"; during a compacting run compactions of the big topic are restarted as
soon as one ends, so one is always running.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psutil
import pulsar
import requests

from bench.plan import Plan, SectionResult, run_timeout
from bench.report import Row, Summary, format_rate
from bench.sections.throughput import MODES, RunResult, run_once
from brokerlet.testing.process import BrokerletProcess

__all__ = ["run_compaction"]

SIZES = {True: (100_000, 1_000), False: (1_000_000, 10_000)}  # quick, full: messages, keys
TARGET = 0.80


def _fill(url: str, topic: str, messages: int, keys: int) -> float:
    client = pulsar.Client(url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=100,
            batching_max_publish_delay_ms=10,
            max_pending_messages=20_000,
            block_if_queue_full=True,
        )
        started = time.perf_counter()
        for index in range(messages):
            producer.send_async(f"value-{index}".encode(), None, partition_key=f"k{index % keys}")
        producer.flush()
        return messages / (time.perf_counter() - started)
    finally:
        client.close()


def _compact(web: str, topic: str, timeout: float) -> dict[str, Any]:
    path = f"{web}/admin/v2/persistent/{topic.removeprefix('persistent://')}/compaction"
    started = time.perf_counter()
    answer = requests.put(path, timeout=30)
    if answer.status_code not in (204, 409):
        raise RuntimeError(f"PUT compaction: {answer.status_code} {answer.text}")
    while time.perf_counter() - started < timeout:
        status = requests.get(path, timeout=30).json()
        if status["status"] != "RUNNING":
            status["seconds"] = time.perf_counter() - started
            return dict(status)
        time.sleep(0.05)
    raise RuntimeError(f"compaction did not finish within {timeout} s")


def run_compaction(plan: Plan, producers: int, quick: bool) -> SectionResult:
    section = SectionResult()
    messages, keys = SIZES[quick]
    mode = MODES["unbatched"]
    produce_messages = plan.messages["unbatched"]
    with BrokerletProcess(web_service=True) as broker:
        url = broker.start().service_url
        process = psutil.Process(broker.pid)
        web = broker.stats_url
        # One big topic for the quiet compaction, one per compacting produce run: each of
        # those runs overlaps a whole first compaction (not a cheap re-compaction).
        topics = [
            f"persistent://public/default/compaction-{i}-{uuid.uuid4().hex[:8]}"
            for i in range(plan.repeats + 1)
        ]
        fill_rates = [_fill(url, topic, messages, keys) for topic in topics]
        stats = requests.get(
            f"{web}/admin/v2/persistent/{topics[0].removeprefix('persistent://')}/stats",
            timeout=30,
        ).json()
        entries = stats["lastEntryId"] + 1
        print(
            f"compaction: filled {len(topics)} topics of {messages:,} messages "
            f"({entries:,} entries), {keys:,} keys, at {format_rate(min(fill_rates))} or more",
            flush=True,
        )
        first = _compact(web, topics[0], 1800)
        if first["status"] != "SUCCESS":
            raise RuntimeError(f"compaction ended {first['status']}: {first.get('lastError')}")
        rate = entries / first["seconds"]
        print(
            f"compaction: {first['status']} in {first['seconds']:.1f} s: {rate:,.0f} entries/s, "
            f"{messages / first['seconds']:,.0f} messages/s",
            flush=True,
        )
        runs: dict[str, list[RunResult]] = {"quiet": [], "compacting": []}
        overlapped = []
        for index in range(plan.repeats):
            for label, results in runs.items():
                outcome: list[dict[str, Any]] = []
                helper = threading.Thread(
                    target=lambda t=topics[index + 1], o=outcome: o.append(_compact(web, t, 1800)),
                    daemon=True,
                )
                if label == "compacting":
                    helper.start()
                started = time.perf_counter()
                result = run_once(
                    url,
                    mode,
                    produce_messages,
                    run_timeout(produce_messages),
                    process,
                    producers=producers,
                )
                produced_for = time.perf_counter() - started
                note = ""
                if label == "compacting":
                    helper.join(1800)
                    took = outcome[0]["seconds"] if outcome else float("nan")
                    overlapped.append(took >= produced_for)
                    note = f", compaction {took:.1f} s for a {produced_for:.1f} s run" + (
                        "" if took >= produced_for else " (ended first)"
                    )
                results.append(result)
                print(
                    f"  run {index + 1}/{plan.repeats}, {label}: produce "
                    f"{format_rate(result.produce_rate)}, broker CPU {result.broker_cpu:.0%}"
                    + note
                    + (f"; FAILED: {result.error}" if result.error else ""),
                    flush=True,
                )
    quiet = Summary.of([r.produce_rate for r in runs["quiet"]])
    busy = Summary.of([r.produce_rate for r in runs["compacting"]])
    ratio = busy.median / quiet.median if quiet.median else float("nan")
    section.data = {
        "messages": messages,
        "keys": keys,
        "entries": entries,
        "compaction_seconds": first["seconds"],
        "compaction_entries_per_second": rate,
        "compaction_messages_per_second": messages / first["seconds"],
        "produce_quiet": quiet.as_dict(),
        "produce_compacting": busy.as_dict(),
        "compaction_overlapped_whole_run": overlapped,
        "ratio": ratio,
    }
    section.rows = [
        Row(
            f"compaction, {messages:,} messages / {keys:,} keys",
            f"{rate:,.0f} entries/s",
            f"{messages / first['seconds']:,.0f} msg/s, {first['seconds']:.1f} s",
        ),
        Row("produce, unbatched, no compaction", format_rate(quiet.median)),
        Row("produce, unbatched, while compacting", format_rate(busy.median)),
        Row(
            "  while compacting / without",
            f"{ratio:.2f}x",
            target=f">= {TARGET:.2f}x",
            status="MET" if ratio >= TARGET else "MISSED",
        ),
    ]
    section.failed = any(r.error for rs in runs.values() for r in rs)
    return section
