"""The Job lifecycle: from what its attempts did to the Job's phase, conditions and events.

`reconcile(store, namespace, name, now)` re-reads the Job and its Bindings and moves it one step:
Scheduled -> Running when the agent reports the process; Succeeded, Failed or back to Pending
(with capped exponential back-off) when an attempt ends; stops attempts past their deadline,
suspended or deleted; deletes finished Jobs whose TTL ran out. It returns when it wants to run
again (a deadline or TTL coming due), never sleeps, and running it twice does no harm. What
an ended attempt means for its Job (finished, failed, requeued) is written by `outcomes`.

A multi-node Job's attempt is one Binding per node (its members): it runs once every member
has started, and ends once every member has; a member that ends badly (fails, is lost, or is
stopped) has the others stopped (`STOP_MEMBER_ENDED`), and the member whose end came first
decides the attempt's outcome as a single-node attempt's end would.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from controller import cycles, outcomes, sweeps
from gctl.api import binding, job, meta, quantity, sweep
from gctl.store import store

SOURCE = outcomes.SOURCE


def reconcile(
    writer: store.Store,
    namespace: str,
    name: str,
    now: datetime,
    backoff_base: timedelta = outcomes.BACKOFF_BASE,
    *,
    settled: set[tuple[str, str]] | None = None,
) -> datetime | None:
    """`settled` gets (namespace, name) if the Job is left `at_rest`."""
    j = writer.find(job.Job, name, namespace)
    if j is None:
        return None
    attempts = writer.bindings_of(j.metadata.uid or "")
    due = _reconcile(writer, j, attempts, now, backoff_base, finder=cycles.Finder(writer))
    if settled is not None and at_rest(j, attempts):
        settled.add((namespace, name))
    return due


def reconcile_many(
    writer: store.Store,
    keys: list[tuple[str, str]],
    now: datetime,
    backoff_base: timedelta = outcomes.BACKOFF_BASE,
    *,
    settled: set[tuple[str, str]] | None = None,
) -> dict[tuple[str, str], datetime]:
    """`reconcile` for many Jobs (namespace, name) in one transaction, with their Jobs,
    Bindings and latest events each read in one query for all; returns when each wants to run
    again (those that do). `settled` gets the keys of the Jobs left `at_rest`."""
    found: dict[tuple[str, str], job.Job] = {}
    for namespace in sorted({namespace for namespace, _ in keys}):
        names = sorted(name for ns, name in keys if ns == namespace)
        found |= {(namespace, j.name): j for j in writer.find_many(job.Job, namespace, names)}
    uids = [j.metadata.uid or "" for j in found.values()]
    attempts = writer.bindings_of_many(uids)
    writer.prefetch_events(uids)
    finder = cycles.Finder(writer)  # what the pass reads of dependsOn, read once
    due = {}
    with writer.batched():  # their status writes and events, one statement per kind
        for key in keys:
            j = found.get(key)
            if j is None:
                continue
            its = attempts.get(j.metadata.uid or "", [])
            when = _reconcile(writer, j, its, now, backoff_base, finder=finder)
            if when is not None:
                due[key] = when
            if settled is not None and at_rest(j, its):
                settled.add(key)
    return due


def at_rest(j: job.Job, attempts: list[binding.Binding]) -> bool:
    """Whether reconciling the Job as it now is, with these attempts, would do nothing and
    want nothing again: finished, no attempt active, nothing asked of it (a deletion, a
    re-run) and no TTL to count down. The controller then skips the reconcile that its own
    write of the Job would wake (`manager.Controller`): one Job reconcile in three of a
    `true` Job's life, on nothing but its own conclusion."""
    return (
        j.status.phase in job.FINISHED_PHASES
        and j.spec.ttl_seconds_after_finished is None
        and j.metadata.deletion_timestamp is None
        and job.rerun_requested(j) is None
        and not any(a.status.phase in binding.ACTIVE_PHASES for a in attempts)
    )


