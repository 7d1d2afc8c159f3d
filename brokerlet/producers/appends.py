"""The append items of a slice of SENDs, grouped by producer: the connection's per-SEND loop,
compiled (brokerlet/_compiled.py).

Nearly every SEND is plain: the fast decoder took its command and split its payload, the
checksum matches, the entry fits the size limit and its metadata has the official clients'
layout (`plain_key`). Its item is made here. Any other SEND gets a place in its producer's
items, left for the connection to fill (it parses, refuses or disconnects as the SEND needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from brokerlet.keyshared.hashing import plain_key_hash
from brokerlet.storage.ledger import PLAIN_UNHASHED
from brokerlet.transport.protocol._payload import plain_key

if TYPE_CHECKING:
    from brokerlet.actors.messages import AppendItem
    from brokerlet.transport.protocol import Frame

__all__ = ["UNFILLED", "plain_appends"]

UNFILLED: Final[AppendItem] = (-1, -1, None, None)
"""The place of a SEND that `plain_appends` left to the connection."""


def plain_appends(
    sends: list[Frame], max_size: int
) -> tuple[dict[int, list[AppendItem]], list[tuple[list[AppendItem], int, Frame]]]:
    """The append items of ``sends`` by producer id, each producer's in their order.

    A partition key read on the way is hashed once here for Key_Shared (`plain_key_hash`),
    not at every read of every subscription; a keyless entry is marked `PLAIN_UNHASHED`.

    Args:
        sends: SEND frames whose ``send`` fields the fast decoder set.
        max_size: the broker's ``max_message_size``.

    Returns:
        The items by producer id, and for each SEND that is not plain, its producer's items,
        its index there (holding `UNFILLED`) and its frame.
    """
    by_producer: dict[int, list[AppendItem]] = {}
    unusual: list[tuple[list[AppendItem], int, Frame]] = []
    last_producer = -1
    items: list[AppendItem] = []
    # The frame's tuples are of any length (see Frame): the fields stored in the item stay
    # the objects they are, and these are read as the types declared.
    producer_id: int
    num_messages: int
    data: bytes
    checksum_ok: bool
    for frame in sends:
        send = frame.send
        if send is None:
            raise ValueError("a SEND frame without the fast decoder's fields")
        producer_id, sequence_id, num_messages, highest = send
        if producer_id != last_producer:
            items = by_producer.setdefault(producer_id, [])
            last_producer = producer_id
        section = frame.section
        if section is not None and num_messages > 0:
            data, checksum, checksum_ok = section
            if checksum_ok and len(data) <= max_size and (key := plain_key(data)) is not None:
                key_hash = (plain_key_hash(key) or PLAIN_UNHASHED) if key else PLAIN_UNHASHED
                entry = (data, checksum, num_messages, key_hash)
                items.append(
                    (sequence_id, sequence_id if highest is None else highest, entry, None)
                )
                continue
        unusual.append((items, len(items), frame))
        items.append(UNFILLED)
    return by_producer, unusual
