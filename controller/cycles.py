"""The dependsOn cycle a pending Job is in, if any: read from the store, found by gctl.api.

A `Finder` serves one pass of the Job controller (`jobs.reconcile_many`): `finder.cycle(job)`
reads what the Job's dependsOn leads to, one query per step away from it for all the names at
that step not read yet in this pass (a name is a Job, else a Sweep, as
controller.sweeps.dependency looks it up), then asks `dependencies.cycle` for the shortest
cycle back to the Job. Only Jobs and Sweeps that still wait are followed, so the read stops at
what has succeeded or runs. The names read are kept for the pass: a chain of 1,000 pending
Jobs, each waiting on the one before, is read in about 1,000 queries, not 500,000 (one walk
per Job, each reading the whole chain above it, took 80 s in one transaction).
"""

import collections
from collections.abc import Iterable, Mapping

from gctl.api import dependencies, job, sweep
from gctl.store import store

_CHUNK = 500  # names per IN (...) query


class Finder:
    """Cycles among the stored Jobs and Sweeps, with what one pass has read kept."""

    def __init__(self, reader: store.Store) -> None:
        self._reader = reader
        self._graphs: dict[str, dict[str, dependencies.Waiter]] = {}  # namespace -> name
        self._unknown: dict[str, set[str]] = {}  # neither a Job nor a Sweep (yet)
        self._closed: dict[str, set[str]] = {}  # read, with all they lead to
        self._acyclic: dict[str, set[str]] = {}  # no cycle can be reached from them

    def cycle(self, j: job.Job) -> str | None:
        """`default/a -> default/b -> default/a` if `j` is on a dependsOn cycle, else None."""
        # A Sweep's Job: its Sweep waits for it, so a path back to the Sweep closes a cycle.
        refs = j.metadata.owner_references
        owner = next((r.name for r in refs if r.kind == sweep.Sweep.KIND and r.controller), None)
        read = self._graphs.setdefault(j.namespace, {})
        unknown = self._unknown.setdefault(j.namespace, set())
        closed = self._closed.setdefault(j.namespace, set())
        wanted = set(j.spec.depends_on)
        seen: set[str] = set()
        while wanted := wanted - seen - closed - unknown:
            seen |= wanted
            if missing := sorted(wanted - read.keys()):
                step = _read(self._reader, j.namespace, missing)
                read |= step
                unknown |= set(missing) - step.keys()
            waiting = [w for name in wanted if (w := read.get(name)) and w.waits]
            wanted = {need for w in waiting for need in w.needs}
        closed |= seen  # all they lead to is read: later Jobs of the pass need not walk them
        # The Job as this pass sees it: its dependsOn may be newer than a copy read above.
        graph = collections.ChainMap(
            {j.name: dependencies.Waiter(dependencies.JOB, tuple(j.spec.depends_on))}, read
        )
        acyclic = self._acyclic.setdefault(j.namespace, set())
        _classify(graph, j.spec.depends_on, acyclic)
        if all(need in acyclic for need in j.spec.depends_on):
            return None  # nothing it waits for leads to a cycle, so no cycle leads back to it
        path = dependencies.cycle(j.name, graph, owner)
        return None if path is None else dependencies.describe(j.namespace, path, graph)


def _classify(
    graph: Mapping[str, dependencies.Waiter], roots: Iterable[str], acyclic: set[str]
) -> None:
    """Add to `acyclic` every name reachable from `roots` from which no cycle can be reached
    (Tarjan's strongly connected components, iterative: each name is visited once a pass). A
    name that does not wait, or that is neither a Job nor a Sweep, leads nowhere."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def edges(name: str) -> list[str]:
        w = graph.get(name)
        return [] if w is None or not w.waits else list(w.needs)

    for root in roots:
        if root in acyclic or root in index:
            continue
        work = [(root, iter(edges(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            name, pending = work[-1]
            child = next(pending, None)
            if child is not None:
                if child in acyclic:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges(child))))
                elif child in on_stack:
                    low[name] = min(low[name], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[name])
            if low[name] != index[name]:
                continue
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            # One name that does not need itself, all it needs already found acyclic: acyclic.
            if (
                len(component) == 1
                and all(need in acyclic for need in edges(name) if need != name)
                and name not in edges(name)
            ):
                acyclic.add(name)


def _read(reader: store.Store, namespace: str, names: list[str]) -> dict[str, dependencies.Waiter]:
    found: dict[str, dependencies.Waiter] = {}
    for start in range(0, len(names), _CHUNK):
        chunk = names[start : start + _CHUNK]
        for wire in reader.list_wire(job.Job, namespace, names=chunk):
            found[wire["metadata"]["name"]] = dependencies.of_job(wire)
        # The stored form only: validating a Sweep expands all its points.
        if rest := [name for name in chunk if name not in found]:
            for wire in reader.list_wire(sweep.Sweep, namespace, names=rest):
                found[wire["metadata"]["name"]] = dependencies.of_sweep(wire)
    return found
