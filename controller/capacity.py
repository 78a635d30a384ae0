"""The GPUs as a planning pass changes them, and where a request fits on them now.

`Capacity` is the state a pass keeps, that `placement`'s planner is built on: each GPU's slot
(what gctl's attempts take of it, who holds it, who is next on it), the GPUs without jobs on
each node, the shared GPUs with room left, the attempts stopping and the places held by
attempts bound ahead. Every change to it is counted (`version`, `blocking`) and logged for the
fit indexes (`fitindex`). On that state, the first two steps of `placement`'s pass:

1. filter: the GPUs that could ever take a request shape (`_static`, with `diagnosis`'s checks);
2. fit: why a GPU cannot take a request now (`_blocker`), and the GPUs with room now, scored
   by its pool's policy (`_fit`); `_place` puts the request there. A multi-node request's part
   on one node is scored as for one node, then mutual peers first (`_member_option`); `gangs`
   takes `nodes` such nodes at once.

The later steps hold GPUs for a Job that waits (`_reserve`), and skip a request shape that
failed them earlier in the pass (`no_fit`, `no_wait`, `no_preemption`): capacity only shrinks
while a pass runs.
"""

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from controller import diagnosis, fitindex, snapshot
from gctl.api import quantity

EPSILON = 1e-9
NEVER = datetime.max.replace(tzinfo=UTC)  # a GPU's `free_at` when not known: it frees last
RESERVED = "reserved for a Job ahead in the queue"
QUEUED = "taken by a job bound ahead"


def plus(moment: datetime, span: timedelta | float) -> datetime:
    """`moment` plus `span` (or that many seconds), or NEVER past the last moment a datetime
    holds: one Job's far deadline, or many of them queued one after another, must not stop a
    pass."""
    return quantity.after(moment, span) or NEVER


def later(a: datetime | None, b: datetime | None) -> datetime | None:
    """The later of two moments, None meaning never known."""
    return None if a is None or b is None else max(a, b)


