"""The node agent's newer features, run for real: stop warnings, per-job grace periods, fake GPU
processes, GPU memory enforcement, the supervisor fork server, and evictions that requeue.

The controller and agent are real `gctl` processes (test_jobs.py's Cluster), the jobs real
processes that record the signals they get; fake GPUs only. Waits poll up to a deadline;
timings are checked loosely, with a second or more to spare.
"""

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gctl, sqlite_unless_asked
from tests.e2e.test_jobs import Cluster, alive, apply_job, phase_is, wait_for


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only: what is tested here happens in the agent and the supervisors it starts (signals,
    grace periods, its fork server, GPU memory); the database only carries their reports, and
    the controller's side of them is tested on both (tests/integration)."""
    return sqlite_unless_asked(request, tmp_path)


DEADLINE = 20.0  # seconds any one thing may take before a test gives up on it
GI = 2**30


class Agents(Cluster):
    """test_jobs.Cluster whose agents fence their jobs soon after a test ends."""

    def agent_with(
        self, name: str = "n1", gpus: int = 2, grace: float = 1, heartbeat: float = 0.5
    ) -> subprocess.Popen[bytes]:
        return self.agent(name, gpus, fence=5, grace=grace, heartbeat=heartbeat)


@pytest.fixture
def agents(gctl: Gctl, tmp_path: Path) -> Iterator[Agents]:
    running = Agents(gctl, tmp_path)
    yield running
    running.stop()


def attempt(gctl: Gctl, name: str) -> dict[str, Any]:
    """A Binding (one attempt) as `gctl get -o json` prints it."""
    return gctl.object("Binding", name)


def node_status(gctl: Gctl, name: str = "n1") -> dict[str, Any]:
    status: dict[str, Any] = gctl.object("Node", name)["status"]
    return status


def wait_phase(gctl: Gctl, name: str, *phases: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        phase_is(gctl, name, *phases), f"job {name} to be {' or '.join(phases)}", DEADLINE
    )
    return found


def stamp(path: Path) -> float:
    return float(path.read_text())


# -- stop warnings ---------------------------------------------------------------------------


def _signal_recorder(tmp_path: Path) -> list[str]:
    """A bash job that writes the time it got USR1 to `usr1` and TERM to `term` (exiting 0 on
    TERM). Bash runs a trap only once its foreground command returns: so it sleeps in the
    background and waits, and `wait` returns early for each trapped signal. Each stamp is
    written aside and renamed into place: a test that waits for the file reads it whole."""
    script = f"""
stamp() {{ date +%s.%N > {tmp_path}/$1.part && mv {tmp_path}/$1.part {tmp_path}/$1; }}
trap 'stamp usr1' USR1
trap 'stamp term; exit 0' TERM
sleep 300 &
stamp started
while :; do wait $!; done
"""
    return ["bash", "-c", script]


def test_suspend_sends_the_warning_signal_before_sigterm(
    agents: Agents, gctl: Gctl, tmp_path: Path
) -> None:
    agents.controller()
    agents.agent_with()
    warning = {"signal": "SIGUSR1", "seconds": 2}
    apply_job(gctl, "ckpt", _signal_recorder(tmp_path), stopWarning=warning)
    wait_for((tmp_path / "started").exists, "the job to start", DEADLINE)

    suspended_at = time.time()
    apply_job(gctl, "ckpt", _signal_recorder(tmp_path), stopWarning=warning, suspend=True)
    requeued = wait_phase(gctl, "ckpt", "Pending")

    usr1, term = stamp(tmp_path / "usr1"), stamp(tmp_path / "term")
    assert suspended_at <= usr1 < suspended_at + 5
    assert 1.8 <= term - usr1 <= 4.5, (usr1, term)
    stopped = attempt(gctl, "ckpt-1")
    assert (stopped["spec"]["stopReason"], stopped["status"]["reason"]) == (
        "Suspended",
        "Suspended",
    )
    assert stopped["status"]["exitCode"] == 0  # its TERM trap exited cleanly: no SIGKILL
    assert (requeued["status"]["failed"], requeued["status"]["reason"]) == (0, "Suspended")


def test_deadline_warning_comes_early_so_sigterm_lands_at_the_deadline(
    agents: Agents, gctl: Gctl, tmp_path: Path
) -> None:
    agents.controller()
    agents.agent_with()
    apply_job(
        gctl,
        "bounded",
        _signal_recorder(tmp_path),
        activeDeadlineSeconds=4,
        stopWarning={"signal": "USR1", "seconds": 2},
    )

    failed = wait_phase(gctl, "bounded", "Failed")

    assert failed["status"]["reason"] == "DeadlineExceeded"
    start = datetime.fromisoformat(failed["status"]["startTime"]).timestamp()
    usr1, term = stamp(tmp_path / "usr1"), stamp(tmp_path / "term")
    # USR1 at the deadline less the warning, SIGTERM at the deadline itself: without the
    # early stop they would come at 4 s and 6 s.
    assert 1.8 <= usr1 - start < 3.9, (start, usr1)
    assert 3.8 <= term - start < 6.0, (start, term)
    assert attempt(gctl, "bounded-1")["status"]["reason"] == "DeadlineExceeded"


