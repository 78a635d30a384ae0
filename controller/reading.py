"""Step 1 of a scheduling pass, reading: the store as `placement` needs it.

The pending Jobs are read as stored (unvalidated dicts: a pass looks at every one of them, so it
pays only for those it writes). From the store come the Nodes and their GPUs, the GPUPools, the
GPUProfiles, the active Bindings and their Jobs, and the run times of recent successful Jobs;
`read_world` turns them into the planner's snapshot, and `request_of` a pending Job into its
Request, its GPUProfile applied.
"""

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import select

from controller import placement
from gctl.api import (
    binding,
    errors,
    job,
    kinds,
    meta,
    node,
    pool,
    profile,
    quantity,
    queue,
    selection,
)
from gctl.store import jsontext, shared, store, stored, tables

V = TypeVar("V")
T = TypeVar("T", bound=meta.Resource)
HISTORY = 200  # recent successful Jobs whose run times estimate start times
RUN_TIMES_TTL = 10.0
_RUN_TIMES: dict[str, tuple[float, dict[str, timedelta]]] = {}  # database -> (read at, times)

Wire = dict[str, Any]
Key = tuple[str, str]


@dataclass
class SetAside:
    """Stored objects a pass leaves out because they do not validate (docs/decisions.md).

    `versions`: those already reported, (kind, namespace, name) -> the resourceVersion that
    failed; a Job among them has no place in the queue until it changes. `found`: those this
    pass met and left out (a GPUPool, GPUProfile or Node as if it were not there, the Node of
    an active Binding as if it were not Ready), for the caller to report."""

    versions: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    found: list[errors.StoredInvalid] = field(default_factory=list)

    def holds(self, w: Wire) -> bool:
        """Whether the stored Job `w` is set aside in the version read."""
        if not self.versions:
            return False
        metadata = w["metadata"]
        named = (job.Job.KIND, metadata.get("namespace", ""), metadata["name"])
        return self.versions.get(named) == str(metadata.get("resourceVersion", ""))

    def named(self, kind: str) -> dict[str, str]:
        """The objects of a kind this pass left out: name -> what is wrong."""
        return {exc.key[2]: exc.detail for exc in self.found if exc.key[0] == kind}


@dataclass
class World:
    """What a pass reads besides the queue."""

    snapshot: placement.Snapshot
    # Active, by namespace and name; and their Jobs. Shared reads (`Store.shared_objects`):
    # read them, never change them (copy first).
    bindings: dict[Key, binding.Binding]
    running: dict[Key, Wire]
    profiles: dict[str, profile.GPUProfileSpec]
    run_times: dict[str, timedelta]  # command -> median run time of its recent successes
    # GPUProfiles left out because they do not validate: name -> what is wrong
    invalid_profiles: dict[str, str] = field(default_factory=dict)
    # Node -> the address its agent reports (--address, else its hostname): where a multi-node
    # Job's rank 0 listens
    addresses: dict[str, str] = field(default_factory=dict)
    orders: "Orders" = field(init=False)  # each pool's queueOrder (`queue_orders`)

    def __post_init__(self) -> None:
        self.orders = queue_orders(self.snapshot.pools)


# (pool, queueOrder) of every pool, sorted
Orders = tuple[tuple[str, str], ...]
_ORDERS: list[Orders] = [()]  # the last pass's


def queue_orders(pools: Mapping[str, placement.Pool]) -> Orders:
    """Each pool's queueOrder: the very object the last pass had while none changed, so that a
    Request kept from pass to pass is ranked again (`ranked`) only when one did. Two
    controllers in one process (tests) make each other's passes rank again, no more."""
    found = tuple(sorted((name, p.queue_order) for name, p in pools.items()))
    if found != _ORDERS[0]:
        _ORDERS[0] = found
    return _ORDERS[0]


