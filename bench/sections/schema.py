"""Producer creation with a 50-field Avro schema against no schema, in one run.

Every round creates, on a broker in this process, one official-client producer of each
kind, in turn so that load on the machine falls on all of them alike:

- ``none``: no schema, fresh topic;
- ``none_existing``: no schema, a topic created earlier in the round;
- ``register``: the 50-field schema on a fresh topic (validated, registered as version 0),
  compared with ``none``;
- ``known``: the same schema on a topic that already has it (found as the same version),
  compared with ``none_existing``;
- ``evolve``: a 51st field with a default on a topic at the 50-field version (validated,
  checked FULL both ways by Avro's resolution rules, registered as version 1), compared
  with ``none_existing``.

Run alone: ``python -m bench.sections.schema [--rounds N]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Any

import pulsar

from bench.clients.jobs import quiet_logger
from bench.plan import Plan, SectionResult
from bench.report import Row, judge
from brokerlet import Broker

__all__ = ["ADDED_MS_TARGET", "main", "run", "run_schema"]

ADDED_MS_TARGET = 2.0
"""Most milliseconds a schema may add to producer creation (issue 18)."""

KINDS = ("none", "none_existing", "register", "known", "evolve")
BASELINES = {"register": "none", "known": "none_existing", "evolve": "none_existing"}


def _avro(fields: int) -> str:
    return json.dumps(
        {
            "type": "record",
            "name": "Wide",
            "namespace": "bench",
            "fields": [
                {"name": f"field_{i}", "type": ["null", "string"], "default": None}
                for i in range(fields)
            ],
        }
    )


def run(rounds: int) -> dict[str, Any]:
    """Median creation times (ms) per kind, and each schema kind's excess over ``none``."""
    wide = pulsar.schema.AvroSchema(None, schema_definition=json.loads(_avro(50)))
    wider = pulsar.schema.AvroSchema(None, schema_definition=json.loads(_avro(51)))
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    topics = (f"persistent://public/default/schema-{n}" for n in itertools.count())
    with Broker(port=0, web_service_enabled=False) as broker:
        client = pulsar.Client(
            broker.service_url, operation_timeout_seconds=30, logger=quiet_logger()
        )
        try:
            known = next(topics)
            client.create_producer(known, schema=wide).close()

            def timed(kind: str, topic: str, schema: Any) -> None:
                began = time.perf_counter()
                producer = (
                    client.create_producer(topic)
                    if schema is None
                    else client.create_producer(topic, schema=schema)
                )
                samples[kind].append((time.perf_counter() - began) * 1000)
                producer.close()

            for round_number in range(rounds + 3):
                evolving, existing = next(topics), next(topics)
                client.create_producer(evolving, schema=wide).close()
                client.create_producer(existing).close()
                plan = [
                    ("none", next(topics), None),
                    ("none_existing", existing, None),
                    ("register", next(topics), wide),
                    ("known", known, wide),
                    ("evolve", evolving, wider),
                ]
                # Rotate the order each round; the first 3 rounds warm up and are dropped.
                shift = round_number % len(plan)
                for kind, topic, schema in plan[shift:] + plan[:shift]:
                    timed(kind, topic, schema)
                if round_number < 3:
                    for values in samples.values():
                        values.clear()
        finally:
            client.close()
    medians = {kind: statistics.median(values) for kind, values in samples.items()}
    return {
        "rounds": rounds,
        "median_ms": medians,
        "added_ms": {kind: medians[kind] - medians[base] for kind, base in BASELINES.items()},
    }


def run_schema(plan: Plan) -> SectionResult:
    """The bench section: each schema kind's median creation time and its excess."""
    print(f"schema: bench/sections/schema.py --rounds {plan.schema_rounds}", flush=True)
    results = run(plan.schema_rounds)
    section = SectionResult(data=results)
    medians, added = results["median_ms"], results["added_ms"]
    section.rows += [
        Row(
            "producer creation, no schema, new topic",
            f"{medians['none']:.2f} ms",
            f"median of {plan.schema_rounds}, official client, same run",
        ),
        Row("  no schema, existing topic", f"{medians['none_existing']:.2f} ms"),
    ]
    labels = {
        "register": "50-field Avro, new topic, registered",
        "known": "50-field Avro, known version",
        "evolve": "51st field, FULL check + register",
    }
    for kind, label in labels.items():
        section.rows.append(
            Row(
                f"  {label}",
                f"{medians[kind]:.2f} ms",
                f"{added[kind]:+.2f} ms added",
                f"<= {ADDED_MS_TARGET:.0f} ms added",
                judge(added[kind], at_most=ADDED_MS_TARGET),
            )
        )
    return section


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    results = run(args.rounds)
    for kind in KINDS:
        added = results["added_ms"].get(kind)
        extra = "" if added is None else f"  (+{added:.2f} ms)"
        print(f"{kind:>9}: {results['median_ms'][kind]:.2f} ms{extra}")
    return results


if __name__ == "__main__":
    main()
