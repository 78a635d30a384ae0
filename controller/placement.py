"""Where a Job fits: pure functions over a snapshot, so tests drive them with plain objects.

First fit, in queue order (priority, then age): whole GPUs on one node, fractions that keep each
GPU's sum at most 1, pinned node and GPU indices, GPU model and memory, Ready nodes only.
"""

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field

EPSILON = 1e-9


@dataclass(frozen=True)
class GPU:
    node: str
    index: int
    model: str
    memory_total: int | None = None


@dataclass
class Usage:
    """What gctl's own attempts take of one GPU."""

    share: float = 0.0
    jobs: int = 0
    memory: int = 0  # declared gpuMemory of the jobs on it


@dataclass(frozen=True)
class Request:
    namespace: str
    name: str
    gpus: float
    gpu_model: str | None = None
    gpu_memory: int | None = None
    node: str | None = None
    pinned: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Placement:
    request: Request
    node: str
    gpus: tuple[int, ...]
    share: float  # of each GPU in `gpus`


@dataclass
class Snapshot:
    gpus: list[GPU]  # of schedulable nodes, in node then index order
    usage: dict[tuple[str, int], Usage] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)  # schedulable nodes, for CPU-only jobs

    def use(self, placement: Placement) -> None:
        for index in placement.gpus:
            usage = self.usage.setdefault((placement.node, index), Usage())
            usage.share += placement.share
            usage.jobs += 1
            usage.memory += placement.request.gpu_memory or 0


def _suits(gpu: GPU, request: Request) -> bool:
    if request.node is not None and gpu.node != request.node:
        return False
    if request.pinned is not None and gpu.index not in request.pinned:
        return False
    if request.gpu_model and not fnmatch.fnmatch(gpu.model.lower(), request.gpu_model.lower()):
        return False
    return not (
        request.gpu_memory is not None
        and gpu.memory_total is not None
        and request.gpu_memory > gpu.memory_total
    )


def _memory_left(gpu: GPU, usage: Usage, request: Request) -> bool:
    """Jobs sharing a GPU must fit in its memory together, as they declared it."""
    if request.gpu_memory is None or gpu.memory_total is None:
        return True
    return usage.memory + request.gpu_memory <= gpu.memory_total


def fit(snapshot: Snapshot, request: Request) -> Placement | None:
    """The first place the request fits, or None."""
    if request.gpus == 0:
        nodes = [n for n in snapshot.nodes if request.node in (None, n)]
        return Placement(request, nodes[0], (), 0.0) if nodes else None
    candidates = [g for g in snapshot.gpus if _suits(g, request)]
    if request.gpus < 1:
        for gpu in candidates:
            usage = snapshot.usage.get((gpu.node, gpu.index), Usage())
            if usage.share + request.gpus <= 1 + EPSILON and _memory_left(gpu, usage, request):
                return Placement(request, gpu.node, (gpu.index,), request.gpus)
        return None
    wanted = int(request.gpus)
    by_node: dict[str, list[int]] = {}
    for gpu in candidates:
        if snapshot.usage.get((gpu.node, gpu.index), Usage()).jobs == 0:
            by_node.setdefault(gpu.node, []).append(gpu.index)
    for node_name, free in by_node.items():
        if len(free) >= wanted:
            return Placement(request, node_name, tuple(free[:wanted]), 1.0)
    return None


def place(snapshot: Snapshot, requests: Iterable[Request]) -> list[Placement]:
    """Place requests in the order given; each placement takes its GPUs before the next fits."""
    placed = []
    for request in requests:
        found = fit(snapshot, request)
        if found is not None:
            snapshot.use(found)
            placed.append(found)
    return placed
