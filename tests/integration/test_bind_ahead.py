"""Jobs bound ahead, against a real database (SQLite and PostgreSQL): a pass re-decides an
attempt that waits for busy GPUs until its agent takes it, and a user's delete or suspend takes
it back, without ever losing the attempt or running it twice."""

from datetime import UTC, datetime, timedelta

import pytest

from controller import jobs, nodes, scheduling, writing
from gctl.api import binding, errors, job, node
from gctl.store import db, store
from tests.builders import make_job, put_ready_node, report_attempt

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UNLIMITED = scheduling.Limits(seconds=None)


def _schedule(database: db.Database, now: datetime = T0) -> None:
    store.transact(database, lambda w: scheduling.schedule(w, now, UNLIMITED))


def _reconcile(database: db.Database, name: str, now: datetime = T0) -> None:
    store.transact(database, lambda w: jobs.reconcile(w, "default", name, now))


def _get_job(database: db.Database, name: str) -> job.Job:
    with database.read() as session:
        return store.Store(session).get(job.Job, name, "default")


def _attempts(database: db.Database, name: str) -> list[binding.Binding]:
    with database.read() as session:
        reader = store.Store(session)
        return reader.bindings_of(reader.get(job.Job, name, "default").metadata.uid or "")


def _reasons(database: db.Database, name: str) -> list[str]:
    with database.read() as session:
        reader = store.Store(session)
        return [e.spec.reason for e in reader.events_for(reader.get(job.Job, name, "default"))]


def _running_on_n1(database: db.Database, first: str, second: str, ends: tuple[int, int]) -> None:
    """n1's two GPUs run `first` (GPU 0) and `second` (GPU 1), which end `ends` seconds after
    they started (activeDeadlineSeconds)."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 2, T0)
        for name, seconds in zip((first, second), ends, strict=True):
            j = make_job(name).build()
            j.spec.active_deadline_seconds = seconds
            writer.create(j)
    _schedule(database)
    report_attempt(database, f"{first}-1", "Running", T0)
    report_attempt(database, f"{second}-1", "Running", T0)


def _two_busy_gpus(database: db.Database) -> None:
    """n1's two GPUs run `short` (GPU 0, ends in a minute) and `long` (GPU 1, in a day); `next`
    is bound ahead to GPU 0."""
    _running_on_n1(database, "short", "long", (60, 86_400))
    with database.write() as session:
        store.Store(session).create(make_job("next").build())
    _schedule(database)


def test_a_job_is_bound_ahead_to_the_gpu_that_frees_soonest_and_waits_for_it(
    database: db.Database,
) -> None:
    _two_busy_gpus(database)
    (ahead,) = _attempts(database, "next")
    short = _attempts(database, "short")[0]
    assert (ahead.spec.gpus, ahead.spec.after) == ([0], [short.metadata.uid])
    assert binding.queued(ahead.spec, ahead.status)
    waiting = _get_job(database, "next")
    assert (waiting.status.phase, waiting.status.attempts) == ("Scheduled", 1)
    assert waiting.status.start_time is None  # it has not started: no deadline counts yet
    said = next(c for c in waiting.status.conditions if c.type == job.CONDITION_SCHEDULED)
    assert said.message == "attempt 1 bound to n1, GPUs [0], to start when default/short ends"


def test_it_moves_when_another_gpu_frees_first_and_keeps_its_attempt(
    database: db.Database,
) -> None:
    _two_busy_gpus(database)
    (first,) = _attempts(database, "next")
    report_attempt(database, "long-1", "Exited", T0, exit_code=0)  # GPU 1 frees before GPU 0
    _reconcile(database, "long")
    _schedule(database)
    (moved,) = _attempts(database, "next")
    assert moved.metadata.uid != first.metadata.uid
    assert (moved.metadata.name, moved.spec.gpus, moved.spec.after) == ("next-1", [1], [])
    j = _get_job(database, "next")
    assert (j.status.attempts, j.status.gpus) == (1, [1])
    assert _reasons(database, "next") == ["Scheduled", "Scheduled"]


def test_a_higher_priority_job_takes_its_place_and_it_waits_again(
    database: db.Database,
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 1, T0)
        writer.create(make_job("running").priority(10).build())  # not preempted by `high`
    _schedule(database)
    report_attempt(database, "running-1", "Running", T0)
    with database.write() as session:
        store.Store(session).create(make_job("low").build())
    _schedule(database)
    assert [b.metadata.name for b in _attempts(database, "low")] == ["low-1"]
    with database.write() as session:
        store.Store(session).create(make_job("high").priority(5).build())
    _schedule(database)
    assert _attempts(database, "low") == []
    low = _get_job(database, "low")
    assert (low.status.phase, low.status.attempts, low.status.gpus) == ("Pending", 0, None)
    assert _reasons(database, "low") == ["Scheduled", writing.REASON_UNBOUND]
    with database.read() as session:
        reader = store.Store(session)
        said = reader.events_for(reader.get(job.Job, "low", "default"))[-1].spec.message
    assert said.startswith("attempt 1, bound ahead to n1 GPUs [0], gave up its place to high: ")
    (high,) = _attempts(database, "high")
    assert high.spec.after == [_attempts(database, "running")[0].metadata.uid]


def test_a_job_that_preempts_for_its_place_is_named_by_the_unbound_event(
    database: db.Database,
) -> None:
    """QA's case: `boss` preempts `run0` and holds its GPU until it stops: `waiter`, bound
    ahead behind `run0`, gives up its place to `boss`, which binds nothing yet."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 1, T0)
        writer.create(make_job("run0").priority(1).build())
    _schedule(database)
    report_attempt(database, "run0-1", "Running", T0)
    with database.write() as session:
        store.Store(session).create(make_job("waiter").build())
    _schedule(database)
    assert [b.metadata.name for b in _attempts(database, "waiter")] == ["waiter-1"]
    with database.write() as session:
        store.Store(session).create(make_job("boss").priority(50).build())
    _schedule(database)
    assert _attempts(database, "waiter") == []
    with database.read() as session:
        reader = store.Store(session)
        said = reader.events_for(reader.get(job.Job, "waiter", "default"))[-1].spec.message
    assert said.startswith("attempt 1, bound ahead to n1 GPUs [0], gave up its place to boss: ")


