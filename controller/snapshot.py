"""What the planner reads and returns, and the state of one of its passes.

The snapshot (Nodes, GPUs, Pools and the Allocations that hold GPUs), a pending Job as a
Request, and the Decisions of a Plan: plain frozen values, so tests build them by hand. Below
them, the per-GPU state a pass keeps (`Slot`) and what it works out once per request shape
(`Static`), shared by the planner's modules (`placement` and the layers it is built on,
`preemption`, `diagnosis`). `placement` offers the public names here as its own; import them
from there.
"""

import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gctl.api import queue

DEFAULT_POOL = queue.DEFAULT_POOL


@dataclass(frozen=True)
class Node:
    name: str
    ready: bool = True
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    state: str | None = None  # "Cordoned" | "Draining" for the whole node


@dataclass(frozen=True)
class GPU:
    node: str
    index: int
    model: str = ""
    memory_total: int | None = None
    memory_used: int | None = None  # by every process, as NVML reports it
    utilization: int | None = None  # percent
    foreign_memory: int = 0  # held by processes gctl did not start
    peers: frozenset[int] = frozenset()  # NVLink / PCIe-switch neighbours on this node
    state: str | None = None  # "Cordoned" | "Draining": takes no new work


@dataclass(frozen=True)
class Pool:
    """A GPUPool's selector and rules; `Pool()` is the implicit default (every GPU)."""

    name: str = DEFAULT_POOL
    nodes: frozenset[str] | None = None
    node_labels: tuple[tuple[str, str], ...] = ()
    gpu_model: str | None = None
    gpus: frozenset[int] | None = None
    max_jobs_per_gpu: int | None = None
    allow_fractions: bool = True
    policy: str = "binpack"  # | "spread"
    queue_order: str = queue.FIFO  # | queue.LONGEST_FIRST
    preemption: bool = True
    backfill: bool = False
    max_utilization_percent: int | None = None
    max_memory_used_percent: int | None = None
    enforce_gpu_memory: bool = False
    bind_ahead: bool = True


# Compared and hashed by identity: a pass looks Allocations up in sets and compares a GPU's next
# job with a Request's by the thousand, and each is one object of the snapshot it read.
@dataclass(frozen=True, eq=False)
class Allocation:
    """An attempt that holds GPUs (an active Binding), with what its Job says about it."""

    namespace: str
    job: str
    binding: str
    node: str
    gpus: tuple[int, ...]
    share: float = 1.0
    memory: int | None = None
    priority: int = 0
    preemptible: bool = True
    started: datetime | None = None
    ends: datetime | None = None  # by its deadline or its command's usual run time
    stopping: str | None = None  # the stop reason asked for; the attempt still holds its GPUs
    uid: str = ""  # the Binding's
    # Bound ahead and not yet taken by its agent: it holds no GPU yet, only its place as the
    # next job on its GPUs, and a pass may move it (its Job is then one of the pass's Requests).
    queued: bool = False


@dataclass(frozen=True)
class Request:
    """A pending Job, as placement needs it (its profile already applied)."""

    namespace: str
    name: str
    gpus: float = 1.0
    gpu_memory: int | None = None
    gpu_model: str | None = None
    node: str | None = None
    pinned: tuple[int, ...] | None = None
    pool: str = DEFAULT_POOL
    priority: int = 0
    created: datetime | None = None
    # A multi-node Job: `nodes` nodes at once, `gpus` whole GPUs on each (all or none).
    nodes: int = 1
    allowed: frozenset[str] | None = None  # spec.placement.nodes: the nodes it may use
    deadline: int | None = None  # activeDeadlineSeconds
    length: float = 0.0  # queue.length_key: its place among equal priorities in its pool
    runtime: timedelta | None = None  # expected: the deadline, or earlier runs' median
    problem: tuple[str, str] | None = None  # (reason, message): it cannot be queued at all
    queued: Allocation | None = None  # its attempt bound ahead, which this pass may move

    # Worked out once a Request: the controller keeps each Job's Request from pass to pass in
    # its pool's sorted list, and counts their shapes (pending.Queue, depth.Tail).

    @functools.cached_property
    def order(self) -> tuple[int, float, datetime, str, str]:
        """`queue_key`."""
        return queue.order_key(self.priority, self.created, self.name, self.namespace, self.length)

    @functools.cached_property
    def shape(self) -> tuple[object, ...]:
        """What it asks of the GPUs of its pool: requests of one shape fare alike in a pass,
        until capacity changes (the planner's indexes and `depth.Tail` are kept by it)."""
        return (
            self.pool,
            self.gpus,
            self.gpu_memory,
            self.gpu_model,
            self.node,
            self.allowed,
            self.pinned,
            self.nodes,
            self.deadline,
        )


