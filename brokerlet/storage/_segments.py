"""The writer thread's side of the disk back-end: segment files, group commit and sync policy.

Everything here runs on the writer thread (a `HubWorker`); the hub only builds jobs and reads
their outcome in `Job.finish`. A `SegmentLog` is one ledger's write state (its open segment
and next entry id) and is touched by the writer thread alone once the ledger is open.

One pass of the writer takes every job queued since the last pass. Appends to the same ledger
in a pass go out in one vectored write and, under `SyncPolicy.EVERY_BATCH`, one fdatasync; a
ledger's writes in a pass always land in one segment, so a failure can be undone by cutting
that segment back to where the pass started.

Under every_batch the writer keeps zeros after the records (`SegmentLog.reserved`), because an
fdatasync over bytes already in the file has no size or extent change to journal. Every write
fills the file to the end of its last block (`BLOCK`): the block holds those bytes anyway, so
a synchronous sender's syncs change the file's size once a block instead of once a record (its
send waits about a tenth less; docs/performance.md, "Thirty-fourth pass"). A busy ledger (a pass
of several records) also gets a larger reserve written and synced once the pass's completions
are handed back, where the sync then costs about a third less ("Nineteenth pass"); for a pass
of one record that reserve's own write and sync would come just before the sender's next send.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from brokerlet.storage._io import FileOps, StorageError, write_all, write_file_atomically
from brokerlet.storage._records import encode_segment_header, segment_name
from brokerlet.storage._worker import Job
from brokerlet.storage.ledger import NewEntry

__all__ = [
    "FIRST_RESERVE",
    "MAX_RESERVE",
    "AppendJob",
    "BarrierJob",
    "CloseLogJob",
    "CreateLogJob",
    "DeleteFilesJob",
    "LogWriter",
    "ReplaceFileJob",
    "SegmentLog",
    "SyncPolicy",
]

log = logging.getLogger(__name__)

FIRST_RESERVE = 16 * 1024
"""Bytes of zeros written ahead of a ledger's records after its first busy pass."""
MAX_RESERVE = 512 * 1024
"""The most a reserve grows by at once (its write and sync take under a millisecond here)."""
_ZEROS = memoryview(bytes(MAX_RESERVE))
BLOCK = 4096
"""Under every_batch a segment's writes fill it with zeros to a multiple of this size."""


class SyncPolicy(enum.Enum):
    """When appended entries are forced to disk, and so what a crash can lose.

    Killing the process never loses an acknowledged entry under any policy: the data is in the
    kernel's page cache once written. The policies differ on power loss or a kernel crash.
    """

    EVERY_BATCH = "every_batch"
    """fdatasync each pass of the writer before acknowledging it; loses nothing acknowledged."""

    INTERVAL = "interval"
    """Acknowledge after the write, fdatasync every interval; loses up to one interval."""

    NEVER = "never"
    """Acknowledge after the write, leave flushing to the OS; loses what the OS had not flushed.
    Segments are still synced once when sealed, and cursors files are not synced."""


@dataclass(eq=False, slots=True)
class SegmentLog:
    """One ledger's files as the writer thread sees them.

    Attributes:
        directory: the ledger's directory.
        ledger_id: written into each segment header.
        segment_bytes: a segment is sealed once it grows past this size.
        next_id: id the next appended entry gets.
        fd: the open (last) segment, or None before the first append.
        base: first entry id of the open segment.
        size: bytes of whole records in the open segment (where the next write goes).
        dirty: written since the last sync.
        closed: no more appends.
        broken: a failed write that could not be undone; every later append fails with it.
        uncreated: for a new ledger whose directory does not exist yet, its topic's name:
            this thread creates the directory (`CreateLogJob`, or else before the ledger's
            first segment, cursors file or close), so opening a new topic does no file work
            on the hub.
        unsynced: the ledger's own creation (its ``topic`` file, then the directory that
            holds the ledger's directory) when not yet durable: synced by this thread before
            the first segment or cursors file that depends on it, never on the hub.
        reserved: end of the zeros written and synced after the open segment's records (no
            reserve when not past ``size``); a segment is cut back to its records when sealed
            or closed, so only the last one of a ledger may end in zeros.
        reserve_step: bytes the last reserve took; each next one takes twice as many, up to
            `MAX_RESERVE`, so a ledger that is busy for a moment keeps a little.
        reserving: false after a reserve failed (a full disk), until the next segment.
    """

    directory: str
    ledger_id: int
    segment_bytes: int
    next_id: int
    fd: int | None = None
    base: int = 0
    size: int = 0
    dirty: bool = False
    closed: bool = False
    broken: OSError | None = None
    uncreated: str = ""
    unsynced: tuple[str, ...] = ()
    reserved: int = 0
    reserve_step: int = 0
    reserving: bool = True