class Capacity:
    """The GPUs during one pass, changed by each decision in turn; steps 1 and 2 on them."""

    def __init__(self, world: snapshot.Snapshot, now: datetime) -> None:
        self.now = now
        nodes = {n.name: n for n in world.nodes}
        self.nodes = sorted(nodes.values(), key=lambda n: n.name)
        self.slots = [
            snapshot.Slot(
                gpu, nodes.get(gpu.node, snapshot.Node(gpu.node, ready=False)), free_at=now
            )
            for gpu in sorted(world.gpus, key=lambda g: (g.node, g.index))
        ]
        self.free: Counter[str] = Counter(s.gpu.node for s in self.slots)  # GPUs without jobs
        self.idle = len(self.slots)  # of all nodes
        self.node_jobs: Counter[str] = Counter()
        self.partial: dict[tuple[str, int], snapshot.Slot] = {}  # shared GPUs with room left
        self.stopping: set[snapshot.Allocation] = set()
        self.priorities = sorted({a.priority for a in world.allocations})  # of the attempts
        # attempt bound ahead -> GPUs
        self.places: dict[snapshot.Allocation, list[snapshot.Slot]] = {}
        self.version = 0  # moves with every change of capacity or of a GPU's next job
        # Moves with every change a waiting Job's message could show (`_blocker`'s answer for
        # some request): not when a Job is bound ahead to GPUs busy with a whole job, which
        # say "in use" or "too full" to every request before they say who is next there.
        self.blocking = 0
        self.indexes = fitindex.Indexes()
        self._hold(world.allocations)
        # What this pass learnt about request shapes: capacity only shrinks while it runs.
        self.statics: dict[tuple[object, ...], snapshot.Static] = {}
        self.no_fit: set[tuple[object, ...]] = set()
        self.no_wait: set[tuple[object, ...]] = set()
        self.no_preemption: set[tuple[object, ...]] = set()

    def _hold(self, allocations: Iterable[snapshot.Allocation]) -> None:
        by_key = {snapshot.at(s): s for s in self.slots}
        for allocation in allocations:
            if allocation.queued:  # the next job of its GPUs: it holds none of them yet
                for index in allocation.gpus:
                    if (slot := by_key.get((allocation.node, index))) is not None:
                        slot.queued = allocation
                        self.places.setdefault(allocation, []).append(slot)
                continue
            for index in allocation.gpus:
                slot = by_key.get((allocation.node, index))
                if slot is not None:
                    self._occupy(slot, allocation.share, allocation.memory, allocation.ends)
                    slot.allocations.append(allocation)
            if allocation.stopping:
                self.stopping.add(allocation)
        for slot in self.slots:  # a stopping attempt frees its GPU about now
            if slot.allocations and all(a.stopping for a in slot.allocations):
                slot.free_at = self.now

    def _occupy(
        self, slot: snapshot.Slot, share: float, memory: int | None, ends: datetime | None
    ) -> None:
        self.indexes.touch(slot.gpu.node)
        if slot.jobs == 0:
            self.free[slot.gpu.node] -= 1
            self.idle -= 1
            slot.free_at = self.now
        slot.share += share
        slot.jobs += 1
        slot.memory += memory or 0
        slot.free_at = later(slot.free_at, ends)
        self.node_jobs[slot.gpu.node] += 1
        key = (slot.gpu.node, slot.gpu.index)
        if slot.share < 1 - EPSILON:
            self.partial[key] = slot
        else:
            self.partial.pop(key, None)
        self.version += 1
        self.blocking += 1

    def full(self) -> bool:
        """Whether no GPU has room left for any request: each has a job, and none is shared
        with room left (a cordoned or unready GPU without jobs counts as room: this errs
        towards deciding more)."""
        return self.idle == 0 and not self.partial

    def _place(self, request: snapshot.Request, found: snapshot.Fit) -> snapshot.Decision:
        share = request.gpus if request.gpus < 1 else 1.0
        ends = None if request.runtime is None else plus(self.now, request.runtime)
        for slot in found.slots:
            self._occupy(slot, share, request.gpu_memory, ends)
            slot.placed.append(request)
            if own_place(slot, request):
                slot.queued = None  # it starts there now: the GPU's job, no longer its next
                self.indexes.touch(slot.gpu.node)
        indices = tuple(s.gpu.index for s in found.slots)
        return snapshot.Decision(
            request, placement=snapshot.Placement(request, found.node, indices, share)
        )

    def _reserve(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        slots: Iterable[snapshot.Slot],
        start: datetime | None,
    ) -> tuple[tuple[str, int], ...]:
        """Hold the GPUs for a Job that waits (steps 3, 4 and 6): no Job after it takes them,
        unless it backfills (`_backfills`). Returns them as (node, index)."""
        held = snapshot.Reservation(request, pool, start)
        keys = []
        for slot in slots:
            slot.reserved = held
            self.indexes.touch(slot.gpu.node)
            keys.append(snapshot.at(slot))
        self.version += 1
        self.blocking += 1
        return tuple(keys)

    # -- 1. filter ---------------------------------------------------------------------------

    def _static(self, request: snapshot.Request, pool: snapshot.Pool) -> snapshot.Static:
        key = (
            pool.name,
            request.gpu_model,
            request.gpu_memory,
            request.node,
            request.allowed,
            request.pinned,
        )
        cached = self.statics.get(key)
        if cached is not None:
            return cached
        counts: Counter[str] = Counter()
        slots = []
        for slot in self.slots:
            why = diagnosis.filter_gpu(slot, request, pool)
            if why is None:
                slots.append(slot)
            else:
                counts[why] += 1
        groups: dict[str, list[snapshot.Slot]] = {}
        for slot in slots:
            groups.setdefault(slot.gpu.node, []).append(slot)
        members = frozenset(snapshot.at(s) for s in slots)
        takeable = [
            (name, [s for s in group if could_take(s, request)]) for name, group in groups.items()
        ]
        found = snapshot.Static(
            slots, list(groups.items()), counts, len(self.slots), members, takeable
        )
        self.statics[key] = found
        return found

    # -- 2. fit --------------------------------------------------------------------------------

    def _blocker(
        self,
        slot: snapshot.Slot,
        request: snapshot.Request,
        pool: snapshot.Pool,
        removed: frozenset[snapshot.Allocation] | set[snapshot.Allocation] = frozenset(),
    ) -> str | None:
        """Why this GPU cannot take the request now (with `removed` attempts gone), or None."""
        share, jobs, memory = slot.share, slot.jobs, slot.memory
        if removed:
            for gone in (a for a in slot.allocations if a in removed):
                share, jobs, memory = share - gone.share, jobs - 1, memory - (gone.memory or 0)
        if request.gpus >= 1:
            if jobs > 0:
                return "in use"
        elif share + request.gpus > 1 + EPSILON:
            return f"too full for {quantity.format_gpus(request.gpus)} GPU"
        if queued_for_another(slot, request):
            return QUEUED
        cap = pool.max_jobs_per_gpu
        if cap is not None and jobs >= cap:
            return f"at maxJobsPerGPU={cap}"
        need, total = request.gpu_memory, slot.gpu.memory_total
        if need and total is not None and total - slot.gpu.foreign_memory - memory < need:
            return f"lack {quantity.format_bytes(need)} free"
        held = slot.reserved
        if held is not None and held.holder is not request and not self._backfills(request, held):
            return RESERVED
        return None

    def _backfills(self, request: snapshot.Request, held: snapshot.Reservation) -> bool:
        return (
            held.pool.backfill
            and held.start is not None
            and request.deadline is not None
            and plus(self.now, request.deadline) <= held.start
        )

    def _fit(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        static: snapshot.Static,
        removed: frozenset[snapshot.Allocation] | set[snapshot.Allocation] = frozenset(),
    ) -> snapshot.Fit | None:
        wanted = max(1, int(request.gpus))
        if request.gpus >= 1 or removed or pool.policy == "spread":
            prune = not removed and request.gpus >= 1
            return self._fit_node(request, pool, static, wanted, removed, prune=prune)
        # binpack: a fraction goes onto the fullest shared GPU, else an empty one
        shared = self._fit_shared(request, pool, static)
        return shared or self._fit_node(request, pool, static, 1, removed, prune=True)

    def _fit_node(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        static: snapshot.Static,
        wanted: int,
        removed: frozenset[snapshot.Allocation] | set[snapshot.Allocation],
        *,
        prune: bool,
    ) -> snapshot.Fit | None:
        """`wanted` GPUs on one node: binpack takes the node left with the fewest free GPUs,
        spread the node running the fewest jobs; then GPUs that are mutual peers (a fraction:
        the emptiest GPU)."""
        if not removed and request.queued is None:
            return self._indexed_fit(request, pool, static, wanted)
        return self._scan(request, pool, static, wanted, removed, prune=prune)

    def _scan(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        static: snapshot.Static,
        wanted: int,
        removed: frozenset[snapshot.Allocation] | set[snapshot.Allocation],
        *,
        prune: bool,
    ) -> snapshot.Fit | None:
        """`_fit_node` by looking at every node."""
        options = []
        for name, slots in static.groups:
            if prune and self.free[name] < wanted:
                continue  # not enough GPUs without gctl jobs: skip without looking closer
            option = self._option(name, slots, request, pool, wanted, removed=removed)
            if option is not None:
                options.append((option[0], name, option[1]))
        if not options:
            return None
        best = min(option[0] for option in options)
        tied = sorted((o for o in options if o[0] == best), key=lambda o: o[1])
        return self._choose(request, wanted, ((name, usable) for _, name, usable in tied))

    def _option(
        self,
        name: str,
        slots: list[snapshot.Slot],
        request: snapshot.Request,
        pool: snapshot.Pool,
        wanted: int,
        *,
        removed: frozenset[snapshot.Allocation] | set[snapshot.Allocation] = frozenset(),
    ) -> fitindex.Option | None:
        """The node's GPUs that can take the request now and how good a place they are (lower
        is better), if there are `wanted` of them."""
        usable = [s for s in slots if self._blocker(s, request, pool, removed) is None]
        if len(usable) < wanted:
            return None
        if pool.policy == "spread":
            return (self.node_jobs[name], -len(usable)), usable
        return (len(usable) - wanted, -self.node_jobs[name]), usable

    def _choose(
        self,
        request: snapshot.Request,
        wanted: int,
        tied: Iterable[tuple[str, list[snapshot.Slot]]],
    ) -> snapshot.Fit | None:
        """Of the best nodes, in name order: a fraction takes the first node's emptiest GPU;
        whole GPUs the first node with `wanted` mutual peers, else the first node (None:
        there is none)."""
        first: snapshot.Fit | None = None
        for name, usable in tied:
            if request.gpus < 1:
                return snapshot.Fit(name, (min(usable, key=lambda s: (s.share, s.gpu.index)),))
            chosen, peers = _pick(usable, wanted)
            if peers:
                return snapshot.Fit(name, tuple(chosen))
            first = first or snapshot.Fit(name, tuple(chosen))
        return first

    def _indexed_fit(
        self, request: snapshot.Request, pool: snapshot.Pool, static: snapshot.Static, wanted: int
    ) -> snapshot.Fit | None:
        """`_fit_node` for a request that holds no place yet, from its shape's index."""

        def option(name: str, slots: list[snapshot.Slot]) -> fitindex.Option | None:
            return self._option(name, slots, request, pool, wanted)

        index = self.indexes.index(("fit", *request.shape), static.groups, option)
        popped: list[fitindex.Entry] = []
        found = self._choose(request, wanted, self.indexes.best(index, popped))
        for entry in popped:  # still as good as they were: the caller may not place it
            heapq.heappush(index.heap, entry)
        return found

    def _member_option(
        self,
        name: str,
        slots: list[snapshot.Slot],
        request: snapshot.Request,
        pool: snapshot.Pool,
        removed: frozenset[snapshot.Allocation] | set[snapshot.Allocation] = frozenset(),
    ) -> fitindex.Option | None:
        """A multi-node request's member on this node (with `removed` attempts gone): how
        good a place it is (`_option`, then mutual peers first) and the GPUs it takes."""
        wanted = int(request.gpus)
        found = self._option(name, slots, request, pool, wanted, removed=removed)
        if found is None:
            return None
        chosen, peers = _pick(found[1], wanted)
        return (*found[0], not peers), chosen

    def _fit_shared(
        self, request: snapshot.Request, pool: snapshot.Pool, static: snapshot.Static
    ) -> snapshot.Fit | None:
        """A fraction onto the fullest GPU already shared that still has room."""
        usable = [
            s
            for key, s in self.partial.items()
            if key in static.members and self._blocker(s, request, pool) is None
        ]
        if not usable:
            return None
        best = min(usable, key=lambda s: (-s.share, self.free[s.gpu.node], snapshot.at(s)))
        return snapshot.Fit(best.gpu.node, (best,))


