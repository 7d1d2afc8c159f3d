"""The event loop's thread asks Linux for a short scheduler slice.

Linux's EEVDF scheduler gives a woken thread a deadline of its virtual runtime plus its slice
and runs the earliest deadline first; since Linux 6.12 a normal thread may choose its own
slice with ``sched_setattr`` (``sched_runtime``, 100 µs to 100 ms; the default grows with
the CPU count, 1.4 ms on two cores). A short slice leaves the thread's share of the CPU as it
was but brings its deadline forward at each wake-up, so a hub woken by a socket or a timer
preempts busy work (producers on the same machine, the storage writer) instead of waiting
out that work's slice. On the bench's two-core stall run this halved the hub's p99.9 stall
(docs/performance.md, thirty-fifth pass).

Only the calling thread changes, and only its slice: policy, nice value and flags stay as
they were. Where the call is missing or refused (another OS, an older kernel, a sandbox) the
thread keeps the kernel's default and the broker runs as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import sys
from collections.abc import Callable, Iterator

__all__ = ["current_slice_us", "requested_slice"]

log = logging.getLogger(__name__)

# sched_setattr and sched_getattr by architecture (Linux's syscall tables).
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
_SCHED_OTHER, _SCHED_BATCH = 0, 3  # the fair policies a slice applies to
_SCHED_FLAG_RESET_ON_FORK = 0x01


class _Attr(ctypes.Structure):
    """``struct sched_attr`` as far as its utilisation clamps (size 56)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("flags", ctypes.c_uint64),
        ("nice", ctypes.c_int32),
        ("priority", ctypes.c_uint32),
        ("runtime", ctypes.c_uint64),
        ("deadline", ctypes.c_uint64),
        ("period", ctypes.c_uint64),
        ("util_min", ctypes.c_uint32),
        ("util_max", ctypes.c_uint32),
    ]


def _syscall() -> tuple[Callable[..., int], int, int] | None:
    numbers = _SYSCALLS.get(platform.machine()) if sys.platform.startswith("linux") else None
    if numbers is None:
        return None
    try:
        call: Callable[..., int] = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    return call, *numbers


_SYSCALL = _syscall()


def _get(thread_id: int) -> _Attr | None:
    """A thread's attributes if it runs under a fair policy whose slice Linux reports (6.12+;
    before, a normal thread's is 0), else None."""
    if _SYSCALL is None:
        return None
    call, _, getattr_number = _SYSCALL
    attr = _Attr()
    if call(getattr_number, thread_id, ctypes.byref(attr), ctypes.sizeof(_Attr), 0) != 0:
        return None
    if attr.policy not in (_SCHED_OTHER, _SCHED_BATCH) or not attr.runtime:
        return None
    return attr


def _set(attr: _Attr, nanoseconds: int) -> int:
    """Set the calling thread's slice, keeping the rest of ``attr``; 0 or an errno."""
    assert _SYSCALL is not None
    call, setattr_number, _ = _SYSCALL
    wanted = _Attr(
        size=ctypes.sizeof(_Attr),
        policy=attr.policy,
        flags=attr.flags & _SCHED_FLAG_RESET_ON_FORK,
        nice=attr.nice,
        runtime=nanoseconds,
    )
    if call(setattr_number, 0, ctypes.byref(wanted), 0) != 0:
        return ctypes.get_errno()
    return 0


def current_slice_us(thread_id: int = 0) -> int | None:
    """A thread's scheduler slice in µs (0 = the calling thread), or None where Linux has
    none to report."""
    attr = _get(thread_id)
    return None if attr is None else int(attr.runtime // 1000)


@contextlib.contextmanager
def requested_slice(microseconds: int) -> Iterator[None]:
    """Run the block with the calling thread's slice at ``microseconds``, then put it back.

    0 leaves the thread alone, as does a thread under a real-time or idle policy (chosen by
    whoever runs the process) or a kernel without per-thread slices.
    """
    before = _get(0) if microseconds else None
    if before is None:
        yield
        return
    error = _set(before, microseconds * 1000)
    if error:
        log.debug("scheduler slice of %d µs not set: %s", microseconds, os.strerror(error))
        yield
        return
    try:
        yield
    finally:
        _set(before, before.runtime)
