"""Step 4 of a planning pass, preemption: which lower-priority attempts to stop for a Job.

A Job that fits nowhere, not even once the attempts already stopping have ended, may stop
preemptible attempts of lower priority: on one node, the GPUs whose victims together are the
fewest, then the lowest, then the most recently started. Pure, like the rest of the planner:
it reads the pass's slots and returns the choice; `placement` holds the GPUs and stops them.

A multi-node Job takes steps 3 and 4 together, over its nodes at once (`member`): each node
offers it its GPUs free now, else free once attempts already stopping end, else freed by
stopping attempts there as for one node; `gangs` takes the `nodes` cheapest
(`GangChoice`). Each member of a running multi-node Job may be a victim, as an attempt of its
own (stopping one stops the rest: the Job lifecycle's).
"""

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller import fitindex, snapshot
from gctl.api import binding

# The planner's check of a GPU: why it cannot take the request now, with the given attempts
# gone, or None.
Blocker = Callable[
    [snapshot.Slot, snapshot.Request, snapshot.Pool, set[snapshot.Allocation]], str | None
]


@dataclass(frozen=True)
class Choice:
    """The node, its GPUs to hold, and the attempts to stop there (by namespace and Job)."""

    node: str
    slots: list[snapshot.Slot]
    victims: tuple[snapshot.Allocation, ...]

    def message(self) -> str:
        names = ", ".join(f"{a.namespace}/{a.job}" for a in self.victims)
        return f"preempting {len(self.victims)} lower-priority job(s) on {self.node}: {names}"


def evictable(
    allocation: snapshot.Allocation,
    request: snapshot.Request,
    stopping: Collection[snapshot.Allocation],
) -> bool:
    return (
        allocation.preemptible
        and allocation.priority < request.priority
        and allocation not in stopping
    )


def choose(
    request: snapshot.Request,
    pool: snapshot.Pool,
    static: snapshot.Static,
    *,
    stopping: set[snapshot.Allocation],
    blocker: Blocker,
    now: datetime,
) -> Choice | None:
    """The cheapest node to preempt on for `request`, or None when no stop lets it in."""
    if not any(evictable(a, request, stopping) for s in static.slots for a in s.allocations):
        return None
    options = [
        (found.key, name, found)
        for name, slots in static.groups
        if (
            found := on_node(
                name, slots, request, pool, stopping=stopping, blocker=blocker, now=now
            )
        )
        is not None
    ]
    if not options:
        return None
    return min(options, key=lambda o: (o[0], o[1]))[2].choice


@dataclass(frozen=True)
class NodeOption:
    """What preempting on one node offers a request: how good it is (lower is better: fewest
    victims, then lowest, then most recently started) and the choice itself."""

    key: tuple[int, int, int, float]
    choice: Choice


def on_node(
    name: str,
    slots: list[snapshot.Slot],
    request: snapshot.Request,
    pool: snapshot.Pool,
    *,
    stopping: set[snapshot.Allocation],
    blocker: Blocker,
    now: datetime,
) -> NodeOption | None:
    """The cheapest preemption for `request` on one node's GPUs, or None when none lets it in
    there."""
    costs = [
        (s, v)
        for s in slots
        if (v := _victims_for(s, request, pool, stopping=stopping, blocker=blocker, now=now))
        is not None
    ]
    if len(costs) < max(1, int(request.gpus)):
        return None
    chosen, victims = _cheapest(costs, max(1, int(request.gpus)), now)
    if not victims:
        return None
    ordered = sorted(victims, key=lambda a: (a.namespace, a.job))
    return NodeOption(_victim_key(victims, now), Choice(name, chosen, tuple(ordered)))


def _victim_key(
    victims: Iterable[snapshot.Allocation], now: datetime
) -> tuple[int, int, int, float]:
    """Fewest, then lowest priority, then most recently started."""
    chosen = list(victims)
    if not chosen:
        return (0, 0, 0, 0.0)
    priorities = [a.priority for a in chosen]
    oldest = min((a.started or now) for a in chosen)
    return (len(chosen), max(priorities), sum(priorities), -oldest.timestamp())


def _victims_for(
    slot: snapshot.Slot,
    request: snapshot.Request,
    pool: snapshot.Pool,
    *,
    stopping: set[snapshot.Allocation],
    blocker: Blocker,
    now: datetime,
) -> list[snapshot.Allocation] | None:
    """The fewest, lowest attempts on this GPU whose stop lets the request in, or None."""
    removed = {a for a in slot.allocations if a in stopping}  # all the blocker looks at
    candidates = sorted(
        (a for a in slot.allocations if evictable(a, request, stopping)),
        key=lambda a: (a.priority, -(a.started or now).timestamp(), a.binding),
    )
    chosen: list[snapshot.Allocation] = []
    while blocker(slot, request, pool, removed) is not None:
        if not candidates:
            return None
        victim = candidates.pop(0)
        chosen.append(victim)
        removed.add(victim)
    return chosen