def read_world(reader: store.Store, aside: SetAside | None = None) -> World:
    """The snapshot and what the pass writes from; objects that do not validate are left out,
    and added to `aside.found`."""
    aside = aside if aside is not None else SetAside()
    pools = {p.name: pool_of(p) for p in _valid(reader, pool.GPUPool, aside)}
    profiles = {p.name: p.spec for p in _valid(reader, profile.GPUProfile, aside)}
    active, lost_nodes = _valid_active_bindings(reader, aside)
    nodes, gpus = [], []
    addresses = {}
    invalid_nodes: list[Wire] = []
    for n in _valid(reader, node.Node, aside, shared_read=True, invalid=invalid_nodes):
        found, its_gpus = node_of(n)
        if where := n.status.address or n.status.hostname:
            addresses[n.name] = where
        if n.name in lost_nodes:
            found, its_gpus = _closed(found, its_gpus, ATTEMPT_SET_ASIDE)
        nodes.append(found)
        gpus.extend(its_gpus)
    for w in invalid_nodes:
        found, its_gpus = _closed(*_raw_node(w), NODE_SET_ASIDE)
        nodes.append(found)
        gpus.extend(its_gpus)
    running = _jobs_of(reader, active)
    run_times = _recent_run_times(reader)
    allocations = [
        allocation_of(b, running.get((b.namespace, b.spec.job_name)), run_times) for b in active
    ]
    return World(
        placement.Snapshot(nodes, gpus, pools, allocations, aside.named(pool.GPUPool.KIND)),
        {(b.namespace, b.name): b for b in active},
        running,
        profiles,
        run_times,
        aside.named(profile.GPUProfile.KIND),
        addresses,
    )


def _valid(
    reader: store.Store,
    cls: type[T],
    aside: SetAside,
    *,
    shared_read: bool = False,
    invalid: list[Wire] | None = None,
) -> list[T]:
    """Every object of a kind that validates, in the usual order; those that do not go to
    `invalid`, as stored. Only when one does not is each validated alone, to leave that one
    out: a read costs nothing more until then."""
    read: Callable[[type[T]], list[T]]
    read = reader.shared_objects if shared_read else reader.list_objects
    try:
        return read(cls)
    except errors.StoredInvalid:
        pass
    found = []
    for w in reader.list_wire(cls):
        try:
            found.append(stored.validated(cls, w))
        except errors.StoredInvalid as exc:
            aside.found.append(exc)
            if invalid is not None:
                invalid.append(w)
    return found


# The states of the GPUs of a Node set aside, or of one where an attempt is (said in the
# messages of the Jobs that wait: "0/4 GPUs fit: 4 on a node that does not validate").
NODE_SET_ASIDE = "On a node that does not validate"
ATTEMPT_SET_ASIDE = "Beside an attempt that does not validate"


def _closed(
    found: placement.Node, gpus: list[placement.GPU], state: str
) -> tuple[placement.Node, list[placement.GPU]]:
    """The Node and its GPUs, taking no new work, for `state`."""
    closed = [dataclasses.replace(g, state=state) for g in gpus]
    return dataclasses.replace(found, state=state), closed


def _raw_node(w: Wire) -> tuple[placement.Node, list[placement.GPU]]:
    """What can be read of a Node that does not validate: its name, and the GPUs its status
    lists with an index (to count them in messages). Its state closes it, and names why (its
    Ready condition cannot be read, and would say less)."""
    name = w["metadata"]["name"]
    status = w["status"] if isinstance(w["status"], dict) else {}
    listed = status.get("gpus")
    entries = [g for g in listed if isinstance(g, dict)] if isinstance(listed, list) else []
    indices = {g["index"] for g in entries if isinstance(g.get("index"), int)}
    return placement.Node(name), [placement.GPU(name, i) for i in sorted(indices)]


def _valid_active_bindings(
    reader: store.Store, aside: SetAside
) -> tuple[list[binding.Binding], set[str]]:
    """The active Bindings that validate, and the Nodes of those that do not: what such an
    attempt holds is not known, so nothing new goes to its Node (it fails closed). One that
    names no Node fails the pass, as before (StoredInvalid)."""
    try:
        return reader.shared_active_bindings(), set()
    except errors.StoredInvalid:
        pass
    skipped: list[errors.StoredInvalid] = []
    active = reader.active_bindings(skipped=skipped)
    active.sort(key=lambda b: (b.namespace, b.name))  # the shared read's order
    lost = set()
    for exc in skipped:
        _, namespace, name = exc.key
        spec = next(iter(reader.list_wire(binding.Binding, namespace, names=[name])), {}).get(
            "spec"
        )
        where = spec.get("node") if isinstance(spec, dict) else None
        if not isinstance(where, str):
            raise exc
        aside.found.append(exc)
        lost.add(where)
    return active, lost


def ready(n: node.Node) -> bool:
    condition = next((c for c in n.status.conditions if c.type == "Ready"), None)
    return (
        condition is not None
        and condition.status == "True"
        and n.metadata.deletion_timestamp is None
    )


