"""Why a Job waits: the checks a GPU fails, counted into messages like kube-scheduler's.

A GPU's fixed filters (pool, pinned placement, Ready node, cordon or drain, model, size, the
pool's thresholds) are the same for every request of one shape during a pass; the planner asks
them once per shape (`capacity`). A waiting Job's message counts, for each GPU, the first check
it fails, most frequent first ("0/8 GPUs fit: 6 lack 40Gi free, 2 cordoned"). `gist` is what of
such a message must change for a Job's status to be rewritten. A multi-node Job's message
says first how many nodes have its GPUs ("needs 2 nodes with 4 free GPUs each, 1 has them
(a); 6/16 GPUs fit: 10 in use"). Pure: no I/O.
"""

import functools
import re
from collections import Counter
from collections.abc import Callable

from controller import snapshot
from gctl.api import quantity, selection


@functools.lru_cache(maxsize=1024)  # per waiting Job per pass, over a few distinct messages
def gist(message: str, *, whole: bool = False) -> str:
    """A message's first clause without its numbers: what must change for a Job behind the
    head of its queue to be rewritten ("0/8 GPUs fit: 6 in use, 2 cordoned" -> "#/# GPUs
    fit: # in use"); `whole`: every clause, for the Job at the head ("#/# GPUs fit: # in use,
    # cordoned"), so that its message never names GPUs in use that have all freed."""
    return re.sub(r"\d+(\.\d+)?", "#", message if whole else message.split(", ", maxsplit=1)[0])


# -- the checks --------------------------------------------------------------------------------


def filter_gpu(slot: snapshot.Slot, request: snapshot.Request, pool: snapshot.Pool) -> str | None:
    """The first fixed filter a GPU fails for this request (the same for every request of its
    shape during one pass), or None."""
    gpu = slot.gpu
    if not _in_pool(pool, gpu, slot.node):
        return f"not in pool {pool.name}"
    if (
        (request.node is not None and gpu.node != request.node)
        or (request.allowed is not None and gpu.node not in request.allowed)
        or (request.pinned is not None and gpu.index not in request.pinned)
    ):
        return "excluded by spec.placement"
    if not slot.node.ready:
        return "on NotReady node(s)"
    if gpu.state is not None:  # a draining GPU whose jobs all ended is drained (`get gpus`)
        drained = gpu.state == "Draining" and not slot.allocations
        return "drained" if drained else gpu.state.lower()
    if request.gpu_model and not selection.model_matches(gpu.model, request.gpu_model):
        return f"not model {request.gpu_model}"
    need, total = request.gpu_memory, gpu.memory_total
    if need and total is not None and total < need:
        return f"smaller than {quantity.format_bytes(need)}"
    return _busy(gpu, pool)


def filter_node(n: snapshot.Node, request: snapshot.Request, pool: snapshot.Pool) -> str | None:
    """The first filter a node fails for a CPU-only request, or None."""
    if not selection.takes_node(n.name, n.labels, pool.nodes, pool.node_labels):
        return f"not in pool {pool.name}"
    if (request.node is not None and n.name != request.node) or (
        request.allowed is not None and n.name not in request.allowed
    ):
        return "excluded by spec.placement"
    if not n.ready:
        return "NotReady"
    return None if n.state is None else n.state.lower()


def _in_pool(pool: snapshot.Pool, gpu: snapshot.GPU, node: snapshot.Node) -> bool:
    picked = selection.takes_node(gpu.node, node.labels, pool.nodes, pool.node_labels)
    return picked and selection.takes_gpu(gpu.index, gpu.model, pool.gpus, pool.gpu_model)


def _busy(gpu: snapshot.GPU, pool: snapshot.Pool) -> str | None:
    limit = pool.max_utilization_percent
    if limit is not None and gpu.utilization is not None and gpu.utilization > limit:
        return f"busier than pool {pool.name}'s {limit}% utilization limit"
    limit = pool.max_memory_used_percent
    used, total = gpu.memory_used, gpu.memory_total
    if limit is not None and used is not None and total and used * 100 > limit * total:
        return f"over pool {pool.name}'s {limit}% memory-used limit"
    return None


