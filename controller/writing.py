"""Step 3 of a scheduling pass, writing: the plan applied with compare-and-set.

`apply` takes the pass's decisions in queue order. Jobs bound ahead that move or wait again give
up their places first (their Bindings removed as read; one that waits again goes back to
Pending, `REASON_UNBOUND`). Each placement then creates the attempt's Binding (`members_of`:
named `<job>-<attempt>`, unique, so a second controller racing on the same attempt fails; a
multi-node Job's attempt one per member, all in one transaction) and
moves the Job to Scheduled with the CAS of the Job it read, `BATCH` Jobs at a time; each
preemption sets `stopReason: Preempted` on its victims' Bindings; each Job left waiting gets its
Scheduled=False condition and estimated start, written only when they changed (`telling`).
What the pass may still write is its `Budget` (`scheduling.Limits`); what it leaves is the next
pass's.
"""

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import datetime

from controller import jobs, placement, reading, telling
from gctl.api import binding, job, meta
from gctl.store import store, stored

SOURCE = "controller/scheduler"
# A Job bound ahead went back to waiting: its place went to a Job ahead of it, or no longer
# suits it.
REASON_UNBOUND = "Unbound"

Wire = reading.Wire
Key = reading.Key
Created = tuple[str, str, str]

BATCH = 64  # binds written together (a pass checks its time limit between batches)


@dataclass
class Budget:
    """What is left to a pass of its limits on writing (`scheduling.Limits`)."""

    writes: int  # waiting Jobs whose status it may still write
    seconds: float | None  # of writing, after which it starts no more writes
    clock: Callable[[], float]
    started: float
    short: bool = False  # work was left for the next pass
    follow_up: bool = False  # what was left is binding ahead and telling (`scheduling.FOLLOW_UP`)

    @classmethod
    def of(cls, writes: int, seconds: float | None, clock: Callable[[], float]) -> "Budget":
        """A budget whose time counts from now."""
        return cls(writes, seconds, clock, clock())

    def late(self) -> bool:
        if self.seconds is not None and self.clock() - self.started > self.seconds:
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


def apply(
    writer: store.Store,
    decisions: list[placement.Decision],
    by_key: MutableMapping[Key, Wire],
    world: reading.World,
    now: datetime,
    *,
    budget: Budget,
    undecided: int = 0,
) -> None:
    """Jobs bound ahead that move or wait again give up their places first; then binds,
    preemptions, and what waiting Jobs are told, in queue order. `undecided`: requests the
    plan left for the next pass, after these decisions."""
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
    _give_up_places(writer, giving_up, by_key, world, now, takers=_takers(decisions))
    _rearmable(writer, decisions, world)
    decisions = [d for d in decisions if id(d) not in held]
    # (namespace, Job, node) -> uid of the Binding made for it there (a multi-node Job's
    # attempt has one on each of its nodes)
    created: dict[Created, str] = {}
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
            _bind(writer, batch, pools, created, now, addresses=world.addresses)
            batch = []
        batch.append((d, stored.validated(job.Job, by_key[(d.request.namespace, d.request.name)])))
    _bind(writer, batch, pools, created, now, addresses=world.addresses)
    if late:
        return
    if not _preempt(writer, [d for d in decisions if d.victims], by_key, world, budget):
        return
    if starting and (undecided or _more_to_write(decisions, by_key, now)):
        budget.short = budget.follow_up = True
        return
    # One statement for all that waiting Jobs are told, at the end of the block: the time
    # limit does not see these writes, `scheduling.Limits.writes` bounds them.
    with writer.batched():
        for d in decisions:
            if d.placement is None:
                telling.report(
                    writer, by_key[(d.request.namespace, d.request.name)], d, now, budget.take
                )


def starts(decisions: list[placement.Decision], world: reading.World) -> bool:
    """Whether `apply` would bind a Job that starts now (`_starting`), none held back."""
    held = _held_back(decisions, world)
    return _starting(
        [d for d in decisions if placement.changes(d) and d.placement and id(d) not in held]
    )


