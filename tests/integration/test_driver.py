"""Applying through the driver alone (gctl.store.driver) and through the Store, on real SQLite
files and a real PostgreSQL: the two paths write the same rows and changes, and every case
the driver leaves alone reaches the Store, with nothing written before it does."""

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config

import migrations
from gctl.api import applyset, errors, job, manifest, meta
from gctl.store import applying, db, driver, locations, notify, schema, store, tables
from tests.builders import make_job

MIXED = """\
apiVersion: gctl/v1
kind: Job
metadata:
  name: train
  namespace: team-a
  labels: {team: a, app.kubernetes.io/name: train}
  annotations: {note: "ünïcode and \\"quotes\\"", gctl/simulated-duration: "5"}
spec:
  command: [python, train.py, --lr, "0.1"]
  env: {SEED: "1"}
  resources: {gpus: 0.5, gpuMemory: 24Gi}
  priority: 7
  pool: big
---
apiVersion: gctl/v1
kind: Job
metadata:
  name: eval
  annotations: {gctl/rerun: "2020-01-01T00:00:00.000000Z"}
spec:
  command: python eval.py
  dependsOn: [train]
---
apiVersion: gctl/v1
kind: GPUPool
metadata:
  name: big
spec:
  selector: {gpuModel: "*A100*"}
  policy: spread
---
apiVersion: gctl/v1
kind: GPUProfile
metadata:
  name: small
spec:
  gpus: 1
  gpuMemory: 8Gi
---
apiVersion: gctl/v1
kind: Sweep
metadata:
  name: grid
spec:
  items: [a, b]
  template:
    spec:
      command: "echo {item}"
"""

TABLES = ("jobs", "gpupools", "gpuprofiles", "sweeps")
SERVER = ("uid", "created_at")  # different on every write: compared by their shape alone


def _url(path: Path) -> str:
    return locations.resolve_url(str(path))


def _fresh(path: Path) -> str:
    """A SQLite file with the current schema, as a first use of gctl leaves it."""
    db.Database.open(str(path)).close()
    return _url(path)


def _parse(text: str) -> list[manifest.Manifest]:
    found = manifest.parse("in.yaml", text)
    for m in found:
        if m.obj.NAMESPACED:
            m.obj.metadata.namespace = m.obj.metadata.namespace or "default"
    return found


