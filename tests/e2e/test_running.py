"""End-to-end tests of the commands that follow Jobs as they run: logs, run, wait, get gpus,
and apply --force, which waits for a running Job to be gone before it creates it anew.

Each test that runs jobs starts the real daemons (`gctl up` with fake GPUs) and drives the real
console script; the job processes are real. Waits use `gctl wait` itself, or read the store at
most every 0.1 s up to a generous deadline: nothing asserts on speed. Setup and checks that are
not under test read and write the store in-process, as test_cli.py does.
"""

import itertools
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gctl.api import binding, job, meta, node
from gctl.store import db, store
from tests.builders import make_binding
from tests.conftest import ON_BOTH, Gctl, Result, sqlite_unless_asked
from tests.e2e.test_cli import Lines, watching


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only: these commands read and follow the store as every command does, tested on
    both (test_cli.py, tests/integration); those that wait on the change feed, which is
    PostgreSQL's NOTIFY there, run on both (`ON_BOTH`)."""
    return sqlite_unless_asked(request, tmp_path)


DEADLINE = 20.0  # seconds any one thing may take before a test gives up on it


# -- the daemons and helpers -----------------------------------------------------------------


@pytest.fixture
def cluster(gctl: Gctl, tmp_path: Path) -> Iterator[list[str]]:
    """`gctl up` with two fake GPUs; yields the lines it logged so far (for failure messages)."""
    process = gctl.popen(
        "up",
        "--fake-gpus",
        "2",
        "--state-dir",
        str(tmp_path / "state"),
        "--heartbeat",
        "1",
        "--grace-period",
        "2",
        "--backoff",
        "0.5",
    )
    logged: list[str] = []
    # Drain its output, so that a full pipe never blocks it.
    drains = [
        threading.Thread(target=logged.extend, args=(stream,), daemon=True)
        for stream in (process.stdout, process.stderr)
    ]
    for drain in drains:
        drain.start()
    yield logged
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for drain in drains:
        drain.join(timeout=5)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def poll(check: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """Call `check` every 0.1 s until it returns something true; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def find_job(database: db.Database, name: str) -> job.Job | None:
    with database.read() as session:
        return store.Store(session).find(job.Job, name)


def attempts(database: db.Database, name: str) -> list[binding.Binding]:
    with database.read() as session:
        reader = store.Store(session)
        found = reader.find(job.Job, name)
        return reader.bindings_of(found.metadata.uid or "") if found else []


def running_attempt(database: db.Database, name: str) -> binding.Binding | None:
    return next((a for a in attempts(database, name) if a.status.phase == "Running"), None)


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def apply_job(gctl: Gctl, name: str, **spec: Any) -> None:
    document = {
        "apiVersion": "gctl/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": spec,
    }
    gctl.ok("apply", "-f", "-", stdin=yaml.safe_dump(document))


def error_line(result: Result) -> str:
    """The one `error: ...` line of a failed command; never a traceback."""
    assert result.code != 0, result.out
    assert "Traceback" not in result.err, result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def lines_every(seconds: float, count: int) -> list[str]:
    """A command that prints `line 1` .. `line N`, one each `seconds`."""
    return ["sh", "-c", f"for i in $(seq {count}); do echo line $i; sleep {seconds}; done"]


def finish(process: "subprocess.Popen[str]") -> Result:
    out, err = process.communicate(timeout=DEADLINE)
    return Result(process.returncode, out, err)


# -- logs ------------------------------------------------------------------------------------


def test_run_then_logs_of_the_finished_job(
    gctl: Gctl, cluster: list[str], database: db.Database
) -> None:
    """`run` creates the Job from the command line, in this directory; once it has succeeded,
    `logs` prints what it wrote to stdout and stderr."""
    command = ["sh", "-c", "echo $GREETING from $(pwd); echo to stderr >&2"]
    out = gctl.ok(
        "run", "--name", "done", "--env", "GREETING=hello", "-l", "team=nlp", "--", *command
    )

    assert out == "job.gctl/done created\n"
    gctl.ok("wait", "job/done", "--for=condition=Complete", "--timeout=20s")
    created = find_job(database, "done")
    assert created is not None
    assert (created.spec.command, created.spec.working_dir) == (command, str(gctl.cwd))
    assert (created.metadata.labels, created.status.phase) == ({"team": "nlp"}, "Succeeded")
    printed = f"hello from {gctl.cwd}\nto stderr\n"
    assert gctl.ok("logs", "done") == printed
    assert gctl.ok("logs", "job/done", "--attempt", "1") == printed
    assert error_line(gctl("logs", "missing")) == (
        'error: job "missing" not found in namespace "default"'
    )
    assert error_line(gctl("logs", "done", "-p")) == (
        "error: job done has no previous attempt (attempts: 1)"
    )


@ON_BOTH
def test_logs_follow_prints_every_line_then_exits(
    gctl: Gctl, cluster: list[str], database: db.Database
) -> None:
    """-f on a running job: what it wrote so far, then each line as written, until it ends."""
    gctl.ok("run", "--name", "ticker", "--", *lines_every(0.2, 5))
    poll(lambda: running_attempt(database, "ticker"), "ticker to run")

    result = finish(gctl.popen("logs", "ticker", "-f"))

    assert result.code == 0, result.err
    assert result.out == "".join(f"line {i}\n" for i in range(1, 6))


def test_logs_follow_waits_for_the_first_attempt(gctl: Gctl, cluster: list[str]) -> None:
    """Without -f a Job that has not started is an error; with -f, logs waits for it."""
    apply_job(gctl, "later", command=lines_every(0.2, 3), suspend=True)
    assert error_line(gctl("logs", "later")) == "error: job later has not started yet"
    follower = gctl.popen("logs", "later", "-f")
    time.sleep(0.5)  # give it time to go wrong: nothing has started, it must keep waiting
    assert follower.poll() is None

    apply_job(gctl, "later", command=lines_every(0.2, 3), suspend=False)
    result = finish(follower)

    assert result.code == 0, result.err
    assert result.out == "line 1\nline 2\nline 3\n"
    assert result.err == ""


@pytest.mark.timeout(90)
def test_logs_of_each_attempt(gctl: Gctl, cluster: list[str], tmp_path: Path) -> None:
    """The first attempt fails (exit 3); after the controller's back-off (0.5 s here) the
    second succeeds. The latest attempt is the default; --attempt and --previous reach the
    first."""
    marker = tmp_path / "failed-once"
    script = (
        "echo attempt $GCTL_ATTEMPT; "
        f"if [ -e {marker} ]; then echo ok; else touch {marker}; exit 3; fi"
    )
    apply_job(gctl, "flaky", command=["sh", "-c", script], backoffLimit=1)

    gctl.ok("wait", "job/flaky", "--for=condition=Complete", "--timeout=40s")

    assert gctl.ok("logs", "flaky") == "attempt 2\nok\n"
    assert gctl.ok("logs", "flaky", "--attempt", "1") == "attempt 1\n"
    assert gctl.ok("logs", "flaky", "--previous") == "attempt 1\n"
    assert gctl.ok("logs", "flaky", "--attempt", "2", "-f") == "attempt 2\nok\n"
    assert error_line(gctl("logs", "flaky", "--attempt", "3")) == (
        "error: job flaky has no attempt 3 (attempts: 1, 2)"
    )


def test_a_job_created_again_under_its_name_starts_with_empty_logs(
    gctl: Gctl, cluster: list[str]
) -> None:
    """Deleted and created again, a Job is a new one (a new uid), as a Pod is: its logs, read
    or followed from before it starts, hold none of the old Job's output."""
    gctl.ok("run", "--name", "same", "--", "echo", "first-run")
    gctl.ok("wait", "job/same", "--for=condition=Complete", "--timeout=20s")
    assert gctl.ok("logs", "same") == "first-run\n"
    gctl.ok("delete", "job", "same")
    apply_job(gctl, "same", command=["echo", "second-run"], suspend=True)
    follower = gctl.popen("logs", "same", "-f")

    apply_job(gctl, "same", command=["echo", "second-run"], suspend=False)
    followed = finish(follower)
    gctl.ok("wait", "job/same", "--for=condition=Complete", "--timeout=20s")

    assert (followed.code, followed.out) == (0, "second-run\n"), followed.err
    assert gctl.ok("logs", "same") == "second-run\n"
    assert gctl.ok("logs", "same", "--attempt", "1") == "second-run\n"
    assert gctl.ok("logs", "same", "-f") == "second-run\n"


def test_a_job_replaced_by_apply_force_shows_only_its_own_logs(
    gctl: Gctl, cluster: list[str]
) -> None:
    """Each `apply --force` of a changed spec makes a new Job: `logs` shows its run alone, not
    the runs of the Jobs it replaced."""
    for run in (1, 2, 3):
        document = {
            "apiVersion": "gctl/v1",
            "kind": "Job",
            "metadata": {"name": "frc"},
            "spec": {"command": ["echo", f"spec {run}"]},
        }
        out = gctl.ok("apply", "--force", "-f", "-", stdin=yaml.safe_dump(document))
        assert out == ("job.gctl/frc created\n" if run == 1 else "job.gctl/frc replaced\n")
        gctl.ok("wait", "job/frc", "--for=condition=Complete", "--timeout=20s")

        assert gctl.ok("logs", "frc") == f"spec {run}\n"


# -- run -------------------------------------------------------------------------------------


def test_run_attach_prints_the_output_and_exits_with_its_code(
    gctl: Gctl, cluster: list[str]
) -> None:
    result = gctl("run", "--attach", "--", "sh", "-c", "echo hi; exit 7", timeout=DEADLINE)

    assert result.code == 7, result.err
    assert result.out == "hi\n"
    assert "created" in result.err  # messages go to stderr; stdout is the job's own


def test_run_pins_to_the_gpu_ids_and_node_given(gctl: Gctl, cluster: list[str]) -> None:
    """As srun -w and the GPU lists of the schedulers gctl replaces: --gpu-ids alone asks for
    as many GPUs; the job sees exactly those."""
    names = poll(lambda: gctl.ok("get", "nodes", "-o", "name").split(), "the node to register")
    node = names[0].removeprefix("node.gctl/")
    argv = ["run", "--attach", "--node", node, "--gpu-ids", "1", "--", "sh", "-c"]
    result = gctl(*argv, "echo $CUDA_VISIBLE_DEVICES", timeout=DEADLINE)
    assert (result.code, result.out) == (0, "1\n"), result.err
    line = error_line(gctl("run", "--gpu-ids", "0,x", "--", "true"))
    assert "--gpu-ids '0,x': 'x' is not a GPU index" in line


def test_run_on_one_of_the_gpus_it_may_use(gctl: Gctl, cluster: list[str]) -> None:
    """An allowed-GPU list, as `0-3` in a line of the old jobs.txt: more GPU ids than --gpus
    asks for are the ones it may use; GPU 0 is busy, so it runs on GPU 1."""
    gctl.ok("run", "--name", "hold", "--gpu-ids", "0", "--", "sleep", "60")
    poll(lambda: "Running" in gctl.ok("get", "jobs", "hold"), "hold to run")
    argv = ["run", "--attach", "--gpus", "1", "--gpu-ids", "0-1", "--", "sh", "-c"]
    result = gctl(*argv, "echo $CUDA_VISIBLE_DEVICES", timeout=DEADLINE)
    assert (result.code, result.out) == (0, "1\n"), result.err
    gctl.ok("delete", "job", "hold")


@pytest.mark.parametrize(
    ("gpus", "complaint"),
    [
        ("1.5", "1.5 is neither a fraction in (0,1] nor a whole number"),
        ("nan", "must be a finite number"),
        ("inf", "must be a finite number"),
        ("-inf", "must be a finite number"),
    ],
)
def test_run_refuses_bad_gpus_and_creates_nothing(gctl: Gctl, gpus: str, complaint: str) -> None:
    line = error_line(gctl("run", "--gpus", gpus, "--", "true"))

    assert f"spec.resources.gpus: {complaint}" in line
    result = gctl("get", "jobs")
    assert (result.out, result.err) == ("", "No resources found in default namespace.\n")
    assert re.fullmatch(r"job\.gctl/run-[a-z0-9]{5} created\n", gctl.ok("run", "--", "true"))


def test_run_attach_interrupted_deletes_the_job(
    gctl: Gctl, cluster: list[str], database: db.Database
) -> None:
    attached = gctl.popen(
        "run", "--attach", "--name", "sleepy", "--", "sh", "-c", "echo started; exec sleep 60"
    )
    assert attached.stdout is not None
    first: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: first.put(attached.stdout.readline()), daemon=True).start()
    assert first.get(timeout=DEADLINE) == "started\n"
    pid = poll(lambda: (a := running_attempt(database, "sleepy")) and a.status.pid, "the pid")
    assert alive(pid)

    attached.send_signal(signal.SIGINT)
    result = finish(attached)

    assert result.code == 130, result.err
    assert "interrupted" in result.err
    poll(lambda: find_job(database, "sleepy") is None, "the job to be deleted")
    poll(lambda: not alive(pid), "its process to end")


