"""Where an attempt's log goes on its node, and the path the agent reports for `gctl logs`: an
in-process agent on a SQLite database, real supervisors and processes (nodeagent/runtime.py).
"""

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gctl.api import binding, errors, job
from gctl.cli import following
from gctl.store import db, store
from nodeagent import agent, gpus, launches
from tests.builders import bind_first_attempt, make_job
from tests.e2e.conftest import until


class Node:
    """An agent of node n1 with one fake GPU, and its database."""

    def __init__(self, tmp_path: Path) -> None:
        self.database = db.Database.open(str(tmp_path / "gctl.db"))
        self.agent = agent.Agent(
            self.database, "n1", gpus.FakeGPUs(1), tmp_path / "state", fence_seconds=0
        )
        self.agent.heartbeat()

    def bind(self, owner: job.Job) -> tuple[job.Job, binding.Binding]:
        """Create `owner` and its first attempt on GPU 0, as the scheduler writes it."""
        with self.database.write() as session:
            writer = store.Store(session)
            created = writer.create(owner)
            return created, bind_first_attempt(writer, created, "n1", [0], [])

    def ended(self, name: str) -> binding.Binding:
        """Attempt 1 of Job `name` once the agent's passes have reported it Exited."""

        def synced() -> binding.Binding | None:
            self.agent.sync()
            with self.database.read() as session:
                found = store.Store(session).get(binding.Binding, f"{name}-1", "default")
            return found if found.status.phase == "Exited" else None

        return until(synced, f"{name} to end")


@pytest.fixture
def n1(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path)
    yield node
    node.agent.runtime.close()
    node.database.close()


def _script(name: str, script: str) -> job.Job:
    return make_job(name).command("sh", "-c", script).build()


def test_each_job_of_a_name_logs_under_its_own_uid(n1: Node) -> None:
    """Two Jobs of one name (the first deleted, the second created) never share a log file."""
    first, _ = n1.bind(_script("same", "echo first"))
    first_log = n1.ended("same").status.log_path
    with n1.database.write() as session:  # the Job and its attempt gone, as after a delete
        writer = store.Store(session)
        writer.delete(binding.Binding, "same-1", "default")
        writer.delete(job.Job, "same", "default")
    second, _ = n1.bind(_script("same", "echo second"))
    second_log = n1.ended("same").status.log_path

    logs = n1.agent.runtime.logs_dir / "default" / "same"
    assert first_log == str(logs / (first.metadata.uid or "") / "attempt-1.log")
    assert second_log == str(logs / (second.metadata.uid or "") / "attempt-1.log")
    assert Path(first_log).read_text() == "first\n"  # kept, as before
    assert Path(second_log).read_text() == "second\n"


def test_an_attempt_launched_by_an_earlier_agent_keeps_the_log_it_writes(n1: Node) -> None:
    """An agent upgraded in place while an attempt runs re-adopts it: the log path it reports
    is the one that attempt's supervisor was given (the layout before uids, here), not one
    computed again."""
    owner, bound = n1.bind(_script("kept", "echo from before the upgrade"))
    earlier = n1.agent.runtime.logs_dir / "default" / "kept" / "attempt-1.log"
    settings = launches.Settings("n1", 1.0, None, 0.0)
    launch = launches.launch_for(n1.agent.runtime, settings, bound, owner)
    n1.agent.runtime.launch(dataclasses.replace(launch, log_path=earlier))

    ended = n1.ended("kept").status

    assert (ended.exit_code, ended.log_path) == (0, str(earlier))
    assert earlier.read_text() == "from before the upgrade\n"


def test_an_attempt_that_was_never_launched_reports_no_log(
    n1: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Job that cannot start on this node (here: its conda environment, without conda) has
    no log to point at: `gctl logs` says why it never started instead of printing nothing."""
    monkeypatch.setattr(launches.shutil, "which", lambda _name, path=None: None)
    monkeypatch.delenv("CONDA_EXE", raising=False)
    built = make_job("noconda").command("true").build()
    built.spec.conda_env = "torch"
    n1.bind(built)

    ended = n1.ended("noconda")

    assert (ended.status.reason, ended.status.log_path) == ("StartError", None)
    with pytest.raises(errors.NotFound, match=r"ended before it started: spec\.condaEnv"):
        following.show(n1.database, ended, 0, False, threading.Event())


def test_a_new_jobs_log_directories_are_made_the_jobs_own_private(n1: Node) -> None:
    """Made by the supervisor now (the agent's launches follow one another; supervisors start
    side by side): there, and the Job's own as private as the logs directory."""
    owner, _ = n1.bind(_script("fresh", "echo made"))

    log = Path(n1.ended("fresh").status.log_path or "")

    assert log.read_text() == "made\n"
    assert log.parent == n1.agent.runtime.logs_dir / "default" / "fresh" / owner.metadata.uid
    assert log.parent.stat().st_mode & 0o777 == 0o700


def test_a_log_that_cannot_be_made_is_a_start_error_naming_it(n1: Node) -> None:
    """A file where the Job's log directory would go (a hand edit, say): the attempt ends
    StartError saying which log, its job never started, and no log path is reported, so that
    `gctl logs` says why rather than asking a node for a log that is not there."""
    blocker = n1.agent.runtime.logs_dir / "default" / "blocked"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory")
    owner, _ = n1.bind(_script("blocked", "true"))

    ended = n1.ended("blocked")

    status = ended.status
    assert (status.reason, status.exit_code, status.pid, status.log_path) == (
        "StartError",
        127,
        None,
        None,
    )
    assert status.message is not None
    assert f"cannot open the log {blocker}/{owner.metadata.uid}/attempt-1.log" in status.message
    assert "Not a directory" in status.message
    with pytest.raises(errors.NotFound, match="ended before it started: cannot open the log"):
        following.show(n1.database, ended, 0, False, threading.Event())
