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
5. reserve: the first Job of its pool that still cannot start reserves the GPUs that free
   soonest (then: the most already free); later Jobs may not use them, unless the pool
   backfills and their deadline ends before the reservation's estimated start.

A Job left waiting gets a reason, a message shaped like kube-scheduler's ("0/8 GPUs fit:
6 lack 40Gi free, 2 cordoned"), its place in its pool's queue and, where end times are known,
an estimated start. Capacity only shrinks while a pass runs, so a request shape that failed a
step fails it for every later request of that shape: the pass stays fast with 10,000 queued.
"""

import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gctl.api import binding, job, quantity, queue

EPSILON = 1e-9
DEFAULT_POOL = "default"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NEVER = datetime.max.replace(tzinfo=UTC)
# The head of a pool's queue: Jobs at these positions get exact messages and, where it can be
# told, an estimated start (each takes its place on a simulated timeline of the GPUs). Further
# back, estimates are left out and messages are worked out once per request shape and pass.
QUEUE_HEAD = 100
RESERVED = "reserved for a Job ahead in the queue"


@dataclass(frozen=True)
class Node:
    name: str
    ready: bool = True
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    state: str | None = None  # "Cordoned" | "Draining" for the whole node


@dataclass(frozen=True)
class GPU:
    node: str
    index: int
    model: str = ""
    memory_total: int | None = None
    memory_used: int | None = None  # by every process, as NVML reports it
    utilization: int | None = None  # percent
    foreign_memory: int = 0  # held by processes gctl did not start
    peers: frozenset[int] = frozenset()  # NVLink / PCIe-switch neighbours on this node
    state: str | None = None  # "Cordoned" | "Draining": takes no new work


@dataclass(frozen=True)
class Pool:
    """A GPUPool's selector and rules; `Pool()` is the implicit default (every GPU)."""

    name: str = DEFAULT_POOL
    nodes: frozenset[str] | None = None
    node_labels: tuple[tuple[str, str], ...] = ()
    gpu_model: str | None = None
    gpus: frozenset[int] | None = None
    max_jobs_per_gpu: int | None = None
    allow_fractions: bool = True
    policy: str = "binpack"  # | "spread"
    preemption: bool = True
    backfill: bool = False
    max_utilization_percent: int | None = None
    max_memory_used_percent: int | None = None
    enforce_gpu_memory: bool = False


@dataclass(frozen=True)
class Allocation:
    """An attempt that holds GPUs (an active Binding), with what its Job says about it."""

    namespace: str
    job: str
    binding: str
    node: str
    gpus: tuple[int, ...]
    share: float = 1.0
    memory: int | None = None
    priority: int = 0
    preemptible: bool = True
    started: datetime | None = None
    ends: datetime | None = None  # by its deadline or its command's usual run time
    stopping: str | None = None  # the stop reason asked for; the attempt still holds its GPUs


@dataclass(frozen=True)
class Request:
    """A pending Job, as placement needs it (its profile already applied)."""

    namespace: str
    name: str
    gpus: float = 1.0
    gpu_memory: int | None = None
    gpu_model: str | None = None
    node: str | None = None
    pinned: tuple[int, ...] | None = None
    pool: str = DEFAULT_POOL
    priority: int = 0
    created: datetime | None = None
    deadline: int | None = None  # activeDeadlineSeconds
    runtime: timedelta | None = None  # expected: the deadline, or earlier runs' median
    problem: tuple[str, str] | None = None  # (reason, message): it cannot be queued at all


@dataclass(frozen=True)
class Placement:
    request: Request
    node: str
    gpus: tuple[int, ...]
    share: float  # of each GPU in `gpus`


@dataclass(frozen=True)
class Decision:
    """What the pass decided for one request: placed, or why it waits."""

    request: Request
    placement: Placement | None = None
    victims: tuple[Allocation, ...] = ()  # attempts to stop for it
    reason: str = ""
    message: str = ""
    position: int | None = None  # in its pool's queue, 1 = next
    estimated_start: datetime | None = None
    held: tuple[tuple[str, int], ...] = ()  # GPUs (node, index) reserved for it this pass


@dataclass
class Snapshot:
    nodes: list[Node]
    gpus: list[GPU]
    pools: dict[str, Pool] = field(default_factory=dict)
    allocations: list[Allocation] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    decisions: list[Decision]  # in queue order
    complete: bool = True  # False: max_placements was reached and later requests wait a pass


def queue_key(request: Request) -> tuple[int, datetime, str, str]:
    """The order `gctl get jobs -o wide` numbers the queue in, too (gctl.api.queue)."""
    return queue.order_key(request.priority, request.created, request.name, request.namespace)