# -- wait ------------------------------------------------------------------------------------


@ON_BOTH
def test_wait_for_conditions_and_deletion(gctl: Gctl, cluster: list[str]) -> None:
    gctl.ok("run", "--name", "quick", "--", "true")
    gctl.ok("run", "--name", "slow", "--", "sleep", "30")

    met = gctl("wait", "job/quick", "--for=condition=Complete", "--timeout=20s")
    timed_out = gctl("wait", "job/slow", "--for=condition=Complete", "--timeout=1s")

    assert (met.code, met.out) == (0, "job.gctl/quick condition met\n")
    assert (timed_out.code, timed_out.out) == (1, "")
    assert error_line(timed_out) == "error: timed out waiting for the condition on jobs/slow"
    gctl.ok("delete", "job", "slow", "--no-wait")
    assert gctl.ok("wait", "jobs", "slow", "--for=delete", "--timeout=20s") == (
        "job.gctl/slow condition met\n"
    )


def test_wait_refuses_what_it_cannot_wait_for(gctl: Gctl) -> None:
    apply_job(gctl, "idle", command=["true"], suspend=True)

    assert "--for 'done'" in error_line(gctl("wait", "job/idle", "--for=done"))
    assert "--timeout '5 min'" in error_line(
        gctl("wait", "job/idle", "--for=condition=Complete", "--timeout=5 min")
    )
    # past what a thread can wait for (about 292 years): refused, not a traceback
    assert "--timeout '1e10': must be at most a year (365d)" in error_line(
        gctl("wait", "job/idle", "--for=condition=Complete", "--timeout=1e10")
    )
    assert error_line(gctl("wait", "job/nope", "--for=condition=Complete")) == (
        'error: job "nope" not found in namespace "default"'
    )