def _reconcile(
    writer: store.Store,
    j: job.Job,
    attempts: list[binding.Binding],
    now: datetime,
    backoff_base: timedelta,
    *,
    finder: cycles.Finder,
) -> datetime | None:
    members = _members(attempts)
    if members:
        return _reconcile_members(
            writer, j, attempts, now, backoff_base, members=members, finder=finder
        )
    active = next((b for b in attempts if b.status.phase in binding.ACTIVE_PHASES), None)
    if j.metadata.deletion_timestamp is not None:
        _finish_deletion(writer, j, attempts, active)
        return None
    token = job.rerun_requested(j)
    if token is not None:
        _rerun(writer, j, active, token, now)
        return None
    if active is not None:
        return _follow_active(writer, j, active, now)
    latest = attempts[-1] if attempts else None
    if j.status.phase in ("Scheduled", "Running"):
        if latest is not None and latest.spec.attempt == j.status.attempts:
            outcomes.account(writer, j, latest, now, backoff_base)
        else:  # its Binding was deleted by hand: the attempt is gone
            outcomes.requeue(
                writer,
                j,
                job.REASON_ATTEMPT_LOST,
                f"attempt {j.status.attempts} disappeared; retrying",
                now,
            )
        return None
    if j.status.phase in job.FINISHED_PHASES:
        return _expire(writer, j, now)
    return _check_pending(writer, j, now, finder)


def untouched_when_created(wire: dict[str, Any]) -> bool:
    """Whether `reconcile` would leave a Job just created exactly as it is: one with nothing
    to wait for or act on (no suspend, dependsOn, re-run or deletion) only waits for the
    scheduler. The controller skips reconciling such Jobs, 10,000 of which may arrive in one
    apply, and runs its scheduling pass for them at once."""
    spec, status, metadata = wire["spec"], wire["status"], wire["metadata"]
    return (
        not spec.get("suspend")
        and not spec.get("dependsOn")
        and not metadata.get("deletionTimestamp")
        and job.ANNOTATION_RERUN not in metadata.get("annotations", {})
        and status.get("phase", "Pending") == "Pending"
        and not status.get("attempts")
        and not status.get("conditions")
        and not status.get("retryAfter")
    )


def _stop(writer: store.Store, attempt: binding.Binding, reason: str) -> None:
    """Ask the agent to stop an attempt. The first reason stays, except that a deletion
    replaces any other: it cuts a stop warning short (the agent sends no warning for it)."""
    current = attempt.spec.stop_reason
    if current is None or (reason == binding.STOP_DELETED and current != reason):
        attempt.spec.stop_reason = reason
        writer.update(attempt)


def ask_back(writer: store.Store, attempt: binding.Binding) -> None:
    """Ask the agent for an Armed attempt back (`spec.disarm`): it takes it from its
    supervisor if the job has not started, and reports it Pending, queued again; what was
    wanted of it is done then. An attempt whose job started meanwhile is Running instead."""
    if not attempt.spec.disarm:
        attempt.spec.disarm = True
        writer.update(attempt)


def _withdraw(writer: store.Store, j: job.Job, attempt: binding.Binding) -> None:
    """Take back an attempt bound ahead that its agent has not taken: it never started, so it
    is removed (exactly as read: if its agent took it meanwhile, this conflicts and the next
    read stops it instead) and not counted."""
    writer.remove(attempt)
    j.status.attempts = attempt.spec.attempt - 1


def _finish_deletion(
    writer: store.Store,
    j: job.Job,
    attempts: list[binding.Binding],
    active: binding.Binding | None,
) -> None:
    if active is not None and binding.queued(active.spec, active.status):
        _withdraw(writer, j, active)
        attempts = [a for a in attempts if a is not active]
        active = None
    if active is not None:
        _stop(writer, active, binding.STOP_DELETED)
        return
    for attempt in attempts:
        writer.delete(binding.Binding, attempt.name, attempt.namespace)
    if job.FINALIZER in j.metadata.finalizers:
        j.metadata.finalizers = [f for f in j.metadata.finalizers if f != job.FINALIZER]
        writer.update(j)


