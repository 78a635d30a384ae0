"""Views that no stored object holds: GPUs with the jobs on them, a pool's capacity and queue,
whether a draining node or GPU is empty yet.

Pure functions of wire dicts (as listed), so `get` pays for no validation and unit tests need
no database. A view of a stored kind is kept in the copy of its wire under `VIEW`, which the
table columns read and -o yaml|json never print.

An object stored in a form that does not validate (`malformed`) may hold anything where a field
should be: what cannot be read of it counts nowhere here, so that `get` still lists the rest.
"""

from collections.abc import Callable, Container, Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from gctl.api import kinds, queue, selection

Wire = dict[str, Any]
T = TypeVar("T")
VIEW = "_view"  # the key, in a listed object's copy, of what its table columns show beyond it
HOLDING = frozenset({"Pending", "Armed", "Starting", "Running"})  # as ACTIVE_PHASES
DEFAULT_POOL = "default"
INVALID = "<invalid>"  # what cannot be worked out of an object that does not validate
# What `get` adds to a Job's status to print it (getting.number_queue): no stored field.
PRINTED = frozenset({"queuePosition", "queueOrder"})


def malformed(kind: str, w: Wire) -> bool:
    """Whether a listed object of `kind` does not validate as stored (what `get` added to it
    left out): only such an object's cells and counts may fall back where they cannot be
    worked out of it; for any other, the error is a bug and is raised."""
    if kind not in kinds.BY_KIND:
        return False  # a view's own row (`gpu_rows`): nothing stored to blame
    stored = {key: value for key, value in w.items() if key != VIEW}
    if isinstance(status := stored.get("status"), dict):
        stored["status"] = {key: value for key, value in status.items() if key not in PRINTED}
    return kinds.malformed(kind, stored)


def _each(kind: str, wires: Iterable[Wire], read: Callable[[Wire], T]) -> list[T]:
    """`read` of each object; one that does not validate as stored, where `read` cannot read
    it, is left out: what it holds cannot be known (the scheduler leaves it out too)."""
    found = []
    for w in wires:
        try:
            found.append(read(w))
        except Exception:
            if not malformed(kind, w):
                raise
    return found


def _viewed(kind: str, wires: Iterable[Wire], view: Callable[[Wire], Wire]) -> list[Wire]:
    """Each object with its `view` under VIEW; one that does not validate as stored, where
    `view` cannot read it, without one: its cells say what they can (cells.as_stored)."""
    found = []
    for w in wires:
        try:
            found.append({**w, VIEW: view(w)})
        except Exception:
            if not malformed(kind, w):
                raise
            found.append(w)
    return found


def bound_ahead(bound: Wire) -> bool:
    """Whether an attempt is bound ahead and not started: not taken, or armed to start when
    the attempts before it end (gctl.api.binding.movable)."""
    phase = bound["status"].get("phase", "Pending")
    return phase in ("Pending", "Armed") and bool(bound["spec"].get("after"))


def holding(bound: Wire) -> bool:
    """Whether an attempt holds its GPUs: not one bound ahead that waits for them."""
    return bound["status"].get("phase", "Pending") in HOLDING and not bound_ahead(bound)


def holders(bindings: Iterable[Wire]) -> dict[tuple[str, int], list[Wire]]:
    """(node, GPU index) -> the Jobs that hold it, by the Bindings that do: their namespace,
    name and share of the GPU."""
    held: dict[tuple[str, int], list[Wire]] = {}
    for gpus in _each(kinds.BINDING.kind, bindings, _holds):
        for gpu, holder in gpus:
            held.setdefault(gpu, []).append(holder)
    return held


def _holds(bound: Wire) -> list[tuple[tuple[str, int], Wire]]:
    if not holding(bound):
        return []
    spec = bound["spec"]
    holder = {
        "namespace": bound["metadata"].get("namespace", kinds.DEFAULT_NAMESPACE),
        "name": str(spec["jobName"]),
        "share": float(spec.get("gpuShare", 1.0)),
    }
    return [((str(spec["node"]), int(index)), holder) for index in spec.get("gpus", [])]


