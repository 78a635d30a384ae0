"""The daemons' loops on a SQLite database that is full: a real SQLITE_FULL ("database or
disk is full"), from a page limit on every connection the loop opens. Each loop retries once a
second; the log says so in one line, without a traceback, and not again for a minute."""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import event

from controller import manager
from gctl.store import db, store
from nodeagent import agent, gpus
from tests.builders import make_job

WAIT = 15.0


def fill(database: db.Database) -> None:
    """No page more for the database than it has now: the next write that needs one fails."""
    with database.engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

    @event.listens_for(database.engine, "connect")
    def full(dbapi_connection: object, _record: object) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]

    database.engine.dispose()  # the connections open now know no limit


@pytest.fixture
def database(tmp_path: Path) -> Iterator[db.Database]:
    database = db.Database.open(str(tmp_path / "gctl.db"))
    yield database
    database.close()


@contextmanager
def running(loop: Callable[[threading.Event], None], wake: threading.Event) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        wake.set()
        thread.join(timeout=WAIT)


def retried(caplog: pytest.LogCaptureFixture, what: str) -> None:
    """Wait for the loop's first failure, then for two retries more (one a second)."""
    deadline = time.monotonic() + WAIT
    while not failed_lines(caplog, what):
        assert time.monotonic() < deadline, f"{what} did not fail"
        time.sleep(0.1)
    time.sleep(2.5)


def failed_lines(caplog: pytest.LogCaptureFixture, what: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if f"{what} failed; retrying" in r.getMessage()]


def test_the_agent_says_once_that_the_database_is_full(
    database: db.Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node_agent = agent.Agent(
        database, "n1", gpus.FakeGPUs(1), tmp_path / "state", heartbeat_seconds=0.2
    )
    node_agent.heartbeat()
    fill(database)
    with running(node_agent.run, node_agent.wake):
        retried(caplog, "heartbeat")  # what writes while nothing is bound here
    (record,) = failed_lines(caplog, "heartbeat")
    assert record.getMessage().endswith(": database or disk is full")
    assert record.exc_info is None
    assert "Traceback" not in caplog.text


def test_the_controller_says_once_that_the_database_is_full(
    database: db.Database, caplog: pytest.LogCaptureFixture
) -> None:
    store.transact(database, lambda w: [w.create(make_job(f"j{i}").build()) for i in range(50)])
    fill(database)
    controller = manager.Controller(database)
    with running(controller.run, threading.Event()):
        retried(caplog, "schedule")
    (record,) = failed_lines(caplog, "schedule")
    assert record.getMessage().endswith(": database or disk is full")
    assert record.exc_info is None
    assert "Traceback" not in caplog.text
