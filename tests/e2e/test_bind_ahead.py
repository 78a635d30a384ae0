"""Jobs bound ahead, run for real: the agent arms the next job on a GPU while the one before it
runs, and its supervisor starts it as soon as that one exits, without the controller or even
the agent; a restarted agent starts what it had not armed.

The controller and agent are real `gctl` processes (test_jobs.py's Cluster), on one fake GPU;
the jobs are shell commands that write the time they start and end."""

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gctl
from tests.e2e.test_jobs import Cluster, apply_job, phase_is, wait_for

DEADLINE = 20.0


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: what the agent does here is the same on either database, and the
    compare-and-set it relies on is tested on both (tests/integration/test_bind_ahead.py)."""
    return str(tmp_path / "gctl.db")


def _attempt(gctl: Gctl, name: str) -> dict[str, Any] | None:
    return gctl.read("Binding", name)


def _greeting_staged(spec: Path) -> str | None:
    """GREETING in an armed attempt's spec.json, None before the agent wrote it."""
    try:
        return str(json.loads(spec.read_text())["env"]["GREETING"])
    except FileNotFoundError:
        return None


def _stamped(path: Path) -> float | None:
    return float(path.read_text()) if path.exists() and path.read_text().strip() else None


def _assert_second_started_after_first_ended(tmp: Path) -> None:
    start, end = _stamped(tmp / "start"), _stamped(tmp / "end")
    assert start is not None
    assert end is not None
    assert start > end


