"""Views that no stored object holds: GPUs with the jobs on them, a pool's capacity and queue,
whether a draining node or GPU is empty yet.

Pure functions of wire dicts (as listed), so `get` pays for no validation and unit tests need
no database. A view of a stored kind is kept in the copy of its wire under `VIEW`, which the
table columns read and -o yaml|json never print.
"""

from collections.abc import Container, Iterable, Sequence
from datetime import datetime
from typing import Any

from gctl.api import kinds, queue, selection

Wire = dict[str, Any]
VIEW = "_view"  # the key, in a listed object's copy, of what its table columns show beyond it
HOLDING = frozenset({"Pending", "Armed", "Starting", "Running"})  # as ACTIVE_PHASES
DEFAULT_POOL = "default"


def bound_ahead(bound: Wire) -> bool:
    """Whether an attempt is bound ahead and not started: not taken, or armed to start when
    the attempts before it end (gctl.api.binding.movable)."""
    phase = bound["status"].get("phase", "Pending")
    return phase in ("Pending", "Armed") and bool(bound["spec"].get("after"))


def holding(bound: Wire) -> bool:
    """Whether an attempt holds its GPUs: not one bound ahead that waits for them."""
    return bound["status"].get("phase", "Pending") in HOLDING and not bound_ahead(bound)


def holders(bindings: Iterable[Wire]) -> dict[tuple[str, int], list[Wire]]:
    """(node, GPU index) -> the Bindings that hold it."""
    held: dict[tuple[str, int], list[Wire]] = {}
    for bound in bindings:
        if holding(bound):
            for index in bound["spec"].get("gpus", []):
                held.setdefault((bound["spec"]["node"], int(index)), []).append(bound)
    return held


def ready(node: Wire) -> bool:
    conditions = node["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# -- one GPU, one node -------------------------------------------------------------------------


def gpu_state(node: Wire, index: int, busy: bool) -> str:
    """Ready, Cordoned, Draining (jobs still on it), Drained (none left) or NotReady."""
    spec = node["spec"]
    if not ready(node):
        return "NotReady"
    if spec.get("draining") or index in spec.get("drainingGPUs", []):
        return "Draining" if busy else "Drained"
    if spec.get("unschedulable") or index in spec.get("cordonedGPUs", []):
        return "Cordoned"
    return "Ready"


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
    busy = {b["spec"]["node"] for b in bindings if holding(b)}
    counts = gpu_counts(gpu_rows(nodes, bindings))
    return [
        {
            **n,
            VIEW: {
                "status": node_status(n, n["metadata"]["name"] in busy),
                **counts.get(n["metadata"]["name"], _no_gpus()),
            },
        }
        for n in nodes
    ]


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
    job_pids = {
        (b["spec"]["node"], int(b["status"]["pid"]))
        for b in bindings
        if b["status"].get("phase") == "Running" and b["status"].get("pid") is not None
    }
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = node["metadata"]["name"]
        for gpu in sorted(node["status"].get("gpus", []), key=lambda g: int(g["index"])):
            index = int(gpu["index"])
            foreign = [
                {"pid": p["pid"], "usedMemory": p.get("usedMemory")}
                for p in gpu.get("processes", [])
                if (name, int(p["pid"])) not in job_pids  # the agent leaves them out already
            ]
            on_it = held.get((name, index), [])
            jobs = sorted(
                (
                    {
                        "namespace": b["metadata"].get("namespace", kinds.DEFAULT_NAMESPACE),
                        "name": b["spec"]["jobName"],
                        "share": b["spec"].get("gpuShare", 1.0),
                    }
                    for b in on_it
                ),
                key=lambda h: (h["namespace"], h["name"]),
            )
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
                    "jobs": jobs,
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
    found = set()
    for node in nodes:
        name = node["metadata"]["name"]
        node_labels = node["metadata"].get("labels", {})
        if not selection.takes_node(name, node_labels, names, labels.items()):
            continue
        for gpu in node["status"].get("gpus", []):
            index = int(gpu["index"])
            if selection.takes_gpu(index, str(gpu.get("model", "")), indices, model):
                found.add((name, index))
    return found


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
    job: Wire, ahead: Container[str | None], now: datetime, succeeded: Container[queue.Key]
) -> str | None:
    """Which of a pool's job counts a Job adds to, if any."""
    phase = job["status"].get("phase", "Pending")
    if phase in ("Scheduled", "Running"):
        return "ahead" if job["metadata"].get("uid") in ahead else "running"
    if phase != "Pending":
        return None
    return "queued" if queue.queued(job, now, succeeded) else "held"


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
    ahead = {b["spec"].get("jobUID") for b in bindings if bound_ahead(b)}
    counts: dict[tuple[str, str], int] = {}
    for j in jobs:
        if (column := _pool_column(j, ahead, now, succeeded)) is not None:
            where = (queue.pool_of(j), column)
            counts[where] = counts.get(where, 0) + 1
    viewed = []
    for p in pools:
        name = p["metadata"]["name"]
        gpus = pool_gpus(p, nodes)
        view = {
            "gpus": len(gpus),
            "allocated": len(gpus & taken),
            **{column: counts.get((name, column), 0) for column in _POOL_COLUMNS},
        }
        viewed.append({**p, VIEW: view})
    return viewed
