"""Key_Shared dispatch data structures: sticky-key hashing, selectors, draining hashes.

Pure Python with no I/O, gevent or Pykka: the dispatcher actor calls into it.

- `hashing`: Pulsar-compatible sticky keys and their Murmur3 hashes.
- `snapshot`: immutable hash-range assignments and their diffs.
- `selectors`: the AUTO_SPLIT (range-split and consistent-hashing) and STICKY
  selectors, each publishing snapshots.
- `draining`: PIP-379's draining-hashes tracker.
- `meta`: a Key_Shared consumer's SUBSCRIBE options.
"""

from brokerlet.keyshared.draining import (
    BATCH_UNBLOCKED,
    DrainingHashConflictError,
    DrainingHashEntry,
    DrainingHashesTracker,
)
from brokerlet.keyshared.hashing import (
    NONE_KEY,
    RANGE_SIZE,
    STICKY_KEY_HASH_NOT_SET,
    murmur3_32,
    plain_key_hash,
    sticky_key,
    sticky_key_hash,
)
from brokerlet.keyshared.meta import KeySharedMeta
from brokerlet.keyshared.selectors import (
    AutoSplitSelector,
    ConsistentHashingSelector,
    ConsumerAssignError,
    Selector,
    StickySelector,
    make_selector,
)
from brokerlet.keyshared.snapshot import (
    HashRange,
    ImpactedRanges,
    Named,
    RangeChanges,
    Snapshot,
    diff_snapshots,
)

__all__ = [
    "BATCH_UNBLOCKED",
    "NONE_KEY",
    "RANGE_SIZE",
    "STICKY_KEY_HASH_NOT_SET",
    "AutoSplitSelector",
    "ConsistentHashingSelector",
    "ConsumerAssignError",
    "DrainingHashConflictError",
    "DrainingHashEntry",
    "DrainingHashesTracker",
    "HashRange",
    "ImpactedRanges",
    "KeySharedMeta",
    "Named",
    "RangeChanges",
    "Selector",
    "Snapshot",
    "StickySelector",
    "diff_snapshots",
    "make_selector",
    "murmur3_32",
    "plain_key_hash",
    "sticky_key",
    "sticky_key_hash",
]
