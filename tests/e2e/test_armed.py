"""Armed attempts, run for real by the node's runtime: a supervisor started ahead waits for the
one before it to end and starts its job at once; taken back, stopped or fenced first, it never
starts it (nodeagent/supervisor.py, `_Turn`).

No database here: the runtime alone, with real supervisors (through the fork server) and real
processes. The jobs are shell commands that write the time they start and end."""

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gctl.api import binding, job
from gctl.store import db, store
from nodeagent import agent, gpus, runtime, supervisor
from tests.builders import bind_first_attempt, make_job
from tests.e2e.conftest import launch_script, until


def _holding(node: runtime.Runtime, tmp: Path) -> Path:
    """Launch `first`, which runs until the returned file exists, then stamps `first-end`."""
    release = tmp / "release"
    script = f"while [ ! -e {release} ]; do sleep 0.02; done; date +%s.%N > {tmp}/first-end"
    launch_script(node, "first", script)
    until(lambda: node.state("first").pid is not None, "first to run")
    return release


def _second(node: runtime.Runtime, tmp: Path, **kwargs: object) -> None:
    launch_script(node, "second", f"date +%s.%N > {tmp}/second-start", after=("first",), **kwargs)  # type: ignore[arg-type]
    until(lambda: node.state("second").phase == "armed", "second to be armed")


def _phase(node: runtime.Runtime, uid: str, phase: str) -> Callable[[], bool]:
    return lambda: node.state(uid).phase == phase


