"""How much of everything the bench runs (:data:`FULL`, :data:`QUICK`), and what a section
returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.report import Row

__all__ = ["FULL", "QUICK", "Plan", "SectionResult", "run_timeout"]


@dataclass(frozen=True)
class Plan:
    """How much of everything to run.

    Attributes:
        repeats: Timed throughput runs per mode.
        messages: Messages per timed run, by mode.
        warmup: Messages in the untimed warm-up run, by mode.
        startup_repeats: Starts timed per kind of start.
        connections: Idle connections for the memory figure.
        compare_single_producer: Whether each timed throughput run is paired with one from
            a single producer process.
        keyshared_messages: Messages per timed Key_Shared run (``repeats`` runs per mode).
        keyshared_warmup: Messages in the untimed Key_Shared warm-up run, per mode.
        storage_rounds: Produce runs per storage back-end, the back-ends taking turns.
        storage_messages: Messages per storage produce run.
        storage_warmup: Messages in each back-end's untimed warm-up run.
        stall_messages: Messages sent to each stall probe.
        flow_samples: FLOW latency samples per path.
        micro_quick: Whether the in-process sections (selector, cursor, consumer) run short.
        schema_rounds: Rounds of producer creations per kind in the schema section.
    """

    repeats: int
    messages: dict[str, int]
    warmup: dict[str, int]
    startup_repeats: int
    connections: int
    compare_single_producer: bool
    keyshared_messages: int
    keyshared_warmup: int
    storage_rounds: int
    storage_messages: int
    storage_warmup: int
    stall_messages: int
    flow_samples: int
    micro_quick: bool
    schema_rounds: int


FULL = Plan(
    repeats=3,
    messages={"batched": 400_000, "unbatched": 100_000},
    warmup={"batched": 40_000, "unbatched": 10_000},
    startup_repeats=5,
    connections=1000,
    compare_single_producer=True,
    keyshared_messages=150_000,
    keyshared_warmup=10_000,
    storage_rounds=5,
    storage_messages=100_000,
    storage_warmup=10_000,
    stall_messages=150_000,
    flow_samples=40,
    micro_quick=False,
    schema_rounds=200,
)
QUICK = Plan(
    repeats=3,
    messages={"batched": 20_000, "unbatched": 5_000},
    warmup={"batched": 5_000, "unbatched": 1_000},
    startup_repeats=3,
    connections=1000,
    compare_single_producer=False,
    keyshared_messages=10_000,
    keyshared_warmup=2_000,
    storage_rounds=2,
    storage_messages=10_000,
    storage_warmup=2_000,
    stall_messages=30_000,
    flow_samples=20,
    micro_quick=True,
    schema_rounds=40,
)


@dataclass
class SectionResult:
    """A section's figures for the JSON file and its rows for the table."""

    data: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    failed: bool = False


def run_timeout(messages: int) -> float:
    """Seconds a run of ``messages`` may take before it counts as failed."""
    # Generous: a run only fails this when the broker makes less than 2,000 msg/s.
    return max(30.0, messages / 2_000)
