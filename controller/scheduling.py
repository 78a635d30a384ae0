"""The scheduling pass: read a snapshot, let `placement` decide, then apply it with compare-and-set.

A pass runs in three steps (on SQLite the first two in a read transaction and the third in a
write transaction, so that its reads hold no writer back: `run`; elsewhere all three in one):

1. read (`reading`): the pending Jobs as stored (unvalidated: a pass looks at every one of them,
   so it pays only for those it writes), Nodes, GPUPools, GPUProfiles, the active Bindings and
   their Jobs, and the run times of recent successful Jobs;
2. plan: `placement.plan`, a pure function of that snapshot;
3. apply: each placement creates the attempt's Binding (named `<job>-<attempt>`, unique, so a
   second controller racing on the same attempt fails) and moves the Job to Scheduled with the
   CAS of the Job it read; each preemption sets `stopReason: Preempted` on its victims'
   Bindings; each Job left waiting gets its Scheduled=False condition and estimated start,
   written only when they changed (`telling`; its place in the queue is not stored:
   gctl.api.queue).

A pass binds at most `Limits.binds` Jobs, writes at most `Limits.writes` waiting Jobs and starts
no write after `Limits.seconds` of writing (as Slurm's scheduler stops after so many starts or
so much time per cycle); it then returns `now`, so the controller runs the next pass at once
and no single transaction holds the database for long. A pass that binds a Job that starts now
leaves binding ahead and telling waiting Jobs to the next pass too (`_starting`), which it
makes due `FOLLOW_UP` after its own start rather than at once.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from controller import jobs, placement, reading, telling
from gctl.api import binding, errors, job, meta, queue
from gctl.store import bulk, db, store, stored

SOURCE = "controller/scheduler"
# A Job bound ahead went back to waiting: its place went to a Job ahead of it, or no longer
# suits it.
REASON_UNBOUND = "Unbound"

Wire = reading.Wire
Key = reading.Key


BATCH = 64  # binds written together (a pass checks its time limit between batches)
# A pass that binds Jobs to start now writes only those (`_starting`); the pass that binds
# ahead and tells the waiting Jobs why is due this long after its start, not at once:
# meanwhile the agent starts those Jobs, which would otherwise share the CPU with it. An exit
# or a new Job runs a pass sooner, as always.
FOLLOW_UP = timedelta(milliseconds=50)
# A Job that waits on what the GPUs report (memory held by processes outside gctl, a pool's
# utilization or memory-used limit) is decided again this often: those readings change with
# every heartbeat, which does not wake the controller (it would run a pass per heartbeat).
METRICS_RECHECK = timedelta(seconds=5)


@dataclass(frozen=True)
class Limits:
    """How much one pass may do before it leaves the rest to the next one."""

    binds: int = 512  # Jobs bound
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
    follow_up: bool = False  # what was left is binding ahead and telling (`FOLLOW_UP`)

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


def schedule(
    writer: store.Store,
    now: datetime,
    limits: Limits = LIMITS,
    aside: reading.SetAside | None = None,
) -> datetime | None:
    """One pass in one transaction; returns when the next one is due: `now` when work was
    left for it (`now + FOLLOW_UP` when the pass started Jobs and left the rest), else when
    the next back-off ends, if any. The stored objects that do not validate are left out
    (`reading.SetAside`): a Job that fails as the pass writes it raises StoredInvalid, and the
    next pass, given it in `aside.versions`, leaves it out too."""
    aside = aside if aside is not None else reading.SetAside()
    with bulk.collector_paused():  # some hundred thousand objects over 10,000 pending Jobs
        writer.lock_scheduling()
        return _write(writer, _plan(writer, now, limits, aside), now, limits)


def run(
    database: db.Database,
    now: datetime,
    limits: Limits = LIMITS,
    aside: reading.SetAside | None = None,
) -> tuple[datetime | None, int | None]:
    """The controller's pass: as `schedule`, and the revision it wrote at, if it wrote.

    SQLite has one writer at a time, and a pass that read and planned under the write lock
    held every other writer (an apply, an agent's report) for all of it: seconds over a queue
    of 100,000 Jobs. There the pass reads and plans in a read transaction, and only its writes
    take the lock. They are guarded as every write is (the CAS of each Job and Binding it
    read), and what no CAS sees, a Binding another pass made meanwhile (a second controller on
    the same file) or a Node deleted, makes it plan again from a fresh read (`RACES`). After
    `OPTIMISTIC_TRIES` such tries it reads under the lock, as on PostgreSQL, where reads never
    hold writers back and a pass is one transaction under its advisory lock."""
    aside = aside if aside is not None else reading.SetAside()
    if database.dialect == "sqlite":
        for _ in range(OPTIMISTIC_TRIES):
            aside.found.clear()  # of the last try
            with bulk.collector_paused():
                with database.read() as session:
                    reader = store.Store(session)
                    since = reader.current_revision()
                    planned = _plan(reader, now, limits, aside)
                try:
                    with database.write() as session:
                        writer = store.Store(session)
                        if writer.changed_since(since, RACES):
                            raise PassRaced
                        due = _write(writer, planned, now, limits)
                        return due, writer.written_revision
                except (errors.Conflict, PassRaced):
                    continue
    written: list[int | None] = [None]

    def locked(writer: store.Store) -> datetime | None:
        aside.found.clear()  # of an earlier try
        due = schedule(writer, now, limits, aside)
        written[0] = writer.written_revision
        return due

    return store.transact(database, locked), written[0]


class PassRaced(Exception):
    """A pass's plan may no longer hold (`RACES`) though no CAS of its writes would fail."""


OPTIMISTIC_TRIES = 3
# Writes between a pass's read and its own that its plan cannot survive and no CAS of its
# writes sees: a Binding made by another pass (its GPUs are taken) and a Node deleted (bind
# nothing to a Node that is gone).
RACES = (("Binding", "ADDED"), ("Node", "DELETED"))


@dataclass
class _Planned:
    """What a pass read and decided, for its writes."""

    held: list[Wire]
    decisions: list[placement.Decision]
    by_key: dict[Key, Wire]
    world: reading.World | None
    complete: bool = True
    on_metrics: bool = False  # a Job waits on what the GPUs report (`METRICS_RECHECK`)


def _plan(reader: store.Store, now: datetime, limits: Limits, aside: reading.SetAside) -> _Planned:
    pending = reader.pending_wires()
    if aside.versions:
        pending = [w for w in pending if not aside.holds(w)]
    reading.REQUESTS.begin(len(pending))
    telling.TOLD.begin(len(pending))
    eligible: list[Wire] = []
    held: list[Wire] = []
    try:  # a malformed Job fails here as one that does not validate, to be set aside
        succeeded = reading.succeeded_dependencies(reader, pending)
        for w in pending:
            (held if queue.held(w, now, succeeded) else eligible).append(w)
    except Exception:
        reading.raise_invalid(pending)
        raise
    if not eligible and not reader.any_queued_bindings():
        return _Planned(held, [], {}, None)
    world = reading.read_world(reader, aside)
    by_key = {reading.key(w): w for w in eligible}
    requests = reading.requests_of(eligible, world)
    for request, w in reading.queued_requests(world, aside):
        by_key[reading.key(w)] = w
        requests.append(request)
    result = placement.plan(world.snapshot, requests, now, max_placements=limits.binds)
    foreign = any(g.foreign_memory for g in world.snapshot.gpus)
    pools = world.snapshot.pools
    on_metrics = any(_waits_on_metrics(d, pools, foreign) for d in result.decisions)
    return _Planned(held, result.decisions, by_key, world, result.complete, on_metrics)


def _write(
    writer: store.Store, planned: _Planned, now: datetime, limits: Limits
) -> datetime | None:
    budget = _Budget.of(limits)  # the time limit counts from the first write
    if planned.world is not None:
        _apply(writer, planned.decisions, planned.by_key, planned.world, now, budget=budget)
    telling.forget_queue(writer, planned.held, budget.take)
    if planned.complete and budget.follow_up:
        return now + FOLLOW_UP
    if not planned.complete or budget.short:
        return now
    due = _next_retry(planned.held, now)
    if planned.on_metrics:
        due = min(due or now + METRICS_RECHECK, now + METRICS_RECHECK)
    return due


def _waits_on_metrics(
    d: placement.Decision, pools: dict[str, placement.Pool], foreign: bool
) -> bool:
    """Whether a waiting Job may fit once a GPU reports less load: it asks for GPU memory while
    processes outside gctl hold some (`foreign`), or its pool has utilization or memory-used
    limits."""
    if d.placement is not None or d.reason != job.REASON_UNSCHEDULABLE:
        return False
    if d.request.gpu_memory is not None and foreign:
        return True
    rules = pools.get(d.request.pool)
    return rules is not None and (
        rules.max_utilization_percent is not None or rules.max_memory_used_percent is not None
    )


# -- 3. apply ----------------------------------------------------------------------------------


def _apply(
    writer: store.Store,
    decisions: list[placement.Decision],
    by_key: dict[Key, Wire],
    world: reading.World,
    now: datetime,
    *,
    budget: _Budget,
) -> None:
    """Jobs bound ahead that move or wait again give up their places first; then binds,
    preemptions, and what waiting Jobs are told, in queue order."""
    pools = world.snapshot.pools
    held = _held_back(decisions, world)
    changed = [d for d in decisions if placement.changes(d)]
    giving_up = []
    for d in changed:
        queued = d.request.queued
        if queued is None:
            continue
        shared = world.bindings[(queued.namespace, queued.binding)]
        if binding.armed(shared.status):
            jobs.ask_back(writer, shared.model_copy(deep=True))
        elif id(d) not in held:
            giving_up.append(d)
    _give_up_places(writer, giving_up, by_key, world, now, takers=_takers(changed))
    _rearmable(writer, decisions, world)
    decisions = [d for d in decisions if id(d) not in held]
    created: dict[Key, str] = {}  # (namespace, Job) -> uid of the Binding made for it
    batch: list[tuple[placement.Decision, job.Job]] = []
    placed = [d for d in changed if d.placement is not None and id(d) not in held]
    starting = _starting(placed)
    if starting:
        placed = [d for d in placed if not _ahead(d)]
    late = False
    for count, d in enumerate(placed):
        # A Job that moves has given up its place already: it is bound whatever the time.
        # Other binds, and what waiting Jobs are told, wait for the next pass once it is late.
        if d.request.queued is None and (late or (count and budget.late())):
            late = True
            continue
        if len(batch) >= BATCH or _waits_for(d, batch):
            _bind(writer, batch, pools, created, now)
            batch = []
        batch.append((d, stored.validated(job.Job, by_key[(d.request.namespace, d.request.name)])))
    _bind(writer, batch, pools, created, now)
    if late:
        return
    if not _preempt(writer, [d for d in decisions if d.victims], by_key, world, budget):
        return
    if starting and _more_to_write(decisions, by_key, now):
        budget.short = budget.follow_up = True
        return
    # One statement for all that waiting Jobs are told, at the end of the block: the time
    # limit does not see these writes, `Limits.writes` bounds them.
    with writer.batched():
        for d in decisions:
            if d.placement is None:
                telling.report(
                    writer, by_key[(d.request.namespace, d.request.name)], d, now, budget.take
                )


def _ahead(d: placement.Decision) -> bool:
    """A new Job bound ahead (one that moves has given up its place, and is bound at once)."""
    return d.request.queued is None and d.placement is not None and bool(d.placement.after)


def _starting(placed: list[placement.Decision]) -> bool:
    """Whether the pass binds a Job that starts now. Its Binding is then all the pass writes
    besides preemptions: what is bound ahead and what waiting Jobs are told wait for the next
    pass (`FOLLOW_UP`), so that the agent can start it a transaction earlier (the first pass
    over a new queue of 200 Jobs took 100 ms, a third of it telling the other 190 why they
    wait)."""
    return any(d.placement is not None and not d.placement.after for d in placed)


def _more_to_write(
    decisions: list[placement.Decision], by_key: dict[Key, Wire], now: datetime
) -> bool:
    """Whether the pass left a Job bound ahead or a waiting Job to tell for the next."""
    return any(
        _ahead(d)
        if d.placement is not None
        else not telling.told(by_key[(d.request.namespace, d.request.name)], d, now)
        for d in decisions
    )


def _held_back(decisions: list[placement.Decision], world: reading.World) -> set[int]:
    """The decisions (by id) this pass does not apply: an armed attempt it wants elsewhere is
    asked back, not removed, and until its agent gives it back its supervisor may start it on
    its GPUs at any moment. So whatever the plan built on those GPUs freeing waits for the next
    pass too: placements and preemptions on them, Jobs placed after a held one, and what the
    asked-back Job itself would do (its move, its victims, being told it waits)."""
    asked = [
        d
        for d in decisions
        if (queued := d.request.queued) is not None
        and placement.changes(d)
        and binding.armed(world.bindings[(queued.namespace, queued.binding)].status)
    ]
    if not asked:
        return set()
    gpus = {(a.node, g) for d in asked if (a := d.request.queued) is not None for g in a.gpus}
    held = {id(d) for d in asked}
    held_requests = {id(d.request) for d in asked}
    grew = True
    while grew:  # a Job placed after a held one is held, and so on down the chain
        grew = False
        for d in decisions:
            if id(d) in held:
                continue
            p = d.placement
            touched = [(v.node, g) for v in d.victims for g in v.gpus]
            if p is not None:
                touched += [(p.node, g) for g in p.gpus]
            behind = p is not None and any(id(before) in held_requests for before in p.after)
            if behind or any(place in gpus for place in touched):
                held.add(id(d))
                held_requests.add(id(d.request))
                grew = True
    return held


def _rearmable(
    writer: store.Store, decisions: list[placement.Decision], world: reading.World
) -> None:
    """An attempt given back by its agent that this pass leaves where it is may be armed
    again: its request for it back is cleared."""
    for d in decisions:
        queued = d.request.queued
        if queued is None or placement.changes(d):
            continue
        shared = world.bindings[(queued.namespace, queued.binding)]
        if shared.spec.disarm and binding.queued(shared.spec, shared.status):
            attempt = shared.model_copy(deep=True)
            attempt.spec.disarm = False
            writer.update(attempt)


def _uids(d: placement.Decision, created: dict[Key, str]) -> list[str]:
    """The Binding uids of the attempts a Job bound ahead starts after."""
    assert d.placement is not None
    uids = []
    for before in d.placement.after:
        if isinstance(before, placement.Allocation):
            uids.append(before.uid)
        elif (uid := created.get((before.namespace, before.name))) is not None:
            uids.append(uid)
        elif before.queued is not None:  # bound ahead before, starting there now
            uids.append(before.queued.uid)
    return uids


def _takers(placed: list[placement.Decision]) -> dict[tuple[str, int], placement.Request]:
    """(node, GPU) -> the Job this pass binds there, ahead or to start now."""
    return {
        (d.placement.node, gpu): d.request
        for d in placed
        if d.placement is not None
        for gpu in d.placement.gpus
    }


def _give_up_places(
    writer: store.Store,
    giving_up: list[placement.Decision],
    by_key: dict[Key, Wire],
    world: reading.World,
    now: datetime,
    *,
    takers: dict[tuple[str, int], placement.Request],
) -> None:
    """Remove the Bindings of Jobs bound ahead that move or wait again, exactly as read: if
    an agent took one meanwhile (Starting), the write conflicts and the pass runs again from a
    fresh read. A Job that waits again goes back to Pending, the attempt unmade, its Event
    naming the Job bound in its place (`takers`); their statuses and Events are written
    together (1,000 Jobs losing their places to Jobs of higher priority
    took 2 s one by one)."""
    for d in giving_up:
        queued = d.request.queued
        assert queued is not None
        writer.remove(world.bindings[(queued.namespace, queued.binding)])
    with writer.batched():
        for d in giving_up:
            if d.placement is None:  # one that moves: `_bind` rewrites its Job
                _waits_again(writer, d, by_key, now, takers)


def _waits_again(
    writer: store.Store,
    d: placement.Decision,
    by_key: dict[Key, Wire],
    now: datetime,
    takers: dict[tuple[str, int], placement.Request],
) -> None:
    queued = d.request.queued
    assert queued is not None
    j = stored.validated(job.Job, by_key[(d.request.namespace, d.request.name)])
    status = j.status
    gpus = ",".join(str(g) for g in queued.gpus)
    taken = {
        taker.name if taker.namespace == d.request.namespace else f"{taker.namespace}/{taker.name}"
        for g in queued.gpus
        if (taker := takers.get((queued.node, g))) is not None and taker is not d.request
    }
    given = f" to {', '.join(sorted(taken))}" if taken else ""
    message = (
        f"attempt {status.attempts}, bound ahead to {queued.node} GPUs [{gpus}], gave up its "
        f"place{given}: {d.message or d.reason}"
    )
    status.phase = "Pending"
    status.attempts -= 1
    status.node = None
    status.gpus = None
    meta.set_condition(
        status.conditions,
        job.CONDITION_SCHEDULED,
        "False",
        d.reason or job.REASON_UNSCHEDULABLE,
        d.message,
        generation=j.metadata.generation,
        now=now,
    )
    j = writer.update_status(j)
    by_key[(d.request.namespace, d.request.name)] = j.wire()  # told why it waits: done
    writer.record_event(j, REASON_UNBOUND, message, source=SOURCE)


def _waits_for(d: placement.Decision, batch: list[tuple[placement.Decision, job.Job]]) -> bool:
    """Whether the Job, bound ahead, starts after one of the batch: its Binding, named by uid
    in this one's, must be made first."""
    assert d.placement is not None
    batched = {id(b.request) for b, _ in batch}
    return any(id(before) in batched for before in d.placement.after)


def _bind(
    writer: store.Store,
    batch: list[tuple[placement.Decision, job.Job]],
    pools: dict[str, placement.Pool],
    created: dict[Key, str],
    now: datetime,
) -> None:
    """Bind each Job's next attempt (or, for a Job bound ahead that moves, the same attempt
    again) and move it to Scheduled: one write per kind of object for the whole batch. Notes
    the new Bindings' uids in `created`."""
    if not batch:
        return
    attempts, jobs, events = [], [], []
    for d, j in batch:
        assert d.placement is not None
        rules = pools.get(d.request.pool) or placement.Pool()
        after = _uids(d, created)
        attempt, message = _bound(j, d.placement, now, after=after)
        attempts.append(attempt_of(j, attempt, d.placement, rules, after))
        jobs.append(j)
        events.append(store.Occurrence(j, "Scheduled", message, source=SOURCE))
    for (d, _), made in zip(batch, writer.create_many(attempts), strict=True):
        created[(d.request.namespace, d.request.name)] = made.metadata.uid or ""
    writer.write_back(jobs)
    writer.record_events(events)


def _bound(
    j: job.Job, decision: placement.Placement, now: datetime, *, after: list[str]
) -> tuple[int, str]:
    """The Job as its attempt's bind leaves it (changed in place): Scheduled, finalizer on.
    Returns the attempt and what the event says."""
    moved = decision.request.queued
    attempt = j.status.attempts if moved is not None else j.status.attempts + 1
    if job.FINALIZER not in j.metadata.finalizers:
        j.metadata.finalizers = [*j.metadata.finalizers, job.FINALIZER]
    status = j.status
    status.phase = "Scheduled"
    status.attempts = attempt
    status.node = decision.node
    status.gpus = list(decision.gpus)
    status.retry_after = None
    # The exit code is the last ended attempt's: kept while the Job waits in the queue (it
    # says how the attempt before ended), gone once a new attempt is bound, until it ends.
    status.exit_code = None
    # activeDeadlineSeconds counts from the start of the Job's run (time in the queue does not
    # count): its first start, kept by a retry after a failure, cleared by a requeue that
    # counts none (suspend, preemption, eviction, a lost attempt: controller.jobs), so the
    # next bind starts a run again. A Job bound ahead starts when its agent starts it.
    if not after:
        status.start_time = status.start_time or now
    status.reason = None
    status.message = None
    status.estimated_start_time = None
    gpus = ",".join(str(g) for g in decision.gpus) or "none"
    message = f"attempt {attempt} bound to {decision.node}, GPUs [{gpus}]"
    if decision.after:
        names = sorted({f"{b.namespace}/{_job_of(b)}" for b in decision.after})
        message += f", to start when {', '.join(names)} end" + ("s" if len(names) == 1 else "")
    meta.set_condition(
        status.conditions,
        job.CONDITION_SCHEDULED,
        "True",
        "Bound",
        message,
        generation=j.metadata.generation,
        now=now,
    )
    if any(c.type == job.CONDITION_SUSPENDED and c.status == "True" for c in status.conditions):
        # Resumed and bound before the Job's own reconcile said so: bound, it is not suspended.
        meta.set_condition(
            status.conditions,
            job.CONDITION_SUSPENDED,
            "False",
            "Resumed",
            generation=j.metadata.generation,
            now=now,
        )
    if moved is not None:
        was = ",".join(str(g) for g in moved.gpus)
        message += f" (moved from {moved.node} GPUs [{was}], where it was bound ahead)"
    return attempt, message


def _job_of(before: "placement.Allocation | placement.Request") -> str:
    return before.job if isinstance(before, placement.Allocation) else before.name


def attempt_of(
    j: job.Job,
    attempt: int,
    decision: placement.Placement,
    rules: placement.Pool,
    after: list[str] | None = None,
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
            after=after or [],
        ),
    )


