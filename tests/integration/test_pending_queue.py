"""The queue a controller keeps from pass to pass (`pending.Queue`), against a real database:
brought up to date from the change feed, it must say what reading the whole queue says."""

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
import sqlalchemy

from controller import pending, placement, reading, scheduling, telling
from gctl.api import job, meta, pool, profile
from gctl.store import db, shared, store, tables
from tests.builders import make_job, put_ready_node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
Request = placement.Request


def _what(kept: pending.Queue, reader: store.Store, now: datetime) -> dict[str, Any]:
    """Everything a pass takes from the queue."""
    world = reading.read_world(reader)
    others, held = kept.hold_back(reader, now)
    ordered, by_key = kept.ordered(world, others, reading.queued_requests(world))
    requests = list(ordered)
    return {
        "order": [(r.namespace, r.name, r.order, r.shape, r.runtime, r.problem) for r in requests],
        "size": len(ordered),
        "must": ordered.must,
        "shapes": +Counter(ordered.shapes),
        "examples": {s: ordered.examples[s].shape for s in +Counter(ordered.shapes) if s},
        "movable": ordered.movable(),
        "by_key": {k: by_key[k]["metadata"]["resourceVersion"] for k in by_key},
        "held": sorted(reading.key(w) for w in held),
    }


def _compare(
    database: db.Database, kept: pending.Queue, now: datetime, *, whole: bool = False
) -> dict[str, Any]:
    """The kept queue, read from the feed (or, `whole`, in full), against a new one that reads
    it all."""
    with database.read() as session:
        reader = store.Store(session)
        kept.read(reader, reading.SetAside(), whole=whole)
        found = _what(kept, reader, now)
        fresh = pending.Queue()
        fresh.read(reader, reading.SetAside(), whole=True)
        assert found == _what(fresh, reader, now)
    return found


def _requests(database: db.Database, kept: pending.Queue, now: datetime) -> list[Request]:
    """The kept queue, brought up to date from the feed, as a pass walks it."""
    with database.read() as session:
        reader = store.Store(session)
        kept.read(reader, reading.SetAside(), whole=False)
        world = reading.read_world(reader)
        others, _ = kept.hold_back(reader, now)
        ordered, _ = kept.ordered(world, others, reading.queued_requests(world))
        return list(ordered)


def _one_gpu_without_binding_ahead(writer: store.Store) -> None:
    """Node n1 with one GPU; the default pool, where a Job that cannot start waits."""
    put_ready_node(writer, "n1", 1, T0)
    writer.create(
        pool.GPUPool(
            metadata=meta.ObjectMeta(name="default"), spec=pool.GPUPoolSpec(bind_ahead=False)
        )
    )


def _setup(writer: store.Store) -> None:
    put_ready_node(writer, "n1", 2, T0)
    writer.create(
        pool.GPUPool(
            metadata=meta.ObjectMeta(name="lpt"),
            spec=pool.GPUPoolSpec(queue_order="LongestFirst", bind_ahead=False),
        )
    )
    writer.create(
        profile.GPUProfile(metadata=meta.ObjectMeta(name="p"), spec=profile.GPUProfileSpec(gpus=2))
    )


def _new_job(rng: random.Random, name: str, names: list[str]) -> job.Job:
    built = make_job(name).priority(rng.choice((0, 1, 5))).gpus(rng.choice((1, 2, 0, 0.5)))
    spec = built.spec
    if rng.random() < 0.4:
        spec["pool"] = "lpt"
    if rng.random() < 0.3:
        spec["activeDeadlineSeconds"] = rng.choice((60, 600))
    if rng.random() < 0.15 and names:
        spec["dependsOn"] = [rng.choice(names)]
    if rng.random() < 0.1:
        spec["suspend"] = True
    if rng.random() < 0.1:
        spec["resources"] = {"profile": rng.choice(("p", "missing"))}
    if rng.random() < 0.2:
        spec["command"] = ["python", "train.py"]
    return built.build()


