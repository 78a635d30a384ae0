"""The real controller against virtual nodes, as two `gctl` subprocesses, for the benchmarks.

`cluster(url, root, nodes, gpus_per_node, time_scale)` starts `gctl controller run` and
`gctl agent run --simulate --virtual-nodes N` against a database, waits until every virtual
Node is Ready, and yields a `Cluster` with a change-feed `JobWatcher` on the Jobs; both daemons
get SIGTERM at the end. Jobs made with `simulated_job` "run" for their annotation's seconds
divided by the time scale (nodeagent.virtual). GCTL_BENCH_PROFILE=DIR profiles both daemons as
bench.jobs does `gctl up`.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench import jobs as job_benchmarks
from bench.store import BenchError, gctl_command, progress
from gctl.api import job, meta, node
from gctl.store import db, store
from nodeagent.virtual import DURATION_ANNOTATION

READY_TIMEOUT_S = 120.0
HEARTBEAT_S = 10.0


@dataclass
class Cluster:
    """A database with a controller and a virtual agent running against it."""

    url: str
    database: db.Database
    watcher: job_benchmarks.JobWatcher
    controller: subprocess.Popen[bytes]
    agent: subprocess.Popen[bytes]
    logs: Path

    def fail(self, what: str) -> BenchError:
        states = []
        for name, proc in (("controller", self.controller), ("agent", self.agent)):
            code = proc.poll()
            states.append(f"{name} {'running' if code is None else f'exited {code}'}")
        return BenchError(f"{what} ({', '.join(states)}; logs in {self.logs})")


def simulated_job(
    name: str, seconds: float, gpus: float = 1, time_limit: int | None = None, nodes: int = 1
) -> job.Job:
    """A Job whose virtual attempt lasts `seconds` of simulated time; its command never runs.
    `time_limit`: its activeDeadlineSeconds, in real seconds; `nodes` above 1: a multi-node Job
    of `gpus` GPUs on each, whose every member lasts `seconds`."""
    return job.Job(
        metadata=meta.ObjectMeta(
            name=name, annotations={DURATION_ANNOTATION: repr(float(seconds))}
        ),
        spec=job.JobSpec(
            command="true",
            resources=job.Resources(gpus=gpus, nodes=nodes if nodes > 1 else None),
            active_deadline_seconds=time_limit,
        ),
    )


def _start(args: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    """`gctl ARGS --db URL`; with $GCTL_BENCH_PROFILE set, each thread under cProfile."""
    command = [*gctl_command(), *args, "--db", url]
    profile_dir = os.environ.get(job_benchmarks.PROFILE_ENV)
    if profile_dir:
        out_dir = Path(profile_dir) / log.parent.parent.name / log.stem
        command = [sys.executable, "-m", "bench.jobs", str(out_dir), *args, "--db", url]
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def ready_nodes(database: db.Database) -> int:
    with database.read() as session:
        wires = store.Store(session).list_wire(node.Node)
    return sum(
        1
        for w in wires
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in w.get("status", {}).get("conditions", [])
        )
    )


@contextmanager
def cluster(
    url: str, root: Path, nodes: int, gpus_per_node: int, time_scale: float = 1.0
) -> Iterator[Cluster]:
    root.mkdir(parents=True, exist_ok=True)
    database = db.Database.open(url)  # migrated before the daemons start
    watcher = job_benchmarks.JobWatcher(database)
    controller = _start(["controller", "run", "--backoff", "1"], url, root / "controller.log")
    agent_args = ["agent", "run", "--simulate", "--virtual-nodes", str(nodes)]
    agent_args += ["--gpus-per-node", str(gpus_per_node), "--time-scale", repr(time_scale)]
    agent_args += ["--heartbeat", f"{HEARTBEAT_S:g}", "--state-dir", str(root / "virtual")]
    agent = _start(agent_args, url, root / "agent.log")
    rig = Cluster(url, database, watcher, controller, agent, root)
    try:
        progress(f"{nodes} virtual nodes x {gpus_per_node} GPUs starting (logs in {root})")
        deadline = time.perf_counter() + READY_TIMEOUT_S
        while ready_nodes(database) < nodes:
            if controller.poll() is not None or agent.poll() is not None:
                raise rig.fail("a daemon exited before the nodes were Ready")
            if time.perf_counter() > deadline:
                raise rig.fail(f"{nodes} nodes not Ready within {READY_TIMEOUT_S:g} s")
            time.sleep(0.2)
        yield rig
    finally:
        for proc in (agent, controller):  # both at once: each takes a second or two to stop
            if proc.poll() is None:
                proc.terminate()
        for proc in (agent, controller):
            job_benchmarks.stop_daemons(proc)
        watcher.close()
        database.close()
