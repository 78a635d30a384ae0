"""The agent's log server, pass by pass, on both databases: what it sends ahead of its reader,
what it refuses, and when it gives up on a reader. A fake clock stands for the lease's time.
"""

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import pytest
import sqlalchemy

from gctl.api import errors
from gctl.store import db, logstreams, notify
from nodeagent import logserver

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logs_dir(tmp_path: Path) -> Path:
    (tmp_path / "state" / "logs").mkdir(parents=True)
    return tmp_path / "state" / "logs"


def _server(
    database: db.Database, logs_dir: Path, clock: Callable[[], float]
) -> logserver.LogServer:
    return logserver.LogServer(
        database,
        "n1",
        logs_dir,
        exits_bell=logs_dir.parent / "attempts-notify",
        ended=lambda _uid: True,
        clock=clock,
    )


def _ask(database: db.Database, path: Path, follow: bool = False) -> int:
    with logstreams.writing(database) as session:
        return logstreams.open_request(
            session,
            node="n1",
            binding_uid="b-1",
            path=str(path),
            follow=follow,
            lease_seconds=10.0,
            now=T0,
        )


def _read(database: db.Database, request_id: int) -> tuple[logstreams.Request | None, bytes]:
    with database.read() as session:
        request, chunks = logstreams.read(session, request_id, 0, 1 << 30)
    return request, b"".join(c.data for c in chunks)


