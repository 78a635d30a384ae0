"""Virtual nodes (`gctl agent run --simulate`) under the real controller, on both databases,
and `python -m bench replay` end to end.

Real processes: `gctl controller run` and the virtual agent as subprocesses against a real
SQLite file or PostgreSQL database. Waits poll the store every 50 ms up to a generous timeout;
nothing asserts on speed, only on order (a job is seen done no earlier than its simulated end).
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gctl.api import binding, job, meta, node
from gctl.store import db, store
from tests.conftest import GCTL_BIN

NODES, GPUS, SCALE = 3, 2, 10.0
DURATION = 3.0  # simulated seconds: 0.3 s at the time scale
TIMEOUT = 30.0


def wait_for(what: str, check: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def cluster(database: db.Database, tmp_path: Path) -> Iterator[db.Database]:
    """The controller and a virtual agent with 3 nodes x 2 GPUs, every node Ready."""
    env = {"GCTL_DB": database.url}
    procs = []
    for name, args in (
        ("controller", ["controller", "run", "--backoff", "0.2"]),
        (
            "agent",
            [
                *("agent", "run", "--simulate", "--virtual-nodes", str(NODES)),
                *("--gpus-per-node", str(GPUS), "--time-scale", str(SCALE), "--heartbeat", "0.5"),
                *("--state-dir", str(tmp_path / "virtual")),
            ],
        ),
    ):
        with (tmp_path / f"{name}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [GCTL_BIN, *args], stdout=log, stderr=log, env={**os.environ, **env}
                )
            )
    try:
        wait_for("3 Ready virtual nodes", lambda: len(ready_nodes(database)) == NODES)
        yield database
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def ready_nodes(database: db.Database) -> dict[str, datetime]:
    """Ready nodes and their heartbeat times."""
    with database.read() as session:
        found = store.Store(session).list_objects(node.Node)
    return {
        n.name: n.status.heartbeat_time
        for n in found
        if n.status.heartbeat_time is not None
        and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    }


def simulated(name: str, seconds: float) -> job.Job:
    return job.Job(
        metadata=meta.ObjectMeta(
            name=name, annotations={"gctl/simulated-duration": f"{seconds:g}"}
        ),
        spec=job.JobSpec(command="exit 1"),  # never runs: a simulated job has no process
    )


def phases(database: db.Database) -> dict[str, str]:
    with database.read() as session:
        return {j.name: j.status.phase for j in store.Store(session).list_objects(job.Job)}


def test_simulated_jobs_run_for_their_scaled_duration_and_stop_when_deleted(
    cluster: db.Database, tmp_path: Path
) -> None:
    database = cluster
    beats = ready_nodes(database)
    assert sorted(beats) == ["vnode-0001", "vnode-0002", "vnode-0003"]
    names = [f"sim-{i}" for i in range(10)]
    with database.write() as session:
        store.Store(session).create_many([simulated(n, DURATION) for n in names])
    seen_done: dict[str, datetime] = {}

    def all_succeeded() -> bool:
        now = meta.utcnow()
        for name, phase in phases(database).items():
            assert phase != "Failed", name
            if phase == "Succeeded":
                seen_done.setdefault(name, now)
        return len(seen_done) == len(names)

    wait_for("10 simulated jobs to succeed", all_succeeded)
    with database.read() as session:
        attempts = store.Store(session).list_objects(binding.Binding)
    assert {b.spec.job_name for b in attempts} == set(names)
    for b in attempts:
        assert b.spec.node in beats
        assert (b.status.phase, b.status.exit_code, b.status.reason) == ("Exited", 0, "Completed")
        assert b.status.start_time is not None
        assert b.status.finish_time is not None
        ran = (b.status.finish_time - b.status.start_time).total_seconds()
        assert ran == pytest.approx(DURATION / SCALE, abs=0.002)
        # Reported done no earlier than the simulated end (clock resolution aside).
        assert seen_done[b.spec.job_name] >= b.status.finish_time - timedelta(milliseconds=5)
    # The nodes kept heartbeating meanwhile (every 0.5 s).
    wait_for(
        "a later heartbeat", lambda: all(ready_nodes(database)[n] > t for n, t in beats.items())
    )
    deleting_a_running_job_stops_it(database)
    a_second_agent_for_the_nodes_refuses(database, tmp_path)


def a_second_agent_for_the_nodes_refuses(database: db.Database, tmp_path: Path) -> None:
    """(Part of the test above.) Another `gctl agent run --simulate` for these Nodes, from
    another state directory (on another host, say), and a real agent named as one of them:
    each refuses in one line, and the Nodes stay the running agent's."""
    held = {n.name: n.status.agent_instance for n in _nodes(database)}
    assert len({h.id for h in held.values() if h is not None}) == 1
    for args in (
        ["--simulate", "--virtual-nodes", "2", "--state-dir", str(tmp_path / "second")],
        ["--fake-gpus", "1", "--node-name", "vnode-0002", "--state-dir", str(tmp_path / "real")],
    ):
        done = subprocess.run(
            [GCTL_BIN, "agent", "run", *args, "--db", database.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert lines[-1].startswith("error: node vnode-000"), lines
        assert "another agent is running for it" in lines[-1]
        assert "Traceback" not in done.stderr
    assert {n.name: n.status.agent_instance for n in _nodes(database)} == held


def _nodes(database: db.Database) -> list[node.Node]:
    with database.read() as session:
        return store.Store(session).list_objects(node.Node)


def deleting_a_running_job_stops_it(database: db.Database) -> None:
    """(Part of the test above: one cluster per database keeps the tests quick.)"""
    with database.read() as session:
        since = store.Store(session).current_revision()
    with database.write() as session:
        store.Store(session).create(simulated("long", 1e6))
    wait_for("the long job to run", lambda: phases(database).get("long") == "Running")
    with database.write() as session:
        store.Store(session).delete(job.Job, "long", "default")
    wait_for("the job to be gone", lambda: "long" not in phases(database))
    with database.read() as session:
        changes = store.Store(session).changes_since(since, kinds=[binding.Binding.KIND])
    statuses = [c.object["status"] for c in changes]
    assert [s.get("phase") for s in statuses if s.get("phase") == "Exited"]
    last = next(s for s in reversed(statuses) if s.get("phase") == "Exited")
    # What a real agent reports for a process stopped by SIGTERM because its Job was deleted.
    assert (last["exitCode"], last["signal"], last["reason"]) == (143, "SIGTERM", "Deleted")


def test_virtual_nodes_need_simulate(tmp_path: Path) -> None:
    done = subprocess.run(
        [GCTL_BIN, "agent", "run", "--virtual-nodes", "2", "--db", str(tmp_path / "x.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "--simulate" in done.stderr
    assert "Traceback" not in done.stderr


TINY_TRACE = """\
job_id,submit_s,duration_s,gpus,vc
1,0,200,1,a
2,0,300,2,a
3,100,100,1,b
4,150,400,4,b
5,300,100,8,c
"""


def run_replay(tmp_path: Path, text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "tiny.csv"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "bench", "replay", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parents[2],
    )


def test_bench_replay_prints_the_metrics_as_json(tmp_path: Path) -> None:
    flags = ["--nodes", "2", "--gpus-per-node", "4", "--time-scale", "1000", "--json"]
    done = run_replay(tmp_path, TINY_TRACE, *flags)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["jobs"] == 5
    assert figures["lower_bound_s"] == 550  # job 4: submitted at 150, runs 400 s
    assert figures["makespan_s"] >= figures["lower_bound_s"]
    for reference in (
        "fifo_reference_makespan_s",
        "easy_reference_makespan_s",
        "longest_first_reference_makespan_s",
    ):
        assert figures[reference] >= figures["lower_bound_s"]
    assert (figures["queue_order"], figures["bind_ahead"]) == ("LongestFirst", False)
    for key in ("jct_mean_s", "jct_p95_s", "queueing_delay_mean_s", "queueing_delay_p95_s"):
        assert figures[key] >= 0
    assert 0 < figures["gpu_utilization"] <= 1
    assert "1 job(s) asked for more than 4 GPUs" in done.stderr


def test_bench_replay_runs_a_job_larger_than_a_node_on_several_nodes(tmp_path: Path) -> None:
    """--oversize span: job 5 (8 GPUs) is a Job on 2 nodes x 4 GPUs; it runs to the end and
    its record holds all 8 GPUs for its 100 s."""
    flags = ["--nodes", "2", "--gpus-per-node", "4", "--time-scale", "1000", "--json"]
    done = run_replay(tmp_path, TINY_TRACE, *flags, "--oversize", "span")
    assert done.returncode == 0, done.stderr
    assert "1 job(s) asked for more than 4 GPUs: 1 run on several nodes at once" in done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["jobs"] == 5
    # GPU-seconds: 200 + 600 + 100 + 1,600 + 8 x 100 = 3,300 (job 5 on one node's GPUs: 2,900).
    used = figures["gpu_utilization"] * 8 * figures["makespan_s"]
    assert used == pytest.approx(3300, abs=10)
    assert figures["makespan_s"] >= figures["lower_bound_s"] == 550


def test_bench_replay_names_a_missing_column(tmp_path: Path) -> None:
    done = run_replay(tmp_path, "job_id,submit_s,gpus\n1,0,1\n")
    assert done.returncode == 2
    assert "missing column 'duration_s'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_bench_replay_help_is_the_replays(flag: str) -> None:
    """`python -m bench replay --help` shows the replay's flags, not the suite's usage."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "replay", flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m bench replay")
    for option in ("--nodes", "--gpus-per-node", "--time-scale", "--queue-order", "--bind-ahead"):
        assert option in done.stdout