def _first_then_second(
    gctl: Gctl, cluster: Cluster, tmp: Path, *, before_second: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """`first` runs on the only GPU until `tmp/release` exists; `second`, applied after it
    (and after `before_second`), is bound ahead of it. Returns second's attempt."""
    cluster.controller()
    cluster.agent("n1", gpus=1)
    release = tmp / "release"
    apply_job(
        gctl,
        "first",
        ["bash", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done; date +%s.%N > {tmp}/end"],
    )
    wait_for(phase_is(gctl, "first", "Running"), "first to run", DEADLINE)
    before_second()
    apply_job(gctl, "second", ["bash", "-c", f"date +%s.%N > {tmp}/start"])
    ahead: dict[str, Any] = wait_for(
        lambda: _attempt(gctl, "second-1"), "second to be bound ahead", DEADLINE
    )
    return ahead


def _in_phase(gctl: Gctl, name: str, phase: str) -> Callable[[], dict[str, Any] | None]:
    """The attempt `name`, once its phase is `phase`."""

    def check() -> dict[str, Any] | None:
        found = _attempt(gctl, name)
        return found if found and found["status"].get("phase", "Pending") == phase else None

    return check


def test_the_agent_starts_a_job_bound_ahead_when_the_one_before_exits(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    ahead = _first_then_second(gctl, cluster, tmp_path)
    first = _attempt(gctl, "first-1")
    assert first is not None
    assert ahead["spec"]["after"] == [first["metadata"]["uid"]]
    armed = wait_for(_in_phase(gctl, "second-1", "Armed"), "second to be armed", DEADLINE)
    assert armed["status"]["observedGeneration"] == 1  # the generation of the Job it launches
    cluster.kill("controller")  # what follows is the agent's alone
    (tmp_path / "release").touch()
    done = wait_for(
        lambda: (b := _attempt(gctl, "second-1")) and b["status"].get("phase") == "Exited" and b,
        "second to run and exit",
        DEADLINE,
    )
    assert done["status"]["exitCode"] == 0
    _assert_second_started_after_first_ended(tmp_path)
    cluster.controller()  # the Jobs catch up with what their attempts did
    wait_for(phase_is(gctl, "second", "Succeeded"), "second to succeed", DEADLINE)
    wait_for(phase_is(gctl, "first", "Succeeded"), "first to succeed", DEADLINE)


def test_an_armed_job_starts_while_its_agent_is_down(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    _first_then_second(gctl, cluster, tmp_path)
    armed = wait_for(_in_phase(gctl, "second-1", "Armed"), "second to be armed", DEADLINE)
    # Its supervisor exists: the agent writes Armed, then asks for it (a kill between the two
    # leaves it to the next agent; the full suite's load once made that window).
    launched = tmp_path / "state-n1" / "attempts" / armed["metadata"]["uid"] / "launched.json"
    wait_for(launched.exists, "second's supervisor", DEADLINE)
    cluster.kill("n1", signal.SIGKILL)  # the supervisors run on without their agent
    (tmp_path / "release").touch()
    wait_for(lambda: _stamped(tmp_path / "start"), "second to start", DEADLINE)
    cluster.agent("n1", gpus=1)  # and learns what happened
    wait_for(phase_is(gctl, "second", "Succeeded"), "second to succeed", DEADLINE)
    wait_for(phase_is(gctl, "first", "Succeeded"), "first to succeed", DEADLINE)
    _assert_second_started_after_first_ended(tmp_path)


def test_a_restarted_agent_starts_what_waited_for_a_job_that_ended_meanwhile(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    """The agent died before it could arm the next job: restarted, it takes and starts it."""
    _first_then_second(
        gctl, cluster, tmp_path, before_second=lambda: cluster.kill("n1", signal.SIGKILL)
    )
    (tmp_path / "release").touch()
    wait_for(lambda: _stamped(tmp_path / "end"), "first to end", DEADLINE)
    time.sleep(0.3)
    assert not (tmp_path / "start").exists()
    second = _attempt(gctl, "second-1")
    assert second is not None
    assert second["status"].get("phase", "Pending") == "Pending"
    cluster.agent("n1", gpus=1)
    wait_for(phase_is(gctl, "second", "Succeeded"), "second to succeed", DEADLINE)
    first = wait_for(phase_is(gctl, "first", "Succeeded"), "first to succeed", DEADLINE)
    assert first["status"]["exitCode"] == 0
    _assert_second_started_after_first_ended(tmp_path)


def test_a_job_bound_ahead_changed_after_the_agent_armed_it_runs_as_changed(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    """The agent arms an attempt bound ahead from its Job as it was then; a change to the Job
    before it starts takes it back and arms it anew, so the change reaches the process."""
    cluster.controller()
    cluster.agent("n1", gpus=1)
    release, greeting = tmp_path / "release", tmp_path / "greeting"
    apply_job(gctl, "first", ["bash", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"])
    wait_for(phase_is(gctl, "first", "Running"), "first to run", DEADLINE)
    command = ["bash", "-c", f'echo "$GREETING" > {greeting}']
    apply_job(gctl, "second", command, env={"GREETING": "as applied first"})
    ahead = wait_for(lambda: _attempt(gctl, "second-1"), "second to be bound ahead", DEADLINE)
    staged = tmp_path / "state-n1" / "attempts" / ahead["metadata"]["uid"] / "spec.json"
    armed = wait_for(_in_phase(gctl, "second-1", "Armed"), "second to be armed", DEADLINE)
    assert armed["status"]["observedGeneration"] == 1
    # The agent writes the supervisor's spec once the Armed report has committed, so it may
    # lag the report a moment (a crash between the two leaves it absent: taken back, re-armed).
    wait_for(lambda: _greeting_staged(staged) == "as applied first", "spec.json", DEADLINE)
    apply_job(gctl, "second", command, env={"GREETING": "as changed"})
    wait_for(
        lambda: (
            (b := _in_phase(gctl, "second-1", "Armed")()) and b["status"]["observedGeneration"] == 2
        ),
        "second to be armed again from the changed Job",
        DEADLINE,
    )
    wait_for(lambda: _greeting_staged(staged) == "as changed", "the spec rewritten", DEADLINE)
    release.touch()
    wait_for(phase_is(gctl, "second", "Succeeded"), "second to succeed", DEADLINE)
    assert greeting.read_text() == "as changed\n"


def test_the_agent_does_not_start_a_job_bound_ahead_on_a_cordoned_gpu(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    _first_then_second(gctl, cluster, tmp_path)
    wait_for(_in_phase(gctl, "second-1", "Armed"), "second to be armed", DEADLINE)
    cluster.kill("controller")  # nobody moves `second`: the agent alone must hold back
    gctl.ok("cordon", "gpu0")
    wait_for(_in_phase(gctl, "second-1", "Pending"), "the agent to give second back", DEADLINE)
    (tmp_path / "release").touch()
    wait_for(
        lambda: (b := _attempt(gctl, "first-1")) and b["status"].get("phase") == "Exited",
        "first to exit",
        DEADLINE,
    )
    time.sleep(1.5)  # several agent passes: the attempt bound ahead stays untaken
    second = _attempt(gctl, "second-1")
    assert second is not None
    assert second["status"].get("phase", "Pending") == "Pending"
    assert not (tmp_path / "start").exists()
    gctl.ok("uncordon", "gpu0")
    wait_for((tmp_path / "start").exists, "second to start once uncordoned", DEADLINE)


def test_drain_evicts_what_runs_and_leaves_the_job_bound_ahead_to_the_scheduler(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    _first_then_second(gctl, cluster, tmp_path)
    cluster.kill("controller")  # what drain itself writes, before any pass moves `second`
    gctl.ok("drain", "gpu0", "--evict")
    first, second = _attempt(gctl, "first-1"), _attempt(gctl, "second-1")
    assert first is not None
    assert second is not None
    assert first["spec"].get("stopReason") == "Evicted"
    assert "stopReason" not in second["spec"]  # it never started: nothing to evict


def test_an_armed_job_moves_to_a_gpu_that_frees_first(
    gctl: Gctl, cluster: Cluster, tmp_path: Path
) -> None:
    """Armed behind one busy GPU, `second` is asked back when the other GPU frees first: the
    agent takes it from its supervisor, the scheduler moves it, and it starts there while the
    job it was armed behind still runs."""
    cluster.controller()
    cluster.agent("n1", gpus=2)
    for name in ("a", "b"):
        hold = f"while [ ! -e {tmp_path}/release-{name} ]; do sleep 0.05; done"
        apply_job(gctl, name, ["bash", "-c", f"{hold}; date +%s.%N > {tmp_path}/end-{name}"])
        wait_for(phase_is(gctl, name, "Running"), f"{name} to run", DEADLINE)
    apply_job(gctl, "second", ["bash", "-c", f"date +%s.%N > {tmp_path}/start"])
    armed = wait_for(_in_phase(gctl, "second-1", "Armed"), "second to be armed", DEADLINE)
    behind = next(
        name
        for name in ("a", "b")
        if (found := _attempt(gctl, f"{name}-1"))
        and found["metadata"]["uid"] in armed["spec"]["after"]
    )
    other = "b" if behind == "a" else "a"
    (tmp_path / f"release-{other}").touch()
    wait_for(lambda: _stamped(tmp_path / "start"), "second to start on the freed GPU", DEADLINE)
    assert not (tmp_path / f"end-{behind}").exists()  # the one it was armed behind runs on
    moved = _attempt(gctl, "second-1")
    assert moved is not None
    assert moved["metadata"]["uid"] != armed["metadata"]["uid"]
    assert moved["spec"]["gpus"] != armed["spec"]["gpus"]
    (tmp_path / f"release-{behind}").touch()
    wait_for(phase_is(gctl, "second", "Succeeded"), "second to succeed", DEADLINE)
    assert _get_attempts(gctl, "second") == 1


def _get_attempts(gctl: Gctl, name: str) -> int:
    return int(gctl.object("Job", name)["status"]["attempts"])
