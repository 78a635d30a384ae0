"""The fit indexes of a planning pass, and the log of changes to nodes' GPUs they catch up from.

For each request shape the pass keeps a heap of what each node offers it, best first
(`NodeIndex`): for fitting it now (`capacity`) and for binding it ahead (`ahead`), which say
what a node offers; a multi-node request takes the first few nodes of its index (`firsts`).
Every change to a node's GPUs in the pass is logged (`Indexes.touch`), and an index looks
again only at the nodes whose GPUs changed since it was last used.
"""

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from controller import snapshot

# How good a node is for a request (lower is better), and the GPUs it would take there.
Option = tuple[tuple[Any, ...], list[snapshot.Slot]]
Entry = tuple[tuple[Any, ...], str, int, int, list[snapshot.Slot]]
_ENTRIES = itertools.count()  # ties between entries of one node: the newest last


@dataclass
class NodeIndex:
    """The nodes of a request shape's filtered GPUs (`groups`) and, on a heap, what each
    offers it, best first, as of the node's last change; `seen`: how much of the planner's
    change log the heap has caught up with."""

    groups: dict[str, list[snapshot.Slot]]
    heap: list[Entry] = field(default_factory=list)
    seen: int = 0


class Indexes:
    """A pass's indexes, by request shape, and its log of changes to nodes' GPUs."""

    def __init__(self) -> None:
        # Each change to a node's GPUs, in order (`touch`): the indexes catch up from it.
        self.changes: list[str] = []
        self.changed_at: dict[str, int] = {}  # node -> position of its last change, plus one
        self.indexes: dict[tuple[object, ...], NodeIndex] = {}

    def touch(self, node: str) -> None:
        """Log a change to the node's GPUs, for the fit indexes."""
        self.changes.append(node)
        self.changed_at[node] = len(self.changes)

    def index(
        self,
        key: tuple[object, ...],
        groups: list[tuple[str, list[snapshot.Slot]]],
        option: Callable[[str, list[snapshot.Slot]], Option | None],
    ) -> NodeIndex:
        """The index of a request shape (for fitting, or for binding ahead), caught up with
        every change since it was last used.

        For a request that holds no place yet (not bound ahead, nothing reserved), what a node
        offers depends only on the request's shape and on the node's GPUs: so each node is
        looked at again only after its GPUs changed, not for every request (10,000 Jobs onto
        4,000 GPUs: 40 million GPU checks otherwise)."""
        index = self.indexes.get(key)
        if index is None:
            index = self.indexes[key] = NodeIndex(dict(groups))
            stale: Iterable[str] = index.groups
        else:
            stale = {n for n in self.changes[index.seen :] if n in index.groups}
        index.seen = len(self.changes)
        for name in stale:
            found = option(name, index.groups[name])
            if found is not None:
                at = self.changed_at.get(name, 0)
                heapq.heappush(index.heap, (found[0], name, at, next(_ENTRIES), found[1]))
        return index

    def top(self, index: NodeIndex) -> str | None:
        """The node whose entry is best (then first by name), as of the node's last change;
        entries older than that are dropped on the way."""
        heap = index.heap
        while heap:
            name, at = heap[0][1], heap[0][2]
            if at == self.changed_at.get(name, 0):
                return name
            heapq.heappop(heap)
        return None

    def best(
        self, index: NodeIndex, popped: list[Entry]
    ) -> Iterator[tuple[str, list[snapshot.Slot]]]:
        """The index's current best nodes, in name order; entries older than their node's
        last change are dropped on the way."""
        heap = index.heap
        while heap:
            primary, name, at, _, usable = heap[0]
            if at != self.changed_at.get(name, 0):
                heapq.heappop(heap)
                continue
            if popped and primary != popped[0][0]:
                return
            yield name, usable
            popped.append(heapq.heappop(heap))

    def firsts(self, index: NodeIndex, count: int) -> list[tuple[str, list[snapshot.Slot]]]:
        """The index's `count` best nodes, best first (then by name), as of their last change:
        fewer where fewer have an entry. Entries older than their node's last change are
        dropped on the way; the rest stay on the heap (the caller may place nothing)."""
        heap = index.heap
        kept: list[Entry] = []
        names: set[str] = set()
        while heap and len(kept) < count:
            entry = heapq.heappop(heap)
            name, at = entry[1], entry[2]
            if at == self.changed_at.get(name, 0) and name not in names:
                kept.append(entry)
                names.add(name)
        for entry in kept:
            heapq.heappush(heap, entry)
        return [(name, usable) for _, name, _, _, usable in kept]
