"""The Job controller's handling of `gctl/rerun`, one reconcile at a time against a real
database (both dialects) with a fixed clock: level-triggered, idempotent, and never lost to an
attempt that ends on its own meanwhile."""

from datetime import UTC, datetime

from controller import jobs, scheduling
from gctl.api import binding, job
from gctl.store import db, store
from tests.builders import make_job, put_ready_node

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _reconcile(database: db.Database, name: str) -> None:
    store.transact(database, lambda w: jobs.reconcile(w, "default", name, T0))


def _schedule(database: db.Database) -> None:
    store.transact(database, lambda w: scheduling.schedule(w, T0))


def _job(database: db.Database, name: str) -> job.Job:
    with database.read() as session:
        return store.Store(session).get(job.Job, name, "default")


def _attempt(database: db.Database, name: str) -> binding.Binding:
    with database.read() as session:
        return store.Store(session).get(binding.Binding, name, "default")


def _rerun_events(database: db.Database, name: str) -> list[str]:
    with database.read() as session:
        reader = store.Store(session)
        found = reader.events_for(reader.get(job.Job, name, "default"))
    return [f"{e.spec.message} x{e.spec.count}" for e in found if e.spec.reason == "Rerun"]


def _started(database: db.Database, name: str, backoff_limit: int = 0) -> None:
    """A Job bound and its attempt reported Running, as the scheduler and agent leave it."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 1, T0)
        new = make_job(name).build()
        new.spec.backoff_limit = backoff_limit
        writer.create(new)
    _schedule(database)
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, f"{name}-1", "default")
        attempt.status.phase, attempt.status.pid = "Running", 4242
        writer.update_status(attempt)
    _reconcile(database, name)


def _ends(database: db.Database, name: str, exit_code: int, reason: str) -> None:
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        attempt.status.phase, attempt.status.exit_code = "Exited", exit_code
        attempt.status.reason = reason
        writer.update_status(attempt)


def _ask_rerun(database: db.Database, name: str, token: str = "t1") -> None:
    with database.write() as session:
        writer = store.Store(session)
        found = writer.get(job.Job, name, "default")
        found.metadata.annotations = {
            job.ANNOTATION_RERUN: token,
            job.ANNOTATION_RERUN_REASON: "new data",
        }
        writer.update(found)


def test_a_finished_job_goes_back_to_the_queue_once(database: db.Database) -> None:
    _started(database, "done")
    _ends(database, "done-1", 0, "Completed")
    _reconcile(database, "done")
    assert _job(database, "done").status.phase == "Succeeded"
    _ask_rerun(database, "done")
    assert _job(database, "done").metadata.generation == 1  # annotations are not the spec

    _reconcile(database, "done")
    again = _job(database, "done")
    _reconcile(database, "done")  # a second pass changes nothing

    status = again.status
    assert (status.phase, status.rerun, status.attempts, status.reason) == (
        "Pending",
        "t1",
        1,
        "Rerun",
    )
    assert (status.exit_code, status.completion_time, status.start_time) == (None, None, None)
    assert {c.type: c.status for c in status.conditions}["Complete"] == "False"
    assert _job(database, "done").metadata.resource_version == again.metadata.resource_version
    assert _rerun_events(database, "done") == ["new data: runs again as attempt 2 x1"]
    _schedule(database)
    assert _attempt(database, "done-2").spec.attempt == 2


def test_a_running_attempt_is_stopped_and_not_counted_as_a_failure(
    database: db.Database,
) -> None:
    _started(database, "busy")
    _ask_rerun(database, "busy")

    _reconcile(database, "busy")
    _reconcile(database, "busy")

    assert _attempt(database, "busy-1").spec.stop_reason == binding.STOP_RERUN
    assert _job(database, "busy").status.rerun is None  # handled once the attempt is gone
    _ends(database, "busy-1", 143, binding.STOP_RERUN)
    _reconcile(database, "busy")
    status = _job(database, "busy").status
    assert (status.phase, status.failed, status.rerun, status.preemptions) == (
        "Pending",
        0,
        "t1",
        0,
    )
    assert _rerun_events(database, "busy") == [
        "new data: stopping attempt 1 to run the Job again x1",
        "new data: runs again as attempt 2 x1",
    ]


def test_an_attempt_that_ends_on_its_own_meanwhile_still_runs_again(
    database: db.Database,
) -> None:
    _started(database, "quick")
    _ask_rerun(database, "quick")
    _reconcile(database, "quick")
    _ends(database, "quick-1", 0, "Completed")  # exited before the stop reached it

    _reconcile(database, "quick")

    assert (_job(database, "quick").status.phase, _job(database, "quick").status.rerun) == (
        "Pending",
        "t1",
    )


def test_a_pending_job_only_records_the_request(database: db.Database) -> None:
    with database.write() as session:
        store.Store(session).create(make_job("waiting").build())
    _ask_rerun(database, "waiting")

    _reconcile(database, "waiting")
    _reconcile(database, "waiting")

    assert _job(database, "waiting").status.rerun == "t1"
    assert _rerun_events(database, "waiting") == ["new data: the Job is still pending x1"]


def test_a_job_in_back_off_starts_over(database: db.Database) -> None:
    _started(database, "flaky", backoff_limit=3)
    _ends(database, "flaky-1", 1, "Failed")
    _reconcile(database, "flaky")
    waiting = _job(database, "flaky").status
    assert (waiting.phase, waiting.failed) == ("Pending", 1)
    assert waiting.retry_after is not None
    _ask_rerun(database, "flaky")

    _reconcile(database, "flaky")
    _reconcile(database, "flaky")

    status = _job(database, "flaky").status
    assert (status.phase, status.failed, status.retry_after, status.rerun) == (
        "Pending",
        0,
        None,
        "t1",
    )
    assert _rerun_events(database, "flaky") == ["new data: its back-off is reset x1"]


def test_a_deleting_job_is_not_rerun(database: db.Database) -> None:
    _started(database, "going")
    _ask_rerun(database, "going")
    with database.write() as session:
        store.Store(session).delete(job.Job, "going", "default")

    _reconcile(database, "going")

    assert _attempt(database, "going-1").spec.stop_reason == binding.STOP_DELETED
    assert _rerun_events(database, "going") == []


def test_a_rerun_stop_whose_request_is_gone_still_requeues(database: db.Database) -> None:
    _started(database, "edited")
    _ask_rerun(database, "edited")
    _reconcile(database, "edited")
    with database.write() as session:  # e.g. an apply replaced the annotations meanwhile
        writer = store.Store(session)
        found = writer.get(job.Job, "edited", "default")
        found.metadata.annotations = {}
        writer.update(found)
    _ends(database, "edited-1", 143, binding.STOP_RERUN)

    _reconcile(database, "edited")

    status = _job(database, "edited").status
    assert (status.phase, status.failed, status.reason) == ("Pending", 0, "Rerun")