class AppendJob(Job):
    """Records to append to one ledger; the writer fills in where they went."""

    __slots__ = (
        "blob",
        "callback",
        "count",
        "entries",
        "first_id",
        "log",
        "offset",
        "on_done",
        "segment",
        "sizes",
    )

    def __init__(
        self,
        log: SegmentLog,
        blob: bytes,
        *,
        sizes: list[int],
        entries: list[NewEntry],
        callback: Callable[[int | BaseException], None],
        on_done: Callable[[AppendJob], None],
    ) -> None:
        super().__init__()
        self.log = log
        self.blob = blob
        self.sizes = sizes
        self.count = len(sizes)
        self.entries = entries
        self.callback = callback
        self.on_done = on_done
        self.first_id = -1
        self.segment = -1  # base id of the segment the records went to
        self.offset = -1  # of the first record in that segment

    def finish(self) -> None:
        self.on_done(self)


class ReplaceFileJob(Job):
    """Atomically replace a small file (a cursors file), after syncing the ledger it refers to."""

    __slots__ = ("data", "log", "on_done", "path")

    def __init__(
        self,
        path: str,
        data: bytes,
        log: SegmentLog | None,
        on_done: Callable[[ReplaceFileJob], None],
    ) -> None:
        super().__init__()
        self.path = path
        self.data = data
        self.log = log
        self.on_done = on_done

    def finish(self) -> None:
        self.on_done(self)


class CreateLogJob(Job):
    """Make a new ledger's files ahead of its first append: the directory, the ``topic`` file
    and the first segment, synced as the policy wants.

    Submitted when a topic is created, so that the first append (usually a moment later: a
    client subscribes, or sends its first message) finds them made and pays only its own
    write and sync. A failure is logged and left for the first append to meet and report.
    """

    __slots__ = ("log",)

    def __init__(self, log: SegmentLog) -> None:
        super().__init__()
        self.log = log


class DeleteFilesJob(Job):
    """Remove files (trimmed segments); failures are logged, not reported."""

    __slots__ = ("paths",)

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = paths


class CloseLogJob(Job):
    """Sync and close a ledger's open segment; later appends to it fail."""

    __slots__ = ("log", "on_done")

    def __init__(self, log: SegmentLog, on_done: Callable[[], None]) -> None:
        super().__init__()
        self.log = log
        self.on_done = on_done

    def finish(self) -> None:
        self.on_done()


class BarrierJob(Job):
    """Does nothing; finishes after every job submitted before it."""

    __slots__ = ("on_done",)

    def __init__(self, on_done: Callable[[], None]) -> None:
        super().__init__()
        self.on_done = on_done

    def finish(self) -> None:
        self.on_done()


@dataclass(slots=True)
class _Pending:
    """A ledger's appends in one pass, and where its open segment stood before them."""

    jobs: list[AppendJob]
    size: int = 0
    next_id: int = 0
    written: bool = False