def test_an_attempt_its_agent_took_is_not_moved(database: db.Database) -> None:
    """The pass removes exactly the Binding it read: once the agent wrote Starting, the remove
    conflicts, the transaction rolls back, and a fresh pass sees the attempt as started."""
    _two_busy_gpus(database)
    with database.read() as session:
        read = store.Store(session).get(binding.Binding, "next-1", "default")
    report_attempt(database, "next-1", "Starting", T0)  # the agent took it (short ended, say)
    with pytest.raises(errors.Conflict), database.write() as session:
        store.Store(session).remove(read)
    report_attempt(database, "long-1", "Exited", T0, exit_code=0)
    _reconcile(database, "long")
    _schedule(database)
    (taken,) = _attempts(database, "next")
    assert (taken.spec.gpus, taken.status.phase) == ([0], "Starting")


@pytest.mark.parametrize("how", ["delete", "suspend"])
def test_deleting_or_suspending_takes_the_attempt_back_uncounted(
    database: db.Database, how: str
) -> None:
    _two_busy_gpus(database)
    with database.write() as session:
        writer = store.Store(session)
        if how == "delete":
            writer.delete(job.Job, "next", "default")
        else:
            j = writer.get(job.Job, "next", "default")
            j.spec.suspend = True
            writer.update(j)
    _reconcile(database, "next")
    if how == "delete":
        with database.read() as session:
            assert store.Store(session).find(job.Job, "next", "default") is None
            assert store.Store(session).find(binding.Binding, "next-1", "default") is None
        return
    assert _attempts(database, "next") == []
    j = _get_job(database, "next")
    assert (j.status.phase, j.status.attempts, j.status.reason) == ("Pending", 0, "Suspended")
    _schedule(database, T0 + timedelta(seconds=1))
    assert _attempts(database, "next") == []  # a suspended Job is not bound again


