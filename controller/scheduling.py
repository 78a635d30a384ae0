"""The scheduling pass: read a snapshot, let `placement` decide, then apply it with compare-and-set.

One pass is one transaction, in three steps:

1. read: the pending Jobs as stored (unvalidated: a pass looks at every one of them, so it pays
   only for those it writes), Nodes, GPUPools, GPUProfiles, the active Bindings and their Jobs,
   and the run times of recent successful Jobs;
2. plan: `placement.plan`, a pure function of that snapshot;
3. apply: each placement creates the attempt's Binding (named `<job>-<attempt>`, unique, so a
   second controller racing on the same attempt fails) and moves the Job to Scheduled with the
   CAS of the Job it read; each preemption sets `stopReason: Preempted` on its victims'
   Bindings; each Job left waiting gets its Scheduled=False condition, queue position and
   estimated start, written only when they changed.

A pass binds at most `Limits.binds` Jobs, writes at most `Limits.writes` waiting Jobs and starts
no write after `Limits.seconds` of writing (as Slurm's scheduler stops after so many starts or
so much time per cycle); it then returns `now`, so the controller runs the next pass at once
and no single transaction holds the database for long.
"""

import gc
import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from controller import placement
from gctl.api import binding, job, meta, node, pool, profile, quantity
from gctl.store import store, tables

SOURCE = "controller/scheduler"
HISTORY = 200  # recent successful Jobs whose run times estimate start times
RUN_TIMES_TTL = 10.0
_RUN_TIMES: dict[str, tuple[float, dict[str, timedelta]]] = {}  # database -> (read at, times)
# Reasons this pass sets in status.reason (the Job cannot be queued until a user acts); it
# clears them once they no longer hold, and leaves every other reason to the Job lifecycle.
OWN_REASONS = frozenset({job.REASON_POOL_NOT_FOUND, job.REASON_PROFILE_NOT_FOUND})

Wire = dict[str, Any]
Key = tuple[str, str]


@dataclass(frozen=True)
class Limits:
    """How much one pass may do before it leaves the rest to the next one."""

    binds: int = 64  # Jobs bound
    writes: int = 256  # waiting Jobs whose status is written
    # Seconds of writing after which a pass starts no more writes (it binds at least one Job):
    # a pass holds the write lock, and SQLite has only one.
    seconds: float | None = 0.4
    clock: Callable[[], float] = time.perf_counter


LIMITS = Limits()


@dataclass
class _Budget:
    """What is left to this pass of its Limits."""

    limits: Limits
    writes: int
    started: float
    short: bool = False  # work was left for the next pass

    @classmethod
    def of(cls, limits: Limits) -> "_Budget":
        return cls(limits, limits.writes, limits.clock())

    def late(self) -> bool:
        seconds = self.limits.seconds
        if seconds is not None and self.limits.clock() - self.started > seconds:
            self.short = True
        return self.short

    def take(self) -> bool:
        """One more status write, if the pass has room for it."""
        if self.writes <= 0:
            self.short = True
        if self.late():
            return False
        self.writes -= 1
        return True


@dataclass
class World:
    """What a pass reads besides the queue."""

    snapshot: placement.Snapshot
    bindings: dict[Key, binding.Binding]  # active, by namespace and name
    running: dict[Key, Wire]  # the Jobs of those Bindings, by namespace and name
    profiles: dict[str, profile.GPUProfileSpec]
    run_times: dict[str, timedelta]  # command -> median run time of its recent successes


def schedule(writer: store.Store, now: datetime, limits: Limits = LIMITS) -> datetime | None:
    """One pass; returns when the next one is due: `now` when work was left for it, else when
    the next back-off ends, if any."""
    with _collector_paused():
        return _pass(writer, now, limits)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A pass makes some hundred thousand short-lived objects (the queue as dicts), which set
    off Python's cycle collector several times, each a walk over the whole heap: about 40 % of
    a pass over 10,000 pending Jobs. They die by reference counting; the few cycles a pass
    makes wait for it to end."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _pass(writer: store.Store, now: datetime, limits: Limits) -> datetime | None:
    writer.lock_scheduling()
    pending = writer.pending_wires()
    succeeded = _succeeded_dependencies(writer, pending)
    eligible: list[Wire] = []
    held: list[Wire] = []
    for w in pending:
        (held if waiting(w, now, succeeded) else eligible).append(w)
    complete = True
    budget = _Budget.of(limits)
    if eligible:
        world = read_world(writer)
        by_key = {_key(w): w for w in eligible}
        requests = [request_of(w, world) for w in eligible]
        result = placement.plan(world.snapshot, requests, now, max_placements=limits.binds)
        budget = _Budget.of(limits)  # the time limit counts from the first write
        _apply(writer, result.decisions, by_key, world, now, budget=budget)
        complete = result.complete
    _forget_queue(writer, held, budget)
    if not complete or budget.short:
        return now
    return _next_retry(held, now)


