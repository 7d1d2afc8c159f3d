"""brokerlet's benchmark, its figures printed next to their targets.

Sections: throughput, keyshared (Key_Shared end to end), storage (per back-end, with event-loop
stalls), startup, memory, backpressure (the paused-consumer diagnostic), flow (FLOW latency)
and selector (Key_Shared selection).

Run it with ``make bench`` or
``python -m bench [--quick] [--only SECTION] [--producers N] [--profile]``.
Figures go to stdout and to ``bench/results/latest.json``.
"""