def _preempt(
    writer: store.Store,
    preempting: list[placement.Decision],
    by_key: dict[Key, Wire],
    world: reading.World,
    budget: _Budget,
) -> bool:
    """Ask the victims' agents to stop them (CAS on each Binding) and say who did it, BATCH
    preemptors at a time, their Events together. Returns False when the pass ran out of time:
    the rest is the next pass's to decide again (a burst of 1,000 Jobs of higher priority over
    1,000 busy GPUs wrote for 6 s, holding the write lock)."""
    for start in range(0, len(preempting), BATCH):
        if start and budget.late():
            return False
        said: list[tuple[job.Job, str, str]] = []
        for d in preempting[start : start + BATCH]:
            who = f"{d.request.namespace}/{d.request.name}"
            for victim in d.victims:
                shared = world.bindings.get((victim.namespace, victim.binding))
                if shared is None or shared.spec.stop_reason is not None:
                    continue
                attempt = shared.model_copy(deep=True)
                attempt.spec.stop_reason = binding.STOP_PREEMPTED
                writer.update(attempt)
                owner = world.running.get((victim.namespace, victim.job))
                if owner is not None:
                    gpus = ",".join(str(g) for g in victim.gpus)
                    said.append(
                        (
                            stored.validated(job.Job, owner),
                            job.REASON_PREEMPTED,
                            f"preempted by {who} (priority {d.request.priority}) to free GPUs "
                            f"[{gpus}] on {victim.node}",
                        )
                    )
            preemptor = stored.validated(job.Job, by_key[(d.request.namespace, d.request.name)])
            said.append((preemptor, "Preempting", d.message))
        with writer.batched():
            for involved, reason, message in said:
                writer.record_event(involved, reason, message, source=SOURCE)
    return True


def _next_retry(pending: list[Wire], now: datetime) -> datetime | None:
    times = [t for t in map(reading.retry_after, pending) if t is not None and t > now]
    return min(times) + timedelta(milliseconds=1) if times else None
