"""Power loss under each sync policy: what a receipt promises once the page cache is gone.

A SIGKILL loses nothing under any policy (the kernel still holds every write; see
test_disk_storage's sigkill test). A power cut loses what was written but not synced. This
test stands a `FileOps` in for the disk that remembers, per file, how much was synced, cuts
the power at a seeded random moment (copying the data directory with every file cut back to
its synced size, while the writer thread is held), reopens the copy and checks the loss bound
each policy documents (Settings.sync_policy): every_batch loses nothing receipted; interval
loses at most what was receipted in the last ``sync_interval_ms``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import gevent
import gevent.event
import pytest

from brokerlet.storage import DiskLedger, DiskStorage, FileOps, new_entry
from brokerlet.testing.waiting import wait_until
from brokerlet.transport.protocol import crc32c

TOPIC = "persistent://public/default/power"
SYNC_INTERVAL_MS = 50
# How late a sync may come after its interval on a loaded 2-core machine (writer thread
# scheduling); the bound checked is sync_interval_ms plus this.
SYNC_SLACK_S = 0.25


PAGE = 4096


class PowerCut(FileOps):
    """A disk that forgets unsynced writes when the power is cut.

    Every write and sync is made for real; the class records, per file path, the size the
    file had at its last sync and the ranges written since. `cut_at_next_sync` fails every
    later file call (the machine is off) and copies the data directory as a power cut would
    leave it: each
    file cut back to its synced size, and of each unsynced write inside that size (into zeros
    the writer reserved ahead of its records) a random choice of pages lost, as a disk that
    persists pages out of order loses them.
    """

    def __init__(self, rng: random.Random) -> None:
        self.lock = threading.Lock()
        self.synced: dict[str, int] = {}
        self.unsynced: dict[str, list[tuple[int, int]]] = {}
        self.off = threading.Event()
        self.rng = rng
        self.cut_into: tuple[Path, Path] | None = None
        self.moment = 0.0

    def _path(self, fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def _wait_if_off(self) -> None:
        if self.off.is_set():
            # The machine is off: nothing more reaches the disk (the copy is already taken,
            # so what storage does about the error cannot change what survived).
            raise OSError(errno.EIO, "power is off")

    def write(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        with self.lock:
            self._wait_if_off()
            written = super().write(fd, buffers, offset)
            self.unsynced.setdefault(self._path(fd), []).append((offset, offset + written))
            return written

    def sync(self, fd: int) -> None:
        with self.lock:
            self._wait_if_off()
            if self.cut_into is not None:
                # The worst moment: all written since the last sync is in doubt.
                self._cut(*self.cut_into)
                self._wait_if_off()
            super().sync(fd)
            path = self._path(fd)
            self.synced[path] = os.fstat(fd).st_size
            self.unsynced.pop(path, None)

    def truncate(self, fd: int, size: int) -> None:
        with self.lock:
            self._wait_if_off()
            super().truncate(fd, size)
            path = self._path(fd)
            self.synced[path] = min(self.synced.get(path, 0), size)

    def cut_at_next_sync(self, data_dir: Path, copy: Path) -> float:
        """Turn the power off as the next sync starts; leave in ``copy`` what the disk holds.

        Returns:
            When the power went off.
        """
        self.cut_into = (data_dir, copy)
        wait_until(self.off.is_set, message="a sync to cut the power at", interval=0.001)
        return self.moment

    def _cut(self, data_dir: Path, copy: Path) -> None:
        # Under the lock: no other file call starts before the power is off.
        self.moment = time.monotonic()
        shutil.copytree(data_dir, copy)
        for original in data_dir.rglob("*.seg"):
            path = str(original.resolve())
            kept = self.synced.get(path, 0)
            with open(copy / original.relative_to(data_dir), "r+b") as file:
                file.truncate(kept)
                for start, end in self.unsynced.get(path, []):
                    # What lies past the synced size is gone anyway.
                    for page_start, page_end in _pages(start, min(end, kept)):
                        if self.rng.random() < 0.5:
                            file.seek(page_start)
                            file.write(bytes(page_end - page_start))
        self.off.set()


def _pages(start: int, end: int) -> Iterator[tuple[int, int]]:
    """The pieces of ``[start, end)`` that fall in one page each."""
    while start < end:
        page_end = min(start - start % PAGE + PAGE, end)
        yield start, page_end
        start = page_end


def read_everything(ledger: DiskLedger) -> list[bytes]:
    out: list[bytes] = []
    position = ledger.first_entry_id
    while position <= ledger.last_entry_id:
        result = gevent.event.AsyncResult()
        ledger.read(position, 1000, 0, result.set)
        chunk = result.get(timeout=10)
        assert isinstance(chunk, list), chunk
        assert chunk, f"no progress at {position}"
        out.extend(entry.data for entry in chunk)
        position = chunk[-1].entry_id + 1
    return out


@pytest.mark.parametrize(
    ("policy", "bound_s"),
    [("every_batch", 0.0), ("interval", SYNC_INTERVAL_MS / 1000 + SYNC_SLACK_S)],
)
def test_a_power_cut_loses_at_most_what_the_sync_policy_allows(
    tmp_path: Path, policy: str, bound_s: float
) -> None:
    seed = int(os.environ.get("BROKERLET_CRASH_SEED", random.randrange(1 << 30)))
    print(f"power-cut seed {seed} (rerun with BROKERLET_CRASH_SEED={seed})")
    # The cut comes after a seeded number of receipts: enough production (many sync
    # intervals' worth) that a policy that never synced would lose receipts far older than
    # the bound.
    rng = random.Random(seed)
    cut_after, at_least_s = rng.randint(1_500, 4_000), rng.uniform(0.8, 1.2)
    enough = gevent.event.Event()
    data_dir, copy = tmp_path / "data", tmp_path / "after-the-cut"
    disk = PowerCut(rng)
    storage = DiskStorage(
        data_dir, policy, sync_interval_ms=SYNC_INTERVAL_MS, min_free_bytes=0, file_ops=disk
    )
    ledger, _ = storage.open_topic(TOPIC)
    receipted: dict[bytes, float] = {}  # payload -> when its append was confirmed
    sent: set[bytes] = set()

    def produce(number: int) -> None:
        for sequence in range(1_000_000):
            if disk.off.is_set():
                return
            # Up to 3 KB, so that a pass's records cross pages and a cut can lose one of
            # them and keep a later one.
            data = f"p{number}-{sequence}-".encode() * (1 + (sequence * 7 + number) % 300)
            sent.add(data)
            done = gevent.event.AsyncResult()
            ledger.append([new_entry(data, crc32c(data), 1)], done.set)
            outcome = done.get(timeout=10)
            if isinstance(outcome, BaseException):
                return
            receipted[data] = time.monotonic()
            if len(receipted) >= cut_after and time.monotonic() - started >= at_least_s:
                enough.set()

    started = time.monotonic()
    producers = [gevent.spawn(produce, n) for n in range(4)]
    assert enough.wait(30), f"only {len(receipted)} of {cut_after} receipts in 30 s"
    cut_at = disk.cut_at_next_sync(data_dir, copy)
    before_cut = {data: at for data, at in receipted.items() if at <= cut_at}
    gevent.killall(producers, timeout=10)
    assert all(greenlet.dead for greenlet in producers)
    assert len(before_cut) > 100, f"too little production to judge (seed {seed})"

    survivor = DiskStorage(copy, policy, min_free_bytes=0)
    try:
        recovered, _ = survivor.open_topic(TOPIC)
        stored = read_everything(recovered)
    finally:
        survivor.close()
    kept = set(stored)
    assert len(stored) == len(kept), f"entries came back twice (seed {seed})"
    assert kept <= sent, f"entries never sent came back (seed {seed})"
    lost = {data: at for data, at in before_cut.items() if data not in kept}
    too_old = {data: round(cut_at - at, 3) for data, at in lost.items() if cut_at - at > bound_s}
    print(
        f"{policy}: receipted {len(before_cut)} in {cut_at - started:.2f} s, lost {len(lost)} "
        f"(the oldest {cut_at - min(lost.values(), default=cut_at):.3f} s before the cut)"
    )
    assert not too_old, (
        f"{policy} lost {len(too_old)} receipts older than {bound_s} s before the cut "
        f"(seed {seed}): {sorted(too_old.items(), key=lambda kv: -kv[1])[:5]}"
    )
    with contextlib.suppress(Exception):  # its writes now fail: the power is off
        storage.close()