def node_of(n: node.Node) -> tuple[placement.Node, list[placement.GPU]]:
    spec = n.spec
    state = "Draining" if spec.draining else "Cordoned" if spec.unschedulable else None
    found = placement.Node(n.name, ready(n), dict(n.metadata.labels), state)
    gpus = [
        placement.GPU(
            node=n.name,
            index=g.index,
            model=g.model,
            memory_total=g.memory_total,
            memory_used=g.memory_used,
            utilization=g.utilization,
            foreign_memory=g.foreign_memory(),
            peers=frozenset(g.peers),
            state=spec.gpu_state(g.index),
        )
        for g in n.status.gpus
    ]
    return found, gpus


def pool_of(p: pool.GPUPool) -> placement.Pool:
    spec, selector = p.spec, p.spec.selector
    return placement.Pool(
        name=p.name,
        nodes=frozenset(selector.nodes) if selector.nodes else None,
        node_labels=tuple(sorted((selector.node_labels or {}).items())),
        gpu_model=selector.gpu_model,
        gpus=frozenset(selection.expand_indices(selector.gpus)) if selector.gpus else None,
        max_jobs_per_gpu=spec.max_jobs_per_gpu,
        allow_fractions=spec.allow_fractions,
        policy=spec.policy,
        queue_order=spec.queue_order,
        preemption=spec.preemption,
        backfill=spec.backfill,
        max_utilization_percent=spec.max_utilization_percent,
        max_memory_used_percent=spec.max_memory_used_percent,
        enforce_gpu_memory=spec.enforce_gpu_memory,
        bind_ahead=spec.bind_ahead,
    )


def _jobs_of(reader: store.Store, active: list[binding.Binding]) -> dict[Key, Wire]:
    names: dict[str, set[str]] = {}
    for b in active:
        names.setdefault(b.namespace, set()).add(b.spec.job_name)
    found: dict[Key, Wire] = {}
    for namespace, wanted in names.items():
        ordered = sorted(wanted)
        for start in range(0, len(ordered), 500):
            for w in reader.shared_wires(job.Job, namespace, ordered[start : start + 500]):
                found[key(w)] = w
    return found


def command_key(command: object) -> str:
    return repr(command)


def _recent_run_times(reader: store.Store) -> dict[str, timedelta]:
    """`_run_times`, read again at most every RUN_TIMES_TTL seconds per database: estimates
    need no fresher history, and a pass runs after every Job that ends."""
    key = str(reader.session.get_bind().engine.url)
    read_at, found = _RUN_TIMES.get(key, (None, {}))
    clock = time.monotonic()
    if read_at is None or clock - read_at > RUN_TIMES_TTL:
        fresh = _run_times(reader)
        # The same object while nothing changed: the Requests a controller keeps from pass to
        # pass are given new run times (`pending.Queue`) only when its history changed.
        found = found if fresh == found else fresh
        _RUN_TIMES[key] = (clock, found)
    return found


# Through `ix_jobs_phase_created` (migration 0006): the latest, not every success sorted.
_JOBS = tables.table_of(job.Job.KIND)
_LATEST_SUCCESSES = (
    select(_JOBS.c.spec, _JOBS.c.status)
    .where(_JOBS.c.phase == "Succeeded")
    .order_by(_JOBS.c.created_at.desc())
    .limit(HISTORY)
)


def _run_times(reader: store.Store) -> dict[str, timedelta]:
    """The median run time of each command among the latest successful Jobs (a bounded read).

    The one query of this module that is not a Store operation: it belongs in the Store as a
    named one once the Store grows it."""
    rows = reader.session.execute(_LATEST_SUCCESSES).all()
    runs: dict[str, list[float]] = {}
    for raw_spec, raw_status in rows:
        spec, status = _document(raw_spec), _document(raw_status)
        started, finished = (
            parse_time(status.get("startTime")),
            parse_time(status.get("completionTime")),
        )
        if started is not None and finished is not None and finished > started:
            key = command_key(spec.get("command"))
            runs.setdefault(key, []).append((finished - started).total_seconds())
    return {key: timedelta(seconds=statistics.median(times)) for key, times in runs.items()}


def _document(value: Any) -> Wire:
    loaded = jsontext.loads(value) if isinstance(value, str) else value
    return loaded if isinstance(loaded, dict) else {}


