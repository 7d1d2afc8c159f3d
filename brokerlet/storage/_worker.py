"""A storage thread: blocking file work off the hub, completions back on the hub, in order.

The hub hands a `Job` to `HubWorker.submit`; the worker's OS thread takes every job queued
since its last pass as one batch (that is where group commit comes from) and hands the batch
to its processor. Once the processor returns, the batch's jobs go back to the hub, which runs
each job's `Job.finish` in submission order, on the hub's own thread.

Wake-ups cross threads through primitives gevent does not patch: a real lock acquired by the
thread, and a libev async watcher the thread signals. While jobs are in flight the watcher is
started, which keeps the hub's loop alive for greenlets waiting on them.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from gevent.monkey import get_original

__all__ = ["HubWorker", "Job", "StopJob", "real_lock"]

log = logging.getLogger(__name__)

_DELIVERY_SLICE = 0.001  # seconds of completions the hub runs before polling again

# The originals, so that the worker is a real thread even in a monkey-patched process.
_start_new_thread: Callable[..., int] = get_original("_thread", "start_new_thread")
_allocate_lock: Callable[[], Any] = get_original("_thread", "allocate_lock")


def real_lock() -> Any:
    """A lock that blocks the OS thread, even in a monkey-patched process."""
    return _allocate_lock()


class Job:
    """A unit of storage work.

    The worker's processor fills in the outcome (setting ``error`` on failure) on the worker
    thread; `finish` then runs on the hub.
    """

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def finish(self) -> None:
        """Report the outcome; runs on the hub. Must not block."""


class StopJob(Job):
    """The last job: the worker thread ends after the batch that holds it."""

    __slots__ = ("_on_stopped",)

    def __init__(self, on_stopped: Callable[[], None]) -> None:
        super().__init__()
        self._on_stopped = on_stopped

    def finish(self) -> None:
        self._on_stopped()


Processor = Callable[[list[Job]], None]
"""Does a batch of jobs on the worker thread; must set ``error`` on jobs it fails."""

Deadline = Callable[[], float | None]
"""Seconds until the processor wants a pass even with no jobs (None: not before a job)."""


class HubWorker:
    """One OS thread that runs batches of jobs for the hub it was created on.

    Create, `submit` to and `close` it only on the hub's thread.

    Args:
        hub: the gevent hub that receives completions.
        name: for log messages.
        process: runs a batch of jobs on the worker thread.
        deadline: how long the thread may sleep without jobs; None means until a job arrives.
        after: runs on the thread after each batch, once its completions are handed to the
            hub: work that no caller waits for.
    """

    def __init__(
        self,
        hub: Any,
        name: str,
        process: Processor,
        deadline: Deadline | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._process = process
        self._deadline = deadline or (lambda: None)
        self._after = after
        self._jobs: collections.deque[Job] = collections.deque()
        self._finished: collections.deque[Job] = collections.deque()
        self._wake = _allocate_lock()
        self._wake.acquire()  # locked means "nothing to do"
        self._sleeping = False  # the thread found no jobs and may be waiting on _wake
        self._watcher = hub.loop.async_()
        self._watching = False
        self._in_flight = 0
        self._stopped = False
        self._exited = _allocate_lock()
        self._exited.acquire()  # released by the thread as its very last act
        _start_new_thread(self._run, ())

    def submit(self, job: Job) -> None:
        """Queue ``job`` for the thread. Never blocks."""
        if self._stopped:
            raise RuntimeError(f"{self.name} is stopped")
        if not self._watching:
            self._watcher.start(self._deliver)
            self._watching = True
        self._in_flight += 1
        # Append, then look at the flag; the thread sets the flag, then looks at the queue.
        # Either it sees the job or we see it sleeping, and a lock release per job (a futex
        # wake and a GIL hand-off) is paid only when the thread really is idle.
        self._jobs.append(job)
        if self._sleeping:
            # Until the thread runs again (it needs the GIL, which we hold), later jobs need
            # no wake-up of their own; the thread sets the flag again before it next sleeps.
            self._sleeping = False
            with contextlib.suppress(RuntimeError):  # released already, not yet taken
                self._wake.release()

    def stop(self, on_stopped: Callable[[], None]) -> None:
        """Let queued jobs finish, then end the thread; ``on_stopped`` runs on the hub after."""
        self.submit(StopJob(on_stopped))
        self._stopped = True

    def close(self) -> None:
        """Release the hub watcher; only after the `stop` callback ran."""
        # The thread may still be inside its last send(); that takes microseconds.
        self._exited.acquire(True, 5.0)
        self._watcher.stop()
        self._watcher.close()
        self._watching = False

    # On the worker thread.

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            self._sleeping = True
            if not jobs:
                timeout = self._deadline()
                if timeout is None:
                    self._wake.acquire()
                elif timeout > 0:
                    self._wake.acquire(True, timeout)
            self._sleeping = False
            batch: list[Job] = []
            while jobs:
                batch.append(jobs.popleft())
            try:
                self._process(batch)
            except BaseException as error:  # the thread must outlive any bug
                log.exception("%s: storage thread failed a batch", self.name)
                for job in batch:
                    if job.error is None:
                        job.error = error
            if batch:
                self._finished.extend(batch)
                self._watcher.send()
                if isinstance(batch[-1], StopJob):
                    self._exited.release()
                    return
            if self._after is not None:
                try:
                    self._after()
                except BaseException:
                    log.exception("%s: storage thread failed after a batch", self.name)

    # On the hub.

    def _deliver(self) -> None:
        finished = self._finished
        give_back = time.perf_counter() + _DELIVERY_SLICE
        while finished:
            job = finished.popleft()
            self._in_flight -= 1
            try:
                job.finish()
            except Exception:
                log.exception("%s: storage completion failed", self.name)
            # A job may finish a whole run of appends, so the clock is read after each one.
            if finished and time.perf_counter() > give_back:
                # A large group would hold the hub for its whole length: finish the rest on
                # the next loop iteration, after timers and sockets have had their turn.
                self._watcher.send()
                return
        if self._in_flight == 0 and self._watching:
            self._watcher.stop()
            self._watching = False