def test_a_pass_out_of_time_still_binds_the_job_it_moved(database: db.Database) -> None:
    """A late pass leaves new binds to the next one, but a Job bound ahead that it moved has
    given up its place already: it is bound again, never left without an attempt."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 4, T0)
        for index in range(4):  # r0 frees soonest: `next` is bound ahead of it
            j = make_job(f"r{index}").build()
            j.spec.active_deadline_seconds = 60 * (index + 1)
            writer.create(j)
    _schedule(database)
    with database.write() as session:
        store.Store(session).create(make_job("next").build())
    _schedule(database)
    assert _attempts(database, "next")[0].spec.gpus == [0]
    for index in (1, 2, 3):
        report_attempt(database, f"r{index}-1", "Exited", T0, exit_code=0)
        _reconcile(database, f"r{index}")
    with database.write() as session:
        for name in ("a", "b"):
            store.Store(session).create(make_job(name).priority(5).build())
    ticks = iter(range(1000))  # every look at the clock is a second later: late at once
    limits = scheduling.Limits(seconds=0.5, clock=lambda: float(next(ticks)))
    store.transact(database, lambda w: scheduling.schedule(w, T0, limits))
    (moved,) = _attempts(database, "next")
    assert (moved.spec.gpus, moved.spec.after) == ([3], [])
    assert [len(_attempts(database, name)) for name in ("a", "b")] == [1, 0]


def test_an_attempt_seen_only_once_it_ended_gives_the_job_its_start_time(
    database: db.Database,
) -> None:
    """A Job bound ahead has no start time until it starts; an attempt that ran and exited
    between two looks of the controller still gives it one (its deadline counts from it)."""
    _two_busy_gpus(database)
    report_attempt(database, "next-1", "Exited", T0 + timedelta(minutes=1), exit_code=3)
    _reconcile(database, "next")
    j = _get_job(database, "next")
    assert (j.status.phase, j.status.start_time) == ("Failed", T0 + timedelta(minutes=1))
    # ...and its events tell that it started, then how it ended
    assert _reasons(database, "next")[-2:] == ["Started", "BackoffLimitExceeded"]


def test_a_lost_node_loses_what_ran_there_and_its_job_bound_ahead_moves_uncounted(
    database: db.Database,
) -> None:
    _two_busy_gpus(database)
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n2", 1, T0)
        writer.delete(node.Node, "n1")
    seen: nodes.Seen = {}
    store.transact(database, lambda w: nodes.reconcile(w, "n1", T0, timedelta(seconds=40), seen))
    assert _attempts(database, "short")[0].status.phase == "Lost"
    assert binding.queued(
        _attempts(database, "next")[0].spec, _attempts(database, "next")[0].status
    )
    _schedule(database)
    (moved,) = _attempts(database, "next")
    assert (moved.spec.node, moved.spec.gpus, moved.spec.after) == ("n2", [0], [])
    assert _get_job(database, "next").status.attempts == 1


# -- armed attempts: taken by the agent ahead, given back when the controller asks ------------


def _arm(database: db.Database, name: str, generation: int = 1) -> None:
    """What the agent writes when it arms an attempt bound ahead: Armed, from that Job
    generation."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        attempt.status.phase = "Armed"
        attempt.status.observed_generation = generation
        writer.update_status(attempt)