def _follow_active(
    writer: store.Store, j: job.Job, active: binding.Binding, now: datetime
) -> datetime | None:
    if j.spec.suspend:
        if binding.queued(active.spec, active.status):
            _withdraw(writer, j, active)
            message = f"attempt {active.spec.attempt}, bound ahead, withdrawn: suspended"
            outcomes.requeue(writer, j, "Suspended", message, now)
        elif binding.armed(active.status):
            ask_back(writer, active)  # then withdrawn, as above: it never started
        else:
            _stop(writer, active, binding.STOP_SUSPENDED)
        return None
    armed_with = active.status.observed_generation
    if binding.armed(active.status) and armed_with not in (None, j.metadata.generation):
        # Its supervisor holds a launch made from an older spec: taken back, and armed anew.
        ask_back(writer, active)
        return None
    if active.status.phase == "Running" and j.status.phase != "Running":
        j.status.phase = "Running"
        j.status.start_time = j.status.start_time or active.status.start_time or now
        j = writer.update_status(j)
        outcomes.record_started(writer, j, active)
    deadline = j.spec.active_deadline_seconds
    if deadline is None or j.status.start_time is None:
        return None
    # With a stop warning, the stop is asked for that much earlier: the warning signal comes
    # first and SIGTERM lands at the deadline.
    early = j.spec.stop_warning.seconds if j.spec.stop_warning else 0
    due = quantity.after(j.status.start_time, max(0, deadline - early))
    if due is None:  # so far ahead that it never comes (stored before deadlines were limited)
        return None
    if now >= due:
        _stop(writer, active, binding.STOP_DEADLINE)
        return None
    return due


def _rerun(
    writer: store.Store, j: job.Job, active: binding.Binding | None, token: str, now: datetime
) -> None:
    """Act on a new gctl/rerun token. A running attempt is stopped first (it ends as Rerun,
    not as a failure); the token is recorded only once no attempt is active and the Job is
    back in the queue, in the same write, so a crash, or the attempt exiting on its own
    meanwhile, loses nothing and nothing happens twice."""
    why = j.metadata.annotations.get(job.ANNOTATION_RERUN_REASON) or "gctl rerun"
    if active is not None and binding.queued(active.spec, active.status):
        _withdraw(writer, j, active)  # it never started: it runs as the re-run
        active = None
    if active is not None and binding.armed(active.status):
        ask_back(writer, active)  # then withdrawn, as above
        return
    if active is not None:
        if active.spec.stop_reason is None:  # else it is stopping already: wait for it
            _stop(writer, active, binding.STOP_RERUN)
            message = f"{why}: stopping attempt {active.spec.attempt} to run the Job again"
            writer.record_event(j, job.REASON_RERUN, message, source=SOURCE)
        return
    j.status.rerun = token
    if j.status.phase == "Pending":
        # It runs anyway; but one waiting out a back-off runs as a fresh run too: its failures
        # and the wait are forgotten, in the write that records the token.
        backing_off = j.status.failed > 0 or j.status.retry_after is not None
        if backing_off:
            outcomes.start_over(j, now)
        j = writer.update_status(j)
        how = "its back-off is reset" if backing_off else "the Job is still pending"
        writer.record_event(j, job.REASON_RERUN, f"{why}: {how}", source=SOURCE)
        return
    outcomes.start_over(j, now)
    message = f"{why}: runs again as attempt {j.status.attempts + 1}"
    outcomes.requeue(writer, j, job.REASON_RERUN, message, now)


def _expire(writer: store.Store, j: job.Job, now: datetime) -> datetime | None:
    """ttlSecondsAfterFinished, counted on this controller's clock from when it saw the Job
    finish (its Complete or Failed condition's transition), not from `completionTime`, the
    end as another host's clock recorded it, maybe while this controller was down: a Job must
    not be deleted the moment it is seen finished."""
    ttl = j.spec.ttl_seconds_after_finished
    if ttl is None or j.status.completion_time is None:
        return None
    finished = next(
        (
            c.last_transition_time
            for c in j.status.conditions
            if c.type in (job.CONDITION_COMPLETE, job.CONDITION_FAILED) and c.status == "True"
        ),
        None,
    )
    due = quantity.after(finished or j.status.completion_time, ttl)
    if due is None:  # so far ahead that it never comes (stored before TTLs were limited)
        return None
    if now < due:
        return due
    writer.delete(job.Job, j.name, j.namespace)
    return None