# -- apply --force ---------------------------------------------------------------------------


def test_apply_force_replaces_a_running_job(
    gctl: Gctl, cluster: list[str], database: db.Database, tmp_path: Path
) -> None:
    """A changed command cannot go to a running Job: apply --force deletes it (its process
    stopped as `gctl delete` stops it), returns once it is gone, and creates it anew; the new
    spec runs."""
    marker = tmp_path / "new-spec-ran"
    apply_job(gctl, "chg", command=["sleep", "300"])
    old = poll(lambda: running_attempt(database, "chg"), "the old spec to run")
    first, pid = find_job(database, "chg"), old.status.pid
    assert first is not None
    assert pid is not None
    assert alive(pid)
    changed = {
        "apiVersion": "gctl/v1",
        "kind": "Job",
        "metadata": {"name": "chg"},
        "spec": {"command": ["sh", "-c", f"echo $GCTL_JOB_NAME > {marker}"]},
    }
    try:
        refused = gctl("apply", "-f", "-", stdin=yaml.safe_dump(changed))
        assert "apply with --force" in error_line(refused)

        result = gctl("apply", "--force", "-f", "-", stdin=yaml.safe_dump(changed))

        assert (result.code, result.out) == (0, "job.gctl/chg replaced\n"), result.err
        assert all(line.startswith("waiting for job.gctl/chg") for line in result.err.splitlines())
        assert not alive(pid)  # stopped before apply returned
        replaced = find_job(database, "chg")
        assert replaced is not None
        assert replaced.metadata.uid != first.metadata.uid
        gctl.ok("wait", "job/chg", "--for=condition=Complete", "--timeout=20s")
        assert marker.read_text() == "chg\n"
    finally:  # whatever went wrong, the old process does not outlive the test
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