def ready(node: Wire) -> bool:
    conditions = node["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# -- one GPU, one node -------------------------------------------------------------------------


def gpu_state(node: Wire, index: int, busy: bool) -> str:
    """Ready, Cordoned, Draining (jobs still on it) or Drained (none left); on a node that is
    not Ready, NotReady, then the GPU's own state where it is not Ready (`NotReady,Cordoned`),
    as `get nodes` says `NotReady,SchedulingDisabled`: what it comes back as."""
    spec = node["spec"]
    state = "Ready"
    if spec.get("draining") or index in spec.get("drainingGPUs", []):
        state = "Draining" if busy else "Drained"
    elif spec.get("unschedulable") or index in spec.get("cordonedGPUs", []):
        state = "Cordoned"
    if not ready(node):
        return "NotReady" if state == "Ready" else f"NotReady,{state}"
    return state


def node_status(node: Wire, busy: bool | None) -> str:
    """kubectl's STATUS: Ready or NotReady, then SchedulingDisabled for a cordoned node, and
    Draining or Drained for a draining one (Draining when `busy` is unknown)."""
    conditions = node["status"].get("conditions", [])
    condition = next((c for c in conditions if c["type"] == "Ready"), None)
    text = "Unknown" if condition is None else ("Ready" if ready(node) else "NotReady")
    spec = node["spec"]
    if spec.get("draining"):
        return text + (",Drained" if busy is False else ",Draining")
    if spec.get("unschedulable"):
        return text + ",SchedulingDisabled"
    return text


def with_node_views(nodes: Sequence[Wire], bindings: Sequence[Wire]) -> list[Wire]:
    """Nodes with their STATUS and GPU counts as `get nodes` prints them (they need the
    Bindings on them)."""
    busy = set(_each(kinds.BINDING.kind, bindings, _holding_on))
    counts = gpu_counts(gpu_rows(nodes, bindings))

    def view(n: Wire) -> Wire:
        name = n["metadata"]["name"]
        return {"status": node_status(n, name in busy), **counts.get(name, _no_gpus())}

    return _viewed(kinds.NODE.kind, nodes, view)


def _holding_on(bound: Wire) -> str | None:
    """The node whose GPUs an attempt holds; None if it holds none."""
    return str(bound["spec"]["node"]) if holding(bound) else None


# What `get nodes` counts of a node's GPUs, each GPU in the first that applies (so that they add
# up to the total, as sinfo's allocated/idle/other/total do): held by a gctl job, whole or a
# share of it; taking no new jobs (cordoned, draining or drained, or its node NotReady); held
# by processes gctl did not start; free.
GPU_COUNTS = ("allocated", "cordoned", "other", "free")


def _no_gpus() -> dict[str, int]:
    return dict.fromkeys((*GPU_COUNTS, "total"), 0)


def gpu_count(row: Wire) -> str:
    """Which of GPU_COUNTS a row of `gpu_rows` counts in."""
    if row["jobs"]:
        return "allocated"
    if row["status"] != "Ready":
        return "cordoned"
    return "other" if row["foreignProcesses"] else "free"


def gpu_counts(rows: Iterable[Wire]) -> dict[str, dict[str, int]]:
    """node -> its GPUs counted by GPU_COUNTS, and their total, from rows of `gpu_rows`."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        its = counts.setdefault(row["node"], _no_gpus())
        its[gpu_count(row)] += 1
        its["total"] += 1
    return counts


def gpu_rows(nodes: Sequence[Wire], bindings: Sequence[Wire]) -> list[Wire]:
    """One mapping per GPU of every Node: what it is, how full, which jobs hold it (from the
    Bindings that are Pending or Running), its state, and the processes gctl did not start."""
    held = holders(bindings)
    job_pids = set(_each(kinds.BINDING.kind, bindings, _running_pid))
    ordered = sorted(nodes, key=lambda n: str(n["metadata"]["name"]))
    rows_of = partial(_gpu_rows_of, held=held, job_pids=job_pids)
    return [row for rows in _each(kinds.NODE.kind, ordered, rows_of) for row in rows]


def _running_pid(bound: Wire) -> tuple[str, int] | None:
    """(node, pid) of a running attempt's process, where it has one."""
    status = bound["status"]
    if status.get("phase") != "Running" or status.get("pid") is None:
        return None
    return str(bound["spec"]["node"]), int(status["pid"])


def _gpu_rows_of(
    node: Wire, held: dict[tuple[str, int], list[Wire]], job_pids: set[tuple[str, int] | None]
) -> list[Wire]:
    """The rows of one Node's GPUs (`gpu_rows`)."""
    name = node["metadata"]["name"]
    rows = []
    for gpu in sorted(node["status"].get("gpus", []), key=lambda g: int(g["index"])):
        index = int(gpu["index"])
        foreign = [
            {"pid": p["pid"], "usedMemory": p.get("usedMemory")}
            for p in gpu.get("processes", [])
            if (name, int(p["pid"])) not in job_pids  # the agent leaves them out already
        ]
        on_it = held.get((name, index), [])
        rows.append(
            {
                "node": name,
                "index": index,
                "uuid": gpu.get("uuid"),
                "model": gpu.get("model"),
                "memoryUsed": gpu.get("memoryUsed"),
                "memoryTotal": gpu.get("memoryTotal"),
                "utilization": gpu.get("utilization"),
                "status": gpu_state(node, index, bool(on_it)),
                "jobs": sorted(on_it, key=lambda h: (h["namespace"], h["name"])),
                "foreignProcesses": foreign,
            }
        )
    return rows


# -- pools -------------------------------------------------------------------------------------


def pool_gpus(pool: Wire, nodes: Sequence[Wire]) -> set[tuple[str, int]]:
    """The (node, GPU index) pairs of known nodes that a GPUPool's selector matches; every
    criterion given must hold, by the scheduler's own rule (gctl.api.selection)."""
    selector = pool["spec"].get("selector", {})
    names = selector.get("nodes")
    labels: dict[str, str] = selector.get("nodeLabels") or {}
    model = selector.get("gpuModel") or None
    indices = set(selection.expand_indices(selector["gpus"])) if selector.get("gpus") else None

    def taken(node: Wire) -> list[tuple[str, int]]:
        name = node["metadata"]["name"]
        node_labels = node["metadata"].get("labels", {})
        if not selection.takes_node(name, node_labels, names, labels.items()):
            return []
        return [
            (name, int(gpu["index"]))
            for gpu in node["status"].get("gpus", [])
            if selection.takes_gpu(int(gpu["index"]), str(gpu.get("model", "")), indices, model)
        ]

    return {gpu for gpus in _each(kinds.NODE.kind, nodes, taken) for gpu in gpus}


def with_implicit_default(pools: Sequence[Wire]) -> list[Wire]:
    """The pools, and the default one when none is stored: the scheduler then runs Jobs that
    name no pool on every GPU, and `get pools` shows that pool (without an age: it was never
    created)."""
    if any(p["metadata"]["name"] == DEFAULT_POOL for p in pools):
        return list(pools)
    implicit: Wire = {
        "apiVersion": kinds.API_VERSION,
        "kind": "GPUPool",
        "metadata": {"name": DEFAULT_POOL},
        "spec": {},
        "status": {},
    }
    return sorted([*pools, implicit], key=lambda p: str(p["metadata"]["name"]))


_POOL_COLUMNS = ("running", "queued", "held", "ahead")


def _pool_column(
    ahead: Container[str | None], now: datetime, succeeded: Container[queue.Key], job: Wire
) -> tuple[str, str | None]:
    """A Job's pool, and which of its job counts the Job adds to, if any."""
    pool = queue.pool_of(job)
    phase = job["status"].get("phase", "Pending")
    if phase in ("Scheduled", "Running"):
        return pool, "ahead" if job["metadata"].get("uid") in ahead else "running"
    if phase != "Pending":
        return pool, None
    return pool, "queued" if queue.queued(job, now, succeeded) else "held"


def _ahead_of(bound: Wire) -> Any:
    """The uid of the Job whose attempt is bound ahead; None if it is not."""
    return bound["spec"].get("jobUID") if bound_ahead(bound) else None


def with_pool_views(
    pools: Sequence[Wire],
    nodes: Sequence[Wire],
    bindings: Sequence[Wire],
    jobs: Sequence[Wire],
    *,
    now: datetime,
    succeeded: Container[queue.Key],
) -> list[Wire]:
    """Pools with GPUS (matched on known nodes), ALLOCATED (of those, held by a gctl job), and
    the pool's Jobs (a Job that names no pool is the default pool's): RUNNING, QUEUED (those
    with a place in its queue, by the rule that numbers it: `queue.queued`), HELD (pending,
    but left out of the queue: suspended, deleting, in back-off, waiting for `dependsOn`;
    `succeeded` as `queue.succeeded_among` finds it) and AHEAD (bound ahead to a busy GPU)."""
    taken = set(holders(bindings))
    # Jobs bound ahead are Scheduled, but wait for their GPUs: neither running nor queued.
    ahead = set(_each(kinds.BINDING.kind, bindings, _ahead_of)) - {None}
    counts: dict[tuple[str, str | None], int] = {}
    for where in _each(kinds.JOB.kind, jobs, partial(_pool_column, ahead, now, succeeded)):
        counts[where] = counts.get(where, 0) + 1
    viewed = []
    for p in pools:
        name = p["metadata"]["name"]
        view: dict[str, Any] = {column: counts.get((name, column), 0) for column in _POOL_COLUMNS}
        try:
            gpus = pool_gpus(p, nodes)
            view |= {"gpus": len(gpus), "allocated": len(gpus & taken), "matched": sorted(gpus)}
        except Exception:
            if not malformed(kinds.GPUPOOL.kind, p):
                raise
            view |= {"gpus": INVALID, "allocated": INVALID}  # its GPUs cannot be read
        viewed.append({**p, VIEW: view})
    return viewed