def _change(rng: random.Random, writer: store.Store, names: list[str], serial: list[int]) -> None:
    """One random write a queue sees: a Job created, deleted, told why it waits, given a new
    priority, bound, ended, sent back to the queue, put in back-off or (un)suspended."""
    choice = rng.random()
    if choice < 0.3 or not names:
        serial[0] += 1
        name = f"j{serial[0]:03d}"
        writer.create(_new_job(rng, name, names))
        names.append(name)
        return
    name = rng.choice(names)
    found = writer.get(job.Job, name, "default")
    if choice < 0.4:
        writer.delete(job.Job, name, "default")
        if rng.random() < 0.5:  # made anew under its name, as `apply` replaces a Job
            writer.create(_new_job(rng, name, [n for n in names if n != name]))
        else:
            names.remove(name)
    elif choice < 0.55:
        meta.set_condition(
            found.status.conditions, "Scheduled", "False", "Unschedulable", f"{rng.random()}"
        )
        writer.update_status(found)
    elif choice < 0.65:
        found.spec.priority = rng.choice((0, 1, 5, 9))
        writer.update(found)
    elif choice < 0.8:
        found.status.phase = rng.choice(("Scheduled", "Succeeded", "Pending", "Failed"))
        writer.update_status(found)
    elif choice < 0.9:  # in back-off, or out of it (as `gctl rerun` takes it out)
        found.status.retry_after = rng.choice((T0 + timedelta(seconds=rng.choice((-10, 10))), None))
        writer.update_status(found)
    else:
        found.spec.suspend = not found.spec.suspend
        writer.update(found)


@pytest.mark.parametrize("seed", range(8))
def test_a_queue_kept_from_the_feed_says_what_reading_it_all_says(
    database: db.Database, seed: int
) -> None:
    """Random writes, a few at a time: after each batch the kept queue, brought up to date
    from the change feed (now and then in full, as a whole pass reads it), gives a pass the
    same requests in the same order, the same counts, Jobs and held-back Jobs as a queue that
    reads every pending Job; also after a pass that read it and failed before ordering it."""
    rng = random.Random(seed)
    with database.write() as session:
        _setup(store.Store(session))
    kept = pending.Queue()
    names: list[str] = []
    serial = [0]
    sizes = []
    for _ in range(50):
        with database.write() as session:
            writer = store.Store(session)
            for _ in range(rng.randint(1, 6)):
                _change(rng, writer, names, serial)
        if rng.random() < 0.2:  # a pass that reads the queue and fails before ordering it
            with database.read() as session:
                kept.read(store.Store(session), reading.SetAside(), whole=rng.random() < 0.5)
            continue
        sizes.append(_compare(database, kept, T0, whole=rng.random() < 0.2)["size"])
    assert max(sizes) > 5  # the queue it compared was not trivially short