# -- 1. read -----------------------------------------------------------------------------------


def read_world(reader: store.Store) -> World:
    pools = {p.name: pool_of(p) for p in reader.list_objects(pool.GPUPool)}
    profiles = {p.name: p.spec for p in reader.list_objects(profile.GPUProfile)}
    nodes, gpus = [], []
    for n in reader.list_objects(node.Node):
        found, its_gpus = node_of(n)
        nodes.append(found)
        gpus.extend(its_gpus)
    active = reader.active_bindings()
    running = _jobs_of(reader, active)
    run_times = _recent_run_times(reader)
    allocations = [
        allocation_of(b, running.get((b.namespace, b.spec.job_name)), run_times) for b in active
    ]
    return World(
        placement.Snapshot(nodes, gpus, pools, allocations),
        {(b.namespace, b.name): b for b in active},
        running,
        profiles,
        run_times,
    )


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
        gpus=frozenset(pool.expand_indices(selector.gpus)) if selector.gpus else None,
        max_jobs_per_gpu=spec.max_jobs_per_gpu,
        allow_fractions=spec.allow_fractions,
        policy=spec.policy,
        preemption=spec.preemption,
        backfill=spec.backfill,
        max_utilization_percent=spec.max_utilization_percent,
        max_memory_used_percent=spec.max_memory_used_percent,
        enforce_gpu_memory=spec.enforce_gpu_memory,
    )


def _jobs_of(reader: store.Store, active: list[binding.Binding]) -> dict[Key, Wire]:
    names: dict[str, set[str]] = {}
    for b in active:
        names.setdefault(b.namespace, set()).add(b.spec.job_name)
    found: dict[Key, Wire] = {}
    for namespace, wanted in names.items():
        ordered = sorted(wanted)
        for start in range(0, len(ordered), 500):
            for w in reader.list_wire(job.Job, namespace, names=ordered[start : start + 500]):
                found[_key(w)] = w
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
        found = _run_times(reader)
        _RUN_TIMES[key] = (clock, found)
    return found


def _run_times(reader: store.Store) -> dict[str, timedelta]:
    """The median run time of each command among the latest successful Jobs (a bounded read).

    The one query of this module that is not a Store operation: it belongs in the Store as a
    named one once the Store grows it."""
    table = tables.table_of(job.Job.KIND)
    rows = reader.session.execute(
        select(table.c.spec, table.c.status)
        .where(table.c.phase == "Succeeded")
        .order_by(table.c.created_at.desc())
        .limit(HISTORY)
    ).all()
    runs: dict[str, list[float]] = {}
    for raw_spec, raw_status in rows:
        spec, status = _document(raw_spec), _document(raw_status)
        started, finished = _time(status.get("startTime")), _time(status.get("completionTime"))
        if started is not None and finished is not None and finished > started:
            key = command_key(spec.get("command"))
            runs.setdefault(key, []).append((finished - started).total_seconds())
    return {key: timedelta(seconds=statistics.median(times)) for key, times in runs.items()}


def _document(value: Any) -> Wire:
    loaded = json.loads(value) if isinstance(value, str) else value
    return loaded if isinstance(loaded, dict) else {}


def allocation_of(
    b: binding.Binding, owner: Wire | None, run_times: dict[str, timedelta]
) -> placement.Allocation:
    """An active Binding as placement sees it; its end is known from its Job's deadline
    (counted from the first bind) or, failing that, its command's usual run time."""
    spec = owner["spec"] if owner else {}
    status = owner["status"] if owner else {}
    started = b.status.start_time or b.metadata.creation_timestamp
    ends = None
    first_bind = _time(status.get("startTime"))
    if spec.get("activeDeadlineSeconds") and first_bind is not None:
        ends = first_bind + timedelta(seconds=spec["activeDeadlineSeconds"])
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
    )