def _pick(usable: Sequence[snapshot.Slot], wanted: int) -> tuple[list[snapshot.Slot], bool]:
    """`wanted` of a node's usable GPUs, lowest indices first, preferring a set whose members
    are all mutual peers; returns (GPUs, whether they are)."""
    if wanted == 1 or not any(s.gpu.peers for s in usable):
        return list(usable[:wanted]), wanted == 1
    for start, first in enumerate(usable):
        group = [first]
        for other in usable[start + 1 :]:
            if all(
                other.gpu.index in g.gpu.peers and g.gpu.index in other.gpu.peers for g in group
            ):
                group.append(other)
                if len(group) == wanted:
                    return group, True
    return list(usable[:wanted]), False


def own_place(slot: snapshot.Slot, request: snapshot.Request) -> bool:
    """Whether the GPU's next job is the request's own attempt, bound ahead in an earlier pass."""
    return slot.queued is not None and slot.queued is request.queued


def queued_for_another(slot: snapshot.Slot, request: snapshot.Request) -> bool:
    """A GPU whose next job is another Job's: bound ahead in this pass, or in an earlier one
    and free now, so that its agent is about to start it."""
    if slot.next is not None:
        return slot.next is not request
    queued = slot.queued
    return queued is not None and queued is not request.queued and slot.jobs == 0


def could_take(slot: snapshot.Slot, request: snapshot.Request) -> bool:
    """Whether the GPU could take the request once gctl's attempts on it ended (memory held by
    processes gctl did not start does not end with them)."""
    need, total = request.gpu_memory, slot.gpu.memory_total
    return not need or total is None or total - slot.gpu.foreign_memory >= need
