"""The Store on real SQLite files and a real PostgreSQL: metadata rules, compare-and-set,
finalizers, events and the change feed."""

import gc
import json
import multiprocessing
import re
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from gctl.api import errors, event, job, kinds, meta, pool, queue
from gctl.store import db, driver, feed, locations, shared, store, tables
from tests.builders import corrupt, make_job


def _create(database: db.Database, *jobs: job.Job) -> list[job.Job]:
    with database.write() as session:
        return store.Store(session).create_many(list(jobs))


def test_create_assigns_server_fields(database: db.Database) -> None:
    (created,) = _create(database, make_job("a").build())
    assert created.metadata.uid
    assert created.metadata.generation == 1
    assert created.metadata.namespace == "default"
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.creation_timestamp.tzinfo is not None
    with database.read() as session:
        read = store.Store(session).get(job.Job, "a")
    assert read.wire() == created.wire()


def test_objects_created_together_read_back_as_created_and_pause_the_collector(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many objects created at once: their rows and their changes (on SQLite written through
    the driver, encoded by gctl) read back as the objects created, and the cycle collector is
    paused while they are made (a third of 10,000 Jobs' creation went to its walks)."""
    collecting: list[bool] = []
    creation = driver.creation

    def noted(*args: Any) -> Any:
        collecting.append(gc.isenabled())
        return creation(*args)

    monkeypatch.setattr(driver, "creation", noted)
    jobs = [make_job(f"j{i:03d}").label("app", "x").build() for i in range(300)]
    jobs.append(make_job("unicode").build().model_copy(update={"spec": _spec("echo 'é ✓'")}))
    created = _create(database, *jobs)
    assert len(collecting) == len(jobs)
    assert not any(collecting)
    with database.read() as session:
        reader = store.Store(session)
        assert reader.list_wire(job.Job) == sorted(
            (j.wire() for j in created), key=lambda w: w["metadata"]["name"]
        )
        changes = reader.changes_since(0)
    assert [(c.type, c.object) for c in changes] == [("ADDED", j.wire()) for j in created]


def _spec(command: str) -> job.JobSpec:
    return job.JobSpec(command=command)


def test_jobs_created_together_queue_in_the_order_given(database: db.Database) -> None:
    with database.write() as session:
        store.Store(session).create_many([make_job(n).build() for n in ("zeta", "alpha", "mid")])
    with database.read() as session:
        reader = store.Store(session)
        pending = reader.pending_wires()
        created = {j.name: j.metadata.creation_timestamp for j in reader.list_objects(job.Job)}
    assert [w["metadata"]["name"] for w in pending] == ["zeta", "alpha", "mid"]
    assert created["zeta"] < created["alpha"] < created["mid"]
    assert queue.positions(pending, datetime.now(UTC), set()) == {
        ("default", "zeta"): 1,
        ("default", "alpha"): 2,
        ("default", "mid"): 3,
    }


def test_duplicate_create_is_already_exists(database: db.Database) -> None:
    _create(database, make_job("a").build())
    with pytest.raises(errors.AlreadyExists):
        _create(database, make_job("a").build())


def test_cluster_scoped_kind_has_no_namespace(database: db.Database) -> None:
    with database.write() as session:
        created = store.Store(session).create(
            pool.GPUPool(metadata=meta.ObjectMeta(name="a100", namespace="ignored"))
        )
    assert created.metadata.namespace is None
    assert "namespace" not in created.wire()["metadata"]


def test_generation_moves_with_spec_only(database: db.Database) -> None:
    (created,) = _create(database, make_job("a").build())
    with database.write() as session:
        writer = store.Store(session)
        created.metadata.labels = {"team": "nlp"}
        relabelled = writer.update(created)
        relabelled.spec.priority = 5
        respecced = writer.update(relabelled)
        respecced.status.phase = "Running"
        with_status = writer.update_status(respecced)
    assert relabelled.metadata.generation == 1
    assert respecced.metadata.generation == 2
    assert with_status.metadata.generation == 2
    assert with_status.status.phase == "Running"
    assert with_status.spec.priority == 5


def test_resource_versions_come_from_one_global_revision(database: db.Database) -> None:
    (a,) = _create(database, make_job("a").build())
    (b,) = _create(database, make_job("b").build())
    assert int(b.metadata.resource_version or 0) > int(a.metadata.resource_version or 0)
    with database.read() as session:
        assert store.Store(session).current_revision() == int(b.metadata.resource_version or 0)


def test_stale_write_is_refused_not_overwritten(database: db.Database) -> None:
    (created,) = _create(database, make_job("a").build())
    stale = created.model_copy(deep=True)
    with database.write() as session:
        created.spec.priority = 1
        store.Store(session).update(created)
    stale.spec.priority = 2
    with pytest.raises(errors.Conflict), database.write() as session:
        store.Store(session).update(stale)
    with pytest.raises(errors.Conflict), database.write() as session:
        store.Store(session).update_status(stale)
    with database.read() as session:
        assert store.Store(session).get(job.Job, "a").spec.priority == 1


def test_delete_waits_for_finalizers(database: db.Database) -> None:
    built = make_job("a").build()
    built.metadata.finalizers = ["gctl/stop-process"]
    _create(database, built)
    with database.write() as session:
        marked, gone = store.Store(session).delete(job.Job, "a")
    assert not gone
    assert marked.metadata.deletion_timestamp is not None
    with database.write() as session:
        writer = store.Store(session)
        current = writer.get(job.Job, "a")
        current.metadata.finalizers = []
        writer.update(current)
        assert writer.find(job.Job, "a") is None
    with database.read() as session:
        types = [c.type for c in store.Store(session).changes_since(0, ["Job"])]
    assert types == ["ADDED", "MODIFIED", "DELETED"]


def test_events_aggregate_repeats(database: db.Database) -> None:
    (created,) = _create(database, make_job("a").build())
    with database.write() as session:
        writer = store.Store(session)
        writer.record_event(created, "BackOff", "retrying in 10s", type_="Warning")
        writer.record_event(created, "BackOff", "retrying in 10s", type_="Warning")
        writer.record_event(created, "Started", "pid 42")
    with database.read() as session:
        events = store.Store(session).events_for(created)
    assert [(e.spec.reason, e.spec.count, e.spec.type) for e in events] == [
        ("BackOff", 2, "Warning"),
        ("Started", 1, "Normal"),
    ]


def test_an_objects_events_are_named_in_the_order_they_happened(database: db.Database) -> None:
    """As Kubernetes names events (object.nanoseconds in hex), so that `gctl get events`, which
    lists by name, shows them in order: made together in one transaction, or one by one."""
    (created,) = _create(database, make_job("a").build())
    reasons = ["Scheduled", "Started", "Completed", "Deleted"]
    with database.write() as session:
        store.Store(session).record_events([store.Occurrence(created, r) for r in reasons[:3]])
    with database.write() as session:
        store.Store(session).record_event(created, reasons[3])
    with database.read() as session:
        listed = store.Store(session).list_objects(event.Event)
    assert [e.spec.reason for e in listed] == reasons
    assert all(re.fullmatch(r"a\.[0-9a-f]{16}", e.name) for e in listed)


def test_events_recorded_together_aggregate_with_stored_ones_and_each_other(
    database: db.Database,
) -> None:
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    with database.write() as session:
        store.Store(session).record_event(a, "Scheduled", "attempt 1")
    with database.write() as session:
        recorded = store.Store(session).record_events(
            [
                store.Occurrence(a, "Scheduled", "attempt 1"),  # repeats the stored one
                store.Occurrence(b, "Scheduled", "attempt 1"),
                store.Occurrence(b, "Scheduled", "attempt 1"),  # repeats the one before
                store.Occurrence(b, "Started", "pid 7", "Warning"),
            ]
        )
    assert [(e.spec.reason, e.spec.count) for e in recorded] == [
        ("Scheduled", 2),
        ("Scheduled", 2),
        ("Scheduled", 2),
        ("Started", 1),
    ]
    with database.read() as session:
        reader = store.Store(session)
        assert [(e.spec.reason, e.spec.count) for e in reader.events_for(a)] == [("Scheduled", 2)]
        assert [(e.spec.reason, e.spec.count, e.spec.type) for e in reader.events_for(b)] == [
            ("Scheduled", 2, "Normal"),
            ("Started", 1, "Warning"),
        ]


def test_a_stored_latest_event_is_compared_as_stored_and_read_whole_only_to_repeat_it(
    database: db.Database,
) -> None:
    """The latest event of an object is compared with a new one by what its stored document
    says (a message left out says ""), and validated only when the new one repeats it: one
    that no longer validates (a hand edit) keeps no event from being recorded, a repeat of it
    being recorded as a new one."""
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    with database.write() as session:
        writer = store.Store(session)
        writer.record_events([store.Occurrence(a, "Scheduled"), store.Occurrence(b, "Started")])
    table = tables.table_of(event.Event.KIND)
    with database.write() as session:
        for row in session.execute(sqlalchemy.select(table.c.name, table.c.spec)).all():
            spec = row.spec if isinstance(row.spec, dict) else json.loads(row.spec)
            spec.pop("message")  # as a document written without it
            if spec["reason"] == "Started":
                spec["count"] = 0  # no longer valid
            edit = sqlalchemy.update(table).where(table.c.name == row.name).values(spec=spec)
            session.execute(edit)
    c, *_ = _create(database, make_job("c").build())
    with database.write() as session:
        store.Store(session).record_event(c, "Scheduled")
    with database.write() as session:
        involved = sqlalchemy.update(table).where(table.c.involved_uid == c.metadata.uid)
        session.execute(involved.values(spec=["not", "a", "mapping"]))
    with database.write() as session:
        store.Store(session).record_event(c, "Scheduled")  # recorded beside it
    with database.read() as session:
        beside = sqlalchemy.select(sqlalchemy.func.count()).where(
            table.c.involved_uid == c.metadata.uid
        )
        assert session.execute(beside).scalar_one() == 2
    with database.write() as session:
        store.Store(session).record_events(
            [store.Occurrence(a, "Scheduled", ""), store.Occurrence(b, "Started")]
        )
    with database.write() as session:
        store.Store(session).record_events([store.Occurrence(b, "Completed")])
    with database.read() as session:
        reader = store.Store(session)
        assert [(e.spec.reason, e.spec.count) for e in reader.events_for(a)] == [("Scheduled", 2)]
        with pytest.raises(errors.StoredInvalid):
            reader.events_for(b)  # the edited one does not validate: read as it is stored
    query = sqlalchemy.select(table.c.spec).where(table.c.involved_uid == b.metadata.uid)
    with database.read() as session:
        rows = session.execute(query.order_by(table.c.created_at)).scalars().all()
    specs = [spec if isinstance(spec, dict) else json.loads(spec) for spec in rows]
    assert [(spec["reason"], spec.get("count")) for spec in specs] == [
        ("Started", 0),
        ("Started", 1),
        ("Completed", 1),
    ]


def test_write_back_writes_metadata_and_status_of_many_and_refuses_a_stale_one(
    database: db.Database,
) -> None:
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    for j in (a, b):
        j.metadata.finalizers = ["gctl/stop-process"]
        j.status.phase = "Scheduled"
    with database.write() as session:
        written = store.Store(session).write_back([a, b])
    with database.read() as session:
        reader = store.Store(session)
        read = [reader.get(job.Job, name) for name in ("a", "b")]
        assert [w["metadata"]["name"] for w in reader.pending_wires()] == []
    assert [(j.status.phase, j.metadata.finalizers, j.metadata.generation) for j in read] == [
        ("Scheduled", ["gctl/stop-process"], 1)
    ] * 2
    assert [j.metadata.resource_version for j in read] == [
        j.metadata.resource_version for j in written
    ]
    # `a` as first read is stale now: nothing of the batch is written
    a.status.phase, written[1].status.phase = "Running", "Running"
    with pytest.raises(errors.Conflict), database.write() as session:
        store.Store(session).write_back([written[1], a])
    with database.read() as session:
        assert store.Store(session).get(job.Job, "b").status.phase == "Scheduled"


def test_batched_writes_land_together_and_are_seen_by_the_next_statement(
    database: db.Database,
) -> None:
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    with database.read() as session:
        since = store.Store(session).current_revision()
    with database.write() as session:
        writer = store.Store(session)
        with writer.batched():
            a.status.phase = "Scheduled"
            written = writer.update_status(a)
            writer.record_event(written, "Scheduled", "attempt 1")
            a.status.phase = "Running"  # after the call: not what was queued
            b.status.phase = "Scheduled"
            writer.update_status(b)
            writer.record_event(b, "Scheduled", "attempt 1")
            # A statement in the block sees what was queued before it.
            assert writer.get(job.Job, "a").status.phase == "Scheduled"
            writer.record_event(written, "Scheduled", "attempt 1")  # a repeat: counted
        assert written.metadata.resource_version == str(writer.written_revision)
    with database.read() as session:
        reader = store.Store(session)
        read = {j.name: j for j in reader.list_objects(job.Job)}
        changes = reader.changes_since(since)
        counts = {name: [e.spec.count for e in reader.events_for(read[name])] for name in "ab"}
    assert {n: (j.status.phase, j.metadata.generation) for n, j in read.items()} == {
        "a": ("Scheduled", 1),
        "b": ("Scheduled", 1),
    }
    assert read["a"].metadata.resource_version == written.metadata.resource_version
    assert counts == {"a": [2], "b": [1]}
    modified = [(c.kind, c.name) for c in changes if c.type == "MODIFIED"]
    assert modified[:2] == [("Job", "a"), ("Job", "b")]
    assert {c.revision for c in changes} == {int(written.metadata.resource_version or 0)}


def test_a_stale_object_in_a_batch_fails_it_whole(database: db.Database) -> None:
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    stale = b.model_copy(deep=True)
    b.spec.priority = 3
    with database.write() as session:
        store.Store(session).update(b)
    a.status.phase = stale.status.phase = "Scheduled"

    def batch(writer: store.Store) -> None:
        with writer.batched():
            writer.update_status(a)
            writer.update_status(stale)

    with pytest.raises(errors.Conflict):
        store.transact(database, batch, attempts=1)
    with database.read() as session:
        assert [j.status.phase for j in store.Store(session).list_objects(job.Job)] == [
            "Pending",
            "Pending",
        ]


def _statements(database: db.Database) -> list[tuple[str, bool]]:
    """(SQL, executemany) of every statement run on the database from now on."""
    ran: list[tuple[str, bool]] = []

    def before(*args: Any) -> None:
        statement, executemany = args[2], args[5]
        ran.append((" ".join(statement.split()), executemany))

    sqlalchemy.event.listen(database.engine, "before_cursor_execute", before)
    return ran


def test_objects_written_together_are_one_statement_each_on_postgresql(
    database: db.Database,
) -> None:
    """Many rows go into PostgreSQL as one statement of arrays (gctl.store.pgarrays), not one
    statement a row: and they read back as one written alone does, in the order given, JSON
    documents, empty and null values, timestamps and all."""
    odd = make_job("odd").build()
    odd.metadata.labels = {"team": "a"}
    odd.metadata.annotations = {"note": 'quotes " and \\ and \u00e9'}
    odd.metadata.owner_references = [meta.OwnerReference(kind="Sweep", name="s", uid="u")]
    odd.spec.env = {"EMPTY": ""}
    (alone,) = _create(database, make_job("alone").build())
    with database.read() as session:
        since = store.Store(session).current_revision()
    ran = _statements(database)
    together = _create(database, make_job("b").build(), odd, make_job("a").build())
    for j in together:
        j.status.phase = "Scheduled"
        j.status.message = None
        j.status.gpus = [0, 1]
    with database.write() as session:
        written = store.Store(session).write_back(together)
    with database.read() as session:
        reader = store.Store(session)
        read = {j.name: j for j in reader.list_objects(job.Job)}
        changes = reader.changes_since(since)
    assert [read[j.name].wire() for j in written] == [j.wire() for j in written]
    assert read["alone"].wire() == alone.wire()
    assert [(c.type, c.name) for c in changes] == [
        ("ADDED", "b"), ("ADDED", "odd"), ("ADDED", "a"),
        ("MODIFIED", "b"), ("MODIFIED", "odd"), ("MODIFIED", "a"),
    ]  # fmt: skip
    assert changes[4].object == written[1].wire()
    writes = [
        (sql.split()[0], many)
        for sql, many in ran
        if sql.startswith(("INSERT", "UPDATE jobs", 'UPDATE "jobs"'))
    ]
    if database.dialect == "postgresql":  # jobs, the feed; jobs, the feed
        assert writes == [
            ("INSERT", False),
            ("INSERT", False),
            ("UPDATE", False),
            ("INSERT", False),
        ]
    else:
        assert writes == [("INSERT", True), ("INSERT", True), ("UPDATE", True), ("INSERT", True)]


def test_an_object_written_twice_in_one_batch_takes_both_writes(database: db.Database) -> None:
    """Two writes of one object queued together (each on the version the one before left)
    land in turn, as they would one at a time."""
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    with database.write() as session:
        writer = store.Store(session)
        with writer.batched():
            a.status.phase = "Scheduled"
            scheduled = writer.update_status(a)
            b.status.phase = "Scheduled"
            writer.update_status(b)
            scheduled.status.phase = "Running"
            writer.update_status(scheduled)
    with database.read() as session:
        read = {j.name: j.status.phase for j in store.Store(session).list_objects(job.Job)}
    assert read == {"a": "Running", "b": "Scheduled"}


def test_objects_removed_together_go_as_read_or_not_at_all(database: db.Database) -> None:
    """`remove_many` removes exactly the versions read, in one statement per kind, and the
    change feed records each removal in order; if one was written since it was read, none
    goes."""
    a, b, c, d = _create(database, *(make_job(n).build() for n in "abcd"))
    with database.read() as session:
        since = store.Store(session).current_revision()
    ran = _statements(database)
    with database.write() as session:
        gone = store.Store(session).remove_many([c, a])
    assert [(g.name, g.metadata.deletion_timestamp is not None) for g in gone] == [
        ("c", True),
        ("a", True),
    ]
    deletes = [many for sql, many in ran if sql.startswith("DELETE")]
    assert deletes == [database.dialect == "sqlite"]  # one statement; SQLite's executemany
    b.spec.priority = 7
    with database.write() as session:
        store.Store(session).update(b)
    with pytest.raises(errors.Conflict), database.write() as session:
        store.Store(session).remove_many([d, b])  # b as first read is stale
    with database.read() as session:
        reader = store.Store(session)
        left = [j.name for j in reader.list_objects(job.Job)]
        changes = [(ch.type, ch.name) for ch in reader.changes_since(since)]
    assert left == ["b", "d"]
    assert changes == [("DELETED", "c"), ("DELETED", "a"), ("MODIFIED", "b")]


def test_specs_written_together_land_as_one_update_each_would(database: db.Database) -> None:
    """`update_many` writes the changed specs of objects read, in one statement per kind, and
    leaves each as `update` leaves it (generation moved, derived columns, the change feed);
    if one was written since it was read, none of them is."""
    a, b, c, d = _create(database, *(make_job(n).build() for n in "abcd"))
    for j in (a, b, c):
        j.spec.priority = 5
        j.metadata.labels = {"moved": "yes"}
    with database.write() as session:
        alone = store.Store(session).update(c)
    with database.read() as session:
        since = store.Store(session).current_revision()
    ran = _statements(database)
    with database.write() as session:
        written = store.Store(session).update_many([b, a])
    with database.read() as session:
        reader = store.Store(session)
        read = {j.name: j for j in reader.list_objects(job.Job)}
        changes = reader.changes_since(since)
        queue = [j.name for j in reader.list_objects(job.Job) if j.spec.priority == 5]
    assert [w.wire() for w in written] == [read["b"].wire(), read["a"].wire()]
    for name in "ab":
        assert read[name].metadata.generation == alone.metadata.generation == 2
        mine, its = read[name].wire(), alone.wire()
        for w in (mine, its):
            del w["metadata"]["name"], w["metadata"]["uid"], w["metadata"]["resourceVersion"]
            del w["metadata"]["creationTimestamp"], w["spec"]["command"]
        assert mine == its
    assert queue == ["a", "b", "c"]
    assert [(ch.type, ch.name) for ch in changes] == [("MODIFIED", "b"), ("MODIFIED", "a")]
    assert changes[0].object == read["b"].wire()
    updates = [many for sql, many in ran if sql.startswith(("UPDATE jobs", 'UPDATE "jobs"'))]
    assert updates == [database.dialect == "sqlite"]  # one statement; SQLite's executemany
    d.spec.priority = 9
    stale = read["a"]
    stale.spec.priority = 1
    with pytest.raises(errors.Conflict), database.write() as session:
        store.Store(session).update_many([d, a])  # a as first read is stale
    with database.read() as session:
        after = {j.name: j.spec.priority for j in store.Store(session).list_objects(job.Job)}
    assert after == {"a": 5, "b": 5, "c": 5, "d": 0}


def test_documents_come_as_text_and_are_decoded_by_the_store(database: db.Database) -> None:
    """A read the Store decodes itself asks for the JSON documents as text on PostgreSQL too
    (not decoded by psycopg on arrival, empty ones and all), and reads them as written."""
    (a,) = _create(database, make_job("a").build())
    ran = _statements(database)
    with database.read() as session:
        (read,) = store.Store(session).pending_wires()
    assert read == a.wire()
    reads = [sql for sql, _ in ran if sql.startswith("SELECT") and "jobs.spec" in sql]
    as_text = "CAST(jobs.spec AS TEXT)" if database.dialect == "postgresql" else "jobs.spec AS"
    assert reads
    assert all(as_text in sql for sql in reads)


def test_shared_reads_follow_every_version_and_leave_out_what_stopped_matching(
    database: db.Database,
) -> None:
    a, b = _create(database, make_job("a").build(), make_job("b").build())
    with database.read() as session:
        reader = store.Store(session)
        assert [w["metadata"]["name"] for w in reader.pending_wires()] == ["a", "b"]
        first = reader.shared_objects(job.Job)
    a.spec.priority = 5
    b.status.phase = "Scheduled"
    with database.write() as session:
        writer = store.Store(session)
        writer.update(a)
        writer.update_status(b)
    with database.read() as session:
        reader = store.Store(session)
        pending = reader.pending_wires()
        again = reader.shared_objects(job.Job)
        unchanged = reader.shared_wires(job.Job, "default", ["b"])
    assert [(w["metadata"]["name"], w["spec"].get("priority")) for w in pending] == [("a", 5)]
    assert [(j.name, j.spec.priority, j.status.phase) for j in again] == [
        ("a", 5, "Pending"),
        ("b", 0, "Scheduled"),
    ]
    assert again[1] is not first[1]  # a new version: validated again
    assert unchanged[0]["status"]["phase"] == "Scheduled"


def test_a_nodes_bindings_by_a_shared_read_are_validated_once_a_version_and_skip_the_invalid(
    database: db.Database,
) -> None:
    """What an agent reads at every pass: its node's Bindings in some phases, as
    `active_bindings` reads them; an unchanged one is the object the last read validated, a
    changed one is validated again, and one that does not validate goes to `skipped` (and is
    looked at again next time: fixed, it is read)."""
    from gctl.api import binding

    def attempt(name: str, node: str) -> binding.Binding:
        spec = binding.BindingSpec(job_name=name, job_uid=name, attempt=1, node=node, gpus=[0])
        return binding.Binding(metadata=meta.ObjectMeta(name=name), spec=spec)

    phases = frozenset({"Pending", "Running"})
    with database.write() as session:
        writer = store.Store(session)
        c, a, _, done = writer.create_many(
            [attempt("c", "n1"), attempt("a", "n1"), attempt("other", "n2"), attempt("d", "n1")]
        )
        done.status.phase = "Exited"
        writer.update_status(done)

    def read() -> tuple[list[binding.Binding], list[errors.StoredInvalid]]:
        skipped: list[errors.StoredInvalid] = []
        with database.read() as session:
            reader = store.Store(session)
            found = reader.shared_bindings_on("n1", phases, skipped=skipped)
            own = reader.active_bindings("n1", phases, skipped=[])
            assert [b.name for b in found] == sorted(b.name for b in own)
        return found, skipped

    first, _ = read()
    assert [b.name for b in first] == ["a", "c"]
    c.status.phase = "Running"
    with database.write() as session:
        store.Store(session).update_status(c)
    again, _ = read()
    assert again[0] is first[0]  # unchanged: not validated again
    assert (again[1] is first[1], again[1].status.phase) == (False, "Running")
    corrupt(database, "Binding", "a", spec={"gpus": "lots"}, resource_version=99)
    skipping, skipped = read()
    assert [b.name for b in skipping] == ["c"]
    assert [i.key[2] for i in skipped] == ["a"]
    corrupt(database, "Binding", "a", spec=a.wire()["spec"], resource_version=100)
    fixed, _ = read()
    assert [b.name for b in fixed] == ["a", "c"]


def test_each_change_carries_the_document_its_row_holds_at_that_version(
    database: db.Database,
) -> None:
    """A controller keeps each change's object as its row's wire at that revision
    (`shared.note`), decoding nothing again: every kind of write must put the same document in
    the feed as in the row (metadata, spec, status; a deletion's timestamp too)."""
    a, b = _create(database, make_job("a").label("app", "x").build(), make_job("b").build())
    a.spec.priority = 3
    b.status.phase = "Scheduled"
    writes = [
        lambda w: w.update(a),
        lambda w: w.update_status(b),
        lambda w: w.write_back([w.get(job.Job, "a")]),
        lambda w: w.update_many([w.get(job.Job, "b")]),
        lambda w: w.record_events([store.Occurrence(w.get(job.Job, "a"), "Seen", "once")]),
        lambda w: w.update(_finalized(w.get(job.Job, "a"))),
        lambda w: w.delete(job.Job, "a"),  # held by its finalizer: deletionTimestamp set
        lambda w: _twice(w, "b"),
    ]
    seen: dict[str, store.Change] = {}  # each object's latest change
    for write in writes:
        with database.write() as session:
            writer = store.Store(session)
            since = writer.current_revision()
            write(writer)
        with database.read() as session:
            reader = store.Store(session)
            changes = reader.changes_since(since)
            assert changes
            last = {change.uid: change for change in changes}  # each object's
            for change in last.values():
                (row,) = reader.shared_wires(
                    kinds.model(change.kind), change.namespace, [change.name]
                )
                assert change.object == row
                assert change.object["metadata"]["resourceVersion"] == str(change.revision)
            seen |= last
    assert seen[a.metadata.uid or ""].object["metadata"]["deletionTimestamp"]


def _twice(writer: store.Store, name: str) -> None:
    """Two writes of one Job in one transaction: two changes at one revision."""
    first = writer.get(job.Job, name)
    first.status.message = "first"
    second = writer.update_status(first)
    second.status.message = "second"
    writer.update_status(second)


def _finalized(j: job.Job) -> job.Job:
    j.metadata.finalizers = ["example.com/hold"]
    return j


def test_a_creation_noted_from_the_feed_is_not_decoded_again_and_any_later_write_drops_it(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`shared.note`: a shared read of a created row returns the ADDED change's document itself;
    any later change of it drops that (a write at a later revision, or at the same one, in the
    same transaction), and what a status write's change carries is never kept: the row may
    hold its spec in another form (a hand edit), which a shared read must return as it is."""
    monkeypatch.setattr(shared, "_DECODED", {})
    monkeypatch.setattr(shared, "_VALIDATED", {})

    def noted(since: int) -> list[store.Change]:
        with database.read() as session:
            changes = store.Store(session).changes_since(since)
        for change in changes:
            shared.note(change.type, change.uid, change.revision, change.object)
        return changes

    def pending() -> list[dict[str, Any]]:
        with database.read() as session:
            return store.Store(session).pending_wires()

    (a,) = _create(database, make_job("a").build())
    (added,) = noted(0)
    assert pending()[0] is added.object
    a.spec.priority = 2
    with database.write() as session:
        store.Store(session).update(a)
    (updated,) = noted(added.revision)
    newer = pending()[0]
    assert newer == updated.object
    assert newer is not updated.object  # decoded from the row
    shared.note("ADDED", added.uid, added.revision, added.object)  # late: the newer one stands
    assert pending()[0] is newer
    with database.write() as session:  # created and written again in one transaction
        writer = store.Store(session)
        writer.create(make_job("b").build())
        _twice(writer, "b")
    created, *_ = noted(updated.revision)
    (b,) = [w for w in pending() if w["metadata"]["name"] == "b"]
    assert b is not created.object
    assert b["status"]["message"] == "second"
    table = tables.table_of(job.Job.KIND)
    hand = {"command": "true", "resources": {"gpus": 1}}  # no defaults written out
    with database.engine.begin() as connection:  # a hand edit: a new version, no change
        connection.execute(
            sqlalchemy.update(table)
            .where(table.c.name == "b")
            .values(spec=hand, resource_version=table.c.resource_version + 1)
        )
    with database.write() as session:
        writer = store.Store(session)
        told = writer.get(job.Job, "b")
        told.status.message = "told"
        writer.update_status(told)
    (status_write,) = noted(created.revision)
    assert status_write.object["spec"] != hand  # the model's spec, its defaults written out
    (b,) = [w for w in pending() if w["metadata"]["name"] == "b"]
    assert b["spec"] == hand
    assert b["status"]["message"] == "told"


def test_change_feed_is_ordered_resumable_and_keeps_deletions(database: db.Database) -> None:
    _create(database, make_job("a").build(), make_job("b").build())
    with database.read() as session:
        middle = store.Store(session).current_revision()
    with database.write() as session:
        store.Store(session).delete(job.Job, "a")
    with database.read() as session:
        reader = store.Store(session)
        everything = reader.changes_since(0)
        resumed = reader.changes_since(middle)
    assert [(c.type, c.name) for c in everything] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]
    assert [(c.type, c.name) for c in resumed] == [("DELETED", "a")]
    assert resumed[0].object["metadata"]["deletionTimestamp"]
    revisions = [c.revision for c in everything]
    assert revisions == sorted(revisions)


def test_watch_wakes_on_a_write_without_polling(database: db.Database) -> None:
    """The watcher's only timer is a 60 s resync; seeing a write within 10 s proves the wake-up."""
    stop = threading.Event()
    seen: list[str] = []
    arrived = threading.Event()
    with database.read() as session:
        start = store.Store(session).current_revision()

    def follow() -> None:
        with feed.Watch(database, since=start, kinds=["Job"], stop=stop) as watch:
            for batch in watch:
                seen.extend(c.name for c in batch)
                arrived.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(0.3)  # let the watcher go idle first
    _create(database, make_job("late").build())
    assert arrived.wait(10), "the watcher was not woken by the write"
    stop.set()
    thread.join(10)
    assert seen == ["late"]
    assert not thread.is_alive()


def test_watch_pages_through_one_large_transaction(database: db.Database) -> None:
    jobs = [make_job(f"j{i:03d}").build() for i in range(250)]
    _create(database, *jobs)
    with feed.Watch(database, since=0, kinds=["Job"]) as watch:
        names: list[str] = []
        while len(names) < 250:
            with database.read() as session:
                page = store.Store(session).changes_since(0, ["Job"], limit=100)
            assert len(page) == 100
            batch = watch.poll()
            assert batch, "the feed stopped before every change was read"
            names.extend(c.name for c in batch)
    assert names == [j.name for j in jobs]


def test_a_page_of_the_feed_says_whether_its_last_transaction_goes_on(
    database: db.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that waits for whole transactions (the controller) must know whether a full
    page ended within one: a transaction of exactly a page's changes does not go on."""
    monkeypatch.setattr(feed, "PAGE", 3)
    _create(database, *[make_job(f"a{i}").build() for i in range(3)])  # exactly a page
    _create(database, *[make_job(f"b{i}").build() for i in range(4)])  # a page and one more
    _create(database, make_job("c").build())
    with feed.Watch(database, since=0, kinds=["Job"]) as watch:
        pages = [watch.poll() for _ in range(4)]
    assert [([c.name for c in p], p.continues) for p in pages] == [
        (["a0", "a1", "a2"], False),
        (["b0", "b1", "b2"], True),
        (["b3", "c"], False),
        ([], False),
    ]
    # A watch made again after a page (a reconnect) reads all of a transaction it ended in.
    for page, again in ((pages[0], ["b0", "b1", "b2"]), (pages[1], ["b0", "b1", "b2"])):
        with feed.Watch(database, since=feed.resume_after(page), kinds=["Job"]) as watch:
            assert [c.name for c in watch.poll()] == again


def _bump_counter(url: str, rounds: int) -> None:
    database = db.Database.open(url)

    def work(writer: store.Store) -> None:
        current = writer.get(job.Job, "counter")
        count = int(current.metadata.annotations.get("count", "0"))
        current.metadata.annotations = {"count": str(count + 1)}
        writer.update(current)

    for _ in range(rounds):
        store.transact(database, work, attempts=200)
    database.close()


def test_concurrent_read_modify_write_loses_no_update(database: db.Database, db_url: str) -> None:
    _create(database, make_job("counter").build())
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_bump_counter, args=(db_url, 15)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    with database.read() as session:
        final = store.Store(session).get(job.Job, "counter")
    assert final.metadata.annotations["count"] == "60"


def test_sqlite_file_is_private_and_tuned(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "gctl.db"
    database = db.Database.open(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with database.engine.connect() as conn:
        pragmas = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "foreign_keys", "busy_timeout")
        }
    assert pragmas == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 30000}
    database.close()


def test_an_absent_sqlite_file_reads_empty_and_takes_no_write(tmp_path: Path) -> None:
    """A command that only reads reads an absent file as an empty database (gctl.store.db);
    a write that would change a row is refused, not kept in a stand-in that vanishes, and a
    watch is refused: each would have nothing to show for it, or create the file."""
    path = tmp_path / "gctl.db"
    database = db.Database.open(str(path), create=False)
    try:
        with database.read() as session:
            reader = store.Store(session)
            assert (reader.current_revision(), reader.list_wire(job.Job)) == (0, [])
        with (  # a write transaction that reads, as a delete of what is not there
            pytest.raises(errors.NotFound, match='job "a" not found'),
            database.write() as session,
        ):
            store.Store(session).get(job.Job, "a")
        said = f"--db: no database at {path} to write to (gctl up, apply and run create it)"
        with pytest.raises(errors.NotFound, match=re.escape(said)):
            _create(database, make_job("a").build())
        with database.read() as session:
            assert store.Store(session).list_wire(job.Job) == []  # rolled back
        with pytest.raises(errors.NotFound, match="to watch"):
            feed.Watch(database, since=0)
    finally:
        database.close()
    assert list(tmp_path.iterdir()) == []


def test_unreachable_postgres_is_one_clear_error() -> None:
    database = db.Database(locations.resolve_url("postgresql://postgres@127.0.0.1:1/nothing"))
    with pytest.raises(errors.Unavailable, match=r"127\.0\.0\.1:1/nothing"):
        database.ensure_schema()


def test_a_label_is_matched_in_sql(database: db.Database) -> None:
    _create(
        database,
        make_job("a").label("gctl/sweep", "lr").build(),
        make_job("b").label("gctl/sweep", "lr2").build(),
        make_job("c").label("gctl/sweep", "lr").label("team", "x").build(),
        make_job("d").label("team", "lr").build(),
        make_job("e").label("gctl/sweep", "lr").in_namespace("other").build(),
        make_job("f").build(),
    )
    with database.read() as session:
        reader = store.Store(session)
        found = reader.list_wire_labelled(job.Job, "default", "gctl/sweep", "lr")
        elsewhere = reader.list_wire_labelled(job.Job, "other", "gctl/sweep", "lr")
        none = reader.list_wire_labelled(job.Job, "default", "gctl/sweep", "nothing")
    assert [w["metadata"]["name"] for w in found] == ["a", "c"]
    assert found[1]["metadata"]["labels"] == {"gctl/sweep": "lr", "team": "x"}
    assert [w["metadata"]["name"] for w in elsewhere] == ["e"]
    assert none == []