def _ahead(d: placement.Decision) -> bool:
    """A new Job bound ahead (one that moves has given up its place, and is bound at once)."""
    return d.request.queued is None and d.placement is not None and bool(d.placement.after)


def _starting(placed: list[placement.Decision]) -> bool:
    """Whether the pass binds a Job that starts now. Its Binding is then all the pass writes
    besides preemptions: what is bound ahead and what waiting Jobs are told wait for the next
    pass (`scheduling.FOLLOW_UP`), so that the agent can start it a transaction earlier (the
    first pass over a new queue of 200 Jobs took 100 ms, a third of it telling the other 190
    why they wait)."""
    return any(d.placement is not None and not d.placement.after for d in placed)


def _more_to_write(
    decisions: list[placement.Decision], by_key: MutableMapping[Key, Wire], now: datetime
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
            if p is not None:  # every member of a multi-node Job
                touched += [(node, g) for node, gpus in p.ranks() for g in gpus]
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
    again: its request for it back is cleared (for all of them in one statement)."""
    rearmed: list[binding.Binding] = []
    for d in decisions:
        queued = d.request.queued
        if queued is None or placement.changes(d):
            continue
        shared = world.bindings[(queued.namespace, queued.binding)]
        if shared.spec.disarm and binding.queued(shared.spec, shared.status):
            attempt = shared.model_copy(deep=True)
            attempt.spec.disarm = False
            rearmed.append(attempt)
    writer.update_many(rearmed)


def _uids(d: placement.Decision, created: dict[Created, str]) -> list[str]:
    """The Binding uids of the attempts a Job bound ahead starts after."""
    assert d.placement is not None
    uids = []
    for before in d.placement.after:
        if isinstance(before, placement.Allocation):
            uids.append(before.uid)
        elif (uid := created.get((before.namespace, before.name, d.placement.node))) is not None:
            uids.append(uid)
        elif before.queued is not None:  # bound ahead before, starting there now
            uids.append(before.queued.uid)
    return uids


def _takers(decisions: list[placement.Decision]) -> dict[tuple[str, int], placement.Request]:
    """(node, GPU) -> the Job this pass binds there (ahead, or to start now), else the one it
    holds it for (a Job that preempts, waits for a job stopping, or reserves)."""
    found: dict[tuple[str, int], placement.Request] = {}
    for d in decisions:
        if d.placement is not None:  # every member of a multi-node Job
            found.update(
                ((node, gpu), d.request) for node, gpus in d.placement.ranks() for gpu in gpus
            )
    for d in decisions:
        for held in d.held:
            found.setdefault(held, d.request)
    return found


def _give_up_places(
    writer: store.Store,
    giving_up: list[placement.Decision],
    by_key: MutableMapping[Key, Wire],
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
    attempts = []
    for d in giving_up:
        queued = d.request.queued
        assert queued is not None
        attempts.append(world.bindings[(queued.namespace, queued.binding)])
    writer.remove_many(attempts)
    with writer.batched():
        for d in giving_up:
            if d.placement is None:  # one that moves: `_bind` rewrites its Job
                _waits_again(writer, d, by_key, now, takers)


def _waits_again(
    writer: store.Store,
    d: placement.Decision,
    by_key: MutableMapping[Key, Wire],
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
    created: dict[Created, str],
    now: datetime,
    *,
    addresses: dict[str, str],
) -> None:
    """Bind each Job's next attempt (or, for a Job bound ahead that moves, the same attempt
    again) and move it to Scheduled: one write per kind of object for the whole batch. Notes
    the new Bindings' uids in `created`."""
    if not batch:
        return
    attempts: list[binding.Binding] = []
    jobs, events = [], []
    for d, j in batch:
        assert d.placement is not None
        rules = pools.get(d.request.pool) or placement.Pool()
        after = _uids(d, created)
        attempt, message = _bound(j, d.placement, now, after=after)
        attempts.extend(
            members_of(j, attempt, d.placement, rules, after=after, addresses=addresses)
        )
        jobs.append(j)
        events.append(store.Occurrence(j, "Scheduled", message, source=SOURCE))
    for made in writer.create_many(attempts):
        created[(made.namespace, made.spec.job_name, made.spec.node)] = made.metadata.uid or ""
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
    status.nodes = [node for node, _ in decision.ranks()] if decision.members else None
    status.retry_after = None
    # The exit code is the last ended attempt's: kept while the Job waits in the queue (it
    # says how the attempt before ended), gone once a new attempt is bound, until it ends.
    status.exit_code = None
    # activeDeadlineSeconds counts from the start of the Job's run (time in the queue does not
    # count): its first start, kept by a retry after a failure, cleared by a requeue that
    # counts none (suspend, preemption, eviction, a lost attempt: controller.outcomes), so the
    # next bind starts a run again. A Job bound ahead starts when its agent starts it.
    if not after:
        status.start_time = status.start_time or now
    status.reason = None
    status.message = None
    status.estimated_start_time = None
    where = [
        f"{node}, GPUs [{','.join(str(g) for g in gpus) or 'none'}]"
        for node, gpus in decision.ranks()
    ]
    if len(where) == 1:
        message = f"attempt {attempt} bound to {where[0]}"
    else:  # a multi-node Job: its members by rank
        message = f"attempt {attempt} bound to {len(where)} nodes: " + "; ".join(where)
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