class LogWriter:
    """The writer thread's processor: runs batches of jobs under a sync policy.

    Args:
        ops: the file system calls (replaceable in tests).
        policy: when to sync appended records.
        interval: seconds between syncs under `SyncPolicy.INTERVAL`.
    """

    def __init__(self, ops: FileOps, policy: SyncPolicy, interval: float) -> None:
        self._ops = ops
        self._policy = policy
        self._interval = interval
        self._dirty: dict[SegmentLog, None] = {}  # ordered set
        self._last_sync = time.monotonic()
        self._short: dict[SegmentLog, None] = {}  # ledgers whose reserve runs low

    def deadline(self) -> float | None:
        """Seconds until unsynced writes are due for a sync, or None if none are waiting."""
        if self._policy is not SyncPolicy.INTERVAL or not self._dirty:
            return None
        return max(0.0, self._last_sync + self._interval - time.monotonic())

    def process(self, jobs: list[Job]) -> None:
        """Run one pass: appends to a ledger are grouped until a job of another kind."""
        appends: dict[SegmentLog, _Pending] = {}
        for job in jobs:
            if isinstance(job, AppendJob):
                pending = appends.get(job.log)
                if pending is None:
                    appends[job.log] = _Pending([job])
                else:
                    pending.jobs.append(job)
                continue
            if appends:
                self._append(appends)
                appends = {}
            self._run_other(job)
        if appends:
            self._append(appends)
        if self._policy is SyncPolicy.INTERVAL and self._dirty and self.deadline() == 0.0:
            self._sync_dirty()

    def reserve(self) -> None:
        """Write and sync zeros ahead of the records of ledgers that used their reserve.

        Runs after a pass's completions are handed back: nobody waits for it, and the next
        pass's appends to those ledgers then sync over blocks the file already has.
        """
        if not self._short:
            return
        short, self._short = self._short, {}
        for segment_log in short:
            fd = segment_log.fd
            if fd is None or segment_log.closed or segment_log.broken is not None:
                continue
            step = min(max(2 * segment_log.reserve_step, FIRST_RESERVE), MAX_RESERVE)
            start = max(segment_log.reserved, segment_log.size)
            end = min(segment_log.size + step, segment_log.segment_bytes)
            if end <= start:
                continue
            try:
                write_all(self._ops, fd, [_ZEROS[: end - start]], start)
                self._ops.sync(fd)
            except OSError as error:
                # Zeros that made it are harmless (recovery reads them as the end); appends
                # go on growing the file, and the next segment tries again.
                log.warning(
                    "ledger %d: cannot write ahead of its records: %s", segment_log.ledger_id, error
                )
                segment_log.reserving = False
                continue
            segment_log.reserved = end
            segment_log.reserve_step = step

    # Appends.

    def _append(self, appends: dict[SegmentLog, _Pending]) -> None:
        for segment_log, pending in appends.items():
            error = self._write(segment_log, pending)
            if error is not None:
                _fail(pending.jobs, error)
        if self._policy is SyncPolicy.EVERY_BATCH:
            for segment_log, pending in appends.items():
                if pending.written:
                    self._sync_batch(segment_log, pending)
                    if (
                        segment_log.next_id - pending.next_id > 1
                        and segment_log.reserving
                        and segment_log.reserved - segment_log.size
                        < max(segment_log.reserve_step // 2, BLOCK)
                    ):
                        self._short[segment_log] = None
        else:
            for segment_log, pending in appends.items():
                if pending.written:
                    segment_log.dirty = True
                    self._dirty[segment_log] = None

    def _write(self, segment_log: SegmentLog, pending: _Pending) -> Exception | None:
        if segment_log.closed:
            return StorageError(f"ledger {segment_log.ledger_id} is closed")
        if segment_log.broken is not None:
            return segment_log.broken
        if segment_log.fd is None or (
            segment_log.size >= segment_log.segment_bytes and segment_log.next_id > segment_log.base
        ):
            try:
                self._roll(segment_log)
            except OSError as error:
                return error
        assert segment_log.fd is not None
        pending.size = start = segment_log.size
        pending.next_id = next_id = segment_log.next_id
        buffers: list[bytes | memoryview] = [job.blob for job in pending.jobs]
        end = start + sum(map(len, buffers))
        zeros = 0
        if end > segment_log.reserved:
            zeros = self._fill_block(buffers, end, segment_log.segment_bytes)
        try:
            write_all(self._ops, segment_log.fd, buffers, start)
        except OSError as error:
            self._cut(segment_log, start)
            return error
        if zeros:
            segment_log.reserved = end + zeros
        offset = start
        for job in pending.jobs:
            job.first_id = next_id
            job.segment = segment_log.base
            job.offset = offset
            next_id += job.count
            offset += len(job.blob)
        segment_log.size = end
        segment_log.next_id = next_id
        pending.written = True
        return None

    def _fill_block(self, buffers: list[bytes | memoryview], end: int, segment_bytes: int) -> int:
        """Add to ``buffers`` (which end at file offset ``end``) the zeros that fill its block,
        and return how many: every_batch only, and never past a segment's size, so that a small
        segment is not mostly zeros."""
        if self._policy is not SyncPolicy.EVERY_BATCH:
            return 0
        zeros = max(0, min(-end % BLOCK, segment_bytes - end))
        if zeros:
            buffers.append(_ZEROS[:zeros])
        return zeros

    def _sync_batch(self, segment_log: SegmentLog, pending: _Pending) -> None:
        assert segment_log.fd is not None
        try:
            self._ops.sync(segment_log.fd)
        except OSError as error:
            # What the failed sync covered is in doubt: take it back and report it failed.
            log.error("ledger %d: sync failed: %s", segment_log.ledger_id, error)
            self._cut(segment_log, pending.size)
            segment_log.size = pending.size
            segment_log.next_id = pending.next_id
            _fail(pending.jobs, error)

    def _cut(self, segment_log: SegmentLog, size: int) -> None:
        """Drop a failed write's bytes, so that no half-written record survives a restart."""
        assert segment_log.fd is not None
        try:
            self._ops.truncate(segment_log.fd, size)
        except OSError as error:
            log.error(
                "ledger %d: cannot undo a failed write (%s); refusing further appends",
                segment_log.ledger_id,
                error,
            )
            segment_log.broken = error
        segment_log.reserved = 0

    def _roll(self, segment_log: SegmentLog) -> None:
        """Seal the open segment (synced, whatever the policy) and start the next one."""
        ops = self._ops
        old_fd = segment_log.fd
        if old_fd is not None:
            cut = self._cut_reserve(segment_log, old_fd)
            if cut or segment_log.dirty:  # a sealed segment is synced, cut and all
                ops.sync(old_fd)
                segment_log.dirty = False
                self._dirty.pop(segment_log, None)
        self._ensure_created(segment_log)
        if self._policy is not SyncPolicy.NEVER or old_fd is not None:
            self._settle_creation(segment_log)
        base = segment_log.next_id
        path = os.path.join(segment_log.directory, segment_name(base))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            header = encode_segment_header(segment_log.ledger_id, base)
            buffers: list[bytes | memoryview] = [header]
            zeros = self._fill_block(buffers, len(header), segment_log.segment_bytes)
            write_all(ops, fd, buffers, 0)
            if self._policy is not SyncPolicy.NEVER:
                ops.sync(fd)
                ops.sync_dir(segment_log.directory)
        except BaseException:
            os.close(fd)
            _remove(path)
            raise
        if old_fd is not None:
            os.close(old_fd)
        segment_log.fd = fd
        segment_log.base = base
        segment_log.size = len(header)
        segment_log.reserved = len(header) + zeros
        segment_log.reserving = True

    def _cut_reserve(self, segment_log: SegmentLog, fd: int) -> bool:
        """Cut a segment being sealed or closed back to its records; whether there was a cut."""
        # The file's own size, not `reserved`: a reserve that failed may have left zeros too.
        cut = os.fstat(fd).st_size > segment_log.size
        if cut:
            self._ops.truncate(fd, segment_log.size)
        segment_log.reserved = 0
        return cut

    def _settle_creation(self, segment_log: SegmentLog) -> None:
        """Make the ledger's creation durable (once), before anything that depends on it."""
        ops = self._ops
        for path in segment_log.unsynced:
            if os.path.isdir(path):
                ops.sync_dir(path)
            else:
                fd = os.open(path, os.O_RDONLY)
                try:
                    ops.sync(fd)
                finally:
                    os.close(fd)
        segment_log.unsynced = ()

    def _sync_dirty(self) -> None:
        for segment_log in self._dirty:
            if segment_log.fd is None:
                continue
            try:
                self._ops.sync(segment_log.fd)
            except OSError as error:
                # Already acknowledged: the entries are readable but may not survive power loss.
                log.error("ledger %d: periodic sync failed: %s", segment_log.ledger_id, error)
            segment_log.dirty = False
        self._dirty.clear()
        self._last_sync = time.monotonic()

    # Everything else.

    def _run_other(self, job: Job) -> None:
        if isinstance(job, ReplaceFileJob):
            self._replace_file(job)
        elif isinstance(job, DeleteFilesJob):
            for path in job.paths:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as error:
                    log.warning("cannot remove %s: %s", path, error)
        elif isinstance(job, CloseLogJob):
            self._close(job.log)
        elif isinstance(job, CreateLogJob):
            self._create(job.log)

    def _create(self, segment_log: SegmentLog) -> None:
        if segment_log.fd is not None or segment_log.closed or segment_log.broken is not None:
            return
        try:
            self._roll(segment_log)
        except OSError as error:
            log.warning(
                "ledger %d: creating its files failed (retried at its first append): %s",
                segment_log.ledger_id,
                error,
            )

    def _ensure_created(self, segment_log: SegmentLog) -> None:
        """Create a new ledger's directory and ``topic`` file, unsynced, if not done yet."""
        topic = segment_log.uncreated
        if not topic:
            return
        directory = segment_log.directory
        # Built under another name and renamed: a scan never sees a half-made directory.
        building = directory + ".new"
        os.makedirs(building, exist_ok=True)
        fd = os.open(os.path.join(building, "topic"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(self._ops, fd, [topic.encode()], 0)
        finally:
            os.close(fd)
        os.replace(building, directory)
        segment_log.uncreated = ""

    def _replace_file(self, job: ReplaceFileJob) -> None:
        durable = self._policy is not SyncPolicy.NEVER
        try:
            segment_log = job.log
            if segment_log is not None:
                self._ensure_created(segment_log)
            if durable and segment_log is not None and segment_log.unsynced:
                self._settle_creation(segment_log)
            if durable and segment_log is not None and segment_log.dirty:
                # A durable cursor must never point past durable entries: after a power loss
                # new entries would reuse those ids and count as acknowledged.
                assert segment_log.fd is not None
                self._ops.sync(segment_log.fd)
                segment_log.dirty = False
                self._dirty.pop(segment_log, None)
            write_file_atomically(self._ops, job.path, job.data, sync=durable)
        except OSError as error:
            job.error = error

    def _close(self, segment_log: SegmentLog) -> None:
        segment_log.closed = True
        if segment_log.uncreated or segment_log.unsynced:
            try:
                self._ensure_created(segment_log)
                self._settle_creation(segment_log)
            except OSError as error:
                log.error("ledger %d: creating its files failed: %s", segment_log.ledger_id, error)
        fd = segment_log.fd
        if fd is None:
            return
        segment_log.fd = None
        self._dirty.pop(segment_log, None)
        try:
            # The cut needs no sync of its own: zeros a power loss brings back are read as
            # the reserve they were. So a topic whose records were all synced closes without
            # one.
            self._cut_reserve(segment_log, fd)
            if segment_log.dirty:
                self._ops.sync(fd)
        except OSError as error:
            log.error("ledger %d: sealing at close failed: %s", segment_log.ledger_id, error)
        finally:
            os.close(fd)


def _fail(jobs: list[AppendJob], error: BaseException) -> None:
    for job in jobs:
        job.error = error


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
