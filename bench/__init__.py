"""brokerlet's benchmark, its figures printed next to their targets.

Sections: throughput, keyshared (Key_Shared end to end), storage (per back-end, with event-loop
stalls), startup, memory, backpressure (the paused-consumer diagnostic), flow (FLOW latency)
and selector (Key_Shared selection).

Run it with ``make bench`` or
``python -m bench [--quick] [--only SECTION] [--producers N] [--profile]``.
Figures go to stdout and to ``bench/results/latest.json``.

Layout:

* :mod:`bench.cli` (options, section order, the final table), :mod:`bench.report` (what is
  printed and saved), :mod:`bench.plan` (how much of everything each plan runs).
* ``bench/sections/``: one module per ``--only`` section, each measuring and making its rows.
* ``bench/clients/``: the official client's producer and consumer processes the end-to-end
  sections drive a broker with.
* ``bench/micro/``: micro-benchmarks run on their own (codec, selector, disk ledger);
  the selector section reports :mod:`bench.micro.selector`.
* :mod:`bench.stall_probe` (a broker with a stall meter, run as a child by the storage
  section) and :mod:`bench.profiling` (reading ``--profile``'s cProfile output).

Brokers in child processes, free ports and percentiles come from :mod:`brokerlet.testing`,
the harness the tests and the load tests share.
"""