def _check_pending(
    writer: store.Store, j: job.Job, now: datetime, finder: cycles.Finder
) -> datetime | None:
    """A Pending Job: say why it waits (suspended, dependencies), or fail a broken chain or a
    cycle."""
    changed = False
    if j.spec.suspend or any(c.type == job.CONDITION_SUSPENDED for c in j.status.conditions):
        changed = meta.set_condition(
            j.status.conditions,
            job.CONDITION_SUSPENDED,
            "True" if j.spec.suspend else "False",
            "Suspended" if j.spec.suspend else "Resumed",
            generation=j.metadata.generation,
            now=now,
        )
    # A name in dependsOn is a Job or a Sweep (afterok on all its Jobs): controller.sweeps.
    found = [sweeps.dependency(writer, j.namespace, d) for d in j.spec.depends_on]
    decided = sweep.verdict(found)
    # On a cycle it would wait for ever: it fails, and so does each Job of the cycle in turn
    # (a failed one still counts as on it), whichever the controller looked at first.
    if decided.state != "ready" and (loop := finder.cycle(j)) is not None:
        why = f"dependsOn makes a cycle: {loop}"
        outcomes.finish(writer, j, "Failed", job.REASON_DEPENDENCY_CYCLE, why, now=now)
        return None
    if decided.state == "failed":
        outcomes.finish(writer, j, "Failed", job.REASON_DEPENDENCY_FAILED, decided.message, now=now)
        return None
    reason, message = j.status.reason, j.status.message
    if decided.state == "waiting":
        reason, message = job.REASON_WAITING_DEPENDENCIES, decided.message
    elif reason == job.REASON_WAITING_DEPENDENCIES:  # the wait is over: clear it
        reason, message = None, None
    if (reason, message) != (j.status.reason, j.status.message):
        j.status.reason, j.status.message = reason, message
        changed = True
    if changed:
        writer.update_status(j)
    return j.status.retry_after if j.status.retry_after and j.status.retry_after > now else None


# -- multi-node attempts ---------------------------------------------------------------------


def _members(attempts: list[binding.Binding]) -> list[binding.Binding]:
    """The latest attempt's Bindings, by rank, if it is a multi-node attempt; else none."""
    if not attempts or attempts[-1].spec.rank is None:  # oldest first: the last is the latest's
        return []
    return binding.latest_attempt(attempts)


def _reconcile_members(
    writer: store.Store,
    j: job.Job,
    attempts: list[binding.Binding],
    now: datetime,
    backoff_base: timedelta,
    *,
    members: list[binding.Binding],
    finder: cycles.Finder,
) -> datetime | None:
    """`_reconcile` for a Job whose latest attempt is a multi-node one."""
    active = [b for b in members if b.status.phase in binding.ACTIVE_PHASES]
    if j.metadata.deletion_timestamp is not None:
        for member in active:
            _stop(writer, member, binding.STOP_DELETED)
        if not active:
            _finish_deletion(writer, j, attempts, None)
        return None
    token = job.rerun_requested(j)
    if token is not None:
        if not active:
            _rerun(writer, j, None, token, now)
        elif any(m.spec.stop_reason is None for m in active):
            for member in active:
                _stop(writer, member, binding.STOP_RERUN)
            why = j.metadata.annotations.get(job.ANNOTATION_RERUN_REASON) or "gctl rerun"
            message = f"{why}: stopping attempt {members[0].spec.attempt} to run the Job again"
            writer.record_event(j, job.REASON_RERUN, message, source=SOURCE)
        return None
    if active:
        return _follow_members(writer, j, members, active, now)
    if j.status.phase in ("Scheduled", "Running"):
        if members[0].spec.attempt == j.status.attempts and _complete(members):
            outcomes.account(writer, j, _deciding(members), now, backoff_base, members=members)
        else:  # Bindings deleted by hand: the attempt is gone
            number = j.status.attempts
            message = f"attempt {number} (or a member of it) disappeared; retrying"
            outcomes.requeue(writer, j, job.REASON_ATTEMPT_LOST, message, now)
        return None
    if j.status.phase in job.FINISHED_PHASES:
        return _expire(writer, j, now)
    return _check_pending(writer, j, now, finder)