# -- the messages ------------------------------------------------------------------------------


# The planner's check of a GPU against what the pass has placed so far: why it cannot take the
# request now, or None.
Blocker = Callable[[snapshot.Slot, snapshot.Request, snapshot.Pool], str | None]


def why(
    static: snapshot.Static, blocker: Blocker, request: snapshot.Request, pool: snapshot.Pool
) -> str:
    """kube-scheduler's FailedScheduling message: for each GPU the first filter it fails (the
    fixed ones, counted once per shape in `static`, then `blocker`), most frequent first."""
    if request.nodes > 1:
        return _why_gang(static, blocker, request, pool)
    counts = Counter(static.counts)
    fit = 0
    for slot in static.slots:
        reason = blocker(slot, request, pool)
        if reason is None:
            fit += 1
        else:
            counts[reason] += 1
    return _describe(counts, fit, static.total, max(1, int(request.gpus)))


def _why_gang(
    static: snapshot.Static, blocker: Blocker, request: snapshot.Request, pool: snapshot.Pool
) -> str:
    """A multi-node request's message: how many nodes have its GPUs free now ("needs 2 nodes
    with 4 free GPUs each, 1 has them (a); 6/16 GPUs fit: 10 in use"), or, where too few
    nodes have that many GPUs it may ever use, that it cannot fit as the pool is ("needs 3
    nodes with 4 GPUs each: pool default has only 2 such nodes (a,b); ..."); then the
    GPUs counted as for one node."""
    wanted = max(1, int(request.gpus))
    counts = Counter(static.counts)
    fit = 0
    free: list[str] = []  # nodes with `wanted` GPUs that can take it now
    usable: list[str] = []  # nodes with `wanted` GPUs that pass its fixed filters
    for name, slots in static.groups:
        here = 0
        for slot in slots:
            reason = blocker(slot, request, pool)
            if reason is None:
                here += 1
            else:
                counts[reason] += 1
        fit += here
        if here >= wanted:
            free.append(name)
        if len(slots) >= wanted:
            usable.append(name)
    tail = _counted(counts, fit, static.total)
    needs = f"needs {request.nodes} nodes with {wanted}"
    if len(usable) < request.nodes:
        have = "no such node" if not usable else f"only {len(usable)} such node"
        plural = "s" if len(usable) > 1 else ""
        return f"{needs} GPUs each: pool {pool.name} has {have}{plural}{_names(usable)}; {tail}"
    have = "1 has" if len(free) == 1 else f"{len(free)} have"
    return f"{needs} free GPUs each, {have} them{_names(free)}; {tail}"


def _names(nodes: list[str], most: int = 3) -> str:
    """A few node names, for a message: " (a,b,c,...)"."""
    if not nodes:
        return ""
    more = ",..." if len(nodes) > most else ""
    return f" ({','.join(nodes[:most])}{more})"


def why_no_node(counts: Counter[str], total: int) -> str:
    """The message of a CPU-only request that no node takes."""
    details = ", ".join(f"{n} {reason}" for reason, n in _ranked(counts))
    return f"0/{total} nodes fit" + (f": {details}" if details else "")


def _ranked(counts: Counter[str]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _counted(counts: Counter[str], fit: int, total: int) -> str:
    """The GPUs that fit now, and why the others do not: "6/16 GPUs fit: 10 in use"."""
    if total == 0:
        return "0/0 GPUs fit: no Ready node has reported a GPU"
    details = ", ".join(f"{n} {reason}" for reason, n in _ranked(counts))
    return f"{fit}/{total} GPUs fit" + (f": {details}" if details else "")


def _describe(counts: Counter[str], fit: int, total: int, wanted: int) -> str:
    details = ", ".join(f"{n} {reason}" for reason, n in _ranked(counts))
    if total == 0:
        return "0/0 GPUs fit: no Ready node has reported a GPU"
    if fit:
        head = f"{fit}/{total} GPUs fit, but no node has {wanted} of them"
        return f"{head}: {details}" if details else head
    return f"0/{total} GPUs fit: {details}"