def _give_back(database: db.Database, name: str) -> None:
    """What the agent writes once it took an armed attempt back from its supervisor."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, name, "default")
        assert attempt.spec.disarm  # only when asked (or its GPUs closed)
        attempt.status.phase = "Pending"
        attempt.status.observed_generation = None
        writer.update_status(attempt)


def _binding(database: db.Database, name: str) -> binding.Binding:
    with database.read() as session:
        return store.Store(session).get(binding.Binding, name, "default")


def test_an_armed_attempt_that_should_move_is_asked_back_then_moved(
    database: db.Database,
) -> None:
    _two_busy_gpus(database)
    _arm(database, "next-1")
    armed = _binding(database, "next-1")
    report_attempt(database, "long-1", "Exited", T0, exit_code=0)  # GPU 1 frees first
    _reconcile(database, "long")
    _schedule(database)
    asked = _binding(database, "next-1")  # not removed: its supervisor may start it any time
    assert (asked.metadata.uid, asked.status.phase, asked.spec.disarm) == (
        armed.metadata.uid,
        "Armed",
        True,
    )
    assert _get_job(database, "next").status.gpus == [0]
    _give_back(database, "next-1")
    _schedule(database)
    (moved,) = _attempts(database, "next")
    assert moved.metadata.uid != armed.metadata.uid
    assert (moved.spec.gpus, moved.spec.after, moved.spec.disarm) == ([1], [], False)
    assert _get_job(database, "next").status.attempts == 1


def test_an_attempt_given_back_that_stays_may_be_armed_again(database: db.Database) -> None:
    _two_busy_gpus(database)
    _arm(database, "next-1")
    with database.write() as session:
        writer = store.Store(session)
        jobs.ask_back(writer, writer.get(binding.Binding, "next-1", "default"))
    _give_back(database, "next-1")
    _schedule(database)  # GPU 0 still frees soonest: it stays, and may be armed again
    stays = _binding(database, "next-1")
    assert (stays.spec.gpus, stays.status.phase, stays.spec.disarm) == ([0], "Pending", False)


@pytest.mark.parametrize("how", ["suspend", "rerun"])
def test_an_armed_attempt_suspended_or_rerun_is_asked_back_then_withdrawn_uncounted(
    database: db.Database, how: str
) -> None:
    _two_busy_gpus(database)
    _arm(database, "next-1")
    with database.write() as session:
        writer = store.Store(session)
        j = writer.get(job.Job, "next", "default")
        if how == "suspend":
            j.spec.suspend = True
        else:
            j.metadata.annotations[job.ANNOTATION_RERUN] = "token-1"
        writer.update(j)
    _reconcile(database, "next")
    asked = _binding(database, "next-1")
    assert (asked.status.phase, asked.spec.disarm, asked.spec.stop_reason) == ("Armed", True, None)
    _give_back(database, "next-1")
    _reconcile(database, "next")
    if how == "suspend":
        assert _attempts(database, "next") == []
        j = _get_job(database, "next")
        assert (j.status.phase, j.status.attempts, j.status.reason) == ("Pending", 0, "Suspended")
    else:  # withdrawn, and the re-run is the Job pending again: bound again by the next pass
        assert _attempts(database, "next") == []
        assert _get_job(database, "next").status.phase == "Pending"


def test_a_job_changed_after_its_attempt_was_armed_asks_it_back(database: db.Database) -> None:
    _two_busy_gpus(database)
    _arm(database, "next-1", generation=1)
    _reconcile(database, "next")
    assert not _binding(database, "next-1").spec.disarm  # armed from the Job as it is
    with database.write() as session:
        writer = store.Store(session)
        j = writer.get(job.Job, "next", "default")
        j.spec.env = {"GREETING": "changed"}
        writer.update(j)  # generation 2
    _reconcile(database, "next")
    assert _binding(database, "next-1").spec.disarm


def test_deleting_a_job_whose_attempt_is_armed_stops_it_before_it_starts(
    database: db.Database,
) -> None:
    _two_busy_gpus(database)
    _arm(database, "next-1")
    with database.write() as session:
        store.Store(session).delete(job.Job, "next", "default")
    _reconcile(database, "next")
    assert _binding(database, "next-1").spec.stop_reason == binding.STOP_DELETED


def test_a_lost_node_loses_an_armed_attempt(database: db.Database) -> None:
    """Its supervisor may have started it: like a started one, it is Lost, not moved."""
    _two_busy_gpus(database)
    _arm(database, "next-1")
    with database.write() as session:
        store.Store(session).delete(node.Node, "n1")
    seen: nodes.Seen = {}
    store.transact(database, lambda w: nodes.reconcile(w, "n1", T0, timedelta(seconds=40), seen))
    assert _binding(database, "next-1").status.phase == "Lost"


def test_what_an_armed_attempt_asked_back_frees_is_not_given_away_in_the_same_pass(
    database: db.Database,
) -> None:
    """The pass that asks `y` back (armed on n1 [0,1], GPU 0 free, GPU 1 busy) must not bind
    `z` to n1 GPU 0: `y`'s supervisor may start it there before its agent gives it back."""
    _running_on_n1(database, "a", "b", (60, 600))
    with database.write() as session:
        store.Store(session).create(make_job("y").gpus(2).build())
    _schedule(database)
    _arm(database, "y-1")
    report_attempt(database, "a-1", "Exited", T0, exit_code=0)
    _reconcile(database, "a")
    _schedule(database)
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n2", 2, T0)  # two GPUs free elsewhere: `y` should move there
        writer.create(make_job("z").build())
    _schedule(database)
    asked = _binding(database, "y-1")
    assert (asked.spec.node, asked.status.phase, asked.spec.disarm) == ("n1", "Armed", True)
    assert _attempts(database, "z") == []  # held back: n1 GPU 0 is not free yet
    _give_back(database, "y-1")
    _schedule(database)
    (moved,) = _attempts(database, "y")
    (z,) = _attempts(database, "z")
    assert (moved.spec.node, moved.spec.gpus) == ("n2", [0, 1])
    assert (z.spec.node, z.spec.gpus) == ("n1", [0])


