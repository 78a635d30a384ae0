"""`gctl run --attach` of a Job that runs on another host whose agent does not answer for its
log (down, or too old to serve logs): the agent there reports a log path that is not on this
machine, and nothing takes the request for it. The command says so once, waits, and ends with
the Job's exit code, instead of failing and leaving the Job running with nobody attached."""

import threading
import time
from datetime import UTC, datetime

import pytest

from controller import jobs, scheduling
from gctl.api import binding, job
from gctl.cli import nodelogs, running
from gctl.store import db, logstreams, store
from tests.builders import make_job, put_ready_node

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _report(database: db.Database, attempt_name: str = "remote-1", **status: object) -> None:
    """What the agent of node `far` (or the controller) writes of an attempt."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, attempt_name, "default")
        attempt.status = attempt.status.model_copy(update=status)
        writer.update_status(attempt)


def test_attach_to_a_job_on_a_silent_host_waits_and_ends_with_its_exit_code(
    database: db.Database, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodelogs, "ANSWER_SECONDS", 0.5)
    builder = make_job("remote")
    builder.spec["backoffLimit"] = 0
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "far", 1, T0)
        created = writer.create(builder.build())
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    log = "/nowhere-on-this-host/state/logs/default/remote/uid/attempt-1.log"

    def far_agent() -> None:  # what the agent of `far` and the controller write meanwhile
        _report(database, phase="Running", start_time=T0, log_path=log, pid=4242)
        _report(database, phase="Exited", exit_code=3, reason="Error", finish_time=T0)
        store.transact(database, lambda w: jobs.reconcile(w, "default", "remote", T0))

    elsewhere = threading.Thread(target=far_agent)
    elsewhere.start()
    code = running._attach(database, "default", "remote", created.metadata.uid)
    elsewhere.join(timeout=30)
    assert code == 3
    said = capsys.readouterr().err
    assert (
        "node far is not answering: its agent did not take the request for the log of "
        "attempt 1 of job remote within 0.5s"
    ) in said
    assert "waiting for the job to end" in said
    assert "job.gctl/remote failed" in said
    with database.read() as session:
        assert store.Store(session).get(job.Job, "remote", "default").status.phase == "Failed"


def _take_request(database: db.Database) -> None:
    """What the log server of `far` does with the first request for a log: take it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with database.read() as session:
            requests = logstreams.requests_for(session, "far")
        if requests:
            with logstreams.writing(database) as session:
                assert logstreams.answer(session, requests[0], logstreams.SERVING)
            return
        time.sleep(0.05)
    raise AssertionError("no request for the log came")


def test_attach_to_a_job_whose_attempt_is_lost_goes_on_to_its_next_attempt(
    database: db.Database, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node takes the request, then goes silent and its attempt is declared Lost: the Job
    is retried, and `run --attach` says so in one line and ends with the retry's exit code."""
    monkeypatch.setattr(nodelogs, "LEASE_SECONDS", 0.5)
    builder = make_job("remote")
    builder.spec["backoffLimit"] = 0
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "far", 1, T0)
        created = writer.create(builder.build())
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    log = "/nowhere-on-this-host/state/logs/default/remote/uid/attempt-{}.log"

    def far_side() -> None:  # the agent of `far` takes the request, then goes silent
        _report(database, phase="Running", start_time=T0, log_path=log.format(1), pid=4242)
        _take_request(database)
        _report(database, phase="Lost", reason=binding.REASON_NODE_LOST)  # the controller
        store.transact(database, lambda w: jobs.reconcile(w, "default", "remote", T0))
        store.transact(database, lambda w: scheduling.schedule(w, T0))
        ended = {"exit_code": 3, "reason": "Error", "start_time": T0, "finish_time": T0}
        _report(database, "remote-2", phase="Exited", **ended)
        store.transact(database, lambda w: jobs.reconcile(w, "default", "remote", T0))

    elsewhere = threading.Thread(target=far_side)
    elsewhere.start()
    code = running._attach(database, "default", "remote", created.metadata.uid)
    elsewhere.join(timeout=30)
    assert code == 3
    said = capsys.readouterr().err
    assert (
        "node far stopped sending the log of attempt 1 of job remote: the attempt was lost; "
        "waiting for the job to end"
    ) in said
    assert "job.gctl/remote failed" in said