def _follow_members(
    writer: store.Store,
    j: job.Job,
    members: list[binding.Binding],
    active: list[binding.Binding],
    now: datetime,
) -> datetime | None:
    """`_follow_active` for a multi-node attempt: stop every member when one ended badly (or
    is missing), or when the Job is suspended or past its deadline; Running once all run."""
    if j.spec.suspend:
        for member in active:
            _stop(writer, member, binding.STOP_SUSPENDED)
        return None
    ended = [b for b in members if b.status.phase not in binding.ACTIVE_PHASES]
    if not _complete(members) or any(not _ended_well(b) for b in ended):
        for member in active:
            _stop(writer, member, binding.STOP_MEMBER_ENDED)
        return None
    starts = [b.status.start_time for b in members]
    if j.status.phase != "Running" and all(starts):
        j.status.phase = "Running"
        j.status.start_time = j.status.start_time or min(t for t in starts if t) or now
        j = writer.update_status(j)
        outcomes.record_started(writer, j, members[0], members)
    deadline = j.spec.active_deadline_seconds
    if deadline is None or j.status.start_time is None:
        return None
    early = j.spec.stop_warning.seconds if j.spec.stop_warning else 0
    due = quantity.after(j.status.start_time, max(0, deadline - early))
    if due is None:
        return None
    if now >= due:
        for member in active:
            _stop(writer, member, binding.STOP_DEADLINE)
        return None
    return due


def _complete(members: list[binding.Binding]) -> bool:
    """Whether every member of the attempt is there (none was deleted by hand)."""
    return len(members) == len(members[0].spec.members)


def _ended_well(member: binding.Binding) -> bool:
    """A member that exited on its own and did its work: the others go on. A stop asked for
    after its process had already exited does not count, as for a single-node attempt
    (`outcomes.account`): its status.reason says how it ended, the stop's reason if stopped."""
    stopped = (
        member.spec.stop_reason is not None and member.status.reason == member.spec.stop_reason
    )
    return member.status.phase == "Exited" and not stopped and binding.succeeded(member.status)


def _deciding(members: list[binding.Binding]) -> binding.Binding:
    """The member whose end decides how the attempt ended, its message naming its rank: one lost
    (with its node, or fenced) first, as Slurm requeues a job on NODE_FAIL (a node's attempts
    are declared lost seconds after it went silent, and the members that failed meanwhile most
    likely failed for want of it); else the first to end badly (stopped for a reason of its own,
    or failed; not one stopped because another ended); rank 0 when all did their work."""
    by_end = sorted(
        members,
        key=lambda b: (b.status.finish_time or datetime.max.replace(tzinfo=UTC), b.spec.rank or 0),
    )
    ordered = [b for b in by_end if _lost(b)] + [b for b in by_end if not _lost(b)]
    for member in ordered:
        stopped_for_another = member.status.reason == binding.STOP_MEMBER_ENDED
        if _ended_well(member) or stopped_for_another:
            continue
        deciding = member.model_copy(deep=True)
        status = deciding.status
        how = status.message or (
            f"exit code {status.exit_code}"
            if status.exit_code is not None
            else "it ended without an exit record"  # lost, as `outcomes` says of one alone
        )
        # A lost member's message names its node already (`outcomes`).
        where = "" if _lost(member) else f" on {member.spec.node}"
        status.message = f"rank {member.spec.rank}{where}: {how}"
        return deciding
    return members[0]


def _lost(member: binding.Binding) -> bool:
    return member.status.phase == "Lost" or member.status.reason == binding.REASON_FENCED
