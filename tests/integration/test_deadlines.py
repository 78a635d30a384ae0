"""activeDeadlineSeconds against a real database, one step at a time with a fixed clock: it
counts the Job's current run, which a requeue that counts no failure (suspend, preemption,
eviction, a lost attempt) ends, as Kubernetes resets a resumed Job's startTime; a retry after a
failure goes on with the same run."""

from datetime import UTC, datetime, timedelta

import pytest

from controller import jobs, scheduling
from gctl.api import binding, job
from gctl.store import db, store
from tests.builders import make_job, put_ready_node, report_attempt, stored

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DEADLINE = 8


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _schedule(database: db.Database, now: datetime) -> None:
    store.transact(database, lambda w: scheduling.schedule(w, now))


def _reconcile(database: db.Database, name: str, now: datetime) -> datetime | None:
    return store.transact(database, lambda w: jobs.reconcile(w, "default", name, now))


def _job(database: db.Database, name: str) -> job.Job:
    return stored(database, job.Job, name)


def _binding(database: db.Database, name: str) -> binding.Binding:
    return stored(database, binding.Binding, name)


def _set_suspend(database: db.Database, name: str, suspend: bool) -> None:
    with database.write() as session:
        writer = store.Store(session)
        found = writer.get(job.Job, name, "default")
        found.spec.suspend = suspend
        writer.update(found)


def _ends(database: db.Database, name: str, how: str) -> None:
    """The agent reports how the attempt `name` ended, a stop the controller (or drain, or a
    preemptor) asked for included."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        if how in (binding.STOP_PREEMPTED, binding.STOP_EVICTED):
            attempt.spec.stop_reason = how
            attempt = writer.update(attempt)
        if how == "Lost":
            attempt.status.phase = "Lost"
        else:
            attempt.status.phase = "Exited"
            attempt.status.exit_code = 1 if how == "Error" else 143
            attempt.status.reason = how
        writer.update_status(attempt)


def _start(database: db.Database, name: str, attempt: int, now: datetime) -> datetime | None:
    """Attempt `attempt` of `name` is bound (at `now`) and its process starts: what the Job's
    reconcile then says it wants (its deadline)."""
    _schedule(database, now)
    assert (_job(database, name).status.phase, _job(database, name).status.attempts) == (
        "Scheduled",
        attempt,
    )
    report_attempt(database, f"{name}-{attempt}", "Running", now)
    return _reconcile(database, name, now)


@pytest.fixture
def dl(database: db.Database) -> db.Database:
    """A Job `dl` with activeDeadlineSeconds=8 and one retry, on a node with one GPU."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 1, T0)
        created = make_job("dl").build()
        created.spec.active_deadline_seconds = DEADLINE
        created.spec.backoff_limit = 1
        writer.create(created)
    return database


def test_a_resumed_job_gets_its_whole_deadline_again(dl: db.Database) -> None:
    """QA's case: 5 s running, 6 s suspended, resumed: it was killed as DeadlineExceeded at
    once, having run 5 s of its 8."""
    assert _start(dl, "dl", 1, T0) == _at(DEADLINE)
    _set_suspend(dl, "dl", True)
    _reconcile(dl, "dl", _at(5))
    assert _binding(dl, "dl-1").spec.stop_reason == binding.STOP_SUSPENDED
    report_attempt(dl, "dl-1", "Exited", _at(5), exit_code=143)
    _reconcile(dl, "dl", _at(5))
    suspended = _job(dl, "dl").status
    assert (suspended.phase, suspended.reason, suspended.start_time) == (
        "Pending",
        "Suspended",
        None,
    )

    _set_suspend(dl, "dl", False)
    _reconcile(dl, "dl", _at(11))
    assert _start(dl, "dl", 2, _at(11)) == _at(11 + DEADLINE)
    running = _job(dl, "dl").status
    assert (running.phase, running.start_time) == ("Running", _at(11))
    assert _reconcile(dl, "dl", _at(13)) == _at(11 + DEADLINE)
    assert _binding(dl, "dl-2").spec.stop_reason is None
    _reconcile(dl, "dl", _at(11 + DEADLINE))
    assert _binding(dl, "dl-2").spec.stop_reason == binding.STOP_DEADLINE


@pytest.mark.parametrize("how", [binding.STOP_PREEMPTED, binding.STOP_EVICTED, "Lost", "Fenced"])
def test_a_requeue_that_counts_no_failure_restarts_the_deadline(dl: db.Database, how: str) -> None:
    """Preempted (Kueue preempts by suspending), evicted by `drain --evict`, lost with its node
    or fenced: back in the queue without a failure, it runs its full deadline when it starts
    again, however long it waited."""
    _start(dl, "dl", 1, T0)
    _ends(dl, "dl-1", how)
    _reconcile(dl, "dl", _at(5))
    requeued = _job(dl, "dl").status
    assert (requeued.phase, requeued.failed, requeued.start_time) == ("Pending", 0, None)
    assert _start(dl, "dl", 2, _at(17)) == _at(17 + DEADLINE)
    assert _job(dl, "dl").status.start_time == _at(17)


def test_a_retry_after_a_failure_goes_on_with_the_same_deadline(dl: db.Database) -> None:
    """Kubernetes' deadline covers a Job's retries: a failed attempt and its back-off count."""
    _start(dl, "dl", 1, T0)
    _ends(dl, "dl-1", "Error")
    _reconcile(dl, "dl", _at(2))
    backing_off = _job(dl, "dl").status
    assert (backing_off.phase, backing_off.failed, backing_off.start_time) == ("Pending", 1, T0)
    assert backing_off.retry_after == _at(12)
    _start(dl, "dl", 2, _at(12))  # past the deadline already: stopped at once
    assert _binding(dl, "dl-2").spec.stop_reason == binding.STOP_DEADLINE
    assert _job(dl, "dl").status.start_time == T0


def test_a_preempted_job_bound_ahead_counts_its_deadline_from_its_new_start(
    database: db.Database,
) -> None:
    """QA's case: `low` (deadline 20) preempted after 3 s by `high`, which runs 12 s; `low`,
    requeued and bound ahead after `high`, starts again when it ends and was killed 5 s later,
    having run 8 s of its 20."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 1, T0)
        low = make_job("low").build()
        low.spec.active_deadline_seconds = 20
        writer.create(low)
    _start(database, "low", 1, T0)
    with database.write() as session:
        store.Store(session).create(make_job("high").priority(10).build())
    _schedule(database, _at(3))
    assert _binding(database, "low-1").spec.stop_reason == binding.STOP_PREEMPTED
    report_attempt(database, "low-1", "Exited", _at(3), exit_code=143)
    _reconcile(database, "low", _at(3))
    assert _start(database, "high", 1, _at(3)) is None
    _schedule(database, _at(3))
    requeued = _job(database, "low").status
    assert (requeued.phase, requeued.preemptions, requeued.start_time) == ("Scheduled", 1, None)
    assert _binding(database, "low-2").spec.after  # bound ahead: starts when high ends

    report_attempt(database, "high-1", "Exited", _at(15), exit_code=0)
    report_attempt(database, "low-2", "Running", _at(15))
    assert _reconcile(database, "low", _at(16)) == _at(35)
    assert _reconcile(database, "low", _at(20)) == _at(35)
    assert _binding(database, "low-2").spec.stop_reason is None
