"""How writers share a database: SQLite's take turns across processes on a file lock
(gctl.store.writers), and PostgreSQL plans every statement for its values."""

import fcntl
import multiprocessing
import os
import time
from pathlib import Path

from sqlalchemy import text

from gctl.api import job
from gctl.store import db, locations, store, writers
from tests.builders import make_job


def _write_one(path: str, ready: "multiprocessing.synchronize.Event") -> None:
    database = db.Database.open(path)
    ready.set()
    with database.write() as session:
        store.Store(session).create(make_job("late").build())
    database.close()


def _names(database: db.Database) -> list[str]:
    with database.read() as session:
        return [j.name for j in store.Store(session).list_objects(job.Job)]


def test_a_writer_in_another_process_waits_for_the_turn(tmp_path: Path) -> None:
    path = tmp_path / "gctl.db"
    database = db.Database.open(str(path))
    turns = writers.Turns(locations.writers_path(path))
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    with turns.turn():  # the turn alone: SQLite's own lock is free all along
        child = context.Process(target=_write_one, args=(str(path), ready))
        child.start()
        assert ready.wait(60)
        time.sleep(0.3)
        assert child.is_alive()
        assert _names(database) == []  # it waits for the turn, not for SQLite
    child.join(60)
    assert child.exitcode == 0
    assert _names(database) == ["late"]
    turns.close()
    database.close()


def test_a_nested_turn_keeps_the_file_locked_until_the_outer_one_ends(tmp_path: Path) -> None:
    path = tmp_path / "gctl.db-writers"
    turns = writers.Turns(path)

    def free() -> bool:
        fd = os.open(path, os.O_RDWR)  # another open file: flock tells the two apart
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    with turns.turn():
        with turns.turn():
            assert not free()
        assert not free()
    assert free()
    turns.close()


def test_a_writer_that_cannot_open_the_turn_file_still_writes(tmp_path: Path) -> None:
    database = db.Database.open(str(tmp_path / "gctl.db"))
    locations.writers_path(tmp_path / "gctl.db").mkdir()  # a directory: cannot be opened
    with database.write() as session:
        store.Store(session).create(make_job("a").build())
    assert _names(database) == ["a"]
    database.close()


def test_postgresql_prepares_no_statement(pg_url: str) -> None:
    """A prepared statement is planned generically after a few runs: for `name IN (500
    values)` that compares every row with every value (see gctl.store.db)."""
    database = db.Database.open(pg_url)
    with database.read() as session:
        reader = store.Store(session)
        for _ in range(8):  # psycopg prepares what it runs 5 times, unless told not to
            reader.shared_wires(job.Job, "default", ["a", "b"])
        prepared = session.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
    assert prepared == 0
    database.close()


def test_the_check_above_sees_prepared_statements(pg_url: str) -> None:
    """The test above can fail: with psycopg's default, the same reads are prepared."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(db.Database(pg_url).url, connect_args={"prepare_threshold": 5})
    with Session(engine) as session, session.begin():
        reader = store.Store(session)
        for _ in range(8):
            reader.shared_wires(job.Job, "default", ["a", "b"])
        prepared = session.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar()
    assert prepared
    engine.dispose()
