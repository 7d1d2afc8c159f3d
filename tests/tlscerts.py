"""Test certificates made in the test session with trustme: nothing private is committed.

One CA signs the broker's certificate (for 127.0.0.1 and localhost) and the client
certificates; a second, untrusted CA signs an impostor's.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from brokerlet import Broker


@dataclass(frozen=True)
class CertFiles:
    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    ca: str
    """PEM of the trusted CA (the broker's tlsTrustCertsFilePath and the clients' trust)."""
    broker: CertFiles
    client: CertFiles
    """CN = tls-client."""
    no_cn: CertFiles
    """Signed by the trusted CA, with no common name."""
    stranger: CertFiles
    """CN = tls-client, signed by another CA."""
    superuser: CertFiles
    """CN = superuser."""
    ca_obj: trustme.CA

    def tls_listener(self) -> dict[str, Any]:
        """Broker settings for a TLS listener on an ephemeral port, with the broker's cert."""
        return {
            "broker_service_port_tls": 0,
            "tls_certificate_file_path": self.broker.cert,
            "tls_key_file_path": self.broker.key,
        }

    def client_context(self, cert: CertFiles | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        if cert is not None:
            context.load_cert_chain(cert.cert, cert.key)
        return context


def tls_listener_address(broker: Broker) -> tuple[str, int]:
    """Where a running broker's TLS listener (:meth:`Pki.tls_listener`) accepts."""
    assert broker.service_url_tls is not None
    return "127.0.0.1", int(broker.service_url_tls.rsplit(":", 1)[1])


def _write(directory: Path, name: str, leaf: trustme.LeafCert) -> CertFiles:
    cert, key = directory / f"{name}.cert.pem", directory / f"{name}.key.pem"
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    return CertFiles(str(cert), str(key))


def make_pki(directory: Path) -> Pki:
    ca, other_ca = trustme.CA(), trustme.CA()
    ca_path = directory / "ca.cert.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    return Pki(
        ca=str(ca_path),
        broker=_write(directory, "broker", ca.issue_cert("127.0.0.1", "localhost")),
        client=_write(
            directory, "client", ca.issue_cert("client@example.org", common_name="tls-client")
        ),
        no_cn=_write(directory, "no-cn", ca.issue_cert("nocn@example.org")),
        stranger=_write(
            directory,
            "stranger",
            other_ca.issue_cert("client@example.org", common_name="tls-client"),
        ),
        superuser=_write(
            directory, "superuser", ca.issue_cert("super@example.org", common_name="superuser")
        ),
        ca_obj=ca,
    )
