"""Where Jobs fit: one pure planning pass over a snapshot, so tests drive it with plain objects.

`plan(snapshot, requests, now)` walks the pools' queues in order (each pool's by priority, then,
in a `LongestFirst` pool, the longest time limit, then submission time, then name:
`snapshot.queue_key`; the pools' together by their first Jobs' priority, then age:
`depth.Ordered`) and decides each request in numbered steps:

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

A multi-node Job (`nodes` > 1, whole GPUs on each) is a gang: it takes `nodes` distinct
nodes at once or none, in step 2 and in steps 3 and 4 taken together; it is never bound ahead
(step 5); in step 6 it reserves on `nodes` nodes and starts when the last of them frees
(`gangs` says how).

A Job bound ahead in an earlier pass is decided again, in its place in the queue, until its
agent takes it: it stays where it is while it may (it starts now if its GPUs have freed, and
no other Job is placed on them meanwhile); it moves to GPUs that are free now, or that a Job
ahead of it in the queue did not take; else it goes back to waiting.

A Job left waiting gets a reason, a message shaped like kube-scheduler's ("0/8 GPUs fit:
6 lack 40Gi free, 2 cordoned"), its place in its pool's queue and, where end times are known,
an estimated start. Capacity only shrinks while a pass runs, so a request shape that failed a
step fails it for every later request of that shape: the pass stays fast with 10,000 queued.

The planner's values (Snapshot, Request, Decision ...) live in `snapshot` and are offered here.
The planner is built in layers, each over the state it handles: the GPUs as the pass changes
them, with steps 1 and 2, are `capacity`'s (its fit indexes `fitindex`'s); the attempts bound
ahead, with step 5, are `ahead`'s; a multi-node Job's steps are `gangs`'s; the queue, with
steps 3, 4 and 6 and the order of the steps, is here; how far down the queue a pass decides
is `depth`'s. Step 4's choice of victims (and what each node offers a gang in steps 3 and 4)
is `preemption`'s, and the checks and messages are `diagnosis`'s.
"""

import bisect
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from controller import capacity, depth, diagnosis, fitindex, gangs, preemption, snapshot
from gctl.api import binding, job

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

# The head of a pool's queue: Jobs at these positions get exact messages and, where it can be
# told, an estimated start (each takes its place on a simulated timeline of the GPUs). Further
# back, estimates are left out and messages are worked out once per request shape and pass.
QUEUE_HEAD = 100


def plan(
    snapshot: Snapshot,
    requests: Iterable[Request] | depth.Ordered,
    now: datetime,
    max_placements: int | None = None,
    *,
    starts_only: bool = False,
    head: int | None = None,
) -> Plan:
    """Decide every request, in queue order (`depth.Ordered`; given as one, as it is); stop
    after `max_placements` placements; with `starts_only`, once a Job starts and no later
    request could start now (`depth.Rest`); with `head`, once `head` requests are decided and
    no later one could change anything but what it is told (`depth.Tail`)."""
    ordered = requests if isinstance(requests, depth.Ordered) else depth.Ordered.of(requests)
    planner = _Planner(snapshot, now, ordered.movable())
    rest = depth.Rest(ordered) if starts_only or head is not None else None
    tail = depth.Tail(ordered) if head is not None and len(ordered) > head else None
    decisions: list[Decision] = []
    placed = 0
    starting = False
    for i, request in enumerate(ordered):
        if max_placements is not None and placed >= max_placements:
            return Plan(decisions, complete=False)
        if rest and planner.full() and rest.none_may_start(request, planner.priorities):
            if starting and starts_only:
                return Plan(decisions, undecided=len(ordered) - i)
            if tail and i >= (head or 0) and tail.settled(planner.exhausted):
                return Plan(decisions, untold=len(ordered) - i)
        if rest:
            rest.take(request)
        if tail:
            tail.take(request)
        decision = planner.decide(request)
        placed += changes(decision)
        starting = starting or (_starts(decision) and changes(decision))
        decisions.append(decision)
    return Plan(decisions)


def _starts(decision: Decision) -> bool:
    """It starts now. A Job bound ahead that starts where it was bound writes nothing (its
    agent starts it): `plan` counts only the starts that write a Binding, as `writing`
    does, so that a pass whose only start is that one decides every request."""
    return decision.placement is not None and not decision.placement.after


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


