"""The file system calls of the disk back-end, gathered so tests can intercept them."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Sequence

__all__ = ["FileOps", "StorageError", "write_all", "write_file_atomically"]

# pwritev takes at most this many buffers per call.
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


class StorageError(Exception):
    """Storage cannot do what was asked: bad data directory, full disk, failed write."""


class FileOps:
    """The system calls that write and sync storage files.

    Subclass and pass an instance to `DiskStorage` to count syncs or simulate a full disk.
    Every method runs on a storage thread, never on the hub, except `free_bytes` and the
    start-up probe, which run where `DiskStorage` is constructed.
    """

    def write(self, fd: int, buffers: Sequence[bytes], offset: int) -> int:
        """Write ``buffers`` at ``offset``; return how many bytes went out (may be short)."""
        return os.pwritev(fd, buffers, offset)

    def sync(self, fd: int) -> None:
        """Make what was written to ``fd`` durable."""
        os.fdatasync(fd)

    def sync_dir(self, path: str) -> None:
        """Make the creation, renaming or removal of entries in directory ``path`` durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def free_bytes(self, path: str) -> int:
        """Bytes an unprivileged writer may still use on the file system of ``path``."""
        stat = os.statvfs(path)
        return stat.f_bavail * stat.f_frsize


def write_all(ops: FileOps, fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> int:
    """Write every byte of ``buffers`` at ``offset``, resuming after short writes.

    Returns:
        The offset just past the written data.

    Raises:
        OSError: the write failed (ENOSPC when the disk is full); some bytes may be written.
    """
    pending: list[bytes | memoryview] = list(buffers)
    position = offset
    while pending:
        chunk = pending[:_IOV_MAX]
        written = ops.write(fd, chunk, position)  # type: ignore[arg-type]
        if written <= 0:
            # pwritev reports a full disk as a short write first; no progress at all means
            # the next call would fail the same way.
            raise OSError(errno.ENOSPC, "write made no progress")
        position += written
        done = 0
        while done < len(chunk) and written >= len(chunk[done]):
            written -= len(chunk[done])
            done += 1
        del pending[:done]
        if written:
            pending[0] = memoryview(pending[0])[written:]
    return position


def write_file_atomically(ops: FileOps, path: str, data: bytes, *, sync: bool) -> None:
    """Replace the file at ``path`` with ``data``: a reader sees the old or the new, never a mix.

    Args:
        sync: make the new contents and the rename durable before returning.
    """
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(ops, fd, [data], 0)
        if sync:
            ops.sync(fd)
    except BaseException:
        os.close(fd)
        _remove_quietly(temporary)
        raise
    os.close(fd)
    os.replace(temporary, path)
    if sync:
        ops.sync_dir(os.path.dirname(path) or ".")


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
