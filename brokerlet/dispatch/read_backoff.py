"""How long the read loop waits before retrying, and how much it reads, after a bad pass.

As Pulsar's dispatcher: a pass that read entries nobody could take retries after a delay that
doubles from ``dispatcher_retry_backoff_initial_time_ms`` up to ``..._max_time_ms`` and
starts again once something goes out; a failed read retries after a delay that doubles from
``dispatcher_read_failure_backoff_initial_time_ms`` (halving on each success) and reads one
entry at a time (``dispatcher_min_read_batch_size``), the read size doubling back towards
``dispatcher_max_read_batch_size`` on each success.
"""

from __future__ import annotations

from brokerlet.config import Settings

__all__ = ["ReadBackoff"]


class ReadBackoff:
    __slots__ = ("_failure_ms", "_retry_ms", "_settings", "read_batch_size")

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._retry_ms = 0.0
        self._failure_ms = 0.0
        self.read_batch_size = settings.dispatcher_max_read_batch_size

    def retry_delay_ms(self) -> float:
        """A pass dispatched nothing: the delay before the next one (growing)."""
        s = self._settings
        initial = s.dispatcher_retry_backoff_initial_time_ms
        ceiling = s.dispatcher_retry_backoff_max_time_ms
        self._retry_ms = min(ceiling, max(initial, self._retry_ms * 2))
        return self._retry_ms

    def dispatched(self) -> None:
        """Something went out: the retry delay starts again from the initial one."""
        self._retry_ms = 0.0

    def read_failed(self) -> float:
        """A read failed: read one entry at a time, after the returned (growing) delay."""
        s = self._settings
        self.read_batch_size = s.dispatcher_min_read_batch_size
        self._failure_ms = min(
            s.dispatcher_read_failure_backoff_max_time_ms,
            max(s.dispatcher_read_failure_backoff_initial_time_ms, self._failure_ms * 2),
        )
        return self._failure_ms

    def read_succeeded(self) -> None:
        """The read size doubles back towards the maximum; the failure delay halves."""
        maximum = self._settings.dispatcher_max_read_batch_size
        if self.read_batch_size < maximum:
            self.read_batch_size = min(maximum, self.read_batch_size * 2)
        self._failure_ms /= 2