def test_delete_skips_the_warning(agents: Agents, gctl: Gctl, tmp_path: Path) -> None:
    agents.controller()
    agents.agent_with()
    apply_job(gctl, "gone", _signal_recorder(tmp_path), stopWarning={"seconds": 30})
    wait_for((tmp_path / "started").exists, "the job to start", DEADLINE)

    gctl.ok("delete", "job", "gone", "--no-wait")

    # With the 30 s warning it would get USR1 now and TERM only after this wait gave up.
    wait_for((tmp_path / "term").exists, "the deleted job to get SIGTERM", DEADLINE)
    assert not (tmp_path / "usr1").exists()
    wait_for(lambda: gctl("get", "job", "gone").code == 1, "the job to be gone", DEADLINE)
    assert gctl.ok("get", "bindings") == ""


def test_delete_cuts_a_warning_short(agents: Agents, gctl: Gctl, tmp_path: Path) -> None:
    """Suspended with a 60 s warning, then deleted while the warning runs: the deletion stops
    the job at once instead of waiting the warning out."""
    agents.controller()
    agents.agent_with()
    warning = {"signal": "SIGUSR1", "seconds": 60}
    apply_job(gctl, "slow", _signal_recorder(tmp_path), stopWarning=warning)
    wait_for((tmp_path / "started").exists, "the job to start", DEADLINE)
    apply_job(gctl, "slow", _signal_recorder(tmp_path), stopWarning=warning, suspend=True)
    wait_for((tmp_path / "usr1").exists, "the warning signal", DEADLINE)

    deleted_at = time.time()
    gctl.ok("delete", "job", "slow", "--no-wait")

    wait_for((tmp_path / "term").exists, "the deleted job to get SIGTERM", DEADLINE)
    assert stamp(tmp_path / "term") - deleted_at < 10
    wait_for(lambda: gctl("get", "job", "slow").code == 1, "the job to be gone", DEADLINE)


# -- the grace period ------------------------------------------------------------------------


def test_job_grace_period_overrides_the_agents(agents: Agents, gctl: Gctl, tmp_path: Path) -> None:
    """The job ignores SIGTERM (and so does its child); the agent would wait 30 s before
    SIGKILL, the job asks for 1 s."""
    agents.controller()
    agents.agent_with(grace=30)
    script = f"trap '' TERM; sleep 300 & echo $! > {tmp_path}/child; wait"
    apply_job(gctl, "stubborn", ["bash", "-c", script], terminationGracePeriodSeconds=1)
    wait_phase(gctl, "stubborn", "Running")
    wait_for(  # written whole: the file exists, empty, before `echo` writes it
        lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text().endswith("\n"),
        "the job to start its child",
        DEADLINE,
    )
    child = int((tmp_path / "child").read_text())
    pid = attempt(gctl, "stubborn-1")["status"]["pid"]

    suspended_at = time.monotonic()
    apply_job(
        gctl, "stubborn", ["bash", "-c", script], terminationGracePeriodSeconds=1, suspend=True
    )
    wait_phase(gctl, "stubborn", "Pending")
    took = time.monotonic() - suspended_at

    assert 1.0 <= took < 10, took
    assert not alive(pid)
    assert not alive(child)
    stopped = attempt(gctl, "stubborn-1")["status"]
    assert (stopped["signal"], stopped["exitCode"], stopped["reason"]) == (
        "SIGKILL",
        137,
        "Suspended",
    )


# -- fake GPU processes ----------------------------------------------------------------------


