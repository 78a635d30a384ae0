"""Where Jobs fit: one pure planning pass over a snapshot, so tests drive it with plain objects.

`plan(snapshot, requests, now)` walks the queue in order (priority, then submission time, then
name) and decides each request in numbered steps:

1. filter: the GPUs that could ever take it (pool, pinned placement, Ready node, not cordoned or
   draining, model, size, the pool's utilization and memory thresholds);
2. fit: those with room now (share, maxJobsPerGPU, free memory, not reserved for a Job ahead of
   it) -> place it, scored by its pool's policy;
3. wait: it fits once attempts already stopping have ended -> hold those GPUs and wait;
4. preempt: it fits by stopping lower-priority preemptible attempts -> stop the fewest and
   lowest (then the most recently started), hold their GPUs and wait;
5. bind ahead: where its pool allows it, bind it to the busy whole GPUs that free soonest,
   queued behind the jobs on them (one job ahead per GPU): their agent starts it the moment
   they end, with no round trip through the controller; a place held by a Job later in the
   queue is taken from the last such Job, so that one Job waits again rather than every Job
   bound ahead moving one place along;
6. reserve: the first Job of its pool that still cannot start reserves the GPUs that free
   soonest (then: the most already free); later Jobs may not use them, unless the pool
   backfills and their deadline ends before the reservation's estimated start.

A Job bound ahead in an earlier pass is decided again, in its place in the queue, until its
agent takes it: it stays where it is while it may (it starts now if its GPUs have freed, and
no other Job is placed on them meanwhile); it moves to GPUs that are free now, or that a Job
ahead of it in the queue did not take; else it goes back to waiting.

A Job left waiting gets a reason, a message shaped like kube-scheduler's ("0/8 GPUs fit:
6 lack 40Gi free, 2 cordoned"), its place in its pool's queue and, where end times are known,
an estimated start. Capacity only shrinks while a pass runs, so a request shape that failed a
step fails it for every later request of that shape: the pass stays fast with 10,000 queued.

The planner's values (Snapshot, Request, Decision ...) live in `snapshot` and are offered here;
step 4's choice of victims is `preemption`'s, and the checks and messages are `diagnosis`'s.
"""

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from controller import diagnosis, preemption, snapshot
from gctl.api import binding, job, quantity

# The values of `snapshot`, under the names callers use (`placement.Request` ...).
DEFAULT_POOL = snapshot.DEFAULT_POOL
GPU = snapshot.GPU
Allocation = snapshot.Allocation
Decision = snapshot.Decision
Node = snapshot.Node
Placement = snapshot.Placement
Plan = snapshot.Plan
Pool = snapshot.Pool
Request = snapshot.Request
Snapshot = snapshot.Snapshot
queue_key = snapshot.queue_key

EPSILON = 1e-9
NEVER = datetime.max.replace(tzinfo=UTC)
# The head of a pool's queue: Jobs at these positions get exact messages and, where it can be
# told, an estimated start (each takes its place on a simulated timeline of the GPUs). Further
# back, estimates are left out and messages are worked out once per request shape and pass.
QUEUE_HEAD = 100
RESERVED = "reserved for a Job ahead in the queue"
QUEUED = "taken by a job bound ahead"


def plan(
    snapshot: Snapshot,
    requests: Iterable[Request],
    now: datetime,
    max_placements: int | None = None,
) -> Plan:
    """Decide every request, in queue order; stop after `max_placements` placements."""
    ordered = sorted(requests, key=queue_key)
    planner = _Planner(snapshot, now, [r.queued for r in ordered if r.queued is not None])
    decisions: list[Decision] = []
    placed = 0
    for request in ordered:
        if max_placements is not None and placed >= max_placements:
            return Plan(decisions, complete=False)
        decision = planner.decide(request)
        placed += changes(decision)
        decisions.append(decision)
    return Plan(decisions)


