"""Topic storage: the ledger interface, its in-memory and disk back-ends, and cursors."""

from brokerlet.storage.cursor import Cursor
from brokerlet.storage.disk import (
    CursorStore,
    DiskLedger,
    DiskStorage,
    FileOps,
    StorageError,
    SyncPolicy,
)
from brokerlet.storage.ledger import Entry, Ledger, MemoryLedger, NewEntry, new_entry

__all__ = [
    "Cursor",
    "CursorStore",
    "DiskLedger",
    "DiskStorage",
    "Entry",
    "FileOps",
    "Ledger",
    "MemoryLedger",
    "NewEntry",
    "StorageError",
    "SyncPolicy",
    "new_entry",
]