def test_a_pass_before_the_rerun_is_acted_on_does_not_arm_the_old_attempt_again(
    database: db.Database,
) -> None:
    """Given back for a re-run, the attempt is the re-run's to withdraw: a pass that comes
    first must not clear the request for it back (its agent would arm it again)."""
    _two_busy_gpus(database)
    _arm(database, "next-1")
    with database.write() as session:
        writer = store.Store(session)
        j = writer.get(job.Job, "next", "default")
        j.metadata.annotations[job.ANNOTATION_RERUN] = "token-1"
        writer.update(j)
    _reconcile(database, "next")
    _give_back(database, "next-1")
    _schedule(database)
    assert _binding(database, "next-1").spec.disarm
    _reconcile(database, "next")
    assert _attempts(database, "next") == []


# -- a pass that starts Jobs and leaves the rest of the queue undecided (placement.plan) -----


def _next_behind_each_other(database: db.Database) -> None:
    """n1's GPU 0 runs `x` (a day, priority 10), GPU 1 ran `y`, which just ended: `q1`, bound ahead
    behind `y`, is about to be started by its agent, which has not taken it yet; `q2` is
    bound ahead behind `x`; `w0`..`w2` wait."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 2, T0)
        for name, seconds, priority in (("x", 86_400, 10), ("y", 60, 0)):
            j = make_job(name).priority(priority).build()  # x: no Job here may preempt it
            j.spec.active_deadline_seconds = seconds
            writer.create(j)
    _schedule(database)
    report_attempt(database, "x-1", "Running", T0)
    report_attempt(database, "y-1", "Running", T0)
    with database.write() as session:
        writer = store.Store(session)
        writer.create(make_job("q1").build())
        writer.create(make_job("q2").build())
        for i in range(3):
            writer.create(make_job(f"w{i}").build())
    _schedule(database)
    report_attempt(database, "y-1", "Exited", T0, exit_code=0)
    _reconcile(database, "y")


def _next_on(database: db.Database, names: list[str]) -> dict[int, list[str]]:
    """The Jobs bound ahead to each GPU of n1 (their attempts not yet taken)."""
    found: dict[int, list[str]] = {}
    for name in names:
        for b in _attempts(database, name):
            if binding.queued(b.spec, b.status):
                for gpu in b.spec.gpus:
                    found.setdefault(gpu, []).append(name)
    return found


def test_a_job_bound_ahead_is_not_left_beside_the_job_that_took_its_place(
    database: db.Database,
) -> None:
    """`n` comes first in the queue and takes `q2`'s place behind `x`; `q2` moves behind
    `q1`. A pass that stopped deciding after `q1` started wrote `n`'s Binding and left
    `q2`'s: two Jobs next on GPU 0."""
    _next_behind_each_other(database)
    with database.write() as session:
        store.Store(session).create(make_job("n").priority(5).build())
    _schedule(database)
    assert _next_on(database, ["q1", "q2", "n"])[0] == ["n"]


def test_a_pass_whose_only_start_is_a_job_bound_ahead_tells_every_waiting_job(
    database: db.Database,
) -> None:
    """`q1` starts where it was bound, which writes nothing: a pass that counted it as a start
    left the waiting Jobs untold and was due again 50 ms later, pass after pass, for as long
    as the agent did not take `q1`."""
    _next_behind_each_other(database)
    dues = [
        store.transact(database, lambda w: scheduling.schedule(w, T0, UNLIMITED)) for _ in range(2)
    ]
    assert dues[-1] != T0 + scheduling.FOLLOW_UP
    said = next(c for c in _get_job(database, "w2").status.conditions)
    assert said.reason == "Unschedulable"
