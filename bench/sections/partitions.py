"""Partitioned topics: the lookup + partitioned-metadata round trip, and end-to-end msg/s on
a 4-partition topic against the same load on one topic, on one broker in one run.

The round trip is timed from this process over a raw socket with brokerlet's codec (one
PARTITIONED_METADATA and one LOOKUP per round, as a client does before it connects a
producer). The throughput runs are :func:`bench.sections.throughput.run_once` (producer and
consumer processes of the official client), the one-topic and 4-partition runs taking turns.
"""

from __future__ import annotations

import itertools
import os
import socket
import statistics
import time
import uuid
from typing import Any

import psutil
import requests

from bench.plan import Plan, SectionResult
from bench.report import Row, Summary, format_rate
from bench.sections.throughput import MODES, run_in_turns
from brokerlet import __version__
from brokerlet.testing import percentile
from brokerlet.testing.process import BrokerletProcess
from brokerlet.transport.protocol import FrameDecoder, encode_command, pb

__all__ = ["run_partitions"]

PARTITIONS = 4
ROUND_TRIPS = {True: 500, False: 5_000}  # quick, full
T = pb.BaseCommand


def run_partitions(plan: Plan, producers: int, quick: bool) -> SectionResult:
    section = SectionResult()
    mode = MODES["unbatched"]
    messages = plan.messages["unbatched"]
    with BrokerletProcess(web_service=True) as broker:
        url = broker.start().service_url
        process = psutil.Process(broker.pid)
        web = broker.stats_url
        lookups = _round_trips(url, web, ROUND_TRIPS[quick])
        print(
            f"partitions: lookup + partitioned metadata, {ROUND_TRIPS[quick]:,} rounds: "
            f"median {lookups['median_us']:.0f} us, p99 {lookups['p99_us']:.0f} us",
            flush=True,
        )
        print(
            f"partitions: {mode.name}, {messages:,} messages per run, {producers} producer "
            f"process(es), one topic and {PARTITIONS} partitions taking turns",
            flush=True,
        )
        runs = run_in_turns(
            {
                "one topic": lambda: _topic(web, 0),
                f"{PARTITIONS} partitions": lambda: _topic(web, PARTITIONS),
            },
            plan.repeats,
            url,
            mode,
            messages,
            process,
            producers,
        )
    one = Summary.of([r.end_to_end_rate for r in runs["one topic"]])
    many = Summary.of([r.end_to_end_rate for r in runs[f"{PARTITIONS} partitions"]])
    ratio = many.median / one.median if one.median else float("nan")
    section.data = {
        "lookup_round_trip": lookups,
        "end_to_end_one_topic": one.as_dict(),
        "end_to_end_partitioned": many.as_dict(),
        "partitions": PARTITIONS,
        "ratio_partitioned_to_one_topic": ratio,
    }
    section.rows = [
        Row(
            "lookup + partitioned metadata round trip",
            f"{lookups['median_us']:.0f} us",
            f"p99 {lookups['p99_us']:.0f} us",
        ),
        Row("end-to-end, unbatched, one topic", format_rate(one.median), _range(one)),
        Row(
            f"end-to-end, unbatched, {PARTITIONS} partitions",
            format_rate(many.median),
            _range(many),
        ),
        Row(f"  {PARTITIONS} partitions / one topic", f"{ratio:.2f}x"),
    ]
    section.failed = any(r.error is not None for rs in runs.values() for r in rs)
    return section


def _range(summary: Summary) -> str:
    return f"{summary.low:,.0f}-{summary.high:,.0f}"


def _topic(web: str, partitions: int) -> str:
    local = f"public/default/bench-partitions-{uuid.uuid4().hex[:12]}"
    if partitions:
        reply = requests.put(
            f"{web}/admin/v2/persistent/{local}/partitions", json=partitions, timeout=10
        )
        reply.raise_for_status()
    return f"persistent://{local}"


def _round_trips(service_url: str, web: str, rounds: int) -> dict[str, Any]:
    topic = _topic(web, PARTITIONS)
    host, port = service_url.removeprefix("pulsar://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    decoder = FrameDecoder(16 * 1024 * 1024)
    pending: list[Any] = []

    def expect(kind: int) -> Any:
        while not pending:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            pending.extend(decoder.feed(data))
        command = pending.pop(0).command
        if command.type != kind:
            raise AssertionError(f"expected {kind}, got {command.type}")
        return command

    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(
            encode_command(
                T(
                    type=T.CONNECT,
                    connect=pb.CommandConnect(
                        client_version=f"bench-{__version__}", protocol_version=21
                    ),
                )
            )
        )
        expect(T.CONNECTED)
        ids = itertools.count(1)
        samples = []
        for _ in range(rounds):
            began = time.perf_counter()
            sock.sendall(
                encode_command(
                    T(
                        type=T.PARTITIONED_METADATA,
                        partitioned_metadata=pb.CommandPartitionedTopicMetadata(
                            topic=topic, request_id=next(ids)
                        ),
                    )
                )
            )
            answer = expect(T.PARTITIONED_METADATA_RESPONSE).partitioned_metadata_response
            assert answer.partitions == PARTITIONS, answer
            sock.sendall(
                encode_command(
                    T(
                        type=T.LOOKUP,
                        lookup=pb.CommandLookupTopic(
                            topic=f"{topic}-partition-0", request_id=next(ids)
                        ),
                    )
                )
            )
            expect(T.LOOKUP_RESPONSE)
            samples.append((time.perf_counter() - began) * 1e6)
    finally:
        sock.close()
    return {
        "rounds": rounds,
        "median_us": statistics.median(samples),
        "p99_us": percentile(samples, 0.99),
        "cpu_count": os.cpu_count(),
    }