def plan(
    snapshot: Snapshot,
    requests: Iterable[Request],
    now: datetime,
    max_placements: int | None = None,
) -> Plan:
    """Decide every request, in queue order; stop after `max_placements` placements."""
    planner = _Planner(snapshot, now)
    decisions: list[Decision] = []
    placed = 0
    for request in sorted(requests, key=queue_key):
        if max_placements is not None and placed >= max_placements:
            return Plan(decisions, complete=False)
        decision = planner.decide(request)
        placed += decision.placement is not None
        decisions.append(decision)
    return Plan(decisions)


def gist(message: str) -> str:
    """A message's first clause without its numbers: what must change for a Job deep in the
    queue to be rewritten ("0/8 GPUs fit: 6 in use, 2 cordoned" -> "#/# GPUs fit: # in use")."""
    return re.sub(r"\d+(\.\d+)?", "#", message.split(", ", maxsplit=1)[0])


# -- the state of one pass ---------------------------------------------------------------------


@dataclass(eq=False)
class _Reservation:
    holder: Request
    pool: Pool
    start: datetime | None  # estimated; None: unknown


@dataclass(eq=False)
class _Slot:
    """One GPU as the pass sees it: what gctl's attempts take of it, and who holds it."""

    gpu: GPU
    node: Node
    share: float = 0.0
    jobs: int = 0
    memory: int = 0  # declared gpuMemory of gctl's attempts on it
    allocations: list[Allocation] = field(default_factory=list)
    reserved: _Reservation | None = None
    free_at: datetime | None = None  # on the simulated timeline; None: not known


@dataclass
class _Static:
    """The GPUs that pass a request shape's fixed filters, grouped by node, and why the rest
    fail."""

    slots: list[_Slot]
    groups: list[tuple[str, list[_Slot]]]
    counts: Counter[str]
    total: int
    members: frozenset[tuple[str, int]]
    takeable: list[tuple[str, list[_Slot]]]  # the groups without GPUs it could never use


@dataclass(frozen=True)
class _Fit:
    node: str
    slots: tuple[_Slot, ...]


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    """The later of two moments, None meaning never known."""
    return None if a is None or b is None else max(a, b)


def _victim_key(victims: Iterable[Allocation], now: datetime) -> tuple[int, int, int, float]:
    """Fewest, then lowest priority, then most recently started."""
    chosen = list(victims)
    if not chosen:
        return (0, 0, 0, 0.0)
    priorities = [a.priority for a in chosen]
    oldest = min((a.started or now) for a in chosen)
    return (len(chosen), max(priorities), sum(priorities), -oldest.timestamp())


