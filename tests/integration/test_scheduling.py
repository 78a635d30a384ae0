"""The scheduling pass against a real database (SQLite and PostgreSQL), one pass at a time with a
fixed clock: pools and profiles resolved from the store, preemption through Bindings and Events,
what waiting Jobs are told, and that a pass writes only what changed."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy

from controller import jobs, placement, reading, scheduling, writing
from gctl.api import binding, errors, job, meta, node, pool, profile, queue
from gctl.store import db, store, tables
from tests.builders import make_job, put_ready_node, report_attempt

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GI = 2**30
UNLIMITED = scheduling.Limits(seconds=None)


def _node(writer: store.Store, name: str, gpus: int, **fields: Any) -> None:
    put_ready_node(writer, name, gpus, T0, **fields)


def _without_binding_ahead(writer: store.Store) -> None:
    """The default pool, with Jobs that cannot start waiting in the queue (none bound ahead)."""
    writer.create(
        pool.GPUPool(
            metadata=meta.ObjectMeta(name="default"), spec=pool.GPUPoolSpec(bind_ahead=False)
        )
    )


def _schedule(
    database: db.Database, now: datetime = T0, limits: scheduling.Limits = UNLIMITED
) -> datetime | None:
    return store.transact(database, lambda w: scheduling.schedule(w, now, limits))


def _settle(database: db.Database, now: datetime = T0) -> None:
    """Passes until one leaves nothing for the next, as the controller runs them (the one
    after a pass that started Jobs comes `FOLLOW_UP` later)."""
    for _ in range(10):
        due = _schedule(database, now)
        if due not in (now, now + scheduling.FOLLOW_UP):
            return
    raise AssertionError("ten passes in a row left work for the next")


def _job(database: db.Database, name: str) -> job.Job:
    with database.read() as session:
        return store.Store(session).get(job.Job, name, "default")


def _binding(database: db.Database, name: str) -> binding.Binding:
    with database.read() as session:
        return store.Store(session).get(binding.Binding, name, "default")


def _events(database: db.Database, name: str) -> list[tuple[str, str]]:
    with database.read() as session:
        reader = store.Store(session)
        found = reader.get(job.Job, name, "default")
        return [(e.spec.reason, e.spec.message) for e in reader.events_for(found)]


def _waiting(j: job.Job) -> tuple[str, str]:
    said = next(c for c in j.status.conditions if c.type == job.CONDITION_SCHEDULED)
    assert said.status == "False"
    return said.reason, said.message


def _places(database: db.Database, now: datetime = T0) -> dict[tuple[str, str], int]:
    """Places in the queue as `gctl get jobs -o wide` numbers them, with the dependencies
    that succeeded as the scheduling pass finds them."""
    with database.read() as session:
        reader = store.Store(session)
        pending = reader.pending_wires()
        return queue.positions(pending, now, reading.succeeded_dependencies(reader, pending))


def _revision(database: db.Database) -> int:
    with database.read() as session:
        return store.Store(session).current_revision()


def test_a_job_naming_a_missing_pool_waits_until_the_pool_exists(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        lost = make_job("lost").build()
        lost.spec.pool = "research"
        writer.create(lost)
    _schedule(database)
    waiting = _job(database, "lost")
    message = 'GPUPool "research" not found: create it, or change spec.pool'
    assert _waiting(waiting) == ("GPUPoolNotFound", message)
    assert waiting.status.reason == "GPUPoolNotFound"
    with database.write() as session:
        store.Store(session).create(pool.GPUPool(metadata=meta.ObjectMeta(name="research")))
    _schedule(database)
    placed = _job(database, "lost")
    assert (placed.status.phase, placed.status.reason) == ("Scheduled", None)


def test_a_profile_fills_what_the_job_leaves_out_and_is_looked_up_each_pass(
    database: db.Database,
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 4)
        for name, gpus in (("served", None), ("override", 1)):
            j = make_job(name).build()
            j.spec.resources = job.Resources(gpus=gpus, profile="llm-32b")
            writer.create(j)
    _schedule(database)
    assert _waiting(_job(database, "served"))[0] == "GPUProfileNotFound"
    with database.write() as session:
        store.Store(session).create(
            profile.GPUProfile(
                metadata=meta.ObjectMeta(name="llm-32b"),
                spec=profile.GPUProfileSpec(gpus=2, gpu_memory="48Gi"),
            )
        )
    _schedule(database)
    served, override = _binding(database, "served-1"), _binding(database, "override-1")
    assert (len(served.spec.gpus), served.spec.gpu_memory) == (2, 48 * GI)
    assert (len(override.spec.gpus), override.spec.gpu_memory) == (1, 48 * GI)
    assert _job(database, "served").status.reason is None


def test_preemption_stops_the_lower_job_then_binds_the_higher_one(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("low").build())
    _schedule(database)
    report_attempt(database, "low-1", "Running", T0)
    with database.write() as session:
        store.Store(session).create(make_job("high").priority(10).build())
    _schedule(database)
    assert _binding(database, "low-1").spec.stop_reason == binding.STOP_PREEMPTED
    assert ("Preempted", "preempted by default/high (priority 10) to free GPUs [0] on n1") in (
        _events(database, "low")
    )
    preempting = "preempting 1 lower-priority job(s) on n1: default/low"
    assert ("Preempting", preempting) in _events(database, "high")
    assert _waiting(_job(database, "high")) == ("Unschedulable", preempting)

    before = _revision(database)
    _schedule(database)  # the victim still runs: wait, and preempt nobody else
    high = _job(database, "high")
    assert _waiting(high)[1].startswith("waiting for 1 preempted job(s) to stop on n1")
    assert len([e for e in _events(database, "high") if e[0] == "Preempting"]) == 1
    _schedule(database)
    assert _revision(database) == before + 1  # one write: what high is told

    report_attempt(database, "low-1", "Exited", T0, exit_code=143)
    store.transact(database, lambda w: jobs.reconcile(w, "default", "low", T0))
    low = _job(database, "low")
    assert (low.status.phase, low.status.preemptions, low.status.failed) == ("Pending", 1, 0)
    _settle(database)
    assert _job(database, "high").status.phase == "Scheduled"
    low = _job(database, "low")  # requeued, and bound ahead: it runs next, after high
    assert (low.status.phase, low.status.attempts) == ("Scheduled", 2)
    assert _binding(database, "low-2").spec.after == [_binding(database, "high-1").metadata.uid]


def test_a_pass_out_of_time_leaves_the_rest_of_its_preemptions_to_the_next(
    database: db.Database,
) -> None:
    """Preemptions are written a batch at a time within the pass's time limit; the next pass
    decides the rest again, and no attempt is preempted twice, nor any Job told twice."""
    count = writing.BATCH + 6
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", count)
        for index in range(count):
            writer.create(make_job(f"low-{index:02d}").build())
    _schedule(database)
    for index in range(count):
        report_attempt(database, f"low-{index:02d}-1", "Running", T0)
    with database.write() as session:
        for index in range(count):
            store.Store(session).create(make_job(f"high-{index:02d}").priority(10).build())
    ticks = iter(range(10_000))  # every look at the clock is a second later: late at once
    late = scheduling.Limits(seconds=0.5, clock=lambda: float(next(ticks)))
    assert _schedule(database, limits=late) == T0  # work left: the next pass is due now

    def stopping() -> int:
        with database.read() as session:
            return sum(1 for b in store.Store(session).active_bindings() if b.spec.stop_reason)

    assert stopping() == writing.BATCH
    _schedule(database)
    assert stopping() == count
    for index in range(count):
        assert [r for r, _ in _events(database, f"low-{index:02d}")].count("Preempted") == 1
        assert [r for r, _ in _events(database, f"high-{index:02d}")].count("Preempting") == 1


def test_a_pass_with_nothing_changed_writes_nothing(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        for i in range(5):
            writer.create(make_job(f"j{i}").build())
    _settle(database)
    settled = _revision(database)
    assert _schedule(database, T0 + timedelta(minutes=1)) is None  # j2, j3 stay bound ahead
    assert _revision(database) == settled
    for name, first in (("j2", "j0"), ("j3", "j1")):
        ahead = _binding(database, f"{name}-1")
        assert ahead.spec.after == [_binding(database, f"{first}-1").metadata.uid]
        assert ahead.spec.gpus == _binding(database, f"{first}-1").spec.gpus
    waiting = _job(database, "j4")
    assert _places(database)[("default", "j4")] == 1
    assert _waiting(waiting) == ("Unschedulable", "0/2 GPUs fit: 2 in use")


def test_a_pass_that_starts_jobs_leaves_the_rest_to_the_next_one(database: db.Database) -> None:
    """So that the agent can start them a transaction earlier: binding ahead and telling the
    waiting Jobs come with the pass after it, a moment later, while the agent starts them."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        for i in range(5):
            writer.create(make_job(f"j{i}").build())
    assert _schedule(database) == T0 + scheduling.FOLLOW_UP  # the next pass is due soon
    assert [_job(database, f"j{i}").status.phase for i in range(5)] == (
        ["Scheduled"] * 2 + ["Pending"] * 3
    )
    untold = [_job(database, f"j{i}").status.conditions for i in (2, 3, 4)]
    assert untold == [[], [], []]

    assert _schedule(database) is None
    assert [_job(database, f"j{i}").status.phase for i in range(5)] == (
        ["Scheduled"] * 4 + ["Pending"]
    )
    assert _binding(database, "j2-1").spec.after == [_binding(database, "j0-1").metadata.uid]
    assert _waiting(_job(database, "j4")) == ("Unschedulable", "0/2 GPUs fit: 2 in use")