def test_many_writes_at_once_read_the_queue_anew(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `MAX_CHANGES` Jobs written since its last read, the queue is read in full."""
    monkeypatch.setattr(pending, "MAX_CHANGES", 3)
    with database.write() as session:
        writer = store.Store(session)
        _setup(writer)
        writer.create_many([make_job(f"a{i}").build() for i in range(2)])
    kept = pending.Queue()
    _compare(database, kept, T0)
    with database.write() as session:
        store.Store(session).create_many([make_job(f"b{i}").build() for i in range(5)])
    assert _compare(database, kept, T0)["size"] == 7


def test_a_request_is_ranked_by_its_pools_queue_order_as_it_is_now(database: db.Database) -> None:
    """The Requests a controller keeps take the order their pool has now."""
    with database.write() as session:
        writer = store.Store(session)
        writer.create(pool.GPUPool(metadata=meta.ObjectMeta(name="default")))
        for name, limit in (("short", 60), ("long", 600)):
            limited = make_job(name).build()
            limited.spec.active_deadline_seconds = limit
            writer.create(limited)
    kept = pending.Queue()

    def order(queue_order: Literal["FIFO", "LongestFirst"]) -> list[str]:
        with database.write() as session:
            writer = store.Store(session)
            found = writer.get(pool.GPUPool, "default")
            if found.spec.queue_order != queue_order:
                found.spec.queue_order = queue_order
                writer.update(found)
        return [r.name for r in _requests(database, kept, T0)]

    assert order("LongestFirst") == ["long", "short"]
    assert order("FIFO") == ["short", "long"]
    assert order("LongestFirst") == ["long", "short"]


def test_a_queue_longer_than_the_store_keeps_is_read_anew_in_one_copy(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond `shared.MAX_KEPT` the stored Jobs are new objects at every whole read: the queue
    keeps nothing of the last one while it reads the next, so that one copy of the queue is
    held, not two (queue-depth-100k's RSS); and what passes were told is not kept."""
    with database.write() as session:
        writer = store.Store(session)
        _one_gpu_without_binding_ahead(writer)
        for i in range(3):
            writer.create(make_job(f"j{i}").build())
    kept = pending.Queue()

    def schedule(now: datetime) -> list[Request]:
        store.transact(database, lambda w: scheduling.schedule(w, now, kept=kept))
        return _requests(database, kept, now)  # with the pass's own writes

    first = schedule(T0)
    assert len(first) == 2  # one of three started
    assert [id(r) for r in schedule(T0 + timedelta(minutes=1))] == [id(r) for r in first]
    monkeypatch.setattr(shared, "MAX_KEPT", 1)
    again = schedule(T0 + timedelta(minutes=2))
    assert [r.name for r in again] == [r.name for r in first]
    assert not {id(r) for r in again} & {id(r) for r in first}
    assert not telling.TOLD


def test_a_database_behind_the_revision_read_last_is_read_anew(
    database: db.Database, tmp_path: Any
) -> None:
    """A queue that finds the database's revision behind the one it read last (another
    database, or one restored from a backup) cannot trust the feed: it reads it all."""
    for i in range(5):  # at revisions 1 to 5
        with database.write() as session:
            store.Store(session).create(make_job(f"a{i}").build())
    kept = pending.Queue()
    assert _compare(database, kept, T0)["size"] == 5
    other = db.Database.open(f"sqlite:///{tmp_path}/other.db")
    try:
        with other.write() as session:
            store.Store(session).create(make_job("b").build())
        assert [r[1] for r in _compare(other, kept, T0)["order"]] == ["b"]
    finally:
        other.close()


@pytest.mark.parametrize("whole", [True, False])
def test_a_job_made_anew_under_its_name_is_scheduled(database: db.Database, whole: bool) -> None:
    """`gctl delete` then `gctl apply` of a waiting Job between two passes (or apply's
    "replaced"): the new Job is placed once there is room, whether the next pass reads the
    queue from the feed or in full."""
    with database.write() as session:
        writer = store.Store(session)
        _one_gpu_without_binding_ahead(writer)
        writer.create(make_job("busy").build())
        writer.create(make_job("x").build())
    kept = pending.Queue()
    store.transact(database, lambda w: scheduling.schedule(w, T0, kept=kept))  # `busy` starts
    with database.write() as session:
        writer = store.Store(session)
        writer.delete(job.Job, "x", "default")
        writer.create(make_job("x").build())
        put_ready_node(writer, "n2", 1, T0)  # room for it now
    tail = scheduling.Tail(lambda: T0 + timedelta(seconds=1))
    if not whole:  # a pass that decides the head alone: from the feed
        tail.last, tail.done = T0 + timedelta(seconds=1), True
    store.transact(database, lambda w: scheduling.schedule(w, T0, tail=tail, kept=kept))
    with database.read() as session:
        assert store.Store(session).get(job.Job, "x", "default").status.phase == "Scheduled"


def _whole_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each read of the whole queue (`Store.pending_wires`)."""
    reads: list[int] = []
    whole = store.Store.pending_wires

    def counted(reader: store.Store) -> list[dict[str, Any]]:
        reads.append(1)
        return whole(reader)

    monkeypatch.setattr(store.Store, "pending_wires", counted)
    return reads


def test_only_set_aside_jobs_make_a_pass_read_the_queue_anew(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Node that does not validate is set aside in a new version at every heartbeat: that
    must not make every pass read the whole queue; a Job set aside (or taken back) must."""
    with database.write() as session:
        store.Store(session).create(make_job("a").build())
    reads = _whole_reads(monkeypatch)
    kept = pending.Queue()

    def read(versions: dict[tuple[str, str, str], str]) -> int:
        with database.read() as session:
            kept.read(store.Store(session), reading.SetAside(versions), whole=False)
        return len(reads)

    assert read({}) == 1  # the first reads it all
    assert read({("Node", "", "n1"): "7"}) == 1
    assert read({("Node", "", "n1"): "8"}) == 1
    assert read({("Node", "", "n1"): "8", ("Job", "default", "b"): "3"}) == 2
    assert read({("Node", "", "n1"): "9", ("Job", "default", "b"): "3"}) == 2
    assert read({}) == 3


def test_whole_passes_read_the_queue_in_full_once_a_second_and_so_see_a_hand_edit(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that decides the whole queue reads it in full only if the last read in full is
    `REREAD_EVERY` old (or the clock went back); between, from the feed, as a head pass does.
    What only a read in full sees (a hand edit of a row, which writes no change) is seen by the
    first whole pass `REREAD_EVERY` after the last read in full."""
    with database.write() as session:
        store.Store(session).create(make_job("a").build())
    reads = _whole_reads(monkeypatch)
    kept = pending.Queue()

    def read(after: float, *, whole: bool = True) -> int:
        """The priority the kept queue has for Job a, after a read at T0 + `after` seconds."""
        with database.read() as session:
            kept.read(store.Store(session), reading.SetAside(), whole=whole, now=at(after))
        return int(kept.by_key[("default", "a")]["spec"].get("priority", 0))

    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    every = pending.REREAD_EVERY.total_seconds()
    assert (read(0), len(reads)) == (0, 1)
    table = tables.table_of(job.Job.KIND)
    with database.engine.begin() as connection:  # a hand edit: a new version, no change
        spec = {"command": "true", "resources": {"gpus": 1}, "priority": 5}
        connection.execute(
            sqlalchemy.update(table).values(
                spec=spec, resource_version=table.c.resource_version + 1
            )
        )
    assert (read(every / 2), len(reads)) == (0, 1)
    assert (read(every, whole=False), len(reads)) == (0, 1)  # a head pass: from the feed
    assert (read(every), len(reads)) == (5, 2)
    assert (read(every * 1.5), len(reads)) == (5, 2)
    assert (read(every / 2), len(reads)) == (5, 3)  # the clock went back
    with database.read() as session:  # without a time: in full, as the tests' reads are
        kept.read(store.Store(session), reading.SetAside(), whole=True)
    assert len(reads) == 4


def _sqlite_plan(tmp_path: Any, query: Any) -> str:
    """How SQLite runs `query` (its bound values rendered in), on an empty gctl database."""
    import sqlalchemy
    from sqlalchemy.dialects import sqlite

    sql = str(query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    database = db.Database.open(str(tmp_path / "gctl.db"))
    try:
        with database.read() as session:
            rows = session.execute(sqlalchemy.text(f"EXPLAIN QUERY PLAN {sql}")).all()
    finally:
        database.close()
    return " ".join(str(row[-1]) for row in rows)


def test_the_changed_pending_jobs_are_looked_up_by_uid_not_found_among_every_pending_one(
    tmp_path: Any,
) -> None:
    """A pass reads the Jobs the change feed named since its last (`pending_wires_of`). SQLite
    keeps no statistics: given `phase = 'Pending'`, it took the queue's index on phase and read
    every pending Job to find the few named (3 ms a pass behind 10,000 of them) as soon as
    they were four or more. What it does is read off its plan."""
    from gctl.store import reading as store_reading

    uids = [f"uid-{i}" for i in range(8)]
    for query in (
        store_reading._pending_of().keys.params(among=uids),
        store_reading._pending_of().missing.params(among=uids, uids=uids),
        # the whole queue's read, for the Jobs it has not decoded before (review)
        store_reading._pending().missing.params(uids=uids),
    ):
        plan = _sqlite_plan(tmp_path, query)
        assert "ix_jobs_queue" not in plan, plan
        assert "(uid=?)" in plan, plan
    assert "ix_jobs_queue" in _sqlite_plan(tmp_path, store_reading._pending().keys)


def test_a_pass_finds_the_active_attempts_by_their_phase_not_among_every_attempt(
    tmp_path: Any,
) -> None:
    """Attempts are kept as long as their Jobs: a pass that read every one to find the active
    ones took 20 ms over 100,000 finished attempts (`ix_bindings_phase`, migration 0005)."""
    from gctl.store import reading as store_reading

    plan = _sqlite_plan(tmp_path, store_reading._active().keys)
    assert "ix_bindings_phase" in plan, plan


def test_the_run_time_history_reads_the_latest_successes_through_an_index(
    tmp_path: Any,
) -> None:
    """Every 10 s a pass reads the latest 200 successful Jobs to estimate start times: through
    the queue's index (phase, priority, created_at) SQLite read and sorted every successful Job
    kept, 117 ms over 100,000 (`ix_jobs_phase_created`, migration 0006)."""
    plan = _sqlite_plan(tmp_path, reading._LATEST_SUCCESSES)
    assert "ix_jobs_phase_created" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