class _Planner:
    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.now = now
        self.pools = snapshot.pools
        nodes = {n.name: n for n in snapshot.nodes}
        self.nodes = sorted(nodes.values(), key=lambda n: n.name)
        self.slots = [
            _Slot(gpu, nodes.get(gpu.node, Node(gpu.node, ready=False)), free_at=now)
            for gpu in sorted(snapshot.gpus, key=lambda g: (g.node, g.index))
        ]
        self.free: Counter[str] = Counter(s.gpu.node for s in self.slots)  # GPUs without jobs
        self.node_jobs: Counter[str] = Counter()
        self.partial: dict[tuple[str, int], _Slot] = {}  # shared GPUs with room left
        self.stopping: set[Allocation] = set()
        self.version = 0  # moves with every change of capacity, for cached messages
        self._hold(snapshot.allocations)
        # What this pass learnt about request shapes: capacity only shrinks while it runs.
        self.statics: dict[tuple[object, ...], _Static] = {}
        self.no_fit: set[tuple[object, ...]] = set()
        self.no_wait: set[tuple[object, ...]] = set()
        self.no_preemption: set[tuple[object, ...]] = set()
        self.unknown_start: set[tuple[object, ...]] = set()
        self.messages: dict[tuple[object, ...], str] = {}
        self.positions: Counter[str] = Counter()
        self.reserved_pools: set[str] = set()

    def _hold(self, allocations: Iterable[Allocation]) -> None:
        by_key = {_at(s): s for s in self.slots}
        for allocation in allocations:
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

    def _occupy(self, slot: _Slot, share: float, memory: int | None, ends: datetime | None) -> None:
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

    # -- the steps -----------------------------------------------------------------------------

    def decide(self, request: Request) -> Decision:
        if request.problem is not None:
            return Decision(request, reason=request.problem[0], message=request.problem[1])
        pool = self._pool(request)
        if isinstance(pool, Decision):
            return pool
        if request.gpus == 0:
            return self._decide_cpu_only(request, pool)
        shape = self._shape(request, pool)
        static = self._static(request, pool)
        if shape not in self.no_fit:  # 2. fit
            found = self._fit(request, pool, static)
            if found is not None:
                return self._place(request, found)
            self.no_fit.add(shape)
        self.positions[pool.name] += 1
        position = self.positions[pool.name]
        waiting = self._wait_for_stopping(request, pool, static, shape)  # 3. wait
        if waiting is None and pool.preemption:  # 4. preempt
            waiting = self._preempt(request, pool, static, shape)
        if waiting is not None:
            return Decision(
                request,
                victims=waiting.victims,
                reason=job.REASON_UNSCHEDULABLE,
                message=waiting.message,
                position=position,
                held=waiting.held,
            )
        message = self._why(request, pool, static, shape, position)  # 5. reserve
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
            found = Pool()
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

    def _place(self, request: Request, found: _Fit) -> Decision:
        share = request.gpus if request.gpus < 1 else 1.0
        ends = None if request.runtime is None else self.now + request.runtime
        for slot in found.slots:
            self._occupy(slot, share, request.gpu_memory, ends)
        indices = tuple(s.gpu.index for s in found.slots)
        return Decision(request, placement=Placement(request, found.node, indices, share))

    # -- 1. filter ---------------------------------------------------------------------------

    def _static(self, request: Request, pool: Pool) -> _Static:
        key = (pool.name, request.gpu_model, request.gpu_memory, request.node, request.pinned)
        cached = self.statics.get(key)
        if cached is not None:
            return cached
        counts: Counter[str] = Counter()
        slots = []
        for slot in self.slots:
            why = _filter(slot, request, pool)
            if why is None:
                slots.append(slot)
            else:
                counts[why] += 1
        groups: dict[str, list[_Slot]] = {}
        for slot in slots:
            groups.setdefault(slot.gpu.node, []).append(slot)
        members = frozenset(_at(s) for s in slots)
        takeable = [
            (name, [s for s in group if _could_take(s, request)]) for name, group in groups.items()
        ]
        found = _Static(slots, list(groups.items()), counts, len(self.slots), members, takeable)
        self.statics[key] = found
        return found

    # -- 2. fit --------------------------------------------------------------------------------

    def _blocker(
        self,
        slot: _Slot,
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

    def _backfills(self, request: Request, held: _Reservation) -> bool:
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
        static: _Static,
        removed: frozenset[Allocation] | set[Allocation] = frozenset(),
    ) -> _Fit | None:
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
        static: _Static,
        wanted: int,
        removed: frozenset[Allocation] | set[Allocation],
        *,
        prune: bool,
    ) -> _Fit | None:
        """`wanted` GPUs on one node: binpack takes the node left with the fewest free GPUs,
        spread the node running the fewest jobs; then GPUs that are mutual peers (a fraction:
        the emptiest GPU)."""
        options = []
        for name, slots in static.groups:
            if prune and self.free[name] < wanted:
                continue  # not enough GPUs without gctl jobs: skip without looking closer
            usable = [s for s in slots if self._blocker(s, request, pool, removed) is None]
            if len(usable) >= wanted:
                if pool.policy == "spread":
                    primary = (self.node_jobs[name], -len(usable))
                else:
                    primary = (len(usable) - wanted, -self.node_jobs[name])
                options.append((primary, name, usable))
        if not options:
            return None
        best = min(option[0] for option in options)
        tied = sorted((o for o in options if o[0] == best), key=lambda o: o[1])
        if request.gpus < 1:
            _, name, usable = tied[0]
            return _Fit(name, (min(usable, key=lambda s: (s.share, s.gpu.index)),))
        picks = [(_pick(usable, wanted), name) for _, name, usable in tied]
        (chosen, _), name = next((p for p in picks if p[0][1]), picks[0])
        return _Fit(name, tuple(chosen))

    def _fit_shared(self, request: Request, pool: Pool, static: _Static) -> _Fit | None:
        """A fraction onto the fullest GPU already shared that still has room."""
        usable = [
            s
            for key, s in self.partial.items()
            if key in static.members and self._blocker(s, request, pool) is None
        ]
        if not usable:
            return None
        best = min(usable, key=lambda s: (-s.share, self.free[s.gpu.node], _at(s)))
        return _Fit(best.gpu.node, (best,))

    # -- 3. wait for attempts that are stopping ---------------------------------------------------

    def _wait_for_stopping(
        self, request: Request, pool: Pool, static: _Static, shape: tuple[object, ...]
    ) -> "_Waiting | None":
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
        return _Waiting(
            f"waiting for {len(stopping)} {what} to stop on {found.node} (GPUs [{gpus}] "
            "held for this Job)",
            (),
            held,
        )

    def _reserve(
        self, request: Request, pool: Pool, slots: Iterable[_Slot], start: datetime | None
    ) -> tuple[tuple[str, int], ...]:
        held = _Reservation(request, pool, start)
        keys = []
        for slot in slots:
            slot.reserved = held
            keys.append(_at(slot))
        self.version += 1
        return tuple(keys)

    # -- 4. preempt ----------------------------------------------------------------------------

    def _evictable(self, allocation: Allocation, request: Request) -> bool:
        return (
            allocation.preemptible
            and allocation.priority < request.priority
            and allocation not in self.stopping
        )

    def _victims_for(self, slot: _Slot, request: Request, pool: Pool) -> list[Allocation] | None:
        """The fewest, lowest attempts on this GPU whose stop lets the request in, or None."""
        removed = set(self.stopping)
        candidates = sorted(
            (a for a in slot.allocations if self._evictable(a, request)),
            key=lambda a: (a.priority, -(a.started or self.now).timestamp(), a.binding),
        )
        chosen: list[Allocation] = []
        while self._blocker(slot, request, pool, removed) is not None:
            if not candidates:
                return None
            victim = candidates.pop(0)
            chosen.append(victim)
            removed.add(victim)
        return chosen

    def _preempt(
        self, request: Request, pool: Pool, static: _Static, shape: tuple[object, ...]
    ) -> "_Waiting | None":
        if shape in self.no_preemption or not any(
            self._evictable(a, request) for s in static.slots for a in s.allocations
        ):
            self.no_preemption.add(shape)
            return None
        wanted = max(1, int(request.gpus))
        options = []
        for name, slots in static.groups:
            costs = [
                (s, v) for s in slots if (v := self._victims_for(s, request, pool)) is not None
            ]
            if len(costs) >= wanted:
                chosen, victims = self._cheapest(costs, wanted)
                options.append((_victim_key(victims, self.now), name, chosen, victims))
        options = [o for o in options if o[3]]
        if not options:
            self.no_preemption.add(shape)
            return None
        _, name, chosen, victims = min(options, key=lambda o: (o[0], o[1]))
        self.stopping.update(victims)
        held = self._reserve(request, pool, chosen, None)
        ordered = sorted(victims, key=lambda a: (a.namespace, a.job))
        names = ", ".join(f"{a.namespace}/{a.job}" for a in ordered)
        return _Waiting(
            f"preempting {len(ordered)} lower-priority job(s) on {name}: {names}",
            tuple(ordered),
            held,
        )

    def _cheapest(
        self, costs: list[tuple[_Slot, list[Allocation]]], wanted: int
    ) -> tuple[list[_Slot], set[Allocation]]:
        """`wanted` GPUs of one node whose victims together are fewest and lowest (greedy)."""
        chosen: list[_Slot] = []
        victims: set[Allocation] = set()
        left = list(costs)
        while len(chosen) < wanted:
            slot, cost = min(
                left, key=lambda c: (_victim_key(victims | set(c[1]), self.now), c[0].gpu.index)
            )
            left = [c for c in left if c[0] is not slot]
            chosen.append(slot)
            victims |= set(cost)
        return chosen, victims

    # -- 5. reserve, estimate and explain --------------------------------------------------------

    def _estimate(
        self, request: Request, pool: Pool, static: _Static, shape: tuple[object, ...]
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
        return (start if start > self.now else None), held

    def _soonest(
        self, request: Request, static: _Static, wanted: int, *, reserving: bool
    ) -> tuple[datetime | None, list[_Slot]] | None:
        """The `wanted` GPUs of one node that free soonest on the simulated timeline, then
        those most already free; a reservation takes no GPU another Job holds."""
        options = []
        for name, takeable in static.takeable:
            slots = takeable
            if reserving:
                slots = [s for s in slots if s.reserved is None or s.reserved.holder is request]
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
        static: _Static,
        shape: tuple[object, ...],
        position: int,
    ) -> str:
        """kube-scheduler's FailedScheduling message: for each GPU the first filter it fails,
        most frequent first. Deep in the queue it is worked out once per shape and pass."""
        key = (*shape, self.version if position <= QUEUE_HEAD else -1)
        cached = self.messages.get(key)
        if cached is not None:
            return cached
        counts = Counter(static.counts)
        fit = 0
        for slot in static.slots:
            why = self._blocker(slot, request, pool)
            if why is None:
                fit += 1
            else:
                counts[why] += 1
        message = _describe(counts, fit, static.total, max(1, int(request.gpus)))
        self.messages[key] = message
        return message

    # -- CPU-only jobs ---------------------------------------------------------------------------

    def _decide_cpu_only(self, request: Request, pool: Pool) -> Decision:
        counts: Counter[str] = Counter()
        fits = []
        for n in self.nodes:
            why = _filter_node(n, request, pool)
            if why is None:
                fits.append(n.name)
            else:
                counts[why] += 1
        if fits:
            if pool.policy == "spread":
                fits.sort(key=lambda name: self.node_jobs[name])
            return Decision(request, placement=Placement(request, fits[0], (), 0.0))
        self.positions[pool.name] += 1
        details = ", ".join(f"{n} {why}" for why, n in _ranked(counts))
        message = f"0/{len(self.nodes)} nodes fit" + (f": {details}" if details else "")
        return Decision(
            request,
            reason=job.REASON_UNSCHEDULABLE,
            message=message,
            position=self.positions[pool.name],
        )