def test_an_armed_attempt_starts_its_job_when_the_one_before_it_ends(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    release = _holding(node, tmp_path)
    _second(node, tmp_path)
    time.sleep(0.3)
    assert node.state("second").phase == "armed"  # it waits while first runs
    assert not (tmp_path / "second-start").exists()
    release.touch()
    until(_phase(node, "second", "exited"), "second to run and exit")
    ended = float((tmp_path / "first-end").read_text())
    started = float((tmp_path / "second-start").read_text())
    assert started > ended
    assert node.state("second").exit_code == 0
    assert (node.attempts_dir / "second" / supervisor.FIRED).exists()
    assert not node.disarm("second")  # started: too late to take it back


def test_an_armed_attempt_taken_back_never_starts(node: runtime.Runtime, tmp_path: Path) -> None:
    release = _holding(node, tmp_path)
    _second(node, tmp_path)
    assert node.disarm("second")
    until(_phase(node, "second", "absent"), "second's supervisor to end")
    release.touch()
    until(_phase(node, "first", "exited"), "first to exit")
    time.sleep(0.3)
    assert not (tmp_path / "second-start").exists()
    assert node.state("second").phase == "absent"


def test_an_armed_attempt_stopped_ends_before_it_starts(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    release = _holding(node, tmp_path)
    _second(node, tmp_path)
    node.stop("second", warn=False, reason="Deleted")
    until(_phase(node, "second", "exited"), "second to end")
    state = node.state("second")
    assert (state.stopped, state.reason, state.exit_code, state.pid, state.message) == (
        True,
        "Deleted",
        None,
        None,
        supervisor.NOT_STARTED,
    )
    release.touch()
    until(_phase(node, "first", "exited"), "first to exit")
    time.sleep(0.3)
    assert not (tmp_path / "second-start").exists()


def test_an_armed_attempt_does_not_start_once_its_agent_is_silent(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    lease = tmp_path / "lease"
    lease.touch()
    release = _holding(node, tmp_path)
    _second(node, tmp_path, lease=lease)
    stale = time.time() - 100
    os.utime(lease, (stale, stale))  # the agent has not renewed it for 100 s (fence: 30 s)
    release.touch()
    until(_phase(node, "second", "exited"), "second to give up")
    state = node.state("second")
    assert (state.reason, state.exit_code, state.stopped) == (supervisor.FENCED, None, False)
    assert not (tmp_path / "second-start").exists()


def _stubborn(node: runtime.Runtime, tmp: Path) -> Path:
    """Launch `stubborn`, a job that ignores SIGTERM with a grace period of 300 s, fenced after
    30 s with the agent's grace period of 0.5 s; returns its lease, fresh, once it runs."""
    lease = tmp / "lease"
    lease.touch()
    up = tmp / "up"
    node.launch(
        runtime.Launch(
            uid="stubborn",
            argv=["bash", "-c", f"trap '' TERM; touch {up}; while true; do sleep 0.05; done"],
            env=dict(os.environ),
            cwd=None,
            log_path=node.log_path("default", "stubborn", "job-uid", 1),
            grace_seconds=300.0,
            lease_path=lease,
            fence_seconds=30.0,
            fence_grace_seconds=0.5,
        )
    )
    until(up.exists, "the job to ignore SIGTERM")
    return lease


@pytest.mark.parametrize("deleted_first", [False, True], ids=["running", "being-stopped"])
def test_a_job_its_fence_stops_gets_the_agents_grace_period_not_its_own(
    node: runtime.Runtime, tmp_path: Path, deleted_first: bool
) -> None:
    """Review: a Job with a grace period of 300 s that ignores SIGTERM, stopped by its fence,
    ran on for 300 s; its node is taken over once the agent's grace period is past
    (AgentInstance.gone_after), and its retry ran beside it. A fence's SIGKILL comes after the
    agent's grace period at most, also where the job was being stopped already (deleted: its
    SIGTERM out, its own 300 s running)."""
    lease = _stubborn(node, tmp_path)
    if deleted_first:
        node.stop("stubborn", warn=False)
        time.sleep(0.5)
        assert node.state("stubborn").phase == "running"
    stale = time.time() - 100
    os.utime(lease, (stale, stale))  # the agent has not renewed it for 100 s (fence: 30 s)
    until(_phase(node, "stubborn", "exited"), "the fence's SIGKILL")
    state = node.state("stubborn")
    assert (state.reason, state.exit_code) == (supervisor.FENCED, 137)


def test_an_armed_attempt_waits_on_after_its_fork_server_and_agent_are_gone(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    """Supervisors outlive the agent: the next job starts while the agent is down."""
    release = _holding(node, tmp_path)
    _second(node, tmp_path)
    node.close()  # the agent's fork server goes, as when the agent dies
    release.touch()
    later = runtime.Runtime(tmp_path / "state")  # a restarted agent finds it ran
    try:
        until(_phase(later, "second", "exited"), "second to run and exit")
        assert (tmp_path / "second-start").exists()
    finally:
        later.close()


def test_an_armed_attempt_does_not_start_after_a_supervisor_that_died_without_a_record(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    """The job before it may still hold the GPU: the agent must end it, then decide."""
    _holding(node, tmp_path)
    _second(node, tmp_path)
    launched = supervisor.read_json(node.attempts_dir / "first" / supervisor.PID)
    assert launched is not None
    os.kill(int(launched["supervisor"]), signal.SIGKILL)  # first's job runs on, orphaned
    until(_phase(node, "first", "lost"), "first to be lost")
    until(_phase(node, "second", "absent"), "second to give up")
    assert not (tmp_path / "second-start").exists()
    assert (node.attempts_dir / "second" / supervisor.CANCELLED).exists()
    node.kill_lost("first")


# -- the agent's backstop: nothing starts on a GPU an armed attempt may take ------------------


def _bind(
    writer: store.Store, job_name: str, on: list[int], *, after: tuple[str, ...] = ()
) -> binding.Binding:
    owner = writer.get(job.Job, job_name, "default")
    return bind_first_attempt(writer, owner, "n1", on, list(after))


def test_the_agent_starts_nothing_on_a_gpu_armed_for_another_attempt(tmp_path: Path) -> None:
    """A race with the scheduler could bind `z` to a GPU on which `y` is armed (the pass that
    asks `y` back to move it): `z` waits until `y` is gone, as armed or as running, so two
    jobs never share the GPU."""
    database = db.Database.open(str(tmp_path / "gctl.db"))
    node_agent = agent.Agent(database, "n1", gpus.FakeGPUs(1), tmp_path / "state", fence_seconds=0)
    release = tmp_path / "release"
    scripts = {
        "a": f"while [ ! -e {release} ]; do sleep 0.02; done",
        "y": f"date +%s.%N > {tmp_path}/y-start; sleep 0.5; date +%s.%N > {tmp_path}/y-end",
        "z": f"date +%s.%N > {tmp_path}/z-start",
    }
    try:
        node_agent.heartbeat()
        with database.write() as session:
            writer = store.Store(session)
            for name, script in scripts.items():
                writer.create(make_job(name).command("bash", "-c", script).build())
            a = _bind(writer, "a", [0])
        until(lambda: _synced_phase(node_agent, database, "a-1") == "Running", "a to run")
        with database.write() as session:
            _bind(store.Store(session), "y", [0], after=(a.metadata.uid or "",))
        until(lambda: _synced_phase(node_agent, database, "y-1") == "Armed", "y to be armed")
        with database.write() as session:
            _bind(store.Store(session), "z", [0])  # the race: bound where `y` is armed
        for _ in range(3):
            node_agent.sync()
        assert _phase_of(database, "z-1") == "Pending"
        release.touch()
        until(lambda: _synced_phase(node_agent, database, "z-1") == "Exited", "z to run")
        assert float((tmp_path / "z-start").read_text()) > float((tmp_path / "y-end").read_text())
    finally:
        node_agent.runtime.close()
        database.close()


def _phase_of(database: db.Database, name: str) -> str:
    with database.read() as session:
        return store.Store(session).get(binding.Binding, name, "default").status.phase


def _synced_phase(node_agent: agent.Agent, database: db.Database, name: str) -> str:
    node_agent.sync()
    return _phase_of(database, name)
