"""Pykka's actor registry, with constant-time removal.

Pykka 4.5 keeps the ref of every running actor in one list, `ActorRegistry._actor_refs`, and
unregisters a stopping actor with ``ref in refs`` and then ``refs.remove(ref)``: two scans
of every running actor. A broker runs an actor per open topic, per subscription and per
connection, and the newest (a connection's) is at the list's end, so with 8,000 open topics
closing a connection scanned 16,000 refs twice on the hub (0.8-1.9 ms of CPU;
``python -m bench.micro.open_topics``). `install` puts a `RefTable` in the list's place: the
same operations on an insertion-ordered dict. Pykka's public registry API (``get_all``,
``get_by_class``, ``get_by_urn``, ``broadcast``, ``stop_all``) reads it as it read the list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, overload

import pykka

__all__ = ["RefTable", "install"]


class RefTable:
    """The refs of the running actors in start order, as Pykka's registry uses its list.

    A ref is a key (ActorRef compares and hashes by identity, as the list compared it).
    """

    __slots__ = ("_refs",)

    def __init__(self, refs: Iterable[pykka.ActorRef[Any]] = ()) -> None:
        self._refs: dict[pykka.ActorRef[Any], None] = dict.fromkeys(refs)

    def append(self, ref: pykka.ActorRef[Any]) -> None:
        self._refs[ref] = None

    def remove(self, ref: pykka.ActorRef[Any]) -> None:
        try:
            del self._refs[ref]
        except KeyError:
            raise ValueError(f"{ref} is not registered") from None

    def __contains__(self, ref: object) -> bool:
        return ref in self._refs

    def __len__(self) -> int:
        return len(self._refs)

    def __iter__(self) -> Iterator[pykka.ActorRef[Any]]:
        # A copy: a list's iterator tolerated an actor starting or stopping meanwhile.
        return iter(list(self._refs))

    @overload
    def __getitem__(self, index: int) -> pykka.ActorRef[Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[pykka.ActorRef[Any]]: ...
    def __getitem__(self, index: int | slice) -> pykka.ActorRef[Any] | list[pykka.ActorRef[Any]]:
        return list(self._refs)[index]


def install() -> bool:
    """Put a `RefTable` in place of Pykka's list of refs (once; the refs already there
    kept in order). Returns whether the registry now uses one: not if this Pykka keeps its
    refs in something other than a list, or its refs compare by more than identity."""
    registry = pykka.ActorRegistry
    with registry._actor_refs_lock:
        refs: Any = registry._actor_refs
        if isinstance(refs, RefTable):
            return True
        by_identity = (
            pykka.ActorRef.__eq__ is object.__eq__ and pykka.ActorRef.__hash__ is object.__hash__
        )
        if type(refs) is not list or not by_identity:
            return False
        registry._actor_refs = RefTable(refs)  # type: ignore[assignment]
        return True