class _Ticking:
    """A clock that moves a microsecond at every reading, from `at`."""

    def __init__(self) -> None:
        self.at, self.ticks = T0, 0

    def __call__(self) -> datetime:
        self.ticks += 1
        return self.at + timedelta(microseconds=self.ticks)


def _queue_behind_one_gpu(database: db.Database, jobs: int) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create_many([make_job(f"j{i:03d}").build() for i in range(jobs)])


def test_jobs_behind_the_head_of_the_queue_are_told_by_the_pass_that_decides_them_all(
    database: db.Database,
) -> None:
    """With the controller's `Tail`, its first pass decides the whole queue (and, as it starts
    a Job, so does the next); then a pass that could change nothing behind the head of the
    queue but what those Jobs are told leaves them as they were, and the pass due
    `TAIL_EVERY` after the last one that decided the whole queue tells them."""
    clock = _Ticking()
    tail = scheduling.Tail(clock)

    def run() -> datetime | None:
        return scheduling.run(database, clock.at, UNLIMITED, tail=tail)[0]

    _queue_behind_one_gpu(database, placement.QUEUE_HEAD + 10)
    assert run() == T0 + scheduling.FOLLOW_UP  # j000 starts: the rest is the next pass's ...
    assert not tail.done
    clock.at += scheduling.FOLLOW_UP
    assert run() is None  # ... which binds j001 ahead and tells the others why they wait
    assert tail.done
    last = f"j{placement.QUEUE_HEAD + 9:03d}"
    assert _waiting(_job(database, last)) == ("Unschedulable", "0/1 GPUs fit: 1 in use")
    with database.write() as session:
        store.Store(session).create_many([make_job(f"late{i}").build() for i in range(3)])
    due = run()
    assert due is not None
    whole = T0 + scheduling.FOLLOW_UP + scheduling.TAIL_EVERY  # after the one that was
    assert timedelta(0) < due - whole < timedelta(milliseconds=1)
    assert [_job(database, f"late{i}").status.conditions for i in range(3)] == [[], [], []]

    clock.at = whole + timedelta(milliseconds=1)
    assert run() is None
    assert _waiting(_job(database, "late2")) == ("Unschedulable", "0/1 GPUs fit: 1 in use")
    assert tail.done
    assert tail.last is not None
    assert tail.last > clock.at