def allocation_of(
    b: binding.Binding, owner: Wire | None, run_times: dict[str, timedelta]
) -> placement.Allocation:
    """An active Binding as placement sees it; its end is known from its Job's deadline
    (counted from the start of the Job's run, `status.startTime`) or, failing that, its
    command's usual run time."""
    spec = owner["spec"] if owner else {}
    status = owner["status"] if owner else {}
    started = b.status.start_time
    if started is None and not binding.movable(b.spec, b.status):
        started = b.metadata.creation_timestamp
    ends = None
    run_started = parse_time(status.get("startTime"))
    deadline = queue.time_limit(spec)
    if deadline is not None and run_started is not None:
        ends = run_started + timedelta(seconds=deadline)
    elif (usual := run_times.get(command_key(spec.get("command")))) and started is not None:
        ends = started + usual
    return placement.Allocation(
        namespace=b.namespace,
        job=b.spec.job_name,
        binding=b.name,
        node=b.spec.node,
        gpus=tuple(b.spec.gpus),
        share=b.spec.gpu_share,
        memory=b.spec.gpu_memory,
        priority=int(spec.get("priority", 0)),
        preemptible=bool(spec.get("preemptible", True)),
        started=started,
        ends=ends,
        stopping=b.spec.stop_reason,
        uid=b.metadata.uid or "",
        queued=binding.movable(b.spec, b.status),
    )


def key(w: Wire) -> Key:
    return w["metadata"].get("namespace", ""), w["metadata"]["name"]


def parse_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class PassMemo(Generic[V]):
    """Values a scheduling pass worked out from stored Jobs, for the next pass to look up.

    A pass reads every pending Job, and most are the same stored object as in the pass
    before (`Store.pending_wires` decodes a Job once per version and shares it): values are
    keyed by that object's identity, so a new version of the Job misses. Only the last pass's
    values are kept, and none when the queue is longer than the Store keeps decoded
    (`shared.MAX_KEPT`): its Jobs are then new objects at every pass, and keeping them would
    only hold a second copy of the queue. What a whole pass did not look at is lost to the
    next; a pass that decides the head of the queue alone keeps every value (`begin`).
    Passes of two controllers in one process (tests) may race on it: that costs misses, never
    a wrong value."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Wire, V]] = {}  # of the pass before
        self._next: dict[int, tuple[Wire, V]] = {}  # of this pass
        self._keeping = True

    def begin(self, pending: int, *, whole: bool = True) -> None:
        """A pass over `pending` stored Jobs starts: what the last one kept is looked up. One
        that may decide only the head of the queue (not `whole`) keeps every value for the
        next, those it did not look at too, in the one dict; a Job that left the queue
        meanwhile keeps its value (its wire is never read again) until the next whole pass,
        which drops it."""
        self._keeping = pending <= shared.MAX_KEPT
        if whole or not self._keeping:
            self._kept, self._next = self._next, {}
        else:
            self._kept = self._next

    def get(self, w: Wire) -> V | None:
        entry = self._kept.get(id(w))
        return entry[1] if entry is not None and entry[0] is w else None

    def put(self, w: Wire, value: V) -> None:
        if self._keeping:
            self._next[id(w)] = (w, value)

    def __len__(self) -> int:
        """How many values the next pass may look up."""
        return len(self._next)


def with_run_time(request: placement.Request, command: str, world: World) -> placement.Request:
    """The Request with the run time the history gives it now (`request_of`)."""
    if request.deadline:
        return request
    runtime = world.run_times.get(command)
    return request if runtime == request.runtime else dataclasses.replace(request, runtime=runtime)


def ranked(request: placement.Request, world: World) -> placement.Request:
    """`request` with the `length` its pool's `queueOrder` gives it now (gctl.api.queue)."""
    pool_found = world.snapshot.pools.get(request.pool)
    order = pool_found.queue_order if pool_found else queue.FIFO
    length = queue.length_key(order, request.deadline)
    return request if request.length == length else dataclasses.replace(request, length=length)


