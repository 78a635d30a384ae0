"""Step 5 of a planning pass, binding ahead: a Job that cannot start now becomes the next job of
busy GPUs, and their agent starts it the moment their jobs end, with no round trip through the
controller.

Where its pool allows it, a Job that needs whole GPUs is bound to the busy whole GPUs that free
soonest, queued behind the jobs on them (one job ahead per GPU): its own place first, then places
nobody holds, then those of Jobs later in the queue, taken from the last such Job, so that one
Job waits again rather than every Job bound ahead moving one place along. A multi-node Job is
never bound ahead (`gangs`); a Job may be bound ahead behind one member of it.

A Job bound ahead in an earlier pass is decided again, in its place in the queue, until its agent
takes it: it starts now if its GPUs have freed and still suit it (`_own_free`), stays where it
is while it may, or gives its place up (`_release`). `BindingAhead` adds those attempts, in
queue order, to the GPUs' state (`capacity`); the multi-node layer (`gangs`), and `placement`'s
planner over that, are built on it.
"""

from collections.abc import Iterable
from datetime import datetime

from controller import capacity, fitindex, snapshot


class BindingAhead(capacity.Capacity):
    """The GPUs during one pass, with the attempts bound ahead that it decides again."""

    def __init__(
        self,
        world: snapshot.Snapshot,
        now: datetime,
        movable: Iterable[snapshot.Allocation] = (),
    ) -> None:
        super().__init__(world, now)
        queue = list(movable)  # attempts bound ahead that this pass decides again, in order
        self.movable = frozenset(queue)
        self.rank = {a: i for i, a in enumerate(queue)}  # how far back in the queue each is

    def _own_free(
        self, request: snapshot.Request, pool: snapshot.Pool, static: snapshot.Static
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

    def _release(self, request: snapshot.Request) -> None:
        """A Job bound ahead moves or goes back to waiting: its GPUs' next place is free."""
        if request.queued is None:
            return
        for slot in self._places_of(request.queued):
            slot.queued = None
            self.indexes.touch(slot.gpu.node)
            self.version += 1
            self.blocking += _open(slot)

    def _places_of(self, queued: snapshot.Allocation) -> list[snapshot.Slot]:
        """The GPUs whose next job the attempt bound ahead still is."""
        return [s for s in self.places.get(queued, []) if s.queued is queued]

    def _queueable(self, slot: snapshot.Slot, request: snapshot.Request, own_only: bool) -> bool:
        """Whether the request may be bound ahead to this GPU, which its caller found no
        request's next place in this pass and not reserved for another Job (`_ahead_option`):
        busy with one job that holds all of it, and nobody's next place yet (a place held by a
        Job later in the queue is taken from it)."""
        own = capacity.own_place(slot, request)
        if own and slot.jobs == 0:
            return True  # its job ended: still its place, while its other GPUs are busy
        if slot.jobs != 1 or slot.share < 1 - capacity.EPSILON:
            return False
        if own_only:
            return own
        return slot.queued is None or own or slot.queued in self.movable

    def _ahead(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        static: snapshot.Static,
        *,
        own_only: bool,
    ) -> snapshot.Decision | None:
        """5. Bind the request to the busy whole GPUs that free soonest, as their next job:
        its own place first, then places nobody holds, then those of Jobs behind it."""
        if not pool.bind_ahead or request.gpus < 1:
            return None
        wanted = int(request.gpus)
        if request.queued is None:

            def option(name: str, takeable: list[snapshot.Slot]) -> fitindex.Option | None:
                return self._ahead_option(takeable, request, wanted, own_only=False)

            index = self.indexes.index(("ahead", *request.shape), static.takeable, option)
            best = next(self.indexes.best(index, []), None)
            return None if best is None else self._queue(request, best[0], best[1])
        options = []
        groups = static.takeable
        if own_only:  # only its own place: the GPUs it is bound ahead to
            own = self._places_of(request.queued)
            own = [
                s
                for s in own
                if snapshot.at(s) in static.members and capacity.could_take(s, request)
            ]
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
        self,
        takeable: list[snapshot.Slot],
        request: snapshot.Request,
        wanted: int,
        *,
        own_only: bool,
    ) -> fitindex.Option | None:
        """The node's GPUs that free soonest and may take the request as their next job, and
        how good a place they are (lower is better), if there are `wanted` of them."""
        # The two tests first that every GPU may fail, inline: in a pass that preempts, every
        # GPU may be reserved for a preemptor, and each Job it moves looks at them all.
        usable = [
            s
            for s in takeable
            if s.next is None
            and (s.reserved is None or s.reserved.holder is request)
            and self._queueable(s, request, own_only)
        ]
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
        self, slot: snapshot.Slot, request: snapshot.Request
    ) -> tuple[int, int, datetime, int, int]:
        """Its own place first, then places nobody holds, then those of Jobs behind it; the
        GPU that frees soonest, then the place of the Job furthest back in the queue: that
        Job finds no place behind it and waits again, where taking the place of the next Job
        would send it to take the place of the one after it, and so on down the queue."""
        own = capacity.own_place(slot, request)
        holder = None if own else slot.queued  # the Job behind it whose place this is, if any
        later = 0 if holder is None else -self.rank.get(holder, 0)
        return (
            0 if own else 1,
            int(holder is not None),
            slot.free_at or capacity.NEVER,
            later,
            slot.gpu.index,
        )

    def _queue(
        self, request: snapshot.Request, node: str, chosen: list[snapshot.Slot]
    ) -> snapshot.Decision:
        self._release(request)
        after: list[snapshot.Allocation | snapshot.Request] = []
        frees = [slot.free_at for slot in chosen]
        start = None if None in frees else max(f for f in frees if f is not None)
        ends = (
            None
            if start is None or request.runtime is None
            else capacity.plus(start, request.runtime)
        )
        for slot in chosen:
            after.extend(a for a in slot.allocations if a not in after)
            after.extend(r for r in slot.placed if r not in after)
            slot.queued = None  # a Job behind this one that was next here must move
            slot.next = request
            self.indexes.touch(slot.gpu.node)
            slot.free_at = ends
            self.blocking += _open(slot)
        self.version += 1
        indices = tuple(sorted(s.gpu.index for s in chosen))
        return snapshot.Decision(
            request,
            placement=snapshot.Placement(request, node, indices, 1.0, after=tuple(after)),
        )


def _open(slot: snapshot.Slot) -> bool:
    """Whether a request's `_blocker` may look at who is next on the GPU: it is not full with
    one whole job, which every request is told first."""
    return slot.jobs == 0 or slot.share < 1 - capacity.EPSILON
