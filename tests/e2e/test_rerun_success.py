"""Completion markers (`spec.successFile`) and `gctl rerun`, run for real: the controller and
agent are `gctl` processes (test_jobs.py's Cluster), the jobs real processes on fake GPUs.

Waits poll the database (`Gctl.read`) up to a deadline; nothing asserts on speed.
"""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gctl, sqlite_unless_asked
from tests.e2e.test_jobs import Cluster, alive, apply_job, job, phase_is, wait_for


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only: the agent reads a success file; the controller's outcomes and reruns are tested
    on both (tests/integration/test_rerun_controller.py)."""
    return sqlite_unless_asked(request, tmp_path)


DEADLINE = 30.0


def wait_phase(gctl: Gctl, name: str, *phases: str, attempt: int = 1) -> dict[str, Any]:
    """The Job once it is in one of `phases` with `attempt` attempts made."""

    def check() -> dict[str, Any] | None:
        found = phase_is(gctl, name, *phases)()
        return found if found and found["status"].get("attempts") == attempt else None

    found: dict[str, Any] = wait_for(check, f"{name} to be {'/'.join(phases)}", DEADLINE)
    return found


def all_finished(gctl: Gctl, *names: str) -> dict[str, dict[str, Any]]:
    """The statuses of these Jobs once every one has finished."""

    def check() -> dict[str, dict[str, Any]] | None:
        listed = [gctl.object("Job", name) for name in names]
        statuses = {item["metadata"]["name"]: item["status"] for item in listed}
        done = all(s.get("phase") in ("Succeeded", "Failed") for s in statuses.values())
        return statuses if done and len(statuses) == len(names) else None

    found: dict[str, dict[str, Any]] = wait_for(check, f"{', '.join(names)} to end", DEADLINE)
    return found


def binding_status(gctl: Gctl, name: str) -> dict[str, Any]:
    status: dict[str, Any] = gctl.object("Binding", name)["status"]
    return status


# -- successFile -----------------------------------------------------------------------------


def test_the_success_file_decides(cluster: Cluster, gctl: Gctl, tmp_path: Path) -> None:
    cluster.controller()
    cluster.agent(gpus=1)
    work = tmp_path / "work"
    work.mkdir()
    stale = tmp_path / "stale-done"
    stale.write_text("from an earlier run\n")  # before the attempt: it must not count
    specs = {
        # Relative to workingDir; the others relative to the agent's directory (tmp_path).
        "writes": {"command": "touch done", "workingDir": str(work), "successFile": "done"},
        "forgets": {"command": ["true"], "successFile": "never-written"},
        "teardown": {"command": "touch ok3; exit 3", "successFile": "ok3"},
        "stale": {"command": ["true"], "successFile": str(stale)},
    }
    items = [
        {"kind": "Job", "apiVersion": "gctl/v1", "metadata": {"name": name}, "spec": spec}
        for name, spec in specs.items()
    ]
    gctl.ok("apply", "-f", "-", stdin=json.dumps({"kind": "List", "items": items}))

    ended = all_finished(gctl, "writes", "forgets", "teardown", "stale")
    writes, forgets, teardown, stale_run = (
        ended[n] for n in ("writes", "forgets", "teardown", "stale")
    )

    assert (writes["phase"], writes["exitCode"]) == ("Succeeded", 0), writes
    assert binding_status(gctl, "writes-1")["successFile"] == "Found"
    assert (forgets["phase"], forgets["reason"], forgets["exitCode"]) == (
        "Failed",
        "SuccessFileMissing",
        0,
    )
    assert f"success file {tmp_path / 'never-written'} was not written" in forgets["message"]
    assert binding_status(gctl, "forgets-1")["successFile"] == "Missing"
    assert (teardown["phase"], teardown["exitCode"]) == ("Succeeded", 3), teardown
    assert f"exit code 3, but success file {tmp_path / 'ok3'} was written" in teardown["message"]
    assert (stale_run["phase"], stale_run["reason"]) == ("Failed", "SuccessFileMissing")


def test_a_missing_success_file_is_retried_like_any_failure(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent(gpus=1)
    # The first attempt exits 0 without the file; the second writes it.
    script = f"test -e {tmp_path}/tried && touch {tmp_path}/done; touch {tmp_path}/tried"
    apply_job(gctl, "flaky", script, successFile="done", backoffLimit=1)

    done = wait_phase(gctl, "flaky", "Succeeded", "Failed", attempt=2)["status"]

    assert (done["phase"], done["failed"]) == ("Succeeded", 1)
    assert binding_status(gctl, "flaky-1")["reason"] == "SuccessFileMissing"


def test_success_file_written_while_the_agent_is_down(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent()
    go = tmp_path / "go"
    script = f"while ! test -e {go}; do sleep 0.05; done; touch marker; exit 1"
    apply_job(gctl, "adopted", script, successFile="marker")
    wait_phase(gctl, "adopted", "Running")
    cluster.kill("n1")  # SIGKILL: the job goes on under its supervisor
    go.touch()
    wait_for((tmp_path / "marker").exists, "the job to write its marker", DEADLINE)
    time.sleep(0.3)  # let it exit while no agent runs
    cluster.agent()

    done = wait_phase(gctl, "adopted", "Succeeded", "Failed")["status"]

    assert (done["phase"], done["exitCode"]) == ("Succeeded", 1), done


# -- gctl rerun ------------------------------------------------------------------------------


def test_rerun_of_a_succeeded_job_runs_a_second_attempt(cluster: Cluster, gctl: Gctl) -> None:
    cluster.controller()
    cluster.agent()
    apply_job(gctl, "again", "echo run $GCTL_ATTEMPT")
    wait_phase(gctl, "again", "Succeeded")

    result = gctl("rerun", "job", "again", "--reason", "new data")

    assert (result.code, result.out) == (0, "job.gctl/again rerun requested\n"), result.err
    second = wait_phase(gctl, "again", "Succeeded", attempt=2)
    assert second["status"]["rerun"] == second["metadata"]["annotations"]["gctl/rerun"]
    assert gctl.ok("logs", "again", "--attempt", "1") == "run 1\n"
    assert gctl.ok("logs", "again", "--attempt", "2") == "run 2\n"
    events = gctl.ok("get", "events")
    assert "new data: runs again as attempt 2" in events
    described = gctl.ok("describe", "job", "again")
    assert f"Last Rerun:   {second['status']['rerun']} (" in described
    assert described.count("new data") >= 2  # the head line and the Event


def test_rerun_of_a_running_job_stops_it_and_starts_again(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent()
    script = (
        f"echo $GCTL_ATTEMPT >> {tmp_path}/runs; sleep 300 & "
        f"echo $! > {tmp_path}/child-$GCTL_ATTEMPT; wait"
    )
    apply_job(gctl, "long", script)
    wait_phase(gctl, "long", "Running")
    wait_for((tmp_path / "child-1").exists, "the job to start its child", DEADLINE)
    leader = binding_status(gctl, "long-1")["pid"]
    child = int((tmp_path / "child-1").read_text())

    gctl.ok("rerun", "job", "long")

    wait_for((tmp_path / "child-2").exists, "attempt 2 to start", DEADLINE)
    assert not alive(leader)
    assert not alive(child)
    running = wait_phase(gctl, "long", "Running", attempt=2)["status"]
    assert (running["failed"], running.get("preemptions", 0)) == (0, 0)
    assert binding_status(gctl, "long-1")["reason"] == "Rerun"
    assert (tmp_path / "runs").read_text().split() == ["1", "2"]
    gctl.ok("delete", "job", "long")


def test_rerun_of_a_failed_job_runs_it_again(cluster: Cluster, gctl: Gctl, tmp_path: Path) -> None:
    cluster.controller()
    cluster.agent()
    marker = tmp_path / "tried"
    apply_job(gctl, "broken", f"test -e {marker} || {{ touch {marker}; exit 3; }}", backoffLimit=0)
    failed = wait_phase(gctl, "broken", "Failed")["status"]
    assert (failed["exitCode"], failed["failed"]) == (3, 1)

    gctl.ok("rerun", "job", "broken")

    fixed = wait_phase(gctl, "broken", "Succeeded", "Failed", attempt=2)["status"]
    assert (fixed["phase"], fixed["exitCode"], fixed["failed"]) == ("Succeeded", 0, 0)
    complete = {c["type"]: c["status"] for c in fixed["conditions"]}
    assert complete == {"Scheduled": "True", "Failed": "False", "Complete": "True"}


def test_rerun_of_a_missing_job_is_a_one_line_error(gctl: Gctl) -> None:
    missing = gctl("rerun", "job", "nope")
    assert (missing.code, missing.out) == (1, "")
    assert missing.err == 'error: job "nope" not found in namespace "default"\n'
    wrong_kind = gctl("rerun", "pools", "default")
    assert wrong_kind.code == 1
    assert wrong_kind.err.count("\n") == 1
    assert "only jobs can be rerun" in wrong_kind.err


def test_applying_the_same_job_again_never_reruns_it(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent()
    manifest = tmp_path / "once.yaml"
    document = {
        "apiVersion": "gctl/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {"command": f"echo ran >> {tmp_path}/runs"},
    }
    manifest.write_text(json.dumps(document))
    gctl.ok("apply", "-f", str(manifest))
    wait_phase(gctl, "once", "Succeeded")

    assert gctl.ok("apply", "-f", str(manifest)) == "job.gctl/once unchanged\n"
    time.sleep(1)  # time enough for a second attempt, were one started

    assert job(gctl, "once")["status"]["attempts"] == 1
    assert gctl.ok("get", "bindings", "-o", "name").split() == ["binding.gctl/once-1"]
    assert (tmp_path / "runs").read_text() == "ran\n"
    # After a rerun too: apply keeps the rerun annotations gctl owns, and runs nothing.
    gctl.ok("rerun", "job", "once")
    wait_phase(gctl, "once", "Succeeded", attempt=2)
    assert gctl.ok("apply", "-f", str(manifest)) == "job.gctl/once unchanged\n"
    assert job(gctl, "once")["status"]["attempts"] == 2
