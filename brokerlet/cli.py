"""The ``brokerlet`` command: ``serve`` runs a broker, ``settings`` lists every setting,
``admin`` manages a broker through its admin API (:mod:`brokerlet.admin.cli`) and
``tokens`` makes keys and tokens like ``pulsar tokens``."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence

import gevent

from brokerlet import _compiled
from brokerlet.broker import Broker
from brokerlet.config import SettingsError, add_arguments, describe_settings, settings_from_args
from brokerlet.metadata import MetadataError
from brokerlet.security.tokens_cli import add_tokens_parser, run_tokens
from brokerlet.storage import StorageError

__all__ = [
    "MIDDLE_GC_THRESHOLD",
    "OLD_GC_THRESHOLD",
    "YOUNG_GC_THRESHOLD",
    "main",
    "settle_heap",
    "untrack_greenlet_tree",
]

YOUNG_GC_THRESHOLD = 10_000
"""Net new container objects that start a young-generation collection (Python's default 700).

A broker makes several short-lived tracked objects per message (frames, fields, append items)
and a few thousand are in flight at any time, so at 700 the collector ran every few hundred
messages (0.2-0.4 ms each, inside whatever handler allocated) and walked the in-flight
objects each time; in the stall probe those collections were most runs over 2 ms. At 10,000
the in-flight objects no longer reach the threshold: under the probe's sustained load
collections fell from about 400 to 7 per 150,000 messages, and to none once the ledgers kept
their entries without an object each (``storage.ledger.MemoryLedger``, the tail cache)."""

MIDDLE_GC_THRESHOLD = 2
"""Young collections before a generation-1 one (Python's 10). A new topic's objects survive,
so with 10 a generation-1 collection walked ~100,000 of them: 25-40 ms each while topics were
made with 8,000 open, 4-9 ms with 2 (docs/performance.md, thirty-first pass)."""

OLD_GC_THRESHOLD = 50
"""Generation-1 collections before a full one is considered (Python's 10): with
:data:`MIDDLE_GC_THRESHOLD` at 2, every 100 young collections, as with Python's 10 and 10."""


def settle_heap() -> None:
    """Tune the garbage collector for a process that is a broker, once it is ready.

    Everything alive now (modules, settings, actors) lives as long as the process: it is kept
    out of every later collection, which would otherwise walk it (a full collection paused the
    event loop ~8 ms). Young collections wait for :data:`YOUNG_GC_THRESHOLD` new objects, and
    generation 1 is collected every :data:`MIDDLE_GC_THRESHOLD` of them. Only ``brokerlet
    serve`` does this; an embedding program owns its heap.
    """
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD, MIDDLE_GC_THRESHOLD, OLD_GC_THRESHOLD)


def untrack_greenlet_tree() -> None:
    """Stop gevent recording each new greenlet's parent and spawning stack, unless
    ``GEVENT_TRACK_GREENLET_TREE`` in the environment says otherwise.

    The record is a debugging aid, on by default, paid at every spawn: a connection spawned
    three greenlets (reader, actor, writer) and recording was 46,000 of the 604,000
    instructions its set-up and close cost (docs/performance.md, twenty-ninth pass). Only
    ``brokerlet serve`` does this; an embedding program owns its gevent configuration.
    """
    if "GEVENT_TRACK_GREENLET_TREE" not in os.environ:
        gevent.config.track_greenlet_tree = False


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["admin"]:
        from brokerlet.admin.cli import main as admin_main  # noqa: PLC0415 -- its own parser

        return admin_main(argv[1:])
    parser = argparse.ArgumentParser(prog="brokerlet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("admin", help="pulsar-admin's verbs: brokerlet admin --help")
    serve = commands.add_parser("serve", help="run a broker until interrupted")
    add_arguments(serve)
    commands.add_parser("settings", help="list every setting with its alias and default")
    add_tokens_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "tokens":
        return run_tokens(args)

    if args.command == "settings":
        print(describe_settings())
        return 0

    # Configured before settings load, so the Pulsar-config notice of ignored keys shows.
    logging.basicConfig(format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("brokerlet").setLevel(logging.INFO)
    try:
        settings = settings_from_args(args, defaults={"storage": "disk"})
        logging.getLogger().setLevel(settings.log_level)
        logging.getLogger("brokerlet").setLevel(settings.log_level)
        broker = Broker(settings)  # checks what spans settings (listeners, security)
    except SettingsError as error:
        print(f"brokerlet: bad setting: {error}", file=sys.stderr)
        return 2

    def stop() -> None:
        logging.getLogger("brokerlet").info("stopping")
        broker.stop()

    def ready(_broker: Broker) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(signum, stop)
        settle_heap()
        print(f"brokerlet ready on {broker.service_url}", flush=True)
        if broker.web_service_url is not None:
            print(f"brokerlet stats on {broker.web_service_url}", flush=True)
        for label, url in (("TLS", broker.service_url_tls), ("HTTPS", broker.web_service_url_tls)):
            if url is not None:
                print(f"brokerlet {label} on {url}", flush=True)

    logging.getLogger("brokerlet").info("hot modules: %s", _compiled.STATUS)
    untrack_greenlet_tree()
    try:
        broker.serve_forever(on_ready=ready)
    except MetadataError as error:
        print(f"brokerlet: cannot use the metadata store: {error}", file=sys.stderr)
        return 1
    except StorageError as error:
        print(
            f"brokerlet: cannot use data directory {settings.data_dir!r}: {error}", file=sys.stderr
        )
        return 1
    except OSError as error:
        print(
            f"brokerlet: cannot listen on {settings.host}:{settings.port}: {error}", file=sys.stderr
        )
        return 1
    return 0