def members_of(
    j: job.Job,
    attempt: int,
    decision: placement.Placement,
    rules: placement.Pool,
    *,
    after: list[str] | None = None,
    addresses: dict[str, str] | None = None,
) -> list[binding.Binding]:
    """The Bindings of one attempt: one (`<job>-<attempt>`), or for a multi-node Job one per
    member (`binding.name_of`), each with its rank, the members' nodes and where rank 0
    listens (the address its agent reports; the node's name where it reports none)."""
    ranks = decision.ranks()
    multi = len(ranks) > 1
    nodes = [node for node, _ in ranks]
    uid = j.metadata.uid or ""
    master = (addresses or {}).get(nodes[0], nodes[0])
    return [
        binding.Binding(
            metadata=meta.ObjectMeta(
                name=binding.name_of(j.name, attempt, rank),
                namespace=j.namespace,
                labels={"gctl/job": j.name},
            ),
            spec=binding.BindingSpec(
                job_name=j.name,
                job_uid=uid,
                attempt=attempt,
                node=node,
                gpus=list(gpus),
                gpu_share=decision.share,
                gpu_memory=decision.request.gpu_memory,  # as resolved, profile included
                enforce_gpu_memory=rules.enforce_gpu_memory,
                after=after or [],
                rank=rank if multi else None,
                members=nodes if multi else [],
                master_addr=master if multi else None,
                master_port=binding.master_port(uid) if multi else None,
            ),
        )
        for rank, (node, gpus) in enumerate(ranks)
    ]


def _preempt(
    writer: store.Store,
    preempting: list[placement.Decision],
    by_key: MutableMapping[Key, Wire],
    world: reading.World,
    budget: Budget,
) -> bool:
    """Ask the victims' agents to stop them (CAS on each Binding) and say who did it, BATCH
    preemptors at a time, their Events together. Returns False when the pass ran out of time:
    the rest is the next pass's to decide again (a burst of 1,000 Jobs of higher priority over
    1,000 busy GPUs wrote for 6 s, holding the write lock)."""
    for start in range(0, len(preempting), BATCH):
        if start and budget.late():
            return False
        said: list[tuple[job.Job, str, str]] = []
        stopping: dict[tuple[str, str], binding.Binding] = {}
        for d in preempting[start : start + BATCH]:
            who = f"{d.request.namespace}/{d.request.name}"
            for victim in d.victims:
                key = (victim.namespace, victim.binding)
                shared = world.bindings.get(key)
                if shared is None or shared.spec.stop_reason is not None or key in stopping:
                    continue
                attempt = stopping[key] = shared.model_copy(deep=True)
                attempt.spec.stop_reason = binding.STOP_PREEMPTED
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
        writer.update_many(list(stopping.values()))
        with writer.batched():
            for involved, reason, message in said:
                writer.record_event(involved, reason, message, source=SOURCE)
    return True
