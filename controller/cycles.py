"""The dependsOn cycle a pending Job is in, if any: read from the store, found by gctl.api.

A `Finder` serves one pass of the Job controller (`jobs.reconcile_many`): `finder.cycle(job)`
reads what the Job's dependsOn leads to, one query per step away from it for all the names at
that step not read yet in this pass (a name is a Job, else a Sweep, as
controller.sweeps.dependency looks it up). A Job whose dependencies lead to no cycle
(`dependencies.leads_to_no_cycle`, which remembers for the pass what it cleared) is on none;
otherwise `dependencies.cycle` finds the shortest way back to the Job. Only Jobs and Sweeps
that still wait are followed, so the read stops at what has succeeded or runs. The names read
are kept for the pass: a chain of 1,000 pending Jobs, each waiting on the one before, is read
in about 1,000 queries, not 500,000 (one walk per Job, each reading the whole chain above it,
took 80 s in one transaction).
"""

import collections
from dataclasses import dataclass, field

from gctl.api import dependencies, job, sweep
from gctl.store import store

_CHUNK = 500  # names per IN (...) query


@dataclass
class _Read:
    """What a pass has read of one namespace's dependsOn."""

    graph: dict[str, dependencies.Waiter] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)  # neither a Job nor a Sweep (yet)
    closed: set[str] = field(default_factory=set)  # read, with all that they lead to
    acyclic: set[str] = field(default_factory=set)  # no cycle can be reached from them


class Finder:
    """Cycles among the stored Jobs and Sweeps, with what one pass has read kept."""

    def __init__(self, reader: store.Store) -> None:
        self._reader = reader
        self._namespaces: dict[str, _Read] = {}

    def cycle(self, j: job.Job) -> str | None:
        """`default/a -> default/b -> default/a` if `j` is on a dependsOn cycle, else None."""
        known = self._namespaces.setdefault(j.namespace, _Read())
        wanted = set(j.spec.depends_on)
        seen: set[str] = set()
        while wanted := wanted - seen - known.closed - known.unknown:
            seen |= wanted
            if missing := sorted(wanted - known.graph.keys()):
                step = _read(self._reader, j.namespace, missing)
                known.graph |= step
                known.unknown |= set(missing) - step.keys()
            waiting = [w for name in wanted if (w := known.graph.get(name)) and w.waits]
            wanted = {need for w in waiting for need in w.needs}
        known.closed |= seen  # all they lead to is read: later Jobs need not walk them again
        # The Job as this pass sees it: its dependsOn may be newer than a copy read above.
        graph = collections.ChainMap(
            {j.name: dependencies.Waiter(dependencies.JOB, tuple(j.spec.depends_on))},
            known.graph,
        )
        if dependencies.leads_to_no_cycle(graph, j.spec.depends_on, known.acyclic):
            return None  # nothing it waits for leads to a cycle, so none leads back to it
        # A Sweep's Job: its Sweep waits for it, so a path back to the Sweep closes a cycle.
        refs = j.metadata.owner_references
        owner = next((r.name for r in refs if r.kind == sweep.Sweep.KIND and r.controller), None)
        path = dependencies.cycle(j.name, graph, owner)
        return None if path is None else dependencies.describe(j.namespace, path, graph)


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