# -- get gpus --------------------------------------------------------------------------------


def test_get_gpus_shows_the_jobs_on_each_gpu(
    gctl: Gctl, cluster: list[str], database: db.Database
) -> None:
    gctl.ok("run", "--name", "holder", "--", "sleep", "30")
    poll(lambda: running_attempt(database, "holder"), "holder to run")

    out = gctl.ok("get", "gpus")

    header, *rows = [line.split() for line in out.splitlines()]
    assert header == ["NODE", "GPU", "MODEL", "MEMORY", "UTIL", "JOBS", "OTHER", "STATUS"]
    assert len(rows) == 2
    assert [row[-1] for row in rows] == ["Ready", "Ready"]
    assert sum("holder" in row for row in rows) == 1
    listed = json.loads(gctl.ok("get", "gpus", "-o", "json"))
    assert [[j["name"] for j in row["jobs"]] for row in listed].count(["holder"]) == 1


def test_get_gpus_watch_prints_a_row_again_when_a_job_starts_on_it(
    gctl: Gctl, cluster: list[str]
) -> None:
    """`get gpus -w`: the table, then a GPU's row each time its jobs or state change; the
    node's heartbeats (every second here) print nothing; Ctrl-C ends it as it ends `get -w`."""
    poll(lambda: "Ready" in gctl.ok("get", "nodes"), "the node to be Ready")
    watcher = gctl.popen("get", "gpus", "-w")
    assert watcher.stdout is not None
    assert watcher.stderr is not None
    lines = Lines(watcher.stdout)
    try:
        header = lines.wait_for(lambda line: line.startswith("NODE"))
        assert header.split()[-3:] == ["JOBS", "OTHER", "STATUS"]
        listed = [lines.wait_for(lambda _line: True).split() for _gpu in range(2)]
        assert [row[1] for row in listed] == ["0", "1"]
        assert all(row[-3:] == ["<none>", "<none>", "Ready"] for row in listed)

        gctl.ok("run", "--name", "holder", "--", "sleep", "30")
        held = lines.wait_for(lambda line: "holder" in line.split(), timeout=DEADLINE).split()
        gctl.ok("cordon", f"gpu{1 - int(held[1])}")
        cordoned = lines.wait_for(lambda line: line.endswith("Cordoned")).split()
        time.sleep(2.5)  # two heartbeats, which print nothing
        gctl.ok("delete", "job", "holder")
        freed = lines.wait_for(lambda line: line.split()[1:2] == held[1:2], timeout=DEADLINE)

        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=DEADLINE) == 130
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        lines.rest()
        err = watcher.stderr.read()
        watcher.stdout.close()
        watcher.stderr.close()
    assert "Traceback" not in err, err
    assert cordoned[1] != held[1]
    assert freed.split()[-3:] == ["<none>", "<none>", "Ready"]
    assert len(lines.seen) == 6, lines.seen  # header, two GPUs, holder, cordoned, freed


