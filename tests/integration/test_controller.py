"""The controller's reconcilers against a real database, one step at a time, with a fixed clock:
no processes, so every case is exact."""

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy

from controller import jobs, manager, nodes, scheduling
from gctl.api import binding, job, node
from gctl.store import db, feed, shared, store
from tests.builders import corrupt, make_job, put_ready_node, report_attempt
from tests.conftest import _admin

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _node(writer: store.Store, name: str, gpus: int, heartbeat: datetime = T0) -> None:
    put_ready_node(writer, name, gpus, heartbeat)


def _schedule(database: db.Database, now: datetime = T0) -> None:
    store.transact(database, lambda w: scheduling.schedule(w, now))


def _reconcile(database: db.Database, name: str, now: datetime = T0) -> None:
    store.transact(database, lambda w: jobs.reconcile(w, "default", name, now))


def _stored_on_n1(database: db.Database, gpus: int, *jobs_to_store: job.Job) -> None:
    """Node n1 with `gpus` GPUs, and the Jobs as they are (no manifest validation)."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", gpus)
        for j in jobs_to_store:
            writer.create(j)


def _get(database: db.Database, cls: type, name: str) -> object:
    with database.read() as session:
        return store.Store(session).get(cls, name, "default")


def _attempt_ends(
    database: db.Database,
    name: str,
    exit_code: int,
    stop: str | None,
    ran: tuple[datetime, datetime] | None = None,
) -> None:
    """The agent reports an exit (with `ran`, the start and finish it recorded); the
    controller may have asked for a stop meanwhile."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        attempt.spec.stop_reason = stop
        attempt = writer.update(attempt)
        attempt.status.phase = "Exited"
        attempt.status.exit_code = exit_code
        attempt.status.reason = "Completed" if exit_code == 0 else "Error"
        if ran is not None:
            attempt.status.start_time, attempt.status.finish_time = ran
        writer.update_status(attempt)


def test_a_stop_asked_after_a_clean_exit_does_not_undo_it(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("done").build())
    _schedule(database)
    _attempt_ends(database, "done-1", 0, stop=binding.STOP_SUSPENDED)
    _reconcile(database, "done")
    finished = _get(database, job.Job, "done")
    assert isinstance(finished, job.Job)
    assert (finished.status.phase, finished.status.attempts) == ("Succeeded", 1)