def _key(w: Wire) -> Key:
    return w["metadata"].get("namespace", ""), w["metadata"]["name"]


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def request_of(w: Wire, world: World) -> placement.Request:
    """What placement needs of a pending Job, read from its stored form, its GPUProfile applied
    to the fields the Job leaves out."""
    spec = w["spec"]
    namespace, name = _key(w)
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
    gpus = resources.get("gpus", found.gpus if found else 1)
    memory = resources.get("gpuMemory", found.gpu_memory if found else None)
    pinned_spec = spec.get("placement") or {}
    pinned = tuple(pinned_spec["gpus"]) if pinned_spec.get("gpus") is not None else None
    if pinned is not None and problem is None:
        problem = _pin_mismatch(pinned, float(gpus), wanted_profile)
    deadline = spec.get("activeDeadlineSeconds")
    runtime = world.run_times.get(command_key(spec.get("command"))) if world.run_times else None
    return placement.Request(
        namespace=namespace,
        name=name,
        gpus=float(gpus),
        gpu_memory=None if memory is None else quantity.parse_bytes(memory),
        gpu_model=resources.get("gpuModel", found.gpu_model if found else None),
        node=pinned_spec.get("node"),
        pinned=pinned,
        pool=spec.get("pool") or placement.DEFAULT_POOL,
        priority=int(spec.get("priority", 0)),
        created=_time(w["metadata"].get("creationTimestamp")),
        deadline=deadline,
        runtime=timedelta(seconds=deadline) if deadline else runtime,
        problem=problem,
    )


def _pin_mismatch(
    pinned: tuple[int, ...], gpus: float, profile_name: str | None
) -> tuple[str, str] | None:
    wanted = 1 if 0 < gpus < 1 else int(gpus)
    if len(pinned) == wanted:
        return None
    return (
        job.REASON_UNSCHEDULABLE,
        f"spec.placement.gpus lists {len(pinned)} GPU(s) but GPUProfile {profile_name} asks "
        f"for {quantity.format_gpus(gpus)}: list exactly {wanted}",
    )


def _retry_after(w: Wire) -> datetime | None:
    return _time(w["status"].get("retryAfter"))


def waiting(w: Wire, now: datetime, succeeded: set[Key]) -> bool:
    """Whether a pending Job must not be placed yet: suspended, deleting, in back-off, or a
    dependency has not succeeded (checked here, not trusted from a status field)."""
    retry_after = _retry_after(w)
    namespace = _key(w)[0]
    return bool(
        w["spec"].get("suspend")
        or w["metadata"].get("deletionTimestamp")
        or (retry_after is not None and retry_after > now)
        or any((namespace, d) not in succeeded for d in w["spec"].get("dependsOn", []))
    )


def _succeeded_dependencies(reader: store.Store, pending: list[Wire]) -> set[Key]:
    wanted = {(_key(w)[0], d) for w in pending for d in w["spec"].get("dependsOn", [])}
    found = set()
    for namespace, name in wanted:
        other = reader.find(job.Job, name, namespace)
        if other is not None and other.status.phase == "Succeeded":
            found.add((namespace, name))
    return found


# -- 3. apply ----------------------------------------------------------------------------------


def _apply(
    writer: store.Store,
    decisions: list[placement.Decision],
    by_key: dict[Key, Wire],
    world: World,
    now: datetime,
    *,
    budget: _Budget,
) -> None:
    """Binds first, then preemptions, then what waiting Jobs are told, in queue order."""
    pools = world.snapshot.pools
    placed = [d for d in decisions if d.placement is not None]
    for count, d in enumerate(placed):
        if count and budget.late():
            return  # the rest, and what waiting Jobs are told, next pass
        assert d.placement is not None
        chosen = job.Job.model_validate(by_key[(d.request.namespace, d.request.name)])
        _bind(writer, chosen, d.placement, pools.get(d.request.pool) or placement.Pool(), now)
    for d in decisions:
        if d.victims:
            _preempt(writer, d, by_key, world)
    for d in decisions:
        if d.placement is None:
            _report(writer, by_key[(d.request.namespace, d.request.name)], d, now, budget)


def _bind(
    writer: store.Store,
    j: job.Job,
    decision: placement.Placement,
    rules: placement.Pool,
    now: datetime,
) -> None:
    attempt = j.status.attempts + 1
    writer.create(attempt_of(j, attempt, decision, rules))
    if job.FINALIZER not in j.metadata.finalizers:
        j.metadata.finalizers = [*j.metadata.finalizers, job.FINALIZER]
        j = writer.update(j)
    status = j.status
    status.phase = "Scheduled"
    status.attempts = attempt
    status.node = decision.node
    status.gpus = list(decision.gpus)
    status.retry_after = None
    # activeDeadlineSeconds counts from the first bind (time in the queue does not count) and
    # is never reset by a retry.
    status.start_time = status.start_time or now
    status.reason = None
    status.message = None
    status.estimated_start_time = None
    gpus = ",".join(str(g) for g in decision.gpus) or "none"
    message = f"attempt {attempt} bound to {decision.node}, GPUs [{gpus}]"
    meta.set_condition(
        status.conditions,
        job.CONDITION_SCHEDULED,
        "True",
        "Bound",
        message,
        generation=j.metadata.generation,
        now=now,
    )
    j = writer.update_status(j)
    writer.record_event(j, "Scheduled", message, source=SOURCE)


