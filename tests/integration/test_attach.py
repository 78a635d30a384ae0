"""`gctl run --attach` of a Job that runs on another host whose agent does not answer for its
log (down, or too old to serve logs): the agent there reports a log path that is not on this
machine, and nothing takes the request for it. The command says so once, waits, and ends with
the Job's exit code, instead of failing and leaving the Job running with nobody attached."""

import threading
from datetime import UTC, datetime

import pytest

from controller import jobs, scheduling
from gctl.api import binding, job
from gctl.cli import nodelogs, running
from gctl.store import db, store
from tests.builders import make_job, put_ready_node

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _report(database: db.Database, **status: object) -> None:
    """What the agent of node `far` writes of attempt 1."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, "remote-1", "default")
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
