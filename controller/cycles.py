"""The dependsOn cycle a pending Job is in, if any: read from the store, found by gctl.api.

`cycle(store, job)` reads what the Job's dependsOn leads to, one query per step away from it
for all the names at that step (a name is a Job, else a Sweep, as controller.sweeps.dependency
looks it up), then asks `dependencies.cycle` for the shortest cycle back to the Job. Only Jobs
and Sweeps that still wait are followed, so the read stops at what has succeeded or runs.
"""

from gctl.api import dependencies, job, sweep
from gctl.store import store

_CHUNK = 500  # names per IN (...) query


def cycle(reader: store.Store, j: job.Job) -> str | None:
    """`default/a -> default/b -> default/a` if `j` is on a dependsOn cycle, else None."""
    # A Sweep's Job: its Sweep waits for it, so a path back to the Sweep closes a cycle too.
    refs = j.metadata.owner_references
    owner = next((r.name for r in refs if r.kind == sweep.Sweep.KIND and r.controller), None)
    graph = {j.name: dependencies.Waiter(dependencies.JOB, tuple(j.spec.depends_on))}
    unknown: set[str] = set()  # names that are neither a Job nor a Sweep (yet)
    wanted = set(j.spec.depends_on)
    while wanted := wanted - graph.keys() - unknown:
        step = _read(reader, j.namespace, sorted(wanted))
        graph |= step
        unknown |= wanted - step.keys()
        wanted = {need for w in step.values() if w.waits for need in w.needs}
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