def changes(decision: Decision) -> bool:
    """Whether applying the decision writes a Binding: a new one, or an attempt bound ahead
    that moves or goes back to waiting (one that stays where it is writes nothing)."""
    queued, placed = decision.request.queued, decision.placement
    if queued is None:
        return placed is not None
    return placed is None or (placed.node, sorted(placed.gpus)) != (
        queued.node,
        sorted(queued.gpus),
    )


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    """The later of two moments, None meaning never known."""
    return None if a is None or b is None else max(a, b)


class _Planner:
    def __init__(self, world: Snapshot, now: datetime, movable: Iterable[Allocation] = ()) -> None:
        self.now = now
        queue = list(movable)  # attempts bound ahead that this pass decides again, in order
        self.movable = frozenset(queue)
        self.rank = {a: i for i, a in enumerate(queue)}  # how far back in the queue each is
        self.pools = dict(world.pools)  # the default pool is added when first asked for
        nodes = {n.name: n for n in world.nodes}
        self.nodes = sorted(nodes.values(), key=lambda n: n.name)
        self.slots = [
            snapshot.Slot(gpu, nodes.get(gpu.node, Node(gpu.node, ready=False)), free_at=now)
            for gpu in sorted(world.gpus, key=lambda g: (g.node, g.index))
        ]
        self.free: Counter[str] = Counter(s.gpu.node for s in self.slots)  # GPUs without jobs
        self.node_jobs: Counter[str] = Counter()
        self.partial: dict[tuple[str, int], snapshot.Slot] = {}  # shared GPUs with room left
        self.stopping: set[Allocation] = set()
        self.places: dict[Allocation, list[snapshot.Slot]] = {}  # attempt bound ahead -> GPUs
        self.version = 0  # moves with every change of capacity or of a GPU's next job
        # Moves with every change a waiting Job's message could show (`_blocker`'s answer for
        # some request): not when a Job is bound ahead to GPUs busy with a whole job, which
        # say "in use" or "too full" to every request before they say who is next there.
        self.blocking = 0
        # Each change to a node's GPUs, in order (`_touch`): the fit indexes catch up from it.
        self.changes: list[str] = []
        self.changed_at: dict[str, int] = {}  # node -> position of its last change, plus one
        self.indexes: dict[tuple[object, ...], _NodeIndex] = {}
        self._hold(world.allocations)
        # What this pass learnt about request shapes: capacity only shrinks while it runs.
        self.statics: dict[tuple[object, ...], snapshot.Static] = {}
        self.no_fit: set[tuple[object, ...]] = set()
        self.no_wait: set[tuple[object, ...]] = set()
        self.no_preemption: set[tuple[object, ...]] = set()
        self.no_ahead: dict[tuple[object, ...], int] = {}  # shape -> version it found none at
        self.unknown_start: set[tuple[object, ...]] = set()
        self.messages: dict[tuple[object, ...], str] = {}
        self.positions: Counter[str] = Counter()
        self.reserved_pools: set[str] = set()

    def _hold(self, allocations: Iterable[Allocation]) -> None:
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
        self._touch(slot.gpu.node)
        if slot.jobs == 0:
            self.free[slot.gpu.node] -= 1
            slot.free_at = self.now
        slot.share += share
        slot.jobs += 1
        slot.memory += memory or 0
        slot.free_at = _later(slot.free_at, ends)
        self.node_jobs[slot.gpu.node] += 1
        key = (slot.gpu.node, slot.gpu.index)
        if slot.share < 1 - EPSILON:
            self.partial[key] = slot
        else:
            self.partial.pop(key, None)
        self.version += 1
        self.blocking += 1

    # -- the steps -----------------------------------------------------------------------------

    def decide(self, request: Request) -> Decision:
        if request.problem is not None:
            self._release(request)
            return Decision(request, reason=request.problem[0], message=request.problem[1])
        pool = self._pool(request)
        if isinstance(pool, Decision):
            self._release(request)
            return pool
        if request.gpus == 0:
            return self._decide_cpu_only(request, pool)
        shape = self._shape(request, pool)
        static = self._static(request, pool)
        if request.queued is not None:  # bound ahead: it starts now where its GPUs freed
            starting = self._own_free(request, pool, static)
            if starting is not None:
                return self._place(request, starting)
        if shape not in self.no_fit:  # 2. fit
            found = self._fit(request, pool, static)
            if found is not None:
                self._release(request)
                return self._place(request, found)
            self.no_fit.add(shape)
        if request.queued is not None:  # ... or stays queued where it is, while it may
            kept = self._ahead(request, pool, static, own_only=True)
            if kept is not None:
                return kept
        waiting = self._wait_for_stopping(request, pool, static, shape)  # 3. wait
        if waiting is None and pool.preemption:  # 4. preempt
            waiting = self._preempt(request, pool, static, shape)
        # 5. bind ahead; a shape that found no place finds none until capacity changes.
        if waiting is None and (request.queued or self.no_ahead.get(shape) != self.version):
            ahead = self._ahead(request, pool, static, own_only=False)
            if ahead is not None:
                return ahead
            self.no_ahead[shape] = self.version
        self._release(request)
        self.positions[pool.name] += 1
        position = self.positions[pool.name]
        if waiting is not None:
            return Decision(
                request,
                victims=waiting.victims,
                reason=job.REASON_UNSCHEDULABLE,
                message=waiting.message,
                position=position,
                held=waiting.held,
            )
        message = self._why(request, pool, static, shape, position)  # 6. reserve
        start, held = self._estimate(request, pool, static, shape)
        return Decision(
            request,
            reason=job.REASON_UNSCHEDULABLE,
            message=message,
            position=position,
            estimated_start=start,
            held=held,
        )

    def _pool(self, request: Request) -> Pool | Decision:
        found = self.pools.get(request.pool)
        if found is None and request.pool == DEFAULT_POOL:
            found = self.pools[DEFAULT_POOL] = Pool()  # the same one for every request
        if found is None:
            message = f'GPUPool "{request.pool}" not found: create it, or change spec.pool'
            return Decision(request, reason=job.REASON_POOL_NOT_FOUND, message=message)
        if 0 < request.gpus < 1 and not found.allow_fractions:
            message = (
                f"pool {found.name} does not allow fractional GPUs: ask for whole GPUs or use "
                "another pool"
            )
            return Decision(request, reason=job.REASON_UNSCHEDULABLE, message=message)
        return found

    def _shape(self, request: Request, pool: Pool) -> tuple[object, ...]:
        return (
            pool.name,
            request.gpus,
            request.gpu_memory,
            request.gpu_model,
            request.node,
            request.pinned,
            request.deadline,
        )

    def _place(self, request: Request, found: snapshot.Fit) -> Decision:
        share = request.gpus if request.gpus < 1 else 1.0
        ends = None if request.runtime is None else self.now + request.runtime
        for slot in found.slots:
            self._occupy(slot, share, request.gpu_memory, ends)
            slot.placed.append(request)
            if _own_place(slot, request):
                slot.queued = None  # it starts there now: the GPU's job, no longer its next
                self._touch(slot.gpu.node)
        indices = tuple(s.gpu.index for s in found.slots)
        return Decision(request, placement=Placement(request, found.node, indices, share))

    # -- 1. filter ---------------------------------------------------------------------------

    def _static(self, request: Request, pool: Pool) -> snapshot.Static:
        key = (pool.name, request.gpu_model, request.gpu_memory, request.node, request.pinned)
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
            (name, [s for s in group if _could_take(s, request)]) for name, group in groups.items()
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
        request: Request,
        pool: Pool,
        removed: frozenset[Allocation] | set[Allocation] = frozenset(),
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
        if _queued_for_another(slot, request):
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

    def _backfills(self, request: Request, held: snapshot.Reservation) -> bool:
        return (
            held.pool.backfill
            and held.start is not None
            and request.deadline is not None
            and self.now + timedelta(seconds=request.deadline) <= held.start
        )

    def _fit(
        self,
        request: Request,
        pool: Pool,
        static: snapshot.Static,
        removed: frozenset[Allocation] | set[Allocation] = frozenset(),
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
        request: Request,
        pool: Pool,
        static: snapshot.Static,
        wanted: int,
        removed: frozenset[Allocation] | set[Allocation],
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
        request: Request,
        pool: Pool,
        static: snapshot.Static,
        wanted: int,
        removed: frozenset[Allocation] | set[Allocation],
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
        request: Request,
        pool: Pool,
        wanted: int,
        *,
        removed: frozenset[Allocation] | set[Allocation] = frozenset(),
    ) -> "_Option | None":
        """The node's GPUs that can take the request now and how good a place they are (lower
        is better), if there are `wanted` of them."""
        usable = [s for s in slots if self._blocker(s, request, pool, removed) is None]
        if len(usable) < wanted:
            return None
        if pool.policy == "spread":
            return (self.node_jobs[name], -len(usable)), usable
        return (len(usable) - wanted, -self.node_jobs[name]), usable

    def _choose(
        self, request: Request, wanted: int, tied: Iterable[tuple[str, list[snapshot.Slot]]]
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

    def _touch(self, node: str) -> None:
        """Log a change to the node's GPUs, for the fit indexes."""
        self.changes.append(node)
        self.changed_at[node] = len(self.changes)

    def _indexed_fit(
        self, request: Request, pool: Pool, static: snapshot.Static, wanted: int
    ) -> snapshot.Fit | None:
        """`_fit_node` for a request that holds no place yet, from its shape's index."""

        def option(name: str, slots: list[snapshot.Slot]) -> _Option | None:
            return self._option(name, slots, request, pool, wanted)

        index = self._index(("fit", *self._shape(request, pool)), static.groups, option)
        popped: list[_IndexEntry] = []
        found = self._choose(request, wanted, self._best(index, popped))
        for entry in popped:  # still as good as they were: the caller may not place it
            heapq.heappush(index.heap, entry)
        return found

    def _index(
        self,
        key: tuple[object, ...],
        groups: list[tuple[str, list[snapshot.Slot]]],
        option: Callable[[str, list[snapshot.Slot]], "_Option | None"],
    ) -> "_NodeIndex":
        """The index of a request shape (for fitting, or for binding ahead), caught up with
        every change since it was last used.

        For a request that holds no place yet (not bound ahead, nothing reserved), what a node
        offers depends only on the request's shape and on the node's GPUs: so each node is
        looked at again only after its GPUs changed, not for every request (10,000 Jobs onto
        4,000 GPUs: 40 million GPU checks otherwise)."""
        index = self.indexes.get(key)
        if index is None:
            index = self.indexes[key] = _NodeIndex(dict(groups))
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

    def _best(
        self, index: "_NodeIndex", popped: list["_IndexEntry"]
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

    def _fit_shared(
        self, request: Request, pool: Pool, static: snapshot.Static
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

    # -- a Job bound ahead -----------------------------------------------------------------

    def _own_free(
        self, request: Request, pool: Pool, static: snapshot.Static
    ) -> snapshot.Fit | None:
        """The GPUs a Job bound ahead waits for, if they have all freed (its agent is about to
        start it) and still suit it."""
        queued = request.queued
        assert queued is not None
        own = self._places_of(queued)
        if len(own) != len(queued.gpus):
            return None
        for slot in own:
            if snapshot.at(slot) not in static.members:
                return None
            if self._blocker(slot, request, pool) is not None:
                return None
        return snapshot.Fit(queued.node, tuple(own))

    def _release(self, request: Request) -> None:
        """A Job bound ahead moves or goes back to waiting: its GPUs' next place is free."""
        if request.queued is None:
            return
        for slot in self._places_of(request.queued):
            slot.queued = None
            self._touch(slot.gpu.node)
            self.version += 1
            self.blocking += _open(slot)

    def _places_of(self, queued: Allocation) -> list[snapshot.Slot]:
        """The GPUs whose next job the attempt bound ahead still is."""
        return [s for s in self.places.get(queued, []) if s.queued is queued]

    def _queueable(self, slot: snapshot.Slot, request: Request, own_only: bool) -> bool:
        """Whether the request may be bound ahead to this GPU: busy with one job that holds
        all of it, nobody's next place yet (a place held by a Job later in the queue is taken
        from it), and not reserved for another Job."""
        if slot.next is not None:
            return False
        if slot.reserved is not None and slot.reserved.holder is not request:
            return False
        own = _own_place(slot, request)
        if own and slot.jobs == 0:
            return True  # its job ended: still its place, while its other GPUs are busy
        if slot.jobs != 1 or slot.share < 1 - EPSILON:
            return False
        if own_only:
            return own
        return slot.queued is None or own or slot.queued in self.movable

    def _ahead(
        self, request: Request, pool: Pool, static: snapshot.Static, *, own_only: bool
    ) -> Decision | None:
        """5. Bind the request to the busy whole GPUs that free soonest, as their next job:
        its own place first, then places nobody holds, then those of Jobs behind it."""
        if not pool.bind_ahead or request.gpus < 1:
            return None
        wanted = int(request.gpus)
        if request.queued is None:

            def option(name: str, takeable: list[snapshot.Slot]) -> _Option | None:
                return self._ahead_option(takeable, request, wanted, own_only=False)

            index = self._index(("ahead", *self._shape(request, pool)), static.takeable, option)
            best = next(self._best(index, []), None)
            return None if best is None else self._queue(request, best[0], best[1])
        options = []
        groups = static.takeable
        if own_only:  # only its own place: the GPUs it is bound ahead to
            own = self._places_of(request.queued)
            own = [s for s in own if snapshot.at(s) in static.members and _could_take(s, request)]
            groups = [(request.queued.node, own)]
        for name, takeable in groups:
            found = self._ahead_option(takeable, request, wanted, own_only=own_only)
            if found is not None:
                options.append((found[0], name, found[1]))
        if not options:
            return None
        _, name, chosen = min(options, key=lambda o: (o[0], o[1]))
        return self._queue(request, name, chosen)

    def _ahead_option(
        self, takeable: list[snapshot.Slot], request: Request, wanted: int, *, own_only: bool
    ) -> "_Option | None":
        """The node's GPUs that free soonest and may take the request as their next job, and
        how good a place they are (lower is better), if there are `wanted` of them."""
        usable = [s for s in takeable if self._queueable(s, request, own_only)]
        if len(usable) < wanted:
            return None
        chosen = sorted(usable, key=lambda s: self._ahead_key(s, request))[:wanted]
        keys = [self._ahead_key(s, request) for s in chosen]
        score = (
            sum(k[0] for k in keys),
            sum(k[1] for k in keys),
            max(k[2] for k in keys),
            max(k[3] for k in keys),  # the Job nearest the front among those it takes from
        )
        return score, chosen

    def _ahead_key(
        self, slot: snapshot.Slot, request: Request
    ) -> tuple[int, int, datetime, int, int]:
        """Its own place first, then places nobody holds, then those of Jobs behind it; the
        GPU that frees soonest, then the place of the Job furthest back in the queue: that
        Job finds no place behind it and waits again, where taking the place of the next Job
        would send it to take the place of the one after it, and so on down the queue."""
        own = _own_place(slot, request)
        holder = None if own else slot.queued  # the Job behind it whose place this is, if any
        later = 0 if holder is None else -self.rank.get(holder, 0)
        return (
            0 if own else 1,
            int(holder is not None),
            slot.free_at or NEVER,
            later,
            slot.gpu.index,
        )

    def _queue(self, request: Request, node: str, chosen: list[snapshot.Slot]) -> Decision:
        self._release(request)
        after: list[Allocation | Request] = []
        frees = [slot.free_at for slot in chosen]
        start = None if None in frees else max(f for f in frees if f is not None)
        ends = None if start is None or request.runtime is None else start + request.runtime
        for slot in chosen:
            after.extend(a for a in slot.allocations if a not in after)
            after.extend(r for r in slot.placed if r not in after)
            slot.queued = None  # a Job behind this one that was next here must move
            slot.next = request
            self._touch(slot.gpu.node)
            slot.free_at = ends
            self.blocking += _open(slot)
        self.version += 1
        indices = tuple(sorted(s.gpu.index for s in chosen))
        return Decision(
            request,
            placement=Placement(request, node, indices, 1.0, after=tuple(after)),
        )

    # -- 3. wait for attempts that are stopping ---------------------------------------------------

    def _wait_for_stopping(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> snapshot.Waiting | None:
        if not self.stopping or shape in self.no_wait:
            return None
        found = self._fit(request, pool, static, removed=self.stopping)
        if found is None:
            self.no_wait.add(shape)
            return None
        stopping = {a for s in found.slots for a in s.allocations if a in self.stopping}
        held = self._reserve(request, pool, found.slots, None)
        preempted = all(a.stopping == binding.STOP_PREEMPTED for a in stopping)
        what = "preempted job(s)" if preempted else "job(s)"
        gpus = ",".join(str(s.gpu.index) for s in found.slots)
        return snapshot.Waiting(
            f"waiting for {len(stopping)} {what} to stop on {found.node} (GPUs [{gpus}] "
            "held for this Job)",
            (),
            held,
        )

    def _reserve(
        self, request: Request, pool: Pool, slots: Iterable[snapshot.Slot], start: datetime | None
    ) -> tuple[tuple[str, int], ...]:
        held = snapshot.Reservation(request, pool, start)
        keys = []
        for slot in slots:
            slot.reserved = held
            self._touch(slot.gpu.node)
            keys.append(snapshot.at(slot))
        self.version += 1
        self.blocking += 1
        return tuple(keys)

    # -- 4. preempt ----------------------------------------------------------------------------

    def _preempt(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> snapshot.Waiting | None:
        if shape in self.no_preemption:
            return None
        chosen = preemption.choose(
            request, pool, static, stopping=self.stopping, blocker=self._blocker, now=self.now
        )
        if chosen is None:
            self.no_preemption.add(shape)
            return None
        self.stopping.update(chosen.victims)
        held = self._reserve(request, pool, chosen.slots, None)
        return snapshot.Waiting(chosen.message(), chosen.victims, held)

    # -- 5. reserve, estimate and explain --------------------------------------------------------

    def _estimate(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> tuple[datetime | None, tuple[tuple[str, int], ...]]:
        """Take the request's place on the simulated timeline: the GPUs that free soonest (then
        the most already free). The pool's first blocked Job also reserves them. Returns the
        estimated start, if known, and the GPUs reserved."""
        first = pool.name not in self.reserved_pools
        if not first and (self.positions[pool.name] > QUEUE_HEAD or shape in self.unknown_start):
            return None, ()
        found = self._soonest(request, static, max(1, int(request.gpus)), reserving=first)
        if found is None:
            return None, ()
        start, slots = found
        held: tuple[tuple[str, int], ...] = ()
        if first:
            self.reserved_pools.add(pool.name)
            held = self._reserve(request, pool, slots, start)
        if start is None:
            self.unknown_start.add(shape)
            return None, held
        ends = None if request.runtime is None else start + request.runtime
        for slot in slots:
            slot.free_at = _later(slot.free_at, ends) if ends else None
            self._touch(slot.gpu.node)
        return (start if start > self.now else None), held

    def _soonest(
        self, request: Request, static: snapshot.Static, wanted: int, *, reserving: bool
    ) -> tuple[datetime | None, list[snapshot.Slot]] | None:
        """The `wanted` GPUs of one node that free soonest on the simulated timeline, then
        those most already free; a reservation takes no GPU another Job holds, nor one that
        freed for the Job bound ahead to it (its agent is starting it there: reserving it would
        only send that Job, and every Job bound ahead behind it, to other places)."""
        options = []
        for name, takeable in static.takeable:
            slots = takeable
            if reserving:
                slots = [
                    s
                    for s in slots
                    if (s.reserved is None or s.reserved.holder is request)
                    and not _queued_for_another(s, request)
                ]
            if len(slots) < wanted:
                continue
            if wanted == 1:
                chosen = [min(slots, key=_free_soonest)]
            else:
                chosen = sorted(slots, key=_free_soonest)[:wanted]
            start = chosen[-1].free_at or NEVER
            already = sum(1 for s in chosen if s.jobs == 0)
            options.append(((start, -already, name), chosen))
        if not options:
            return None
        (start, _, _), chosen = min(options, key=lambda o: o[0])
        return (None if start == NEVER else start), chosen

    def _why(
        self,
        request: Request,
        pool: Pool,
        static: snapshot.Static,
        shape: tuple[object, ...],
        position: int,
    ) -> str:
        """Why the request waits (`diagnosis.why`). Deep in the queue it is worked out once per
        shape and pass."""
        key = (*shape, self.blocking if position <= QUEUE_HEAD else -1)
        cached = self.messages.get(key)
        if cached is not None:
            return cached
        message = diagnosis.why(static, self._blocker, request, pool)
        self.messages[key] = message
        return message

    # -- CPU-only jobs ---------------------------------------------------------------------------

    def _decide_cpu_only(self, request: Request, pool: Pool) -> Decision:
        counts: Counter[str] = Counter()
        fits = []
        for n in self.nodes:
            why = diagnosis.filter_node(n, request, pool)
            if why is None:
                fits.append(n.name)
            else:
                counts[why] += 1
        if fits:
            if pool.policy == "spread":
                fits.sort(key=lambda name: self.node_jobs[name])
            return Decision(request, placement=Placement(request, fits[0], (), 0.0))
        self.positions[pool.name] += 1
        return Decision(
            request,
            reason=job.REASON_UNSCHEDULABLE,
            message=diagnosis.why_no_node(counts, len(self.nodes)),
            position=self.positions[pool.name],
        )


# How good a node is for a request (lower is better), and the GPUs it would take there.
_Option = tuple[tuple[Any, ...], list[snapshot.Slot]]
_IndexEntry = tuple[tuple[Any, ...], str, int, int, list[snapshot.Slot]]
_ENTRIES = itertools.count()  # ties between entries of one node: the newest last


@dataclass
class _NodeIndex:
    """The nodes of a request shape's filtered GPUs (`groups`) and, on a heap, what each
    offers it, best first, as of the node's last change; `seen`: how much of the planner's
    change log the heap has caught up with."""

    groups: dict[str, list[snapshot.Slot]]
    heap: list[_IndexEntry] = field(default_factory=list)
    seen: int = 0


def _free_soonest(slot: snapshot.Slot) -> tuple[datetime, int, int]:
    return (slot.free_at or NEVER, slot.jobs, slot.gpu.index)


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


def _own_place(slot: snapshot.Slot, request: Request) -> bool:
    """Whether the GPU's next job is the request's own attempt, bound ahead in an earlier pass."""
    return slot.queued is not None and slot.queued is request.queued


def _open(slot: snapshot.Slot) -> bool:
    """Whether a request's `_blocker` may look at who is next on the GPU: it is not full with
    one whole job, which every request is told first."""
    return slot.jobs == 0 or slot.share < 1 - EPSILON


def _queued_for_another(slot: snapshot.Slot, request: Request) -> bool:
    """A GPU whose next job is another Job's: bound ahead in this pass, or in an earlier one
    and free now, so that its agent is about to start it."""
    if slot.next is not None:
        return slot.next is not request
    queued = slot.queued
    return queued is not None and queued is not request.queued and slot.jobs == 0


def _could_take(slot: snapshot.Slot, request: Request) -> bool:
    """Whether the GPU could take the request once gctl's attempts on it ended (memory held by
    processes gctl did not start does not end with them)."""
    need, total = request.gpu_memory, slot.gpu.memory_total
    return not need or total is None or total - slot.gpu.foreign_memory >= need
