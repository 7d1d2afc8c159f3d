"""The runtime's cost of one hand-over between actors, and of the inbox under it.

``python -m bench.micro.actor_hop [--hops N]``

Side by side in one run: two greenlets passing an item back and forth through gevent's
``SimpleQueue`` and through brokerlet's `FairInbox`; then two `GeventActor` actors telling
each other a message (pykka's tell and loop, the inbox, the switch). The figures are the
thread's CPU per hand-over. Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import gevent
import gevent.event
import gevent.queue

from brokerlet.actors._loop import FairInbox
from brokerlet.actors._runtime import GeventActor

__all__ = ["main"]


def _queue_hop(make: Any, hops: int) -> float:
    """CPU µs per hand-over between two greenlets through two queues made by ``make``."""
    there, back = make(), make()

    def echo() -> None:
        for _ in range(hops // 2):
            back.put(there.get())

    helper = gevent.spawn(echo)
    gevent.sleep(0)  # let it wait on its queue first
    start = time.thread_time()
    for index in range(hops // 2):
        there.put(index)
        back.get()
    used = time.thread_time() - start
    helper.join()
    return used / (hops // 2 * 2) * 1e6


class _Bouncer(GeventActor):
    def __init__(self, hops: int, done: gevent.event.Event) -> None:
        super().__init__()
        self.peer: Any = None
        self.left = hops
        self.done = done

    def on_receive(self, message: Any) -> None:
        if isinstance(message, tuple):
            self.peer = message[0]
            return
        self.left -= 1
        if self.left <= 0:
            self.done.set()
        else:
            self.peer.tell(message)


def _actor_hop(hops: int) -> float:
    """CPU µs per tell between two actors telling each other one message in turn."""
    done = gevent.event.Event()
    first = _Bouncer.start(hops // 2, done)
    second = _Bouncer.start(hops // 2 + 1, gevent.event.Event())
    first.tell((second,))
    second.tell((first,))
    gevent.sleep(0.01)
    start = time.thread_time()
    first.tell("ball")
    done.wait()
    used = time.thread_time() - start
    first.stop()
    second.stop()
    return used / (hops // 2 * 2) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.actor_hop")
    parser.add_argument("--hops", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {
        "gevent SimpleQueue": [],
        "FairInbox": [],
        "GeventActor tell": [],
    }
    for _ in range(args.rounds):
        rows["gevent SimpleQueue"].append(_queue_hop(gevent.queue.SimpleQueue, args.hops))
        rows["FairInbox"].append(_queue_hop(FairInbox, args.hops))
        rows["GeventActor tell"].append(_actor_hop(args.hops))
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    for name, figures in rows.items():
        text = ", ".join(f"{figure:.2f}" for figure in figures)
        print(f"{name:20}: {min(figures):5.2f} µs CPU per hand-over (rounds {text})")
    print(f"({args.hops} hand-overs a round; load {load}; {time.strftime('%H:%M:%S')})")


if __name__ == "__main__":
    main()