def _heartbeat(status: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(status["heartbeatTime"])


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_foreign_processes_are_listed_and_the_jobs_are_not(
    agents: Agents, gctl: Gctl, tmp_path: Path
) -> None:
    agents.controller()
    agents.agent_with("fg")
    env = {k: v for k, v in os.environ.items() if k != "GCTL_GPUS"}
    # Its GCTL_NODE keeps it off the fake GPUs of other tests' nodes on this host.
    fake_use = {"GCTL_FAKE_GPU_MEMORY": "20Gi", "CUDA_VISIBLE_DEVICES": "0", "GCTL_NODE": "fg"}
    notebook = subprocess.Popen(["sleep", "60"], env={**env, **fake_use})
    try:
        apply_job(
            gctl,
            "trainer",
            ["sleep", "300"],
            env={"GCTL_FAKE_GPU_MEMORY": "5Gi"},
            placement={"gpus": [0]},
        )
        wait_phase(gctl, "trainer", "Running")
        job_pid = attempt(gctl, "trainer-1")["status"]["pid"]
        running_at = _heartbeat(node_status(gctl, "fg"))

        # A heartbeat taken after the attempt was recorded Running knows it is a job's.
        status = wait_for(
            lambda: _heartbeat(s := node_status(gctl, "fg")) > running_at and s,
            "a heartbeat after the job started",
            DEADLINE,
        )

        gpu0 = status["gpus"][0]
        listed = {p["pid"]: p for p in gpu0.get("processes", [])}
        assert notebook.pid in listed
        assert listed[notebook.pid]["usedMemory"] == 20 * GI
        assert listed[notebook.pid]["name"] == "sleep"
        assert job_pid not in listed
        assert not [pid for pid in listed if _session_of(pid) == job_pid]
        assert gpu0["memoryUsed"] >= 25 * GI  # the job's memory is used, just not foreign
        assert notebook.pid not in {p["pid"] for p in status["gpus"][1].get("processes", [])}
        gpus = json.loads(gctl.ok("get", "gpus", "-o", "json"))
        assert [[j["name"] for j in row["jobs"]] for row in gpus] == [["trainer"], []]
    finally:
        notebook.kill()
        notebook.wait()


def test_pool_enforcing_gpu_memory_stops_a_job_over_its_declaration(
    agents: Agents, gctl: Gctl
) -> None:
    agents.controller()
    agents.agent_with()
    pool = {
        "apiVersion": "gctl/v1",
        "kind": "GPUPool",
        "metadata": {"name": "strict"},
        "spec": {"enforceGPUMemory": True},
    }
    gctl.ok("apply", "-f", "-", stdin=json.dumps(pool))
    apply_job(
        gctl,
        "greedy",
        ["sleep", "300"],
        pool="strict",
        resources={"gpuMemory": "1Gi"},
        env={"GCTL_FAKE_GPU_MEMORY": "4Gi"},
    )

    failed = wait_phase(gctl, "greedy", "Failed")

    stopped = attempt(gctl, "greedy-1")
    assert stopped["spec"]["enforceGPUMemory"] is True
    assert stopped["status"]["reason"] == "GPUMemoryExceeded"
    assert re.fullmatch(
        r"used 4Gi of GPU \d's memory, more than its gpuMemory 1Gi; its pool enforces "
        r"declared memory",
        stopped["status"]["message"],
    ), stopped["status"]["message"]
    assert (stopped["status"]["signal"], stopped["status"]["exitCode"]) == ("SIGTERM", 143)
    assert failed["status"]["reason"] == "BackoffLimitExceeded"
    assert "gpuMemory 1Gi" in failed["status"]["message"]
    assert failed["status"]["failed"] == 1


# -- the supervisor fork server --------------------------------------------------------------


def _fork_servers(parent: int) -> list[int]:
    """Pids of the `supervisor.py --fork-server` processes whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"--fork-server" in argv and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_jobs_start_after_the_fork_server_dies(agents: Agents, gctl: Gctl, tmp_path: Path) -> None:
    agents.controller()
    agent = agents.agent_with()
    apply_job(gctl, "first", ["true"])
    wait_phase(gctl, "first", "Succeeded")
    [server] = _fork_servers(agent.pid)

    os.kill(server, signal.SIGKILL)
    wait_for(lambda: not alive(server), "the fork server to die", DEADLINE)
    apply_job(gctl, "second", f"echo second > {tmp_path}/second")
    second = wait_phase(gctl, "second", "Succeeded", "Failed")

    assert second["status"]["phase"] == "Succeeded", second["status"]
    assert (tmp_path / "second").read_text() == "second\n"
    logged = (tmp_path / "n1.log").read_text()
    assert "supervisor fork server failed" in logged
    assert "agent pass failed" not in logged  # started directly, not on a retried pass
    apply_job(gctl, "third", ["true"])  # the server is started again on first use
    assert wait_phase(gctl, "third", "Succeeded", "Failed")["status"]["phase"] == "Succeeded"
    [restarted] = _fork_servers(agent.pid)
    assert restarted != server


# -- eviction --------------------------------------------------------------------------------


def test_evicted_job_requeues_without_spending_its_backoff_limit(
    agents: Agents, gctl: Gctl, tmp_path: Path
) -> None:
    """The first attempt blocks until it is evicted; the second (on the other GPU: the first
    one drains) exits 0. backoffLimit 0: had the eviction counted, the Job would fail."""
    agents.controller()
    agents.agent_with()
    marker = tmp_path / "ran-once"
    command = f"test -e {marker} && exit 0; touch {marker}; exec sleep 300"
    apply_job(gctl, "movable", command, backoffLimit=0)
    running = wait_phase(gctl, "movable", "Running")
    [gpu] = running["status"]["gpus"]

    drained = gctl("drain", f"gpu{gpu}", "--evict")

    assert drained.code == 0, drained.err
    assert drained.out == f"gpu n1/gpu{gpu} draining\n"
    assert "evicting job default/movable" in drained.err
    done = wait_phase(gctl, "movable", "Succeeded", "Failed")
    status = done["status"]
    assert (status["phase"], status["preemptions"], status["failed"]) == ("Succeeded", 1, 0)
    assert status["attempts"] == 2
    assert status["gpus"] == [1 - gpu]
    evicted = attempt(gctl, "movable-1")
    assert (evicted["spec"]["stopReason"], evicted["status"]["reason"]) == ("Evicted", "Evicted")
    assert "Evicted" in gctl.ok("get", "events")
