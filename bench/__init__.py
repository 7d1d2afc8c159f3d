"""brokerlet's benchmark: throughput, start-up and memory, printed next to their targets.

Run it with ``make bench`` or
``python -m bench [--quick] [--only SECTION] [--producers N] [--profile]``.
Figures go to stdout and to ``bench/results/latest.json``.
"""
