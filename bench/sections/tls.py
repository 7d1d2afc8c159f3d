"""TLS against plain: end-to-end msg/s on one broker in the same run, and handshakes per second.

One broker serves both ``pulsar://`` and ``pulsar+ssl://`` (certificates made for the run with
trustme); batched and unbatched runs alternate between the two URLs so each pair shares
conditions, and the figure is the ratio of the medians. Connection set-up is timed from this
process: TCP connect, TLS handshake, CONNECT/CONNECTED, close, one after another.
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
import time
from pathlib import Path

import psutil
import trustme

from bench.clients.jobs import TLS_TRUST_ENV
from bench.plan import Plan, SectionResult, run_timeout
from bench.report import Row, Summary, format_rate, judge
from bench.sections.throughput import MODES, RunResult, run_once
from brokerlet.testing import free_port
from brokerlet.testing.process import BrokerletProcess
from brokerlet.transport.protocol import PROTOCOL_VERSION, FrameDecoder, encode_command, pb

__all__ = ["run_tls"]

TLS_RATIO_TARGET = 0.70  # batched end-to-end over TLS, as a share of plain
CONNECT_SECONDS = 3.0


def run_tls(plan: Plan, producers: int) -> SectionResult:
    section = SectionResult()
    with tempfile.TemporaryDirectory(prefix="brokerlet-bench-tls-") as directory:
        ca_path, cert, key = _certificates(Path(directory))
        os.environ[TLS_TRUST_ENV] = ca_path
        tls_port = free_port()
        flags = (
            "--storage",
            "memory",
            "--broker-service-port-tls",
            str(tls_port),
            "--tls-certificate-file-path",
            cert,
            "--tls-key-file-path",
            key,
        )
        with BrokerletProcess(flags=flags) as broker:
            plain_url = broker.start().service_url
            tls_url = f"pulsar+ssl://127.0.0.1:{tls_port}"
            process = psutil.Process(broker.pid)
            for name, mode in MODES.items():
                messages = plan.messages[name] // 2
                timeout = run_timeout(messages)
                print(f"tls, {name}: plain and TLS runs alternate on one broker", flush=True)
                run_once(
                    tls_url,
                    mode,
                    plan.warmup[name],
                    run_timeout(plan.warmup[name]),
                    process,
                    producers,
                )
                runs: dict[str, list[RunResult]] = {"plain": [], "tls": []}
                for index in range(plan.repeats):
                    for label, url in (("plain", plain_url), ("tls", tls_url)):
                        result = run_once(url, mode, messages, timeout, process, producers)
                        state = "" if result.error is None else f" FAILED: {result.error}"
                        print(
                            f"  run {index + 1}/{plan.repeats} {label}: end-to-end "
                            f"{format_rate(result.end_to_end_rate)}, broker CPU "
                            f"{result.broker_cpu:.0%}{state}",
                            flush=True,
                        )
                        runs[label].append(result)
                section.data[name] = _mode_rows(section, name, runs)
            rates = {
                label: _connections_per_second(port, context)
                for label, port, context in (
                    ("plain", broker.port, None),
                    ("tls", tls_port, _client_context(ca_path)),
                )
            }
    section.data["connections_per_second"] = rates
    section.rows.append(
        Row(
            "connections/s with TLS handshake (one at a time)",
            f"{rates['tls']:,.0f}/s",
            f"plain {rates['plain']:,.0f}/s",
        )
    )
    return section


def _mode_rows(
    section: SectionResult, name: str, runs: dict[str, list[RunResult]]
) -> dict[str, object]:
    good = {label: [r for r in rs if r.error is None] for label, rs in runs.items()}
    section.failed |= any(r.error is not None for rs in runs.values() for r in rs)
    medians = {
        label: Summary.of([r.end_to_end_rate for r in rs]).median for label, rs in good.items()
    }
    ratio = medians["tls"] / medians["plain"] if medians["plain"] else float("nan")
    target = f">= {TLS_RATIO_TARGET:.0%}" if name == "batched" else ""
    status = judge(ratio, at_least=TLS_RATIO_TARGET) if name == "batched" else ""
    section.rows.append(
        Row(
            f"end-to-end over TLS / plain, {name}",
            f"{ratio:.0%}",
            f"TLS {format_rate(medians['tls'])}, plain {format_rate(medians['plain'])}",
            target,
            status,
        )
    )
    return {"tls_end_to_end": medians["tls"], "plain_end_to_end": medians["plain"], "ratio": ratio}


def _certificates(directory: Path) -> tuple[str, str, str]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca_path, cert, key = (str(directory / n) for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(ca_path)
    leaf.cert_chain_pems[0].write_to_path(cert)
    leaf.private_key_pem.write_to_path(key)
    return ca_path, cert, key


def _client_context(ca_path: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca_path)


_CONNECT = encode_command(
    pb.BaseCommand(
        type=pb.BaseCommand.CONNECT,
        connect=pb.CommandConnect(client_version="bench", protocol_version=PROTOCOL_VERSION),
    )
)


def _connections_per_second(port: int, context: ssl.SSLContext | None) -> float:
    """Connections opened, handshaken (TLS and CONNECT) and closed per second, serially."""
    done = 0
    began = time.perf_counter()
    while time.perf_counter() - began < CONNECT_SECONDS:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
        with sock:
            sock.sendall(_CONNECT)
            decoder = FrameDecoder(1 << 20)
            frames: list[object] = []
            while not frames:
                data = sock.recv(65536)
                if not data:
                    raise RuntimeError("the broker closed the connection before CONNECTED")
                frames = list(decoder.feed(data))
        done += 1
    return done / (time.perf_counter() - began)