def _cheapest(
    costs: list[tuple[snapshot.Slot, list[snapshot.Allocation]]], wanted: int, now: datetime
) -> tuple[list[snapshot.Slot], set[snapshot.Allocation]]:
    """`wanted` GPUs of one node whose victims together are fewest and lowest (greedy)."""
    chosen: list[snapshot.Slot] = []
    victims: set[snapshot.Allocation] = set()
    left = list(costs)
    while len(chosen) < wanted:
        slot, cost = min(
            left, key=lambda c: (_victim_key(victims | set(c[1]), now), c[0].gpu.index)
        )
        left = [c for c in left if c[0] is not slot]
        chosen.append(slot)
        victims |= set(cost)
    return chosen, victims


# -- a multi-node request: steps 3 and 4 over its nodes at once ---------------------------------

# The planner's check of a node for one member of a multi-node request: with the given attempts
# gone, how good a place it is and the GPUs it takes there, or None.
MemberFit = Callable[
    [frozenset[snapshot.Allocation] | set[snapshot.Allocation]], fitindex.Option | None
]


@dataclass(frozen=True)
class Member:
    """One node a multi-node request waits for: the GPUs held there for it, the attempts to
    stop on them, and those already stopping there that it waits for."""

    node: str
    slots: tuple[snapshot.Slot, ...]
    victims: tuple[snapshot.Allocation, ...] = ()
    stopping: frozenset[snapshot.Allocation] = frozenset()


def member(
    name: str,
    slots: list[snapshot.Slot],
    request: snapshot.Request,
    pool: snapshot.Pool,
    *,
    fits: MemberFit,
    stopping: set[snapshot.Allocation],
    blocker: Blocker,
    now: datetime,
) -> tuple[tuple[Any, ...], Member] | None:
    """What one node offers a multi-node request that fits on too few nodes now, and how cheap
    it is (lower is better): its GPUs free now (0), else free once the attempts already
    stopping there end (1), each then as good a place as its pool's policy says; else, where
    its pool preempts, freed by stopping attempts there (2, then as `on_node`: fewest, lowest,
    most recently started). None: none of these."""
    found = fits(frozenset())
    if found is not None:
        return (0, *found[0]), Member(name, tuple(found[1]))
    if stopping and (found := fits(stopping)) is not None:
        waited = frozenset(a for s in found[1] for a in s.allocations if a in stopping)
        return (1, *found[0]), Member(name, tuple(found[1]), stopping=waited)
    if not pool.preemption:
        return None
    offered = on_node(name, slots, request, pool, stopping=stopping, blocker=blocker, now=now)
    if offered is None:
        return None
    chosen = offered.choice
    return (2, *offered.key), Member(name, tuple(chosen.slots), chosen.victims)


@dataclass(frozen=True)
class GangChoice:
    """The nodes a multi-node request waits for, one member each."""

    members: tuple[Member, ...]

    @property
    def victims(self) -> tuple[snapshot.Allocation, ...]:
        return tuple(v for m in self.members for v in m.victims)

    def waits(self) -> bool:
        """Whether it waits for anything: an attempt to stop, or one already stopping (else
        every member is free now, and it would have been placed)."""
        return any(m.victims or m.stopping for m in self.members)

    def message(self) -> str:
        """As for one node (`Choice.message`, `placement`'s wait for stopping attempts), naming
        the nodes and counting Jobs (two members of one Job are one Job)."""
        if victims := self.victims:
            nodes = ", ".join(sorted(m.node for m in self.members if m.victims))
            names = sorted({f"{a.namespace}/{a.job}" for a in victims})
            return f"preempting {len(names)} lower-priority job(s) on {nodes}: {', '.join(names)}"
        stopping = {a for m in self.members for a in m.stopping}
        preempted = all(a.stopping == binding.STOP_PREEMPTED for a in stopping)
        what = "preempted job(s)" if preempted else "job(s)"
        count = len({(a.namespace, a.job) for a in stopping})
        nodes = ", ".join(sorted(m.node for m in self.members if m.stopping))
        return f"waiting for {count} {what} to stop on {nodes} (GPUs held for this Job)"