@dataclass(frozen=True)
class Placement:
    request: Request
    node: str
    gpus: tuple[int, ...]
    share: float  # of each GPU in `gpus`
    # Bound ahead: the attempts on these GPUs it starts after, as stored (Allocations) or
    # placed earlier in this pass (their Requests). Empty: it starts now.
    after: tuple["Allocation | Request", ...] = ()
    # A multi-node Job's other members, by rank from 1: (node, GPUs) each; `node` and `gpus`
    # above are rank 0's.
    members: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def ranks(self) -> list[tuple[str, tuple[int, ...]]]:
        """(node, GPUs) of every member, by rank: one for a single-node Job."""
        return [(self.node, self.gpus), *self.members]


@dataclass(frozen=True)
class Decision:
    """What the pass decided for one request: placed, or why it waits."""

    request: Request
    placement: Placement | None = None
    victims: tuple[Allocation, ...] = ()  # attempts to stop for it
    reason: str = ""
    message: str = ""
    position: int | None = None  # in its pool's queue, 1 = next
    estimated_start: datetime | None = None
    held: tuple[tuple[str, int], ...] = ()  # GPUs (node, index) reserved for it this pass


@dataclass
class Snapshot:
    nodes: list[Node]
    gpus: list[GPU]
    pools: dict[str, Pool] = field(default_factory=dict)
    allocations: list[Allocation] = field(default_factory=list)
    # GPUPools left out because they do not validate: name -> what is wrong (reading.SetAside)
    invalid_pools: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    decisions: list[Decision]  # in queue order
    complete: bool = True  # False: max_placements was reached and later requests wait a pass
    # Requests left undecided by a pass that starts Jobs and has no room left for the rest
    # (placement.plan's `starts_only`): the next pass decides them.
    undecided: int = 0
    # Requests behind the head of the queue left to a pass that decides the whole queue, as
    # none of them could change anything but what it is told (placement.plan's `head`).
    untold: int = 0


def age_key(request: Request) -> tuple[int, float, datetime, str, str]:
    """`queue_key` as in a FIFO pool: how the pools' queues are merged (placement)."""
    return queue.order_key(request.priority, request.created, request.name, request.namespace)


def queue_key(request: Request) -> tuple[int, float, datetime, str, str]:
    """The order `gctl get jobs -o wide` numbers the queue in, too (gctl.api.queue)."""
    return request.order


# -- the state of one pass ---------------------------------------------------------------------


@dataclass(eq=False)
class Reservation:
    holder: Request
    pool: Pool
    start: datetime | None  # estimated; None: unknown


@dataclass(eq=False)
class Slot:
    """One GPU as the pass sees it: what gctl's attempts take of it, and who holds it."""

    gpu: GPU
    node: Node
    share: float = 0.0
    jobs: int = 0
    memory: int = 0  # declared gpuMemory of gctl's attempts on it
    allocations: list[Allocation] = field(default_factory=list)
    reserved: Reservation | None = None
    free_at: datetime | None = None  # on the simulated timeline; None: not known
    placed: list[Request] = field(default_factory=list)  # the requests this pass put on it
    # Its next job: the attempt bound ahead as stored, until this pass decides its Request...
    queued: Allocation | None = None
    # ... and the request this pass bound ahead to it (kept there, or newly).
    next: Request | None = None


@dataclass
class Static:
    """The GPUs that pass a request shape's fixed filters, grouped by node, and why the rest
    fail."""

    slots: list[Slot]
    groups: list[tuple[str, list[Slot]]]
    counts: Counter[str]
    total: int
    members: frozenset[tuple[str, int]]
    takeable: list[tuple[str, list[Slot]]]  # the groups without GPUs it could never use


@dataclass(frozen=True)
class Fit:
    node: str
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class Waiting:
    """A request that waits for GPUs held for it (steps 3 and 4), and who is stopped for it."""

    message: str
    victims: tuple[Allocation, ...]
    held: tuple[tuple[str, int], ...]


def at(slot: Slot) -> tuple[str, int]:
    """A GPU's key: (node, index)."""
    return (slot.gpu.node, slot.gpu.index)
