"""Switches for comparing dispatch with and without a rule (tests and the bench only).

The broker always runs with the defaults; a test or a diagnostic passes other options to
``Broker(dispatch_options=...)`` (or straight to a dispatcher) to show what a rule prevents.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_OPTIONS", "DispatchOptions"]


@dataclass(frozen=True, slots=True)
class DispatchOptions:
    """How a dispatcher departs from Pulsar's current dispatch, to measure the difference.

    Attributes:
        writability_gating: skip consumers whose connection is over its high watermark. Off,
            the broker keeps feeding a paused socket (Pulsar's backpressure diagnostic).
        completion_barrier: wait for every consumer batch's write to complete before the next
            read, as Key_Shared did before Pulsar #26635. On, a slow socket stalls everyone.
        read_after_dispatch: request the next read as soon as a pass hands anything out, as
            Pulsar's Shared dispatcher does, besides the batches' write completions. Together
            with ``writability_gating=False`` this is a Pulsar dispatcher without writability
            gating, which feeds a paused socket until the permits run out.
    """

    writability_gating: bool = True
    completion_barrier: bool = False
    read_after_dispatch: bool = False


DEFAULT_OPTIONS = DispatchOptions()
