"""Micro-benchmarks of single components, each runnable with ``python -m bench.micro.X``."""