def attempt_of(
    j: job.Job, attempt: int, decision: placement.Placement, rules: placement.Pool
) -> binding.Binding:
    """The Binding of one attempt: `<job>-<attempt>`, so two passes cannot both bind it."""
    return binding.Binding(
        metadata=meta.ObjectMeta(
            name=f"{j.name}-{attempt}", namespace=j.namespace, labels={"gctl/job": j.name}
        ),
        spec=binding.BindingSpec(
            job_name=j.name,
            job_uid=j.metadata.uid or "",
            attempt=attempt,
            node=decision.node,
            gpus=list(decision.gpus),
            gpu_share=decision.share,
            gpu_memory=decision.request.gpu_memory,  # as resolved, profile included
            enforce_gpu_memory=rules.enforce_gpu_memory,
        ),
    )


def _preempt(
    writer: store.Store, d: placement.Decision, by_key: dict[Key, Wire], world: World
) -> None:
    """Ask the victims' agents to stop them (CAS on each Binding) and say who did it."""
    who = f"{d.request.namespace}/{d.request.name}"
    for victim in d.victims:
        attempt = world.bindings.get((victim.namespace, victim.binding))
        if attempt is None or attempt.spec.stop_reason is not None:
            continue
        attempt.spec.stop_reason = binding.STOP_PREEMPTED
        writer.update(attempt)
        owner = world.running.get((victim.namespace, victim.job))
        if owner is not None:
            gpus = ",".join(str(g) for g in victim.gpus)
            writer.record_event(
                job.Job.model_validate(owner),
                job.REASON_PREEMPTED,
                f"preempted by {who} (priority {d.request.priority}) to free GPUs [{gpus}] "
                f"on {victim.node}",
                source=SOURCE,
            )
    preemptor = job.Job.model_validate(by_key[(d.request.namespace, d.request.name)])
    writer.record_event(preemptor, "Preempting", d.message, source=SOURCE)


def _report(
    writer: store.Store, w: Wire, d: placement.Decision, now: datetime, budget: _Budget
) -> None:
    """Tell a waiting Job why, where it stands and when it should start, if that changed."""
    if not stale(w, d, now):
        return
    if not budget.take():
        return  # the next pass writes it
    j = job.Job.model_validate(w)
    status = j.status
    meta.set_condition(
        status.conditions,
        job.CONDITION_SCHEDULED,
        "False",
        d.reason,
        d.message,
        generation=j.metadata.generation,
        now=now,
    )
    status.estimated_start_time = d.estimated_start
    if d.reason in OWN_REASONS:
        status.reason, status.message = d.reason, d.message
    elif status.reason in OWN_REASONS:
        status.reason, status.message = None, None
    writer.update_status(j)


def stale(w: Wire, d: placement.Decision, now: datetime) -> bool:
    """Whether what a waiting Job's status says differs from the decision enough to write.

    A waiting Job is rewritten only when the reason or the gist of the message changes, or
    its estimate moves by more than 10 % of the time left (at least 30 s): a Job ending must
    not rewrite the queue behind it. Its place in the queue is not stored at all."""
    status = w["status"]
    said = next(
        (c for c in status.get("conditions", []) if c["type"] == job.CONDITION_SCHEDULED), None
    )
    if said is None or (said["status"], said.get("reason"), said.get("observedGeneration")) != (
        "False",
        d.reason,
        w["metadata"].get("generation"),
    ):
        return True
    if placement.gist(said.get("message", "")) != placement.gist(d.message):
        return True
    if _drifted(_time(status.get("estimatedStartTime")), d.estimated_start, now):
        return True
    mine = (d.reason, d.message) if d.reason in OWN_REASONS else None
    has = status.get("reason"), status.get("message")
    return has != mine if mine else has[0] in OWN_REASONS


def _drifted(old: datetime | None, new: datetime | None, now: datetime) -> bool:
    if old is None or new is None:
        return old != new
    slack = max(timedelta(seconds=30), (new - now) / 10)
    return abs(old - new) > slack


def _forget_queue(writer: store.Store, held: Iterable[Wire], budget: _Budget) -> None:
    """A Job held back (suspended, in back-off, waiting for dependencies) has no place in the
    queue and no estimated start."""
    for w in held:
        status = w["status"]
        if status.get("estimatedStartTime") is None:
            continue
        if not budget.take():
            return
        j = job.Job.model_validate(w)
        j.status.estimated_start_time = None
        writer.update_status(j)


def _next_retry(pending: list[Wire], now: datetime) -> datetime | None:
    times = [t for t in map(_retry_after, pending) if t is not None and t > now]
    return min(times) + timedelta(milliseconds=1) if times else None
