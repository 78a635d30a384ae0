"""dependsOn as a graph: what each Job or Sweep waits for, and the cycle a Job is caught in.

A name in `dependsOn` is a Job of that name, else a Sweep, in the same namespace. A Sweep waits
for its Jobs and they wait for what the Sweep and its template name, so here a Sweep needs what
its Jobs need. Jobs on a cycle wait for each other for ever; no one of them can start.

Pure: `gctl apply` looks for cycles among the objects of one apply (gctl.api.manifest), the Job
controller for the one a pending Job is in among the stored objects (controller.cycles).
Plain data, no pydantic: apply's fast path loads no more than it needs.
"""

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gctl.api import kinds

JOB, SWEEP = kinds.JOB.kind, kinds.SWEEP.kind


@dataclass(frozen=True)
class Waiter:
    """A Job or Sweep as the search for cycles sees it."""

    kind: str  # JOB or SWEEP
    needs: tuple[str, ...] = ()  # the names it waits for
    # Whether it may still be held up by what it needs: not succeeded, and not running.
    # A failed one stays in, so that each Job of a cycle is told of the cycle, not only of
    # the one that the controller happened to fail first.
    waits: bool = True


def of_job(wire: Mapping[str, Any]) -> Waiter:
    """A stored Job: it waits while Pending; a Failed one stays in (see `Waiter.waits`)."""
    phase = wire["status"].get("phase", "Pending")
    return Waiter(JOB, tuple(wire["spec"].get("dependsOn", [])), phase in ("Pending", "Failed"))


def of_sweep(wire: Mapping[str, Any]) -> Waiter:
    """A stored Sweep, with what its Jobs need. It waits until it has `succeeded`."""
    spec = wire["spec"]
    template = spec.get("template", {}).get("spec", {})
    needs = dict.fromkeys([*template.get("dependsOn", []), *spec.get("dependsOn", [])])
    return Waiter(SWEEP, tuple(needs), not succeeded(wire))


def succeeded(wire: Mapping[str, Any]) -> bool:
    """Whether a stored Job or Sweep counts as succeeded for what depends on it: a Job once
    Succeeded; a Sweep once Succeeded for its current generation (a Sweep changed since its
    status was written may have new points), as controller.sweeps.dependency counts it."""
    status = wire["status"]
    if status.get("phase") != "Succeeded":
        return False
    if wire.get("kind", JOB) != SWEEP:
        return True
    return bool(status.get("observedGeneration") == wire["metadata"].get("generation"))


def cycle(start: str, graph: Mapping[str, Waiter], owner: str | None = None) -> list[str] | None:
    """The shortest cycle through the Job `start`, as names from it back to it; None if it is
    on none. Only Jobs and Sweeps that wait are followed (a name not in `graph` is followed
    by no one). `owner` is the Sweep that owns `start`, if any: it waits for `start`, so a
    path that reaches it closes the cycle."""
    if start not in graph:
        return None
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        name = queue.popleft()
        for need in graph[name].needs:
            closes = need == start or (
                need == owner and (found := graph.get(need)) is not None and found.kind == SWEEP
            )
            if closes:
                path = [need, name]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                return path if need == start else [*path, start]
            if need not in came_from and need != start and _followed(graph.get(need)):
                came_from[need] = name
                queue.append(need)
    return None


def cycle_in(graph: Mapping[str, Waiter], order: Sequence[str]) -> list[str] | None:
    """A cycle of `graph`, looked for from the names of `order` in turn, as names from the
    first of it in `order` back to that one; None if there is none. One depth-first walk:
    linear in the graph."""
    found = _any_cycle(graph, order)
    if found is None:
        return None
    place = {name: i for i, name in enumerate(order)}
    ring = found[:-1]
    first = min(range(len(ring)), key=lambda i: place.get(ring[i], len(place)))
    ring = ring[first:] + ring[:first]
    return [*ring, ring[0]]


def leads_to_no_cycle(graph: Mapping[str, Waiter], names: Iterable[str], done: set[str]) -> bool:
    """Whether no cycle can be reached from any of `names`. `done` gathers the names known to
    lead to none, so that calls over one graph walk each name once between them."""
    names = list(names)
    _any_cycle(graph, names, done)
    return all(name in done or not _followed(graph.get(name)) for name in names)


def _any_cycle(
    graph: Mapping[str, Waiter], order: Iterable[str], done: set[str] | None = None
) -> list[str] | None:
    """The first cycle a depth-first walk from `order` meets; `done` gathers the names it
    finished, from which no cycle can be reached."""
    done = set() if done is None else done
    for root in order:
        if root in done or not _followed(graph.get(root)):
            continue
        path, at = [root], {root: 0}  # the walk's current path, and where each name is on it
        nexts = [iter(graph[root].needs)]
        while nexts:
            need = next(nexts[-1], None)
            if need is None:  # all it needs is explored: no cycle goes through it
                finished = path.pop()
                del at[finished]
                done.add(finished)
                nexts.pop()
            elif need in at:
                return [*path[at[need] :], need]
            elif need not in done and _followed(graph.get(need)):
                at[need] = len(path)
                path.append(need)
                nexts.append(iter(graph[need].needs))
    return None


def _followed(waiter: Waiter | None) -> bool:
    return waiter is not None and waiter.waits


def describe(namespace: str, path: list[str], graph: Mapping[str, Waiter]) -> str:
    """`default/a -> sweep default/grid -> default/a`."""
    return " -> ".join(
        f"sweep {namespace}/{name}"
        if (found := graph.get(name)) is not None and found.kind == SWEEP
        else f"{namespace}/{name}"
        for name in path
    )