def _node(name: str, gpus: list[node.GPUInfo], **spec: Any) -> node.Node:
    ready = meta.Condition(type="Ready", status="True", reason="AgentReady")
    return node.Node(
        metadata=meta.ObjectMeta(name=name),
        spec=node.NodeSpec.model_validate(spec),
        status=node.NodeStatus(conditions=[ready], gpus=gpus),
    )


def _gpu(index: int, used_gi: float, **fields: Any) -> node.GPUInfo:
    return node.GPUInfo(
        index=index,
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-dddddddddddd",
        model="NVIDIA A100-SXM4-80GB",
        memory_total=80 * 2**30,
        memory_used=int(used_gi * 2**30),
        utilization=97,
        **fields,
    )


def test_get_gpus_on_two_nodes_fits_100_columns(gctl: Gctl, database: db.Database) -> None:
    """Two nodes of two A100s each, as agents report them: shared, cordoned and drained GPUs,
    and a process gctl did not start."""
    notebook = node.GPUProcess(pid=4242, used_memory=3 * 2**30)
    ours = node.GPUProcess(pid=100, used_memory=20 * 2**30)
    nodes = [
        _node("gpu-node-01", [_gpu(0, 79.3, processes=[ours, notebook]), _gpu(1, 3.2)]),
        _node("gpu-node-02", [_gpu(0, 0), _gpu(1, 40)], cordonedGPUs=[0], drainingGPUs=[1]),
    ]
    bindings = [
        make_binding("train-small", "gpu-node-01", [0], share=1.0, pid=100),
        make_binding("eval-a", "gpu-node-01", [1], share=0.5, pid=101),
        make_binding("eval-b", "gpu-node-01", [1], share=0.5, pid=102),
    ]
    with database.write() as session:
        store.Store(session).create_many([*nodes, *bindings])

    out = gctl.ok("get", "gpus")
    wide = gctl.ok("get", "gpus", "-o", "wide")

    assert max(len(line) for line in out.splitlines()) <= 100, out
    rows = [line.split()[:2] + line.split()[3:] for line in out.splitlines()[1:]]
    assert rows == [
        ["gpu-node-01", "0", "79.3/80Gi", "97%", "train-small", "3Gi", "Ready"],
        ["gpu-node-01", "1", "3.2/80Gi", "97%", "eval-a(0.5),eval-b(0.5)", "<none>", "Ready"],
        ["gpu-node-02", "0", "0/80Gi", "97%", "<none>", "<none>", "Cordoned"],
        ["gpu-node-02", "1", "40/80Gi", "97%", "<none>", "<none>", "Drained"],
    ]
    assert all(line.split()[2] == "A100-SXM4-80GB" for line in out.splitlines()[1:])
    wide_rows = [line.split() for line in wide.splitlines()]
    assert wide_rows[0][-2:] == ["UUID", "OTHER-PIDS"]
    assert [row[-1] for row in wide_rows[1:]] == ["4242", "<none>", "<none>", "<none>"]
    listed = yaml.safe_load(gctl.ok("get", "gpus", "-o", "yaml"))
    assert listed[0]["foreignProcesses"] == [{"pid": 4242, "usedMemory": 3 * 2**30}]
    assert listed[1]["model"] == "NVIDIA A100-SXM4-80GB"