@dataclass(frozen=True)
class _Waiting:
    message: str
    victims: tuple[Allocation, ...]
    held: tuple[tuple[str, int], ...]


def _at(slot: _Slot) -> tuple[str, int]:
    return (slot.gpu.node, slot.gpu.index)


def _free_soonest(slot: _Slot) -> tuple[datetime, int, int]:
    return (slot.free_at or NEVER, slot.jobs, slot.gpu.index)


def _pick(usable: Sequence[_Slot], wanted: int) -> tuple[list[_Slot], bool]:
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


def _could_take(slot: _Slot, request: Request) -> bool:
    """Whether the GPU could take the request once gctl's attempts on it ended (memory held by
    processes gctl did not start does not end with them)."""
    need, total = request.gpu_memory, slot.gpu.memory_total
    return not need or total is None or total - slot.gpu.foreign_memory >= need


def _in_pool(pool: Pool, gpu: GPU, node: Node) -> bool:
    if pool.nodes is not None and gpu.node not in pool.nodes:
        return False
    if any(node.labels.get(k) != v for k, v in pool.node_labels):
        return False
    if pool.gpus is not None and gpu.index not in pool.gpus:
        return False
    return pool.gpu_model is None or _model_matches(gpu.model, pool.gpu_model)


def _model_matches(model: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(model.lower(), pattern.lower())


def _filter(slot: _Slot, request: Request, pool: Pool) -> str | None:
    """The first fixed filter a GPU fails for this request (the same for every request of its
    shape during one pass), or None."""
    gpu = slot.gpu
    if not _in_pool(pool, gpu, slot.node):
        return f"not in pool {pool.name}"
    if (request.node is not None and gpu.node != request.node) or (
        request.pinned is not None and gpu.index not in request.pinned
    ):
        return "excluded by spec.placement"
    if not slot.node.ready:
        return "on NotReady node(s)"
    if gpu.state is not None:
        return gpu.state.lower()
    if request.gpu_model and not _model_matches(gpu.model, request.gpu_model):
        return f"not model {request.gpu_model}"
    need, total = request.gpu_memory, gpu.memory_total
    if need and total is not None and total < need:
        return f"smaller than {quantity.format_bytes(need)}"
    return _busy(gpu, pool)


def _busy(gpu: GPU, pool: Pool) -> str | None:
    limit = pool.max_utilization_percent
    if limit is not None and gpu.utilization is not None and gpu.utilization > limit:
        return f"busier than pool {pool.name}'s {limit}% utilization limit"
    limit = pool.max_memory_used_percent
    used, total = gpu.memory_used, gpu.memory_total
    if limit is not None and used is not None and total and used * 100 > limit * total:
        return f"over pool {pool.name}'s {limit}% memory-used limit"
    return None


def _filter_node(n: Node, request: Request, pool: Pool) -> str | None:
    if pool.nodes is not None and n.name not in pool.nodes:
        return f"not in pool {pool.name}"
    if any(n.labels.get(k) != v for k, v in pool.node_labels):
        return f"not in pool {pool.name}"
    if request.node is not None and n.name != request.node:
        return "excluded by spec.placement"
    if not n.ready:
        return "NotReady"
    return None if n.state is None else n.state.lower()


def _ranked(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _describe(counts: Counter[str], fit: int, total: int, wanted: int) -> str:
    details = ", ".join(f"{n} {why}" for why, n in _ranked(counts))
    if total == 0:
        return "0/0 GPUs fit: no Ready node has reported a GPU"
    if fit:
        head = f"{fit}/{total} GPUs fit, but no node has {wanted} of them"
        return f"{head}: {details}" if details else head
    return f"0/{total} GPUs fit: {details}"
