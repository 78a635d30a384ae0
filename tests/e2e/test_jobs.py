"""Jobs run for real: the controller and node agents as separate processes, real job processes,
real signals. Fake GPUs only (the GPU boundary).

Waits poll the database (`Gctl.read`, the path `gctl get` reads by) or `gctl get`, less often
the longer they wait, up to a generous timeout; nothing asserts on speed.
"""

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GCTL_BIN, Gctl


class Cluster:
    """A controller and agents started with `gctl`, each logging to a file of its own."""

    def __init__(self, gctl: Gctl, tmp: Path) -> None:
        self.gctl = gctl
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            [GCTL_BIN, *args], stdout=log, stderr=log, env=self.gctl.env(), cwd=self.tmp
        )
        log.close()
        self.procs[name] = proc
        return proc

    def controller(self, node_timeout: float = 10) -> subprocess.Popen[bytes]:
        return self._start(
            "controller",
            "controller",
            "run",
            "--node-timeout",
            str(node_timeout),
            "--backoff",
            "0.2",
        )

    def agent(
        self,
        name: str = "n1",
        gpus: int = 2,
        fence: float = 8,
        grace: float = 1,
        heartbeat: float = 0.5,
    ) -> subprocess.Popen[bytes]:
        return self._start(
            name,
            "agent",
            "run",
            "--node-name",
            name,
            "--fake-gpus",
            str(gpus),
            "--state-dir",
            str(self.tmp / f"state-{name}"),
            "--heartbeat",
            str(heartbeat),
            "--grace-period",
            str(grace),
            "--fence-after",
            str(fence),
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(10)

    def stop(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in self.tmp.glob("*.log"))


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """Call `check` until it returns something true; fail after `timeout`. The calls start
    0.05 s apart and draw apart to 0.5 s: a check that runs `gctl get` costs 40-50 ms of CPU
    on a 2-core machine, and tests that poll every 0.1 s for seconds on end (a node's timeout,
    a fence) take from the daemons they wait on much of the CPU they need to get there."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)
    raise AssertionError(f"timed out waiting for {what}")


def job(gctl: Gctl, name: str) -> dict[str, Any]:
    return gctl.object("Job", name)


def phase_is(gctl: Gctl, name: str, *phases: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        found = job(gctl, name)
        return found if found["status"].get("phase") in phases else None

    return check


def apply_job(gctl: Gctl, name: str, command: list[str] | str, **spec: Any) -> None:
    document = {
        "apiVersion": "gctl/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"command": command, **spec},
    }
    gctl.ok("apply", "-f", "-", stdin=json.dumps(document))


def _ready_nodes(gctl: Gctl) -> set[str]:
    rows = [line.split() for line in gctl.ok("get", "nodes").splitlines()[1:]]
    return {row[0] for row in rows if row[1] == "Ready"}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):  # the latter: it went as it was read
        return False


def test_job_sees_its_gpus_and_identity(cluster: Cluster, gctl: Gctl, tmp_path: Path) -> None:
    cluster.controller()
    cluster.agent(gpus=4)
    out = tmp_path / "env.txt"
    script = f"echo $CUDA_VISIBLE_DEVICES $GCTL_JOB_NAME $GCTL_ATTEMPT $GCTL_GPUS {{gpus}} > {out}"
    apply_job(gctl, "envcheck", script, resources={"gpus": 2})
    apply_job(
        gctl,
        "ascend",
        f"echo ascend=$ASCEND_RT_VISIBLE_DEVICES >> {out}.ascend",
        resources={"gpus": 1},
        gpuEnv="ASCEND_RT_VISIBLE_DEVICES",
    )
    done = wait_for(phase_is(gctl, "envcheck", "Succeeded"), "envcheck to succeed")
    gpus = ",".join(str(g) for g in done["status"]["gpus"])
    assert out.read_text().split() == [gpus, "envcheck", "1", gpus, gpus]
    wait_for(phase_is(gctl, "ascend", "Succeeded"), "ascend to succeed")
    assert (tmp_path / "env.txt.ascend").read_text().startswith("ascend=")
    assert len(done["status"]["gpus"]) == 2


def test_exit_code_and_retries(cluster: Cluster, gctl: Gctl, tmp_path: Path) -> None:
    cluster.controller()
    cluster.agent()
    apply_job(gctl, "fails", ["sh", "-c", "exit 3"])
    failed = wait_for(phase_is(gctl, "fails", "Failed"), "fails to fail")
    assert failed["status"]["exitCode"] == 3
    assert failed["status"]["reason"] == "BackoffLimitExceeded"
    attempt = json.loads(gctl.ok("get", "binding", "fails-1", "-o", "json"))["status"]
    assert attempt["startTime"] <= attempt["finishTime"]  # even an instant job has a start
    marker = tmp_path / "tried"
    apply_job(gctl, "flaky", f"test -e {marker} || {{ touch {marker}; exit 4; }}", backoffLimit=2)
    ok = wait_for(phase_is(gctl, "flaky", "Succeeded"), "flaky to succeed on its retry")
    assert (ok["status"]["attempts"], ok["status"]["failed"]) == (2, 1)
    events = gctl.ok("get", "events")
    assert "BackOff" in events
    assert "Completed" in events


def _group_script(tmp_path: Path) -> str:
    """A job that ignores SIGTERM and leaves a child that ignores it too; records the pids."""
    return (
        f"trap '' TERM; (trap '' TERM; sleep 300) & echo $! > {tmp_path}/child; "
        f"echo $$ > {tmp_path}/parent; sleep 300"
    )


def _pids(tmp_path: Path) -> list[int]:
    return [int((tmp_path / name).read_text()) for name in ("parent", "child")]


def _started(tmp_path: Path) -> bool:
    """Whether `_group_script` wrote both pids (the parent's last: a flake read it unwritten)."""
    return (tmp_path / "parent").exists() and (tmp_path / "parent").read_text().endswith("\n")


def test_deadline_kills_the_whole_process_group(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent()
    apply_job(gctl, "slow", _group_script(tmp_path), activeDeadlineSeconds=2)
    wait_for(lambda: _started(tmp_path), "the job to start its child")
    failed = wait_for(phase_is(gctl, "slow", "Failed"), "the deadline to fail the job")
    assert failed["status"]["reason"] == "DeadlineExceeded"
    assert not any(alive(pid) for pid in _pids(tmp_path))


def test_delete_stops_the_whole_process_group(cluster: Cluster, gctl: Gctl, tmp_path: Path) -> None:
    cluster.controller()
    cluster.agent()
    apply_job(gctl, "doomed", _group_script(tmp_path))
    wait_for(lambda: _started(tmp_path), "the job to start its child")
    pids = _pids(tmp_path)
    assert all(alive(pid) for pid in pids)
    assert gctl.ok("delete", "job", "doomed") == 'job.gctl "doomed" deleted\n'
    assert gctl("get", "job", "doomed").code == 1
    assert not any(alive(pid) for pid in pids)
    assert gctl.ok("get", "bindings") == ""


def test_agent_killed_mid_job_learns_the_real_exit_code(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    # The agent must come back before the node is lost (else the attempt is Lost and the Job
    # runs again, as it should): on a loaded machine its restart alone took seconds.
    cluster.controller(node_timeout=30)
    cluster.agent()
    go, ended = tmp_path / "go", tmp_path / "ended"
    apply_job(
        gctl,
        "survivor",
        f"while ! test -e {go}; do sleep 0.05; done; date +%s.%N > {ended}; exit 5",
    )
    wait_for(phase_is(gctl, "survivor", "Running"), "survivor to run")
    cluster.kill("n1")  # SIGKILL: no cleanup at all
    go.touch()  # the job ends while no agent is watching
    wait_for(ended.exists, "the job to end")
    time.sleep(1)
    restarted = time.time()
    cluster.agent()
    failed = wait_for(phase_is(gctl, "survivor", "Failed"), "the restarted agent to report")
    assert failed["status"]["exitCode"] == 5
    assert failed["status"]["attempts"] == 1
    # The attempt finished when the job ended, not when the restarted agent noticed.
    attempt = json.loads(gctl.ok("get", "binding", "survivor-1", "-o", "json"))["status"]
    finished = datetime.fromisoformat(attempt["finishTime"]).timestamp()
    assert float(ended.read_text()) <= finished < restarted - 0.5


def test_a_lost_attempt_keeps_the_exit_code_its_agent_learns_on_return(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    """The node stays silent past its timeout: the attempt is Lost and the Job requeued. The
    job ends meanwhile under its supervisor; the agent, back, tells how: the Binding stays
    Lost with the real exit code and end time, the Job gets an Event, and the Job goes on as
    requeued (its second attempt runs, and decides its phase). Its agent has no fence (0):
    with one, the attempt is lost only once the fence has stopped the job."""
    cluster.controller(node_timeout=2)
    cluster.agent("n1", gpus=1, fence=0)
    go, ended = tmp_path / "go", tmp_path / "ended"
    apply_job(
        gctl,
        "orphan",
        f"if [ $GCTL_ATTEMPT = 2 ]; then exit 0; fi; "
        f"while ! test -e {go}; do sleep 0.05; done; date +%s.%N > {ended}; exit 7",
    )
    wait_for(phase_is(gctl, "orphan", "Running"), "orphan to run")
    cluster.kill("n1")  # SIGKILL: the job goes on under its supervisor
    requeued = wait_for(phase_is(gctl, "orphan", "Pending"), "the attempt to be lost")
    assert (requeued["status"]["reason"], requeued["status"]["attempts"]) == ("AttemptLost", 1)
    go.touch()  # the job ends while its node is lost
    wait_for(ended.exists, "the job to end")
    time.sleep(1)
    restarted = time.time()
    cluster.agent("n1", gpus=1)

    def told() -> dict[str, Any] | None:
        found = json.loads(gctl.ok("get", "binding", "orphan-1", "-o", "json"))["status"]
        return found if found.get("exitCode") is not None else None

    lost = wait_for(told, "the returning agent to tell how the lost attempt ended")
    assert (lost["phase"], lost["reason"], lost["exitCode"]) == ("Lost", "NodeLost", 7)
    finished = datetime.fromisoformat(lost["finishTime"])
    assert float(ended.read_text()) - 1 < finished.timestamp() < restarted - 0.5
    done = wait_for(phase_is(gctl, "orphan", "Succeeded"), "the second attempt to succeed")
    assert (done["status"]["attempts"], done["status"]["exitCode"]) == (2, 0)
    said = (
        f"attempt 1 on n1, lost while the node was silent, exited with code 7 at "
        f"{finished:%Y-%m-%dT%H:%M:%SZ}"
    )
    described = " ".join(gctl.ok("describe", "job", "orphan").split())
    assert re.search(rf"Normal LostAttemptEnded \S+ agent/n1 {re.escape(said)}", described), (
        described
    )
    events = json.loads(gctl.ok("get", "events", "-o", "json"))["items"]
    assert [e["spec"]["message"] for e in events if e["spec"]["reason"] == "LostAttemptEnded"] == [
        said
    ]


def test_a_silent_nodes_job_runs_elsewhere_only_once_its_fence_has_stopped_it(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    """QA: the controller retried a silent node's attempt at its --node-timeout, while the
    job, slow to end on SIGTERM, still ran within the --grace-period its fence gives it: the
    Job ran on two nodes at once. It now waits for the fence, the grace period and one
    heartbeat (the lease's renewal) that the agent recorded on its Node."""
    cluster.controller(node_timeout=2)
    for name in ("n1", "n2"):
        cluster.agent(name, gpus=1, fence=2, grace=3, heartbeat=1)
    pid, both = tmp_path / "pid", tmp_path / "both"
    apply_job(
        gctl,
        "stubborn",
        f"if [ $GCTL_ATTEMPT = 2 ]; then kill -0 $(cat {pid}) && touch {both}; exit 0; fi; "
        f"trap '' TERM; echo $$ > {pid}; while :; do sleep 0.1; done",
    )
    wait_for(pid.exists, "the job to run")
    first = json.loads(gctl.ok("get", "binding", "stubborn-1", "-o", "json"))
    cluster.kill(first["spec"]["node"])  # SIGKILL: its fence stops the job, in 2 + 3 s
    done = wait_for(phase_is(gctl, "stubborn", "Succeeded"), "the retry to succeed", timeout=60)
    assert done["status"]["attempts"] == 2
    assert not both.exists(), "the retry started while the first attempt's job still ran"
    assert not alive(int(pid.read_text()))


def test_controller_killed_while_scheduling_runs_each_job_once(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    ledger = tmp_path / "runs.txt"
    documents = [
        {
            "apiVersion": "gctl/v1",
            "kind": "Job",
            "metadata": {"name": f"once-{i:02d}"},
            "spec": {
                "command": f"echo $GCTL_JOB_NAME >> {ledger}; sleep 0.1",
                "resources": {"gpus": 0.5},
            },
        }
        for i in range(24)
    ]
    gctl.ok("apply", "-f", "-", stdin=json.dumps({"kind": "List", "items": documents}))
    cluster.agent(gpus=2)
    for pause in (0.3, 0.2, 0.4, 0.25):
        cluster.controller()
        time.sleep(pause)
        cluster.kill("controller")
    cluster.controller()

    def all_succeeded() -> bool:
        listed = json.loads(gctl.ok("get", "jobs", "-o", "json"))["items"]
        return all(item["status"].get("phase") == "Succeeded" for item in listed)

    wait_for(all_succeeded, "every job to succeed", timeout=60)
    runs = ledger.read_text().split()
    assert sorted(runs) == sorted(d["metadata"]["name"] for d in documents)


def test_two_agents_share_the_work(cluster: Cluster, gctl: Gctl, tmp_path: Path) -> None:
    cluster.controller()
    cluster.agent("n1", gpus=1)
    cluster.agent("n2", gpus=1)
    wait_for(lambda: _ready_nodes(gctl) == {"n1", "n2"}, "both nodes Ready")
    # Each job runs until both have started, so however slow the machine, the second one
    # can only start on the other node's GPU.
    both = f"[ $(ls {tmp_path} | grep -c started-) -ge 2 ]"
    command = f"touch {tmp_path}/started-$GCTL_NODE; until {both}; do sleep 0.05; done"
    for i in range(2):
        apply_job(gctl, f"share-{i}", command)
    for i in range(2):
        wait_for(phase_is(gctl, f"share-{i}", "Succeeded"), f"share-{i} to succeed")
    assert {p.name for p in tmp_path.glob("started-*")} == {"started-n1", "started-n2"}


def test_silent_node_has_its_jobs_retried_on_another(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller(node_timeout=3)
    cluster.agent("n1", gpus=1, fence=2)
    wait_for(lambda: "n1" in gctl.ok("get", "nodes"), "n1 to register")
    # On n1 it would run for 5 minutes: only fencing can end it in time.
    command = f"echo $GCTL_NODE >> {tmp_path}/nodes; test $GCTL_NODE = n2 || sleep 300"
    apply_job(gctl, "moved", command, placement={"gpus": [0]})
    wait_for(phase_is(gctl, "moved", "Running"), "moved to run on n1")
    running = json.loads(gctl.ok("get", "binding", "moved-1", "-o", "json"))["status"]
    first, fenced_log = running["pid"], Path(running["logPath"])
    cluster.kill("n1")  # n1 stops heartbeating; its supervisor fences the job after 2 s
    wait_for(lambda: not alive(first), "the silent node's job to be fenced", timeout=15)
    assert "the node agent has been silent" in fenced_log.read_text()
    cluster.agent("n2", gpus=1)
    done = wait_for(phase_is(gctl, "moved", "Succeeded"), "moved to finish on n2", timeout=40)
    assert done["status"]["node"] == "n2"
    assert done["status"]["attempts"] == 2
    assert "NotReady" in gctl.ok("get", "nodes") or "Unknown" in gctl.ok("get", "nodes")
    assert (tmp_path / "nodes").read_text().split() == ["n1", "n2"]
    # n1 comes back, finds its attempt declared lost and stops what still runs of it.
    cluster.agent("n1", gpus=1)
    wait_for(lambda: "Ready" in gctl.ok("get", "node", "n1"), "n1 to be Ready again")


@pytest.mark.parametrize("suspend_first", [True])
def test_suspend_stops_and_requeues(
    cluster: Cluster, gctl: Gctl, tmp_path: Path, suspend_first: bool
) -> None:
    cluster.controller()
    cluster.agent()
    apply_job(gctl, "pausable", f"echo run >> {tmp_path}/runs; sleep 300")
    wait_for(phase_is(gctl, "pausable", "Running"), "pausable to run")
    apply_job(gctl, "pausable", f"echo run >> {tmp_path}/runs; sleep 300", suspend=suspend_first)
    paused = wait_for(phase_is(gctl, "pausable", "Pending"), "the suspended job to requeue")
    assert paused["status"]["failed"] == 0
    assert os.path.exists(tmp_path / "runs")
    assert paused["status"]["exitCode"] == 143  # the stopped attempt's (SIGTERM)
    apply_job(gctl, "pausable", f"echo run >> {tmp_path}/runs; sleep 300", suspend=False)
    resumed = wait_for(phase_is(gctl, "pausable", "Running"), "the resumed job to run again")
    assert (tmp_path / "runs").read_text().split() == ["run", "run"]
    # The running attempt has no exit code yet: the stopped one's is not shown as its own.
    assert "exitCode" not in resumed["status"]
    header, row = gctl.ok("get", "job", "pausable", "-o", "wide").splitlines()
    assert row.split()[header.split().index("EXIT")] == "<none>"
