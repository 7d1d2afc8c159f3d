"""A Key_Shared consumer's SUBSCRIBE options, as plain data."""

from __future__ import annotations

from dataclasses import dataclass

from brokerlet.transport.protocol import pb

__all__ = ["AUTO_SPLIT", "STICKY", "KeySharedMeta"]

AUTO_SPLIT = pb.AUTO_SPLIT
STICKY = pb.STICKY


@dataclass(frozen=True, slots=True)
class KeySharedMeta:
    """A Key_Shared consumer's SUBSCRIBE options."""

    mode: int = AUTO_SPLIT
    ranges: tuple[tuple[int, int], ...] = ()
    allow_out_of_order: bool = False

    @classmethod
    def from_command(cls, subscribe: pb.CommandSubscribe) -> KeySharedMeta:
        if not subscribe.HasField("key_shared_meta"):
            return cls()
        meta = subscribe.key_shared_meta
        return cls(
            meta.key_shared_mode,
            tuple((r.start, r.end) for r in meta.hash_ranges),
            meta.allow_out_of_order_delivery,
        )
