"""Multi-node Jobs in a planning pass: a gang takes `nodes` distinct nodes at once, or none.

A multi-node Job (`nodes` > 1, whole GPUs on each) is a gang: in step 2 it takes `nodes`
distinct nodes at once, each the best left for it by its pool's policy (the GPUs on each chosen
as for one node: `capacity`'s `_member_option`), or none, and nothing is held by a try that
failed (`_fit_gang`, `_place_gang`). Steps 3 and 4 it takes together, over all its nodes at
once (`_wait_or_preempt_gang`): each node offers its GPUs free now, else free once attempts
already stopping there end, else (where its pool preempts) freed by stopping the fewest and
lowest attempts there, as for one node (`preemption.member`); the `nodes` cheapest (then by
name) are held for it and their victims stopped, if it waits for any of them. It is never bound
ahead (step 5: its members end at different times, so being a GPU's "next job" means nothing
for it). In step 6 it reserves the GPUs that free soonest on `nodes` distinct nodes and is
estimated to start when the last of them frees (`soonest_nodes`). A running gang is a victim
like any attempt: each member is one Allocation (stopping one stops the rest: `jobs`).

`GangPlanning` adds these steps to the GPUs' state with the attempts bound ahead (`ahead`);
`placement`'s planner is built on it, and takes them in turn for a multi-node Job in its place
in the queue, as it takes one node's steps for any other Job.
"""

import bisect
import functools
import heapq
from collections.abc import Iterable
from datetime import datetime

from controller import ahead, capacity, fitindex, preemption, snapshot


class GangPlanning(ahead.BindingAhead):
    """The GPUs during one pass, with the steps a multi-node request takes on them."""

    def __init__(
        self,
        world: snapshot.Snapshot,
        now: datetime,
        movable: Iterable[snapshot.Allocation] = (),
    ) -> None:
        super().__init__(world, now, movable)
        # ("gang-wait", shape, priorities below) -> node -> what it offers a multi-node
        # request in steps 3 and 4, as the node's entry in the index of that key was last
        # worked out
        self.gang_offers: dict[tuple[object, ...], dict[str, preemption.Member]] = {}

    # -- 2. fit --------------------------------------------------------------------------------

    def _fit_gang(
        self, request: snapshot.Request, pool: snapshot.Pool, static: snapshot.Static
    ) -> list[snapshot.Fit] | None:
        """A multi-node request's members: `request.nodes` distinct nodes, each with
        `request.gpus` GPUs it can take now, the best by its pool's policy as for one node
        (then those with mutual peers, then by name), or None: all or none. From its shape's
        index, as `_indexed_fit`: a gang holds no place yet (it is never bound ahead)."""

        def option(name: str, slots: list[snapshot.Slot]) -> fitindex.Option | None:
            return self._member_option(name, slots, request, pool)

        index = self.indexes.index(("gang", *request.shape), static.groups, option)
        best = self.indexes.firsts(index, request.nodes)
        if len(best) < request.nodes:
            return None
        return [snapshot.Fit(name, tuple(chosen)) for name, chosen in best]

    def _place_gang(
        self, request: snapshot.Request, members: list[snapshot.Fit]
    ) -> snapshot.Decision:
        """A multi-node request on every member's GPUs at once: rank 0 first."""
        ends = None if request.runtime is None else capacity.plus(self.now, request.runtime)
        ranks = []
        for member in members:
            for slot in member.slots:
                self._occupy(slot, 1.0, request.gpu_memory, ends)
                slot.placed.append(request)
            ranks.append((member.node, tuple(s.gpu.index for s in member.slots)))
        (node, gpus), *others = ranks
        return snapshot.Decision(
            request,
            placement=snapshot.Placement(request, node, gpus, 1.0, members=tuple(others)),
        )

    # -- 3. and 4. together --------------------------------------------------------------------

    def _wait_or_preempt_gang(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        static: snapshot.Static,
        shape: tuple[object, ...],
    ) -> snapshot.Waiting | None:
        """Steps 3 and 4 over a multi-node request's nodes at once: its `nodes` cheapest
        (`preemption.member`: free now, else once attempts already stopping end, else by
        stopping the fewest and lowest there), if it waits for any of them; their GPUs are
        held for it and their victims stopped. A shape that found too few nodes finds too few
        for the rest of the pass: capacity only shrinks, and an attempt stopped since was of
        lower priority than the Job that stopped it, so than the request that found too few
        (the queue goes by priority first): the GPUs it frees were offered to that one."""
        if shape in self.no_preemption:
            return None
        members = self._gang_members(request, pool, static, shape)
        if members is None:
            self.no_preemption.add(shape)
            return None
        chosen = preemption.GangChoice(tuple(members))
        if not chosen.waits():  # all free now: step 2 would have placed it
            return None
        victims = chosen.victims
        self.stopping.update(victims)
        held = self._reserve(request, pool, [s for m in members for s in m.slots], None)
        return snapshot.Waiting(chosen.message(), victims, held)

    def _gang_members(
        self,
        request: snapshot.Request,
        pool: snapshot.Pool,
        static: snapshot.Static,
        shape: tuple[object, ...],
    ) -> list[preemption.Member] | None:
        """The `nodes` cheapest nodes for a multi-node request's steps 3 and 4 (then by name),
        or None where fewer have anything to offer, from an index per shape and per set of
        attempts of lower priority, as `placement`'s `_victims` keeps for one node (1,000
        such requests over 500 busy nodes would look at every GPU for each)."""
        key = ("gang-wait", *shape, bisect.bisect_left(self.priorities, request.priority))
        offers = self.gang_offers.setdefault(key, {})

        def option(name: str, slots: list[snapshot.Slot]) -> fitindex.Option | None:
            found = preemption.member(
                name,
                slots,
                request,
                pool,
                fits=functools.partial(self._member_option, name, slots, request, pool),
                stopping=self.stopping,
                blocker=self._blocker,
                now=self.now,
            )
            if found is None:
                offers.pop(name, None)
                return None
            offers[name] = found[1]
            return found[0], list(found[1].slots)

        index = self.indexes.index(key, static.groups, option)
        best = self.indexes.firsts(index, request.nodes)
        if len(best) < request.nodes:
            return None
        return [offers[name] for name, _ in best]


# -- 6. reserve ---------------------------------------------------------------------------------


def soonest_nodes(
    options: list[tuple[tuple[datetime, int, str], list[snapshot.Slot]]], count: int
) -> tuple[datetime | None, list[snapshot.Slot]] | None:
    """A multi-node request's place on the timeline: the `count` nodes whose GPUs free soonest
    (then the most already free, then by name); it starts when the last of them frees."""
    if len(options) < count:
        return None
    chosen = heapq.nsmallest(count, options, key=lambda o: o[0])
    start = max(key[0] for key, _ in chosen)
    slots = [slot for _, member in chosen for slot in member]
    return (None if start == capacity.NEVER else start), slots