def test_get_gpus_watch_only_prints_only_the_rows_that_change(
    gctl: Gctl, database: db.Database
) -> None:
    with database.write() as session:
        store.Store(session).create(_node("gpu-node-01", [_gpu(0, 0), _gpu(1, 0)]))

    with watching(gctl, "get", "gpus", "--watch-only") as lines:
        # Nothing prints until a change, so there is no telling when the watcher has read its
        # starting point: bind a job after another to GPU 1 until one shows.
        deadline = time.monotonic() + DEADLINE
        for number in itertools.count():
            with database.write() as session:
                store.Store(session).create(make_binding(f"j{number}", "gpu-node-01", [1]))
            if lines.find(lambda line: line.startswith("gpu-node-01"), timeout=1.0):
                break
            assert time.monotonic() < deadline, f"nothing within {DEADLINE} s: {lines.seen}"

    assert lines.seen[0].split()[:2] == ["NODE", "GPU"]
    assert all(line.split()[1] == "1" for line in lines.seen[1:]), lines.seen


def test_wide_gpus_list_every_job_on_a_shared_gpu(gctl: Gctl, database: db.Database) -> None:
    """The plain table keeps JOBS narrow with `+N`; -o wide has the room to name them all."""
    bindings = [
        make_binding(name, "gpu-node-01", [0], share=0.25, pid=100 + i)
        for i, name in enumerate(["eval-a", "eval-b", "eval-c"])
    ]
    with database.write() as session:
        store.Store(session).create_many([_node("gpu-node-01", [_gpu(0, 30)]), *bindings])

    plain = gctl.ok("get", "gpus").splitlines()
    wide = gctl.ok("get", "gpus", "-o", "wide").splitlines()

    jobs = plain[0].split().index("JOBS")
    assert plain[1].split()[jobs] == "eval-a(0.25),+2"
    assert wide[0].split()[jobs] == "JOBS"
    assert wide[1].split()[jobs] == "eval-a(0.25),eval-b(0.25),eval-c(0.25)"