class _Planner(gangs.GangPlanning):
    """One pass: each request decided in queue order, over the GPUs' state it changes."""

    def __init__(self, world: Snapshot, now: datetime, movable: Iterable[Allocation] = ()) -> None:
        super().__init__(world, now, movable)
        self.pools = dict(world.pools)  # the default pool is added when first asked for
        self.invalid_pools = world.invalid_pools
        # ("preempt", shape, priorities below) -> node -> what preempting there offers, as the
        # node's entry in the index of that key was last worked out
        self.preemptions: dict[tuple[object, ...], dict[str, preemption.NodeOption]] = {}
        # More of what this pass learnt about request shapes (`capacity` keeps steps 1 to 4's).
        self.no_ahead: dict[tuple[object, ...], int] = {}  # shape -> version it found none at
        self.unknown_start: set[tuple[object, ...]] = set()
        # shape -> version at which its pool's first blocked Job found no GPUs to reserve
        self.no_reservation: dict[tuple[object, ...], int] = {}
        self.messages: dict[tuple[object, ...], str] = {}
        self.positions: Counter[str] = Counter()
        self.reserved_pools: set[str] = set()

    def exhausted(self, request: Request, shape: tuple[object, ...]) -> bool:
        """Whether a request of this shape would find nothing but waiting, told why, where no
        GPU has room and it could preempt no attempt (`depth.Tail`): it can bind ahead nowhere and
        wait for no attempt stopping, as one of its shape found since capacity last changed.
        A pool that is missing, or refuses a fraction asked for, only tells it why."""
        pool = self._pool(request)
        if isinstance(pool, Decision):
            return True
        if request.nodes > 1:  # steps 3 and 4 together; never bound ahead
            return not self.stopping or shape in self.no_preemption
        if self.stopping and shape not in self.no_wait:
            return False
        return not pool.bind_ahead or request.gpus < 1 or self.no_ahead.get(shape) == self.version

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
        shape = request.shape
        static = self._static(request, pool)
        if request.nodes > 1:
            return self._decide_gang(request, pool, static, shape)
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
            bound = self._ahead(request, pool, static, own_only=False)
            if bound is not None:
                return bound
            self.no_ahead[shape] = self.version
        self._release(request)
        return self._waits(request, pool, static, shape, waiting)

    def _decide_gang(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> Decision:
        """A multi-node request (`gangs`): all its nodes now (2. fit), else all of them once
        attempts stopping, or stopped for it, end (3. and 4. together), else it waits,
        reserving as the first blocked Job of its pool does (6.); it skips step 5."""
        self._release(request)  # never bound ahead: an attempt stored so gives its place up
        if shape not in self.no_fit:  # 2. fit
            found = self._fit_gang(request, pool, static)
            if found is not None:
                return self._place_gang(request, found)
            self.no_fit.add(shape)
        waiting = self._wait_or_preempt_gang(request, pool, static, shape)  # 3. and 4.
        return self._waits(request, pool, static, shape, waiting)

    def _waits(
        self,
        request: Request,
        pool: Pool,
        static: snapshot.Static,
        shape: tuple[object, ...],
        waiting: snapshot.Waiting | None,
    ) -> Decision:
        """The request waits, at its place in its pool's queue: for the GPUs held for it
        (`waiting`: steps 3 and 4), else as step 6 says, told why."""
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
            if (invalid := self.invalid_pools.get(request.pool)) is not None:
                message = (
                    f'GPUPool "{request.pool}" as stored does not validate ({invalid}): fix '
                    "or delete its row in the database"
                )
            return Decision(request, reason=job.REASON_POOL_NOT_FOUND, message=message)
        if 0 < request.gpus < 1 and not found.allow_fractions:
            message = (
                f"pool {found.name} does not allow fractional GPUs: ask for whole GPUs or use "
                "another pool"
            )
            return Decision(request, reason=job.REASON_UNSCHEDULABLE, message=message)
        return found

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

    # -- 4. preempt ----------------------------------------------------------------------------

    def _preempt(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> snapshot.Waiting | None:
        if shape in self.no_preemption:
            return None
        chosen = self._victims(request, pool, static, shape)
        if chosen is None:
            self.no_preemption.add(shape)
            return None
        self.stopping.update(chosen.victims)
        held = self._reserve(request, pool, chosen.slots, None)
        return snapshot.Waiting(chosen.message(), chosen.victims, held)

    def _victims(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> preemption.Choice | None:
        """`preemption.choose`, for a request that holds no place yet, from an index of what
        preempting on each node offers its shape and the attempts of lower priority than its
        own (which priorities of attempts are below it): a node is looked at again only
        after its GPUs changed (1,000 Jobs of higher priority over 1,000 busy GPUs looked at
        every GPU for each, and a pass took 5 s; over 2,000 GPUs, 27 s)."""
        if request.queued is not None:  # its own place is where it may not preempt
            return preemption.choose(
                request, pool, static, stopping=self.stopping, blocker=self._blocker, now=self.now
            )
        # Requests whose priorities have the same attempts below them choose alike.
        below = bisect.bisect_left(self.priorities, request.priority)
        key = ("preempt", *shape, below)
        offers = self.preemptions.setdefault(key, {})

        def option(name: str, slots: list[snapshot.Slot]) -> fitindex.Option | None:
            found = preemption.on_node(
                name,
                slots,
                request,
                pool,
                stopping=self.stopping,
                blocker=self._blocker,
                now=self.now,
            )
            if found is None:
                offers.pop(name, None)
                return None
            offers[name] = found
            return found.key, found.choice.slots

        best = self.indexes.top(self.indexes.index(key, static.groups, option))
        return None if best is None else offers[best].choice

    # -- 6. reserve, estimate and explain --------------------------------------------------------

    def _estimate(
        self, request: Request, pool: Pool, static: snapshot.Static, shape: tuple[object, ...]
    ) -> tuple[datetime | None, tuple[tuple[str, int], ...]]:
        """Take the request's place on the simulated timeline: the GPUs that free soonest (then
        the most already free). The pool's first blocked Job also reserves them; where it can
        reserve none (another pool's Job holds them), its place is only estimated. Returns the
        estimated start, if known, and the GPUs reserved."""
        first = pool.name not in self.reserved_pools
        deep = self.positions[pool.name] > QUEUE_HEAD or shape in self.unknown_start
        if not first and deep:
            return None, ()
        wanted = max(1, int(request.gpus))
        found = self._soonest_to_reserve(request, static, wanted, shape) if first else None
        reserving = found is not None
        if found is None and not deep:
            found = self._soonest(request, static, wanted, reserving=False)
        if found is None:
            return None, ()
        start, slots = found
        held: tuple[tuple[str, int], ...] = ()
        if reserving:
            self.reserved_pools.add(pool.name)
            held = self._reserve(request, pool, slots, start)
        if start is None:
            self.unknown_start.add(shape)
            return None, held
        ends = None if request.runtime is None else capacity.plus(start, request.runtime)
        for slot in slots:
            slot.free_at = capacity.later(slot.free_at, ends) if ends else None
            self.indexes.touch(slot.gpu.node)
        return (start if start > self.now else None), held

    def _soonest_to_reserve(
        self, request: Request, static: snapshot.Static, wanted: int, shape: tuple[object, ...]
    ) -> tuple[datetime | None, list[snapshot.Slot]] | None:
        """`_soonest` for the pool's first blocked Job, which reserves what it finds. While none
        is found, every Job after it in the pool is the first in turn: a shape that found none
        finds none until the GPUs' state changes (with every GPU busy and its next job bound
        ahead, the 500 Jobs of a queue each looked at every GPU, every pass)."""
        if self.no_reservation.get(shape) == self.version:
            return None
        found = self._soonest(request, static, wanted, reserving=True)
        if found is None:
            self.no_reservation[shape] = self.version
        return found

    def _soonest(
        self, request: Request, static: snapshot.Static, wanted: int, *, reserving: bool
    ) -> tuple[datetime | None, list[snapshot.Slot]] | None:
        """The `wanted` GPUs of one node that free soonest on the simulated timeline, then
        those most already free (a multi-node request: on each of its nodes,
        `gangs.soonest_nodes`); a reservation takes no GPU another Job holds, nor one that
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
                    and not capacity.queued_for_another(s, request)
                ]
            if len(slots) < wanted:
                continue
            if wanted == 1:
                chosen = [min(slots, key=_free_soonest)]
            else:
                chosen = sorted(slots, key=_free_soonest)[:wanted]
            start = chosen[-1].free_at or capacity.NEVER
            already = sum(1 for s in chosen if s.jobs == 0)
            options.append(((start, -already, name), chosen))
        if not options:
            return None
        if request.nodes > 1:
            return gangs.soonest_nodes(options, request.nodes)
        (start, _, _), chosen = min(options, key=lambda o: o[0])
        return (None if start == capacity.NEVER else start), chosen

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


def _free_soonest(slot: snapshot.Slot) -> tuple[datetime, int, int]:
    return (slot.free_at or capacity.NEVER, slot.jobs, slot.gpu.index)