def request_of(w: Wire, world: World) -> placement.Request:
    """What placement needs of a pending Job, read from its stored form, its GPUProfile applied
    to the fields the Job leaves out."""
    spec = w["spec"]
    namespace, name = key(w)
    resources = spec.get("resources", {})
    wanted_profile = resources.get("profile")
    found = world.profiles.get(wanted_profile) if wanted_profile else None
    problem = None
    if wanted_profile and found is None:
        problem = (
            job.REASON_PROFILE_NOT_FOUND,
            f'GPUProfile "{wanted_profile}" not found: apply it, or set resources.gpus '
            "(and gpuMemory, gpuModel) on the Job",
        )
        if (invalid := world.invalid_profiles.get(wanted_profile)) is not None:
            problem = (
                job.REASON_PROFILE_NOT_FOUND,
                f'GPUProfile "{wanted_profile}" as stored does not validate ({invalid}): fix '
                "or delete its row in the database",
            )
    gpus = resources.get("gpus", found.gpus if found else 1)
    memory = resources.get("gpuMemory", found.gpu_memory if found else None)
    pinned_spec = spec.get("placement") or {}
    pinned = tuple(pinned_spec["gpus"]) if pinned_spec.get("gpus") is not None else None
    if pinned is not None and problem is None:
        problem = _pin_mismatch(pinned, float(gpus), wanted_profile)
    nodes = int(resources.get("nodes") or 1)
    if nodes > 1 and problem is None and (float(gpus) < 1 or float(gpus) != int(gpus)):
        problem = (  # its profile gave it a fraction, or none
            job.REASON_UNSCHEDULABLE,
            f"a Job on {nodes} nodes takes whole GPUs on each, but GPUProfile "
            f'"{wanted_profile}" gives {quantity.format_gpus(float(gpus))}: set resources.gpus',
        )
    allowed = pinned_spec.get("nodes")
    deadline = queue.time_limit(spec)
    runtime = world.run_times.get(command_key(spec.get("command"))) if world.run_times else None
    request = placement.Request(
        namespace=namespace,
        name=name,
        gpus=float(gpus),
        gpu_memory=None if memory is None else quantity.parse_bytes(memory),
        gpu_model=resources.get("gpuModel", found.gpu_model if found else None),
        node=pinned_spec.get("node"),
        pinned=pinned,
        pool=queue.pool_of(w),
        priority=int(spec.get("priority", 0)),
        created=parse_time(w["metadata"].get("creationTimestamp")),
        nodes=nodes,
        allowed=None if allowed is None else frozenset(allowed),
        deadline=deadline,
        runtime=timedelta(seconds=deadline) if deadline else runtime,
        problem=problem,
    )
    return ranked(request, world)


def queued_requests(
    world: World, aside: SetAside | None = None
) -> list[tuple[placement.Request, Wire]]:
    """The Jobs bound ahead whose agents have not taken them, or have armed them, as Requests
    the pass decides again (with their Jobs as stored); not those being stopped, suspended or
    deleted: their attempts end as they are; nor those set aside: they stay where they are."""
    found = []
    for allocation in world.snapshot.allocations:
        if not allocation.queued or allocation.stopping:
            continue
        w = world.running.get((allocation.namespace, allocation.job))
        if w is None or w["spec"].get("suspend") or w["metadata"].get("deletionTimestamp"):
            continue
        if aside is not None and aside.holds(w):
            continue
        token = w["metadata"].get("annotations", {}).get(job.ANNOTATION_RERUN)
        if token and token != w["status"].get("rerun"):
            continue  # to be re-run: its reconcile withdraws the attempt
        request = request_or_invalid(w, world)
        found.append((dataclasses.replace(request, queued=allocation), w))
    return found


def raise_invalid(wires: list[Wire]) -> None:
    """Raise StoredInvalid for the first of these stored Jobs that does not validate: after
    reading them failed, so that the pass sets that one aside rather than fail every time.
    Checked strictly: a value pydantic would convert (a time stored as a number) fails the
    pass's reading all the same."""
    for w in wires:
        stored.validated(job.Job, w, strict=True)


def request_or_invalid(w: Wire, world: World) -> placement.Request:
    """`request_of`; where a malformed Job makes it fail, StoredInvalid naming the Job."""
    try:
        return request_of(w, world)
    except Exception:
        stored.validated(job.Job, w, strict=True)
        raise


def _pin_mismatch(
    pinned: tuple[int, ...], gpus: float, profile_name: str | None
) -> tuple[str, str] | None:
    problem = job.pin_problem(len(pinned), gpus)
    if problem is None:
        return None
    return (
        job.REASON_UNSCHEDULABLE,
        f"spec.placement.gpus lists {len(pinned)} GPU(s) but GPUProfile {profile_name} {problem}",
    )


def retry_after(w: Wire) -> datetime | None:
    return parse_time(w["status"].get("retryAfter"))


def succeeded_dependencies(reader: store.Store, pending: list[Wire]) -> set[Key]:
    """The names the pending Jobs wait for that have succeeded, as `queue.held` needs them:
    read as the CLI reads them to number the queue (`queue.succeeded_among`). A pending Job
    that does not validate, where `queue` cannot read it, raises: the caller sets it aside."""

    def read(info: kinds.KindInfo, namespace: str, names: list[str]) -> list[Wire]:
        return reader.list_wire(kinds.model(info.kind), namespace, names=names)

    return queue.succeeded_among(queue.needed(pending, strict=True), read)
