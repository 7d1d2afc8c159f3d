"""The line tracer the micro-benchmarks' ``--lines`` modes read (bench/linetrace.py)."""

from __future__ import annotations

from pathlib import Path

from bench.linetrace import LineCounts, TracedBroker
from bench.rawsocket import RawConnection
from brokerlet.transport.protocol import pb

T = pb.BaseCommand


def test_a_window_counts_the_python_its_requests_ran(tmp_path: Path) -> None:
    with TracedBroker(["--storage", "memory"], tmp_path / "lines.json") as broker:
        broker.start(timeout=60)
        connection = RawConnection(broker.service_url, "linetrace-test")
        broker.cpu_seconds()  # closes the window of start-up and CONNECT
        for _ in range(10):
            assert connection.request(T(type=T.PING, ping=pb.CommandPing())).type == T.PONG
        broker.cpu_seconds()
        pings = broker.window()
        broker.cpu_seconds()  # nothing asked in between
        idle = broker.window()
        connection.close()
    handled = [name for name in pings.functions if "brokerlet/actors/connection.py" in name]
    assert handled, "the PINGs ran the connection actor's Python"
    assert pings.lines > idle.lines
    assert pings.calls > 0
    # A difference keeps every function of the later counts.
    assert set((pings - idle).functions) == set(pings.functions)
    assert (pings - pings).lines == 0


def test_counts_read_back_from_a_dump(tmp_path: Path) -> None:
    dump = tmp_path / "dump.json"
    dump.write_text('[["a.py:1(f)", 7, 2], ["b.py:3(g)", 5, 1]]')
    counts = LineCounts.read(dump)
    assert (counts.lines, counts.calls) == (12, 3)
    assert counts.report(per=2).splitlines()[0] == "6.0 lines and 1.5 calls of Python each"