def test_sends_at_most_a_window_ahead_of_its_reader(database: db.Database, logs_dir: Path) -> None:
    log = logs_dir / "attempt-1.log"
    log.write_bytes(bytes(range(256)) * (5 * logserver.WINDOW_BYTES // 256 // 2))  # 2.5 windows
    server = _server(database, logs_dir, Clock())
    request_id = _ask(database, log)

    server.serve()
    request, sent = _read(database, request_id)
    assert request is not None
    assert (request.state, request.sent, len(sent)) == (
        "Serving",
        logserver.WINDOW_BYTES,
        request.sent,
    )
    server.serve()  # nothing taken: nothing more
    assert _read(database, request_id)[0].sent == logserver.WINDOW_BYTES  # type: ignore[union-attr]

    received = b""
    while True:
        request, sent = _read(database, request_id)
        assert request is not None
        received += sent
        with logstreams.writing(database) as session:
            logstreams.take(session, request, len(received))
        if request.state == logstreams.DONE and len(received) == request.sent:
            break
        server.serve()
    assert received == log.read_bytes()
    server.close()


def test_refuses_a_file_outside_its_logs(database: db.Database, logs_dir: Path) -> None:
    secret = logs_dir.parent / "elsewhere.txt"
    secret.write_text("not a log")
    request_id = _ask(database, logs_dir / ".." / "elsewhere.txt")

    _server(database, logs_dir, Clock()).serve()

    request, sent = _read(database, request_id)
    assert request is not None
    assert (request.state, sent) == ("Failed", b"")
    assert request.message == f"{logs_dir / '..' / 'elsewhere.txt'} is not a log of node n1"


def test_drops_a_request_not_renewed_for_its_lease(database: db.Database, logs_dir: Path) -> None:
    log = logs_dir / "attempt-1.log"
    log.write_bytes(b"x" * (2 * logserver.WINDOW_BYTES))
    clock = Clock()
    server = _server(database, logs_dir, clock)
    renewed = _ask(database, log)
    abandoned = _ask(database, log)
    assert server.serve() == 10.0  # until the first lease may end

    clock.now += 6
    with logstreams.writing(database) as session:
        assert logstreams.renew(session, renewed, datetime(2026, 1, 1, 0, 0, 6, tzinfo=UTC))
    server.serve()
    clock.now += 6
    server.serve()

    assert _read(database, abandoned) == (None, b"")
    request, sent = _read(database, renewed)
    assert request is not None
    assert len(sent) == logserver.WINDOW_BYTES
    server.close()


def test_a_write_that_keeps_failing_is_retried_after_a_while_and_logged_once(
    database: db.Database,
    logs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reads work, writes fail (a full disk, say): the loop tries again about once a second,
    not at once, and says so in one line, not once per try."""
    log = logs_dir / "attempt-1.log"
    log.write_bytes(b"hello\n")
    _ask(database, log)
    tries: list[float] = []

    def answer(*_args: object, **_kwargs: object) -> NoReturn:
        tries.append(time.monotonic())
        raise errors.Unavailable("database disk is full")

    monkeypatch.setattr(logstreams, "answer", answer)
    server = _server(database, logs_dir, time.monotonic)  # it counts passes in real time
    stop = notify.Stop()
    serving = threading.Thread(target=server.run, args=(stop,))
    with caplog.at_level(logging.WARNING, logger="gctl.agent"):
        serving.start()
        time.sleep(2.5)
        stop.set()
        serving.join(timeout=10)

    assert not serving.is_alive()
    assert 2 <= len(tries) <= 4, f"{len(tries)} tries in 2.5 s"
    said = [r.getMessage() for r in caplog.records if r.name == "gctl.agent"]
    assert said == ["log request 1 failed; retrying: database disk is full"], said


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_an_agent_sleeping_on_its_stop_wakes_only_for_its_own_node(
    database: db.Database, logs_dir: Path
) -> None:
    """The NOTIFYs of another node's requests reach every listener on PostgreSQL: a waiter
    with a stop that poll(2) sees reads them and sleeps on, and wakes for its own."""
    stop = notify.Stop()
    waker = logstreams.waker(database, stop, logstreams.for_node("other"))
    try:
        _ask(database, logs_dir / "attempt-1.log")  # a request for n1: NOTIFY node:n1
        _server(database, logs_dir, Clock()).serve()  # n1's agent answers: request:N
        began = time.monotonic()
        assert not waker.wait(1.0)
        assert time.monotonic() - began >= 0.9  # slept the timeout out, not woken and left
        with logstreams.writing(database) as session:
            logstreams.open_request(
                session,
                node="other",
                binding_uid="b-2",
                path=str(logs_dir / "attempt-2.log"),
                follow=False,
                lease_seconds=10.0,
                now=T0,
            )
        assert waker.wait(5.0)
    finally:
        waker.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_waker_whose_connection_drops_listens_anew_and_wakes(database: db.Database) -> None:
    """QA: the database's backends were ended (as a server restart ends them); a waker's next
    wait raised psycopg's own error, which killed the agent's thread that listens for log
    requests (`gctl logs --from-node` then failed until the agent was restarted) and printed
    a traceback from `gctl logs -f --from-node`. Now the wait listens anew and wakes its
    caller, which reads again: what was sent meanwhile LISTEN cannot give back."""
    stop = notify.Stop()
    waker = logstreams.waker(database, stop, logstreams.for_node("n1"))
    try:
        with database.engine.begin() as connection:
            ended = connection.execute(
                sqlalchemy.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).all()
        assert ended, "no backend to end"
        assert waker.wait(5.0)  # woken: the caller reads again
        assert not waker.wait(0.5)  # and then sleeps as before
        with logstreams.writing(database) as session:
            logstreams.open_request(
                session,
                node="n1",
                binding_uid="b-1",
                path="/nowhere/attempt-1.log",
                follow=False,
                lease_seconds=10.0,
                now=T0,
            )
        assert waker.wait(5.0)  # listening anew: it hears the next request
    finally:
        waker.close()


def test_a_waker_for_a_database_that_cannot_be_reached_says_so_in_one_line() -> None:
    database = db.Database("postgresql+psycopg://nobody@127.0.0.1:1/gctl")  # nothing listens
    with pytest.raises(errors.Unavailable) as raised:
        logstreams.waker(database, None, logstreams.for_node("n1"))
    assert str(raised.value).startswith("database ")
    assert "\n" not in str(raised.value)
