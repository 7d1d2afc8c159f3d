"""Loopback ports for programs that must be told one before they start."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A loopback port that was free a moment ago.

    Only for programs that cannot take port 0 and report theirs; the usual small race
    (something else binding it first) applies.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