def _rows(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Every row gctl wrote, but the values that differ on every write."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        for table in TABLES:
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY namespace, name").fetchall()
            found[table] = [
                {k: _shape(v) if k in SERVER else v for k, v in dict(r).items()} for r in rows
            ]
        changes = conn.execute("SELECT * FROM changes ORDER BY id").fetchall()
        found["changes"] = [
            {k: v for k, v in dict(c).items() if k not in ("uid", "object")} for c in changes
        ]
        found["revision"] = [dict(r) for r in conn.execute("SELECT * FROM revision")]
    finally:
        conn.close()
    return found


def _shape(value: str) -> str:
    """`2026-01-02 03:04:05.000006` -> `0000-00-00 00:00:00.000000`: the format, not the value."""
    return re.sub(r"[0-9a-f]", "0", value)


def _changed_objects(path: Path) -> list[str]:
    """The change feed's objects, with the uid and creation time made into their shapes."""
    conn = sqlite3.connect(path)
    try:
        texts = [row[0] for row in conn.execute("SELECT object FROM changes ORDER BY id")]
    finally:
        conn.close()
    found = []
    for text in texts:
        metadata = json.loads(text)["metadata"]
        shaped = text
        for key in ("uid", "creationTimestamp"):
            shaped = shaped.replace(metadata[key], _shape(metadata[key]))
        found.append(shaped)
    return found


def _masked(obj: meta.Resource) -> dict[str, Any]:
    wire = obj.wire()
    wire["metadata"].pop("uid")
    wire["metadata"].pop("creationTimestamp")
    return wire


def _revision(url: str) -> int:
    database = db.Database.open(url)
    try:
        with database.read() as session:
            return store.Store(session).current_revision()
    finally:
        database.close()


def _jobs(url: str) -> dict[str, job.Job]:
    database = db.Database.open(url)
    try:
        with database.read() as session:
            return {j.name: j for j in store.Store(session).list_objects(job.Job, "default")}
    finally:
        database.close()


def test_both_paths_write_the_same_rows_and_changes(tmp_path: Path) -> None:
    through_driver = _fresh(tmp_path / "driver.db")
    through_store = _fresh(tmp_path / "store.db")

    direct = applying.apply_through_driver(through_driver, _parse(MIXED), False, False)
    database = db.Database.open(through_store)
    try:
        full = applying.apply(database, _parse(MIXED), False, False)
    finally:
        database.close()

    assert direct is not None
    assert [(a.verb, _masked(o)) for a, o in direct] == [(a.verb, _masked(o)) for a, o in full]
    assert _rows(tmp_path / "driver.db") == _rows(tmp_path / "store.db")
    # The change feed holds the objects as created, as JSON text of the same form.
    assert _changed_objects(tmp_path / "driver.db") == _changed_objects(tmp_path / "store.db")


def test_the_store_reads_what_the_driver_created(tmp_path: Path) -> None:
    url = _fresh(tmp_path / "gctl.db")
    created = applying.apply_through_driver(url, _parse(MIXED), False, False)
    assert created is not None

    again = applying.apply_at(url, _parse(MIXED), False, False)  # unchanged: the driver's too

    assert [a.verb for a, _ in again] == ["unchanged"] * len(created)
    assert [o.wire() for _, o in again] == [o.wire() for _, o in created]
    eval_job = _jobs(url)["eval"]
    assert job.ANNOTATION_RERUN not in eval_job.metadata.annotations  # a dump's token is dropped
    assert eval_job.metadata.creation_timestamp == created[1][1].metadata.creation_timestamp


def test_one_revision_per_transaction_and_one_change_per_object(tmp_path: Path) -> None:
    url = _fresh(tmp_path / "gctl.db")
    before = _revision(url)

    results = applying.apply_through_driver(
        url, _parse(make_job("a").yaml() + "---\n" + make_job("b").yaml()), False, False
    )

    assert results is not None
    assert {o.metadata.resource_version for _, o in results} == {str(before + 1)}
    assert _revision(url) == before + 1
    a, b = (o.metadata.creation_timestamp for _, o in results)
    assert a is not None
    assert b is not None
    assert a < b  # queued in the order given
    database = db.Database.open(url)
    try:
        with database.read() as session:
            changes = store.Store(session).changes_since(before)
    finally:
        database.close()
    assert [(c.type, c.name, c.revision) for c in changes] == [
        ("ADDED", "a", before + 1),
        ("ADDED", "b", before + 1),
    ]


def test_a_commit_rings_the_doorbell(tmp_path: Path) -> None:
    path = tmp_path / "gctl.db"
    url = _fresh(path)
    bell = notify.bell(locations.notify_path(path))
    try:
        assert applying.apply_through_driver(url, _parse(make_job("a").yaml()), False, False)
        assert bell.wait(10)
    finally:
        bell.close()


def test_a_dry_run_decides_any_change_and_writes_nothing(tmp_path: Path) -> None:
    url = _fresh(tmp_path / "gctl.db")
    applying.apply_at(url, _parse(make_job("a").yaml()), False, False)
    before = _revision(url)

    changed = _parse(make_job("a").priority(5).yaml() + "---\n" + make_job("b").yaml())
    decided = applying.apply_through_driver(url, changed, False, True)

    assert decided is not None
    assert [(a.verb, o.name) for a, o in decided] == [("configured", "a"), ("created", "b")]
    assert _revision(url) == before
    assert sorted(_jobs(url)) == ["a"]


def test_a_change_goes_to_the_store_with_nothing_written_first(tmp_path: Path) -> None:
    url = _fresh(tmp_path / "gctl.db")
    applying.apply_at(url, _parse(make_job("a").yaml()), False, False)
    before = _revision(url)
    changed = _parse(make_job("a").priority(5).yaml() + "---\n" + make_job("b").yaml())

    assert applying.apply_through_driver(url, changed, False, False) is None
    assert _revision(url) == before  # b was not created on the way

    results = applying.apply_at(url, changed, False, False)
    assert [(a.verb, o.name) for a, o in results] == [("configured", "a"), ("created", "b")]
    jobs = _jobs(url)
    assert (jobs["a"].spec.priority, jobs["a"].metadata.generation) == (5, 2)
    assert _revision(url) == before + 1


def test_a_refused_change_is_refused_by_the_store_in_its_words(tmp_path: Path) -> None:
    url = _fresh(tmp_path / "gctl.db")
    applying.apply_at(url, _parse(make_job("a").yaml()), False, False)
    database = db.Database.open(url)
    try:
        with database.write() as session:
            writer = store.Store(session)
            started = writer.get(job.Job, "a", "default")
            started.status.phase = "Running"
            writer.update_status(started)
    finally:
        database.close()
    changed = _parse(make_job("a").command("false").yaml())

    assert applying.apply_through_driver(url, changed, False, False) is None
    with pytest.raises(errors.Forbidden, match=r"spec\.command: cannot change a started Job"):
        applying.apply_at(url, changed, False, False)
    replaced = applying.apply_at(url, changed, True, False)  # --force
    assert [a.verb for a, _ in replaced] == ["replaced"]


def test_an_applyset_goes_to_the_store(tmp_path: Path) -> None:
    url = _fresh(tmp_path / "gctl.db")
    options = applying.SetOptions(name="exp", source="/src")

    results = applying.apply_at(url, _parse(make_job("a").yaml()), False, False, options)

    assert [a.verb for a, _ in results] == ["created"]
    assert _jobs(url)["a"].metadata.labels == {applyset.LABEL: "exp"}


@pytest.mark.parametrize("state", ["missing", "empty file", "older schema"])
def test_a_database_to_create_or_upgrade_goes_to_the_store(tmp_path: Path, state: str) -> None:
    path = tmp_path / "gctl.db"
    if state == "empty file":
        path.touch()
    elif state == "older schema":  # as an older gctl left it: the newest migration not run
        database = db.Database.open(str(path), migrate=False)
        config = Config()
        config.set_main_option("script_location", str(Path(migrations.__file__).parent))
        with database.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0002")
        database.close()
    url = _url(path)

    assert applying.apply_through_driver(url, _parse(make_job("a").yaml()), False, False) is None
    results = applying.apply_at(url, _parse(make_job("a").yaml()), False, False)

    assert [a.verb for a, _ in results] == ["created"]
    database = db.Database.open(url)
    try:
        assert database.schema_version() == schema.HEAD
    finally:
        database.close()


def test_postgresql_goes_to_the_store(pg_url: str) -> None:
    assert applying.apply_through_driver(pg_url, _parse(make_job("a").yaml()), False, False) is None

    results = applying.apply_at(pg_url, _parse(make_job("a").yaml()), False, False)
    again = applying.apply_at(pg_url, _parse(make_job("a").yaml()), False, True)

    assert [a.verb for a, _ in results] == ["created"]
    assert [a.verb for a, _ in again] == ["unchanged"]


@pytest.mark.parametrize("kind", sorted(schema.TABLES))
def test_the_derived_columns_are_the_tables_own(kind: str) -> None:
    """schema.derived fills exactly the columns a kind's table adds to every object's."""
    common = set(tables.ROWS["GPUPool"].__table__.columns.keys())
    own = set(tables.ROWS[kind].__table__.columns.keys()) - common
    assert set(schema.derived(kind, {}, {})) == own


def test_the_driver_writes_rows_for_the_current_schema() -> None:
    """A migration changes the rows `driver.Transaction.create_many` must write (a column, a
    derived value): bring the driver up to date, check the rows against the Store's above,
    then move WRITES_SCHEMA. Until then every write goes through the Store."""
    assert driver.WRITES_SCHEMA == schema.HEAD


def test_psycopg_warnings_do_not_reach_the_commands_stderr() -> None:
    """QA: a connection lost in the middle of `gctl apply` printed psycopg's own warning
    ("error ignored terminating <psycopg.Pipeline [BAD]>: the connection is lost") before
    gctl's one-line error: the command configures no logging, so Python printed it raw."""
    said = subprocess.run(
        [
            sys.executable,
            "-c",
            "import logging, gctl.store.db; "
            "logging.getLogger('psycopg').warning('error ignored terminating <Pipeline>')",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert said.stderr == ""
