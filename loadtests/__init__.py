"""Locust load tests for brokerlet, built on its gevent-native client.

Run them with ``python -m loadtests`` (see :mod:`loadtests.cli` and ``loadtests/README.md``).
Importing this package imports nothing from Locust: only ``loadtests.runner`` and
``loadtests.users`` do, because Locust monkey-patches the process it is imported into.
"""