def test_a_dependent_waits_for_its_dependency_whatever_its_status_says(
    database: db.Database,
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        writer.create(make_job("train").build())
        dependent = make_job("evaluate").build()
        dependent.spec.depends_on = ["train"]
        writer.create(dependent)
    _schedule(database)  # no reconcile of `evaluate` has run: its status says nothing yet
    evaluate = _get(database, job.Job, "evaluate")
    assert isinstance(evaluate, job.Job)
    assert evaluate.status.phase == "Pending"
    _attempt_ends(database, "train-1", 0, stop=None)
    _reconcile(database, "train")
    _schedule(database)
    evaluate = _get(database, job.Job, "evaluate")
    assert isinstance(evaluate, job.Job)
    assert evaluate.status.phase == "Scheduled"


def test_a_job_whose_binding_was_deleted_is_retried(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("orphaned").build())
    _schedule(database)
    with database.write() as session:
        store.Store(session).delete(binding.Binding, "orphaned-1", "default")
    _reconcile(database, "orphaned")
    _schedule(database)
    again = _get(database, job.Job, "orphaned")
    assert isinstance(again, job.Job)
    assert (again.status.phase, again.status.attempts, again.status.failed) == ("Scheduled", 2, 0)


@pytest.mark.parametrize(("code", "phase"), [(0, "Succeeded"), (3, "Failed")])
def test_a_job_completes_when_its_attempt_ended_not_when_that_was_seen(
    database: db.Database, code: int, phase: str
) -> None:
    """QA: two jobs ended while the controller and the agent were down for 15 s, and their
    DURATION counted the outage. The completion time is the attempt's end as its agent
    recorded it, as Slurm's End."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("early").build())
    _schedule(database)
    _attempt_ends(database, "early-1", code, stop=None, ran=(T0, T0 + timedelta(seconds=3)))
    _reconcile(database, "early", now=T0 + timedelta(seconds=19))
    done = _get(database, job.Job, "early")
    assert isinstance(done, job.Job)
    assert done.status.phase == phase
    assert done.status.completion_time == T0 + timedelta(seconds=3)


def test_a_deleted_node_loses_its_attempts(database: db.Database) -> None:
    seen: nodes.Seen = {}
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("stranded").build())
    _schedule(database)
    with database.write() as session:
        store.Store(session).delete(node.Node, "n1")
    store.transact(database, lambda w: nodes.reconcile(w, "n1", T0, timedelta(seconds=40), seen))
    lost = _get(database, binding.Binding, "stranded-1")
    assert isinstance(lost, binding.Binding)
    assert lost.status.phase == "Lost"


def test_a_deleted_nodes_attempts_are_lost_once_their_fence_stopped_them(
    database: db.Database,
) -> None:
    """`gctl delete node` of a silent node (or one whose agent is alive: it registers the
    Node again) must not run its jobs twice either: lost once their fence and grace period
    are over, counted from the heartbeat last seen."""
    seen: nodes.Seen = {}
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("stranded").build())
        held = writer.get(node.Node, "n1")
        held.status.jobs_outlive_seconds = 50
        writer.update_status(held)
    _schedule(database)
    timeout = timedelta(seconds=40)
    store.transact(database, lambda w: nodes.reconcile(w, "n1", T0, timeout, seen))
    with database.write() as session:
        store.Store(session).delete(node.Node, "n1")
    later = T0 + timedelta(seconds=10)
    due = store.transact(database, lambda w: nodes.reconcile(w, "n1", later, timeout, seen))
    assert due == T0 + timedelta(seconds=50)
    kept = _get(database, binding.Binding, "stranded-1")
    assert isinstance(kept, binding.Binding)
    assert kept.status.phase == "Pending"
    after = T0 + timedelta(seconds=51)
    store.transact(database, lambda w: nodes.reconcile(w, "n1", after, timeout, seen))
    lost = _get(database, binding.Binding, "stranded-1")
    assert isinstance(lost, binding.Binding)
    assert (lost.status.phase, lost.status.message) == ("Lost", "the node was deleted")


def test_node_timeout_runs_from_when_the_controller_saw_the_heartbeat(
    database: db.Database,
) -> None:
    """A controller that starts long after the last heartbeat gives the node a full timeout,
    and clock skew between hosts cannot make a heartbeating node look silent."""
    timeout = timedelta(seconds=40)
    seen: nodes.Seen = {}
    with database.write() as session:
        _node(store.Store(session), "n1", 1, heartbeat=T0 - timedelta(hours=1))

    def check(now: datetime) -> str:
        store.transact(database, lambda w: nodes.reconcile(w, "n1", now, timeout, seen))
        found = _get(database, node.Node, "n1")
        assert isinstance(found, node.Node)
        return next(c.status for c in found.status.conditions if c.type == "Ready")

    assert check(T0) == "True"  # first sight: the timeout starts now
    assert check(T0 + timedelta(seconds=39)) == "True"
    assert check(T0 + timedelta(seconds=41)) == "Unknown"


@pytest.mark.parametrize("released", [False, True])
def test_a_silent_nodes_attempts_are_lost_only_once_their_fence_stopped_them(
    database: db.Database, released: bool
) -> None:
    """NotReady at the node timeout, taking no new work; its attempts Lost (retried
    elsewhere) only once its agent's fence, grace period and one heartbeat have passed,
    which may be later: then no job of it still runs. The same once the agent let go of the
    Node (stopped cleanly, its jobs run on until their fence)."""
    timeout = timedelta(seconds=40)
    seen: nodes.Seen = {}
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("stranded").build())
        held = writer.get(node.Node, "n1")
        instance = node.AgentInstance(
            id="a1",
            hostname="h1",
            pid=7,
            started=T0,
            heartbeat_seconds=10,
            fence_seconds=30,
            grace_seconds=20,
        )
        held.status.agent_instance = None if released else instance
        held.status.jobs_outlive_seconds = instance.jobs_outlive()  # 30 + 20 + 10
        writer.update_status(held)
    _schedule(database)

    def check(seconds: int) -> tuple[str, str]:
        now = T0 + timedelta(seconds=seconds)
        store.transact(database, lambda w: nodes.reconcile(w, "n1", now, timeout, seen))
        found = _get(database, node.Node, "n1")
        attempt = _get(database, binding.Binding, "stranded-1")
        assert isinstance(found, node.Node)
        assert isinstance(attempt, binding.Binding)
        ready = next(c.status for c in found.status.conditions if c.type == "Ready")
        return ready, attempt.status.phase

    assert check(0) == ("True", "Pending")
    assert check(41) == ("Unknown", "Pending")
    assert check(59) == ("Unknown", "Pending")
    assert check(61) == ("Unknown", "Lost")


def test_shared_gpus_respect_declared_memory(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        for name in ("big-a", "big-b"):
            writer.create(make_job(name).gpus(0.5).memory("60Gi").build())
    _schedule(database)
    placed = [_get(database, job.Job, n) for n in ("big-a", "big-b")]
    assert sorted(tuple(j.status.gpus or []) for j in placed if isinstance(j, job.Job)) == [
        (0,),
        (1,),
    ]


def test_a_finished_job_is_deleted_when_its_ttl_runs_out(database: db.Database) -> None:
    short = make_job("short").build()
    short.spec.ttl_seconds_after_finished = 60
    _stored_on_n1(database, 1, short)
    _schedule(database)
    _attempt_ends(database, "short-1", 0, stop=None)
    _reconcile(database, "short")
    due = store.transact(
        database, lambda w: jobs.reconcile(w, "default", "short", T0 + timedelta(seconds=30))
    )
    assert due == T0 + timedelta(seconds=60)  # asks to run again when the TTL runs out
    for step in (61, 62):  # mark deleting, then (no attempt running) drop Bindings and finalizer
        _reconcile(database, "short", T0 + timedelta(seconds=step))
    with database.read() as session:
        reader = store.Store(session)
        assert reader.find(job.Job, "short", "default") is None
        assert reader.find(binding.Binding, "short-1", "default") is None


def test_a_ttl_counts_from_when_the_controller_saw_the_job_finish(database: db.Database) -> None:
    """Its completion time is the attempt's end on its agent's clock, which may be long before
    (the controller was down) or, skewed, after: the TTL counts on the controller's own clock,
    so a Job is never deleted the moment it is seen finished."""
    early = make_job("early").build()
    early.spec.ttl_seconds_after_finished = 60
    _stored_on_n1(database, 1, early)
    _schedule(database)
    _attempt_ends(database, "early-1", 0, stop=None, ran=(T0, T0 + timedelta(seconds=1)))
    seen = T0 + timedelta(minutes=10)  # the controller was down until then
    _reconcile(database, "early", seen)
    done = _get(database, job.Job, "early")
    assert isinstance(done, job.Job)
    assert done.status.completion_time == T0 + timedelta(seconds=1)
    later = seen + timedelta(seconds=1)
    due = store.transact(database, lambda w: jobs.reconcile(w, "default", "early", later))
    assert due == seen + timedelta(seconds=60)


def test_a_new_job_the_controller_skips_is_one_reconcile_leaves_untouched(
    database: db.Database,
) -> None:
    """The controller does not reconcile a Job just created when `untouched_when_created` says
    reconcile would write nothing and want no timer: hold it to that, case by case."""
    suspended, waits = make_job("suspended").build(), make_job("waits").build()
    suspended.spec.suspend = True
    waits.spec.depends_on = ["first"]
    rerun = make_job("rerun").build()
    rerun.metadata.annotations[job.ANNOTATION_RERUN] = "token"
    cases = [make_job("plain").build(), make_job("big").gpus(4).build(), suspended, waits, rerun]
    with database.write() as session:
        writer = store.Store(session)
        created = {j.name: writer.create(j).wire() for j in cases}
    skipped = {name for name, wire in created.items() if jobs.untouched_when_created(wire)}
    assert skipped == {"plain", "big"}
    for name in created:
        with database.read() as session:
            before = store.Store(session).current_revision()
        due = store.transact(database, lambda w, name=name: jobs.reconcile(w, "default", name, T0))
        with database.read() as session:
            wrote = store.Store(session).current_revision() != before
        assert (name in skipped) == (not wrote and due is None), name


def test_a_job_a_reconcile_leaves_at_rest_is_one_the_next_reconcile_leaves_untouched(
    database: db.Database,
) -> None:
    """The controller does not reconcile a Job on its own write of it when `at_rest` says the
    reconcile that wrote it left it so that reconciling again would write nothing and want no
    timer: hold it to that, case by case (a Job with a TTL wants its timer; a Job whose
    attempt is still stopping is not done)."""
    plain, failed, kept = (make_job(name).build() for name in ("plain", "failed", "kept"))
    kept.spec.ttl_seconds_after_finished = 60
    _stored_on_n1(database, 3, plain, failed, kept)
    _schedule(database)
    for name, code in (("plain", 0), ("failed", 1), ("kept", 0)):
        _attempt_ends(database, f"{name}-1", code, stop=None)
    settled: set[tuple[str, str]] = set()
    store.transact(
        database,
        lambda w: jobs.reconcile_many(
            w, [("default", n) for n in ("plain", "failed", "kept")], T0, settled=settled
        ),
    )
    assert settled == {("default", "plain"), ("default", "failed")}
    for name in ("plain", "failed", "kept"):
        with database.read() as session:
            before = store.Store(session).current_revision()
        due = store.transact(database, lambda w, name=name: jobs.reconcile(w, "default", name, T0))
        with database.read() as session:
            wrote = store.Store(session).current_revision() != before
        assert (("default", name) in settled) == (not wrote and due is None), name


def test_the_controller_wakes_no_reconcile_for_a_job_it_left_at_rest_but_still_its_dependents(
    database: db.Database,
) -> None:
    """A Job's change at a revision where the controller's own reconcile left it at rest wakes
    no reconcile of it; the Jobs waiting for it are woken all the same, and a change at any
    other revision (a user's) wakes its reconcile."""
    first, after = make_job("first").build(), make_job("after").build()
    after.spec.depends_on = ["first"]
    _stored_on_n1(database, 1, first, after)
    _schedule(database)
    _attempt_ends(database, "first-1", 0, stop=None)
    controller = manager.Controller(database, clock=lambda: T0)
    controller.resync()  # learns that `after` waits for `first`
    controller.reconcile(("Job", "default", "first"))  # Succeeded: at rest
    with database.read() as session:
        changes = store.Store(session).changes_since(0)
    finished = [c for c in changes if c.kind == "Job" and c.name == "first"][-1:]
    assert finished[0].object["status"]["phase"] == "Succeeded"
    keys = controller._keys_of(finished)
    assert ("Job", "default", "first") not in keys
    assert {("Job", "default", "after"), manager.SCHEDULE} <= keys
    with database.write() as session:  # a user's write of it, at a revision of its own
        writer = store.Store(session)
        labelled = writer.get(job.Job, "first", "default")
        labelled.metadata.labels["seen"] = "yes"
        writer.update(labelled)
    with database.read() as session:
        latest = store.Store(session).changes_since(finished[0].revision)
    assert ("Job", "default", "first") in controller._keys_of(latest)


def test_the_jobs_a_controller_was_told_of_are_not_decoded_again_by_its_next_pass(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The feed's changes carry each new row's document, decoded as the controller reads them:
    its next pass's shared reads take those (`shared.note`) rather than decoding the same rows
    again (10,000 Jobs applied at once: 130 ms of that pass). Of a transaction that a page of
    the feed ended within, nothing created is taken until the rest of it is read, in any of
    its pages; and a Job written again in the same transaction is decoded from its row."""
    monkeypatch.setattr(shared, "_DECODED", {})
    monkeypatch.setattr(shared, "_VALIDATED", {})
    with database.write() as session:
        writer = store.Store(session)
        writer.create_many([make_job(f"j{i}").build() for i in range(3)])
    with database.write() as session:
        writer = store.Store(session)
        x, _ = writer.create_many([make_job("x").build(), make_job("y").build()])
        x.status.message = "told"
        writer.update_status(x)
    with database.read() as session:
        changes = store.Store(session).changes_since(0)

    def page(part: list[store.Change], *, continues: bool) -> feed.Page:
        made = feed.Page(part)
        made.continues = continues
        return made

    first = page(changes[:3], continues=False)
    x_, y_ = page(changes[3:4], continues=True), page(changes[4:5], continues=True)
    rest = page(changes[5:], continues=False)
    assert [c.type for c in rest] == ["MODIFIED"]

    def decoded() -> dict[str, bool]:
        """Whether each pending Job was decoded from its row (not the feed's own object)."""
        with database.read() as session:
            pending = store.Store(session).pending_wires()
        feed_objects = {id(c.object) for c in changes}
        return {w["metadata"]["name"]: id(w) not in feed_objects for w in pending}

    manager._note([first, x_, y_])  # x's and y's transaction goes on past what was read
    assert decoded() == {"j0": False, "j1": False, "j2": False, "x": True, "y": True}
    monkeypatch.setattr(shared, "_DECODED", {})
    manager._note([first, x_, y_, rest])
    assert decoded() == {"j0": False, "j1": False, "j2": False, "x": True, "y": False}
    # The loop waits for the rest of a transaction a page ended in before it passes.
    monkeypatch.setattr(shared, "_DECODED", {})
    monkeypatch.setattr(manager, "PAGE_WAIT_S", 30.0)  # it ends when the rest comes
    controller = manager.Controller(database, clock=lambda: T0)
    controller._changes.put(page(changes[3:5], continues=True))
    later = threading.Timer(0.2, controller._changes.put, [rest])
    later.start()
    keys = controller._wait(threading.Event())
    later.join()
    assert ("Job", "default", "x") in keys
    assert decoded()["y"] is False


def test_a_controller_that_starts_learns_what_every_job_waits_for(database: db.Database) -> None:
    """Its resync reads every Job's name, phase and dependsOn alone (not whole Jobs): enough to
    wake a pending Job when what it waits for ends, and not troubled by a spec that is no
    object or a dependsOn that holds no names (those Jobs are set aside by their own
    reconciles)."""
    waits, done, odd = make_job("eval").build(), make_job("old").build(), make_job("odd").build()
    hand_edited = make_job("edited").build()
    waits.spec.depends_on = ["train", "prep"]
    done.spec.depends_on = ["train"]
    with database.write() as session:
        writer = store.Store(session)
        for j in (make_job("train").build(), waits, done, odd, hand_edited):
            writer.create(j)
        old = writer.get(job.Job, "old", "default")
        old.status.phase = "Succeeded"  # waits for nothing any more
        writer.update_status(old)
    corrupt(database, "Job", "odd", spec=[1, 2])
    edited_spec = hand_edited.wire()["spec"] | {"dependsOn": [{"name": "train"}, ["x"], 3, "prep"]}
    corrupt(database, "Job", "edited", spec=edited_spec)
    controller = manager.Controller(database, clock=lambda: T0)
    keys = controller.resync()
    names = ("train", "eval", "old", "odd", "edited")
    assert keys == {("Job", "default", n) for n in names} | {manager.SCHEDULE}
    eval_key = ("Job", "default", "eval")
    assert controller._dependents == {
        ("default", "train"): {eval_key},
        ("default", "prep"): {eval_key, ("Job", "default", "edited")},
    }


def test_the_controller_keeps_one_due_time_for_its_next_pass(database: db.Database) -> None:
    """The last pass saw everything: when the pass after it is due replaces what earlier
    passes said, so a pass run sooner by a change leaves no stale timer for another."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        for name in ("a", "b", "c"):
            writer.create(make_job(name).build())
    controller = manager.Controller(database, clock=lambda: T0)
    controller.reconcile(manager.SCHEDULE)  # binds a to start now, leaves b and c for later
    assert controller._timers == [(T0 + scheduling.FOLLOW_UP, manager.SCHEDULE)]
    controller.reconcile(manager.SCHEDULE)  # binds b ahead and tells c: nothing due after it
    assert controller._timers == []


@pytest.mark.parametrize(
    ("how", "code", "backoff_limit"),
    [("evicted", 143, 0), ("retried", 3, 1)],
)
def test_a_new_attempt_shows_no_exit_code_until_it_ends(
    database: db.Database, how: str, code: int, backoff_limit: int
) -> None:
    """The exit code is the attempt's that ended: the bind of the next attempt clears it, so a
    Running Job never shows the one before's."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        again = make_job("again").build()
        again.spec.backoff_limit = backoff_limit
        writer.create(again)
    _schedule(database)
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, "again-1", "default")
        attempt.spec.stop_reason = binding.STOP_EVICTED if how == "evicted" else None
        attempt = writer.update(attempt)
        attempt.status.phase = "Exited"
        attempt.status.exit_code = code
        attempt.status.reason = binding.STOP_EVICTED if how == "evicted" else "Error"
        writer.update_status(attempt)
    _reconcile(database, "again")
    requeued = _get(database, job.Job, "again")
    assert isinstance(requeued, job.Job)
    assert (requeued.status.phase, requeued.status.exit_code) == ("Pending", code), how
    later = T0 + timedelta(minutes=1)  # past a retry's back-off
    _schedule(database, later)
    bound = _get(database, job.Job, "again")
    assert isinstance(bound, job.Job)
    assert (bound.status.phase, bound.status.attempts) == ("Scheduled", 2)
    assert bound.status.exit_code is None
    _attempt_ends(database, "again-2", 0, stop=None)
    _reconcile(database, "again", later)
    done = _get(database, job.Job, "again")
    assert isinstance(done, job.Job)
    assert (done.status.phase, done.status.exit_code) == ("Succeeded", 0)


# An activeDeadlineSeconds or ttlSecondsAfterFinished that gctl accepted before durations were
# limited to a year (quantity.MAX_DURATION_SECONDS): three thousand years from now and more.
FOREVER = 300_000_000_000


def test_a_deadline_stored_past_the_calendar_stops_no_one(database: db.Database) -> None:
    """A stored deadline that no time can be added to counts as no deadline known: the Job and
    the others are placed, it runs with no timer, and a Job that must wait is told why."""
    huge = make_job("huge").build()
    huge.spec.active_deadline_seconds = FOREVER
    _stored_on_n1(database, 2, huge, make_job("after").build())
    _schedule(database)
    for name in ("huge", "after"):
        placed = _get(database, job.Job, name)
        assert isinstance(placed, job.Job)
        assert placed.status.phase == "Scheduled", name
    report_attempt(database, "huge-1", "Running", T0)
    due = store.transact(database, lambda w: jobs.reconcile(w, "default", "huge", T0))
    running = _get(database, job.Job, "huge")
    assert isinstance(running, job.Job)
    assert (running.status.phase, due) == ("Running", None)
    with database.write() as session:
        store.Store(session).create(make_job("third").build())
    _schedule(database)  # reads the running Job's deadline to estimate when its GPU frees
    waiting = _get(database, job.Job, "third")
    assert isinstance(waiting, job.Job)
    assert waiting.status.phase in ("Pending", "Scheduled")
    assert waiting.status.estimated_start_time is None


def test_a_ttl_stored_past_the_calendar_never_comes_due(database: db.Database) -> None:
    kept = make_job("kept").build()
    kept.spec.ttl_seconds_after_finished = FOREVER
    _stored_on_n1(database, 1, kept)
    _schedule(database)
    _attempt_ends(database, "kept-1", 0, stop=None)
    _reconcile(database, "kept")
    due = store.transact(database, lambda w: jobs.reconcile(w, "default", "kept", T0))
    finished = _get(database, job.Job, "kept")
    assert isinstance(finished, job.Job)
    assert (finished.status.phase, due) == ("Succeeded", None)


def _job_told(database: db.Database, name: str) -> tuple[str, str]:
    """The reason and message of the Job's latest event."""
    with database.read() as session:
        reader = store.Store(session)
        told = reader.events_for(reader.get(job.Job, name, "default"))
    return told[-1].spec.reason, told[-1].spec.message


def _attempt_reported(
    database: db.Database, name: str, phase: str, reason: str, message: str
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        attempt.status.phase = phase  # type: ignore[assignment]
        attempt.status.reason = reason
        attempt.status.message = message or None
        attempt.status.exit_code = 143 if phase == "Exited" else None
        writer.update_status(attempt)


@pytest.mark.parametrize(
    ("phase", "reason", "message", "told"),
    [
        pytest.param(
            "Exited",
            "Fenced",
            "",
            (
                "AttemptFenced",
                "attempt 1 on n1 was stopped by its fence: the node's agent was silent for "
                "longer than --fence-after; retrying",
            ),
            id="fenced",
        ),
        pytest.param(
            "Lost",
            "Lost",
            "the supervisor died without recording the exit",
            (
                "AttemptLost",
                "attempt 1 on n1 was lost: the supervisor died without recording the exit; "
                "retrying",
            ),
            id="gone-from-its-node",
        ),
    ],
)
def test_an_attempt_that_ended_on_a_live_node_is_not_called_lost_with_it(
    database: db.Database, phase: str, reason: str, message: str, told: tuple[str, str]
) -> None:
    """QA's case: `gctl up` stopped for longer than --fence-after; its supervisors stopped
    attempt 1 (the fence) and the Job ran again on the same node, while its event said the
    attempt 'was lost with node n1; retrying elsewhere'. The node was never lost, and where the
    retry runs is the scheduler's to say."""
    _stored_on_n1(database, 1, make_job("fenced").build())
    _schedule(database)
    report_attempt(database, "fenced-1", "Running", T0)
    _reconcile(database, "fenced")
    _attempt_reported(database, "fenced-1", phase, reason, message)
    _reconcile(database, "fenced")
    assert _job_told(database, "fenced") == told
    again = _get(database, job.Job, "fenced")
    assert isinstance(again, job.Job)
    assert (again.status.phase, again.status.failed, again.status.reason) == ("Pending", 0, told[0])


def test_an_attempt_lost_with_its_node_says_why_and_not_where_it_runs_next(
    database: db.Database,
) -> None:
    seen: nodes.Seen = {}
    _stored_on_n1(database, 1, make_job("stranded").build())
    _schedule(database)
    report_attempt(database, "stranded-1", "Running", T0)
    _reconcile(database, "stranded")
    for now in (T0, T0 + timedelta(seconds=41)):
        store.transact(
            database, lambda w, now=now: nodes.reconcile(w, "n1", now, timedelta(seconds=40), seen)
        )
    _reconcile(database, "stranded", T0 + timedelta(seconds=41))
    assert _job_told(database, "stranded") == (
        "AttemptLost",
        "attempt 1 was lost with node n1: no heartbeat for 41s; retrying",
    )


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_database_outage_is_left_out_of_every_nodes_silence(database: db.Database) -> None:
    """QA: PostgreSQL restarted for 50 s; no agent could heartbeat meanwhile, and the
    controller, back, found every node silent for longer than the timeout: their attempts were
    declared lost and Jobs that had succeeded meanwhile ran again. The time the controller's
    change feed could not reach the database is not counted as any node's silence."""
    now = [T0]
    controller = manager.Controller(
        database, node_timeout=timedelta(seconds=40), clock=lambda: now[0]
    )
    with database.write() as session:
        _node(store.Store(session), "n1", 1, heartbeat=T0)
    key = ("Node", "", "n1")
    controller.reconcile(key)  # seen at T0
    with database.read() as session:
        since = store.Store(session).current_revision()
    name = sqlalchemy.make_url(database.url).database
    stop = threading.Event()
    follower = threading.Thread(target=controller._follow, args=(since, stop), daemon=True)
    follower.start()
    try:
        time.sleep(0.5)  # it follows the feed
        now[0] = T0 + timedelta(seconds=10)  # the outage begins, 10 s after n1's last beat
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        _admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )
        _until(lambda: manager.RESYNC in controller._wait(stop, block=False), "the feed failing")
        now[0] = T0 + timedelta(seconds=60)  # back after 50 s
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        _until(
            lambda: (controller._wait(stop, block=False), controller._seen["n1"][1] > T0)[1],
            "the feed back",
        )
        controller.reconcile(key)
        assert _ready(database) == "True"  # silent 10 s before the outage and 0 s after
        now[0] = T0 + timedelta(seconds=89)
        controller.reconcile(key)
        assert _ready(database) == "True"  # 39 s
        now[0] = T0 + timedelta(seconds=91)
        controller.reconcile(key)
        assert _ready(database) == "Unknown"  # 41 s outside the outage: a node failure
    finally:
        _admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        stop.set()
        follower.join(timeout=10)


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 15
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _ready(database: db.Database) -> str:
    found = _get(database, node.Node, "n1")
    assert isinstance(found, node.Node)
    return next(c.status for c in found.status.conditions if c.type == "Ready")