def test_a_pass_that_was_to_tell_the_whole_queue_and_ran_out_of_writes_leaves_it_to_the_next(
    database: db.Database,
) -> None:
    """Each pass tells 40 Jobs; the passes after the first go on telling the rest in a quarter
    of the time (`BACKLOG_SHARE`), not a second later: the first starts j000, the next five
    tell the other 198 (the last of them within its budget: it decided the whole queue)."""
    clock = _Ticking()
    tail = scheduling.Tail(clock)
    _queue_behind_one_gpu(database, 200)
    limits = scheduling.Limits(writes=40, seconds=None)
    dues = []
    while not tail.done and len(dues) < 10:
        dues.append(scheduling.run(database, clock.at, limits, tail=tail)[0])
        clock.at += timedelta(milliseconds=10)  # more than four times what a pass took
    at = [T0 + timedelta(milliseconds=10 * i) for i in range(6)]
    assert dues == [at[0] + scheduling.FOLLOW_UP, at[1], at[2], at[3], at[4], None]
    assert _waiting(_job(database, "j199")) == ("Unschedulable", "0/1 GPUs fit: 1 in use")


def test_waiting_jobs_learn_their_place_and_when_they_should_start(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        _without_binding_ahead(writer)
        running = make_job("running").priority(5).build()
        running.spec.active_deadline_seconds = 3600
        writer.create(running)
        # an earlier run of `next`'s command took 10 minutes
        done = make_job("done").command("python", "eval.py").build()
        created = writer.create(done)
        created.status.phase = "Succeeded"
        created.status.start_time = T0 - timedelta(minutes=30)
        created.status.completion_time = T0 - timedelta(minutes=20)
        writer.update_status(created)
    _schedule(database)
    with database.write() as session:
        writer = store.Store(session)
        writer.create(make_job("next").command("python", "eval.py").build())
        writer.create(make_job("after").build())
    _schedule(database)
    first, second = _job(database, "next"), _job(database, "after")
    places = _places(database)
    assert (places[("default", "next")], first.status.estimated_start_time) == (
        1,
        T0 + timedelta(hours=1),
    )
    assert (places[("default", "after")], second.status.estimated_start_time) == (
        2,
        T0 + timedelta(hours=1, minutes=10),
    )


def test_a_longest_first_pool_starts_the_longest_time_limit_first(database: db.Database) -> None:
    """Among equal priorities a LongestFirst pool takes the longest activeDeadlineSeconds first
    (none counts as longest), the pass and `get jobs -o wide` alike; set back to FIFO, the
    oldest again, also for Jobs the pass has already read."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        spec = pool.GPUPoolSpec(bind_ahead=False, queue_order="LongestFirst")
        writer.create(pool.GPUPool(metadata=meta.ObjectMeta(name="default"), spec=spec))
        for name, limit in (("short", 60), ("medium", 600), ("open", None), ("long", 3600)):
            new = make_job(name).build()
            new.spec.active_deadline_seconds = limit
            writer.create(new)
    _settle(database)
    assert _job(database, "open").status.phase == "Scheduled"

    def queue_now() -> list[tuple[str, int, datetime | None]]:
        with database.read() as session:
            reader = store.Store(session)
            pending = reader.pending_wires()
            orders = queue.orders(reader.list_wire(pool.GPUPool))
            places = queue.positions(pending, T0, set(), orders)
        return sorted(
            (name, place, _job(database, name).status.estimated_start_time)
            for (_, name), place in places.items()
        )

    assert queue_now() == [("long", 1, None), ("medium", 2, None), ("short", 3, None)]
    with database.write() as session:
        writer = store.Store(session)
        found = writer.get(pool.GPUPool, "default")
        found.spec.queue_order = "FIFO"
        writer.update(found)
        running = writer.get(job.Job, "open", "default")
        running.spec.active_deadline_seconds = 100  # so that the queue gets estimates
        writer.update(running)
    _settle(database)
    start = T0 + timedelta(seconds=100)
    assert queue_now() == [
        ("long", 3, start + timedelta(seconds=660)),
        ("medium", 2, start + timedelta(seconds=60)),
        ("short", 1, start),
    ]


def test_a_longest_first_pool_estimates_its_queue_longest_first(database: db.Database) -> None:
    """The pass's own order in a LongestFirst pool, as its estimates show it: the longest time
    limit starts first, each as the one before it ends; the queue numbered the same way."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        spec = pool.GPUPoolSpec(bind_ahead=False, queue_order="LongestFirst")
        writer.create(pool.GPUPool(metadata=meta.ObjectMeta(name="default"), spec=spec))
        for name, limit in (("short", 60), ("busy", 7200), ("medium", 600), ("long", 3600)):
            new = make_job(name).build()
            new.spec.active_deadline_seconds = limit
            writer.create(new)
    _settle(database)
    assert _job(database, "busy").status.phase == "Scheduled"  # the longest of all
    start = T0 + timedelta(seconds=7200)
    with database.read() as session:
        reader = store.Store(session)
        orders = queue.orders(reader.list_wire(pool.GPUPool))
        places = queue.positions(reader.pending_wires(), T0, set(), orders)
    assert {name: place for (_, name), place in places.items()} == {
        "long": 1,
        "medium": 2,
        "short": 3,
    }
    assert [
        _job(database, name).status.estimated_start_time for name in ("long", "medium", "short")
    ] == [start, start + timedelta(seconds=3600), start + timedelta(seconds=4200)]


def test_limits_leave_the_rest_to_the_next_pass(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        _without_binding_ahead(writer)
        for i in range(4):
            writer.create(make_job(f"j{i}").build())
    tight = scheduling.Limits(binds=1, writes=1, seconds=None)
    assert _schedule(database, limits=tight) == T0  # run again at once
    assert [_job(database, f"j{i}").status.phase for i in range(4)] == ["Scheduled"] + [
        "Pending"
    ] * 3
    assert _schedule(database, limits=tight) == T0
    assert _schedule(database, limits=tight) == T0  # j2 told, j3 left for the next pass
    assert not _job(database, "j3").status.conditions
    assert _schedule(database, limits=tight) is None
    assert _waiting(_job(database, "j3"))[0] == "Unschedulable"


def test_a_suspended_job_leaves_the_queue(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        _without_binding_ahead(writer)
        writer.create(make_job("first").build())
        writer.create(make_job("second").build())
    _schedule(database)
    assert _places(database)[("default", "second")] == 1
    with database.write() as session:
        writer = store.Store(session)
        second = writer.get(job.Job, "second", "default")
        second.spec.suspend = True
        writer.update(second)
    _schedule(database)
    assert ("default", "second") not in _places(database)


def test_jobs_in_back_off_or_waiting_for_dependencies_have_no_place(
    database: db.Database,
) -> None:
    """The pass leaves them alone: numbering them put the Jobs it queues further back."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        _without_binding_ahead(writer)
        writer.create(make_job("first").build())
        waiter = make_job("waiter").priority(100).build()
        waiter.spec.depends_on = ["ghost"]
        writer.create(waiter)
        flaky = writer.create(make_job("flaky").priority(50).build())
        flaky.status.failed = 1
        flaky.status.retry_after = T0 + timedelta(seconds=20)
        writer.update_status(flaky)
        writer.create(make_job("next").build())
    _settle(database)
    assert _waiting(_job(database, "next")) == ("Unschedulable", "0/1 GPUs fit: 1 in use")
    assert not _job(database, "waiter").status.conditions  # not in the queue: never told
    assert _places(database) == {("default", "next"): 1}
    later = T0 + timedelta(seconds=30)  # flaky's back-off is over: it queues again, first
    _settle(database, later)
    assert _waiting(_job(database, "flaky"))[0] == "Unschedulable"
    assert _places(database, later) == {("default", "flaky"): 1, ("default", "next"): 2}


def test_a_resumed_job_bound_before_its_reconcile_is_no_longer_suspended(
    database: db.Database,
) -> None:
    """The Job controller marks a Pending Job resumed; the scheduler may bind it first, and
    then the Job is no longer Pending for the Job controller to say so."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("paused").build())
        paused = writer.get(job.Job, "paused", "default")
        meta.set_condition(paused.status.conditions, job.CONDITION_SUSPENDED, "True", "Suspended")
        writer.update_status(paused)  # as it was left while suspended; now resumed
    _schedule(database)
    found = _job(database, "paused")
    assert found.status.phase == "Scheduled"
    suspended = next(c for c in found.status.conditions if c.type == job.CONDITION_SUSPENDED)
    assert (suspended.status, suspended.reason) == ("False", "Resumed")


def test_the_pool_decides_placement_and_memory_enforcement(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        _node(writer, "n2", 2)
        writer.create(
            pool.GPUPool(
                metadata=meta.ObjectMeta(name="default"),
                spec=pool.GPUPoolSpec(policy="spread", enforce_gpu_memory=True),
            )
        )
        for name in ("a", "b"):
            writer.create(make_job(name).memory("10Gi").build())
    _schedule(database)
    first, second = _binding(database, "a-1"), _binding(database, "b-1")
    assert {first.spec.node, second.spec.node} == {"n1", "n2"}
    assert first.spec.enforce_gpu_memory
    assert first.spec.gpu_memory == 10 * GI


def test_closed_and_busy_gpus_are_explained(database: db.Database) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 2)
        cordoned = writer.get(node.Node, "n1")
        cordoned.spec.cordoned_gpus = [0]
        cordoned.spec.draining_gpus = [1]
        writer.update(cordoned)
        _node(
            writer,
            "n2",
            1,
            processes=[node.GPUProcess(pid=7, used_memory=60 * GI, name="notebook")],
        )
        writer.create(make_job("big").memory("40Gi").build())
    _schedule(database)
    assert _waiting(_job(database, "big")) == (
        "Unschedulable",
        "0/3 GPUs fit: 1 cordoned, 1 drained, 1 lack 40Gi free",  # no job left on GPU 1
    )


def _cordon(database: db.Database, name: str, gpus: list[int]) -> None:
    with database.write() as session:
        writer = store.Store(session)
        found = writer.get(node.Node, name)
        found.spec.cordoned_gpus = gpus
        writer.update(found)


def test_a_waiting_job_is_decided_anew_when_it_or_the_gpus_change(database: db.Database) -> None:
    """Passes reuse what they read of a waiting Job and what it was told while neither changed
    (`pending.Queue`, `telling.TOLD`): a change to either must still reach it."""
    with database.write() as session:
        writer = store.Store(session)
        _without_binding_ahead(writer)
        _node(writer, "n1", 2)
        writer.create(make_job("first").build())
        writer.create(make_job("wide").gpus(2).build())
    for minute in range(3):  # told once, then found told already
        _schedule(database, T0 + timedelta(minutes=minute))
    assert _waiting(_job(database, "wide")) == (
        "Unschedulable",
        "1/2 GPUs fit, but no node has 2 of them: 1 in use",
    )
    _cordon(database, "n1", [1])
    _schedule(database, T0 + timedelta(minutes=4))
    assert _waiting(_job(database, "wide")) == (
        "Unschedulable",
        "0/2 GPUs fit: 1 cordoned, 1 in use",
    )
    _cordon(database, "n1", [])
    with database.write() as session:
        writer = store.Store(session)
        narrower = writer.get(job.Job, "wide", "default")
        narrower.spec.resources.gpus = 1
        writer.update(narrower)
    _schedule(database, T0 + timedelta(minutes=5))
    assert _binding(database, "wide-1").spec.gpus == [1]


def test_the_head_of_the_queue_is_told_when_the_gpus_it_named_in_use_free(
    database: db.Database,
) -> None:
    """A Job too big for any node, at the head of its queue: once the jobs it said were in
    use end, its message says so (behind the head, only the first clause's gist counts)."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 4)
        for index in range(3):
            writer.create(make_job(f"s{index}").build())
        writer.create(make_job("big").gpus(5).build())
        writer.create(make_job("bigger").gpus(6).build())
    _settle(database)
    assert _waiting(_job(database, "big"))[1] == "1/4 GPUs fit, but no node has 5 of them: 3 in use"
    for index in range(3):
        report_attempt(database, f"s{index}-1", "Exited", T0, exit_code=0)
        store.transact(database, lambda w, i=index: jobs.reconcile(w, "default", f"s{i}", T0))
    _settle(database)
    assert _waiting(_job(database, "big"))[1] == "4/4 GPUs fit, but no node has 5 of them"
    assert _waiting(_job(database, "bigger"))[1].endswith(": 3 in use")  # lags: not the head


def test_a_run_time_history_read_again_unchanged_is_the_one_read_before(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Request kept from pass to pass is given a new run time only when the history it was
    read with is another object (`pending.Queue`): one read again and found unchanged
    must be the very object read before, and one that changed a new one."""
    monkeypatch.setattr(reading, "RUN_TIMES_TTL", -1.0)  # read again at every pass

    def history() -> dict[str, timedelta]:
        with database.read() as session:
            return reading._recent_run_times(store.Store(session))

    first = history()
    assert history() is first
    with database.write() as session:
        writer = store.Store(session)
        created = writer.create(make_job("done").command("python", "eval.py").build())
        created.status.phase = "Succeeded"
        created.status.start_time = T0 - timedelta(minutes=30)
        created.status.completion_time = T0 - timedelta(minutes=20)
        writer.update_status(created)
    changed = history()
    assert changed is not first
    assert changed == {reading.command_key(["python", "eval.py"]): timedelta(minutes=10)}
    assert history() is changed


def _report_gpu(database: db.Database, name: str, **fields: Any) -> None:
    """A heartbeat that changes GPU 0's readings only (which does not wake the controller)."""
    with database.write() as session:
        writer = store.Store(session)
        found = writer.get(node.Node, name)
        found.status.gpus[0] = found.status.gpus[0].model_copy(update=fields)
        writer.update_status(found)


def _in_pool(builder: Any, name: str) -> Any:
    builder.spec["pool"] = name
    return builder


def _busy_pool(writer: store.Store) -> None:
    spec = pool.GPUPoolSpec(max_utilization_percent=80)
    writer.create(pool.GPUPool(metadata=meta.ObjectMeta(name="busy"), spec=spec))


@pytest.mark.parametrize(
    ("setup", "waiting", "busy", "freed"),
    [
        pytest.param(
            lambda w: None,
            make_job("fits-later").memory("40Gi"),
            {"processes": [node.GPUProcess(pid=7, used_memory=70 * GI)]},
            {"processes": []},
            id="memory-held-outside-gctl",
        ),
        pytest.param(
            _busy_pool,
            _in_pool(make_job("fits-later"), "busy"),
            {"utilization": 95},
            {"utilization": 3},
            id="pool-utilization-limit",
        ),
    ],
)
def test_a_job_waiting_on_gpu_readings_is_decided_again_until_they_drop(
    database: db.Database, setup: Any, waiting: Any, busy: dict[str, Any], freed: dict[str, Any]
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        setup(writer)
        writer.create(waiting.build())
    _report_gpu(database, "n1", **busy)
    due = _schedule(database)
    assert _job(database, "fits-later").status.phase == "Pending"
    assert due == T0 + scheduling.METRICS_RECHECK
    _report_gpu(database, "n1", **freed)
    _schedule(database, T0 + scheduling.METRICS_RECHECK)
    assert _job(database, "fits-later").status.phase == "Scheduled"


@pytest.mark.parametrize("memory", [None, "8Gi"], ids=["no-memory", "gpu-memory"])
def test_a_job_waiting_only_for_gctl_jobs_is_not_decided_again_on_a_timer(
    database: db.Database, memory: str | None
) -> None:
    """Even one that declares gpuMemory: no process outside gctl holds any."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        _without_binding_ahead(writer)
        jobs_ = [make_job(name) for name in ("first", "second")]
        writer.create_many([(b.memory(memory) if memory else b).build() for b in jobs_])
    _settle(database)
    assert _job(database, "second").status.phase == "Pending"
    assert _schedule(database) is None  # an exit wakes the controller; nothing else can help


# -- the controller's pass: reads that hold no writer back on SQLite ----------------------------


def _during_planning(monkeypatch: pytest.MonkeyPatch, act: Any) -> list[str]:
    """Run `act` once, in the middle of the next pass's planning; returns what it did."""
    done: list[str] = []
    real = scheduling.placement.plan

    def plan(*args: Any, **kwargs: Any) -> placement.Plan:
        if not done:
            done.append("acting")  # once: `act` may run a pass of its own
            done[0] = act()
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduling.placement, "plan", plan)
    return done


def test_a_write_commits_while_a_pass_plans_and_the_pass_still_binds(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("first").build())

    def apply_one() -> str:  # SQLite: the pass holds no lock yet; PostgreSQL never blocks it
        with database.write() as session:
            store.Store(session).create(make_job("applied").build())
        return "applied"

    done = _during_planning(monkeypatch, apply_one)
    due, revision = scheduling.run(database, T0, UNLIMITED)
    assert done == ["applied"]
    assert revision is not None
    assert _binding(database, "first-1").spec.gpus == [0]
    assert due is None


def test_a_pass_that_raced_another_plans_again_and_overbooks_nothing(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Job the pass did not read is bound by another pass (a second controller) while it
    plans: its plan, which no CAS contradicts, must not bind a second Job to the same GPU."""
    if database.dialect != "sqlite":
        pytest.skip("on PostgreSQL passes take an advisory lock: the second would wait")
    with database.write() as session:
        writer = store.Store(session)
        _without_binding_ahead(writer)
        _node(writer, "n1", 1)
        writer.create(make_job("late").build())

    def another_pass() -> str:
        with database.write() as session:
            store.Store(session).create(make_job("urgent").priority(10).build())
        _schedule(database)
        return "bound"

    done = _during_planning(monkeypatch, another_pass)
    scheduling.run(database, T0, UNLIMITED)
    assert done == ["bound"]
    with database.read() as session:
        attempts = store.Store(session).active_bindings()
    assert [b.spec.job_name for b in attempts] == ["urgent"]
    assert _waiting(_job(database, "late"))[0] == "Unschedulable"


def test_a_pass_raced_every_time_takes_the_lock_and_still_binds(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("first").build())
    monkeypatch.setattr(store.Store, "changed_since", lambda _self, _revision, _changes: True)
    scheduling.run(database, T0, UNLIMITED)
    assert _binding(database, "first-1").spec.gpus == [0]


def test_a_pending_job_that_does_not_validate_fails_the_pass_in_one_line(
    database: db.Database,
) -> None:
    """StoredInvalid naming it and the field, not pydantic's error: the controller sets it
    aside, and its next pass leaves it out (test_set_aside)."""
    with database.write() as session:
        writer = store.Store(session)
        _node(writer, "n1", 1)
        writer.create(make_job("bad").build())
    table = tables.table_of(job.Job.KIND)
    spec = {"command": ["true"], "resources": {"gpus": 1}, "colour": "blue"}
    with database.engine.begin() as connection:  # as a hand edit in the database leaves it
        connection.execute(sqlalchemy.update(table).values(spec=spec))
    with pytest.raises(errors.StoredInvalid, match=r'job "bad" .*colour'):
        _schedule(database)
