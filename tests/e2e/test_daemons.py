"""The daemons as a user runs them: `gctl up` and `gctl agent run` as real processes, stopped
with real signals."""

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from gctl.api import meta, node
from gctl.store import db, store
from tests.builders import put_ready_node
from tests.conftest import GCTL_BIN, Gctl, _admin, _pg_url
from tests.e2e.test_jobs import alive, apply_job, phase_is, wait_for

# A clean shutdown takes well under a second; the bound is generous for a loaded machine.
SHUTDOWN_BOUND_S = 3.0


def _up(
    gctl: Gctl, tmp_path: Path, log: Path, *, session: bool = False
) -> "subprocess.Popen[bytes]":
    """`gctl up` with its default heartbeat (10 s): the agent waited for its next one to
    notice a stop. `session`: in a session (and process group) of its own, as a service."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                *(GCTL_BIN, "up", "--fake-gpus", "1", "--node-name", "n1"),
                *("--state-dir", str(tmp_path / "state"), "--backoff", "0.2"),
            ],
            stdout=out,
            stderr=out,
            env=gctl.env(),
            cwd=tmp_path,
            start_new_session=session,
        )


@contextlib.contextmanager
def _up_running_a_job(
    gctl: Gctl, tmp_path: Path, *, session: bool = False
) -> "Iterator[tuple[subprocess.Popen[bytes], int, Path]]":
    """`gctl up` (`_up`) running a Job `stays` (`sleep 60`): (`gctl up`, the job's pid, the
    log). Both are killed on the way out, whatever the test did to them."""
    log = tmp_path / "up.log"
    process = _up(gctl, tmp_path, log, session=session)
    pid = None
    try:
        apply_job(gctl, "stays", ["sleep", "60"])
        wait_for(phase_is(gctl, "stays", "Running"), "the job to run")
        pid = gctl.object("Binding", "stays-1")["status"]["pid"]
        yield process, pid, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_shuts_down_at_once_and_says_so_leaving_its_jobs_running(
    gctl: Gctl, tmp_path: Path, sig: signal.Signals
) -> None:
    """QA's case: SIGTERM or SIGINT made `gctl up` exit after 6-8 s, saying nothing. The job
    it started keeps running (DESIGN.md: jobs outlive their agent)."""
    with _up_running_a_job(gctl, tmp_path) as (process, pid, log):
        time.sleep(0.5)  # past the heartbeat that followed the start
        signalled = time.monotonic()
        process.send_signal(sig)
        code = process.wait(30)
        took = time.monotonic() - signalled
        said = log.read_text()
        assert code == 0, said
        assert took < SHUTDOWN_BOUND_S, f"took {took:.1f}s to stop\n{said}"
        assert f"received {sig.name}: shutting down; running jobs keep running" in said
        assert alive(pid)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


@contextlib.contextmanager
def _reaped(process: "subprocess.Popen[bytes]") -> Iterator[None]:
    """Kill `process` on the way out, if the block left it running."""
    try:
        yield
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _agent_pid(gctl: Gctl, node_name: str) -> int:
    """The pid of the agent heartbeating for `node_name`, once it has claimed its Node."""
    found: int = wait_for(lambda: _instance_pid(gctl, node_name), "the agent to claim its Node")
    return found


def test_up_runs_its_agent_in_a_process_of_its_own_that_never_outlives_it(
    gctl: Gctl, tmp_path: Path
) -> None:
    """The controller and the agent each have an interpreter (and its GIL) to themselves: the
    agent is a child of `gctl up`. Killed with SIGKILL, `gctl up` can tell its agent nothing,
    and the agent stops by itself (the pipe it holds from `gctl up` ends), leaving its job
    running for the next agent of the node to adopt."""
    with _up_running_a_job(gctl, tmp_path) as (process, pid, log):
        agent = _agent_pid(gctl, "n1")
        assert agent != process.pid
        assert _parent_of(agent) == process.pid
        process.kill()
        process.wait(10)
        wait_for(lambda: not alive(agent), "the agent to stop", timeout=SHUTDOWN_BOUND_S * 2)
        assert alive(pid)
        assert "Traceback" not in log.read_text()


def test_up_stopped_with_its_whole_process_group_stops_as_when_stopped_alone(
    gctl: Gctl, tmp_path: Path
) -> None:
    """A service manager stops a service with SIGTERM to all its processes: the agent gets it
    too, and may end before `gctl up` has seen its own. That is a stop, exit 0, not a part
    that failed; the job (in a session of its own) keeps running."""
    with _up_running_a_job(gctl, tmp_path, session=True) as (process, pid, log):
        agent = _agent_pid(gctl, "n1")
        os.killpg(process.pid, signal.SIGTERM)
        code = process.wait(30)
        said = log.read_text()
        assert code == 0, said
        assert said.count("received SIGTERM") == 1, said  # `gctl up`'s, not its agent's too
        assert "received SIGTERM: shutting down; running jobs keep running" in said
        assert "agent stopped" not in said
        assert not alive(agent)
        assert alive(pid)


@pytest.mark.parametrize(
    ("sig", "how"),
    [(signal.SIGKILL, "killed by SIGKILL"), (signal.SIGTERM, "stopped on SIGTERM")],
    ids=["SIGKILL", "SIGTERM"],
)
def test_up_whose_agent_process_ends_stops_and_says_so(
    gctl: Gctl, tmp_path: Path, sig: signal.Signals, how: str
) -> None:
    """An agent that ends on its own (killed, or a signal to it alone) is a part of `gctl up`
    that stopped: `gctl up` stops its other parts and exits 1, naming it, and its job runs on.
    The agent says nothing of a signal itself: one to the whole group would be said twice."""
    with _up_running_a_job(gctl, tmp_path) as (process, pid, log):
        agent = _agent_pid(gctl, "n1")
        os.kill(agent, sig)
        code = process.wait(30)
        assert alive(pid)
    said = log.read_text()
    assert code == 1, said
    ended = f"the node agent's process (pid {agent}) ended ({how})"
    assert f"agent stopped: {ended}" in said
    assert "a part stopped: shutting down; running jobs keep running" in said
    assert said.strip().splitlines()[-1] == f"error: {ended}"
    assert "received" not in said
    assert "Traceback" not in said


def test_up_waiting_for_its_database_says_which_part_waits(tmp_path: Path) -> None:
    """A database server not up yet: `gctl up` and its agent each try again, and say so, the
    agent's line naming it (they were two identical lines); a signal then stops both, exit 0."""
    log = tmp_path / "up.log"
    url = "postgresql://postgres@127.0.0.1:1/gctl"  # nothing listens there
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [
                *(GCTL_BIN, "up", "--db", url, "--fake-gpus", "1", "--node-name", "n1"),
                *("--state-dir", str(tmp_path / "state")),
            ],
            stdout=out,
            stderr=out,
        )

    def both_tried() -> bool:
        said = log.read_text()
        return "starting failed; retrying" in said and "node agent failed; retrying" in said

    with _reaped(process):
        wait_for(both_tried, "both parts' first try")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    said = log.read_text()
    assert said.count("failed; retrying") == 2, said
    assert "Traceback" not in said


@contextlib.contextmanager
def _up_while_its_claim_waits(
    tmp_path: Path,
) -> "Iterator[tuple[subprocess.Popen[bytes], sqlite3.Connection, Path]]":
    """`gctl up` on a SQLite file whose write lock another connection holds, so that the
    agent's claim of its Node waits for it: (`gctl up`, that connection, the log). `gctl up`
    is killed on the way out, whatever the test did."""
    database = tmp_path / "gctl.db"
    env = {**os.environ, "GCTL_DB": str(database)}
    subprocess.run([GCTL_BIN, "db", "upgrade"], env=env, check=True, capture_output=True)
    log = tmp_path / "up.log"
    lock = sqlite3.connect(database, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [GCTL_BIN, "up", "--fake-gpus", "1", "--node-name", "n1"],
                stdout=out,
                stderr=out,
                env=env,
                cwd=tmp_path,
            )
        try:
            yield process, lock, log
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    finally:
        lock.close()


def test_a_signal_while_up_starts_stops_it_and_is_said(tmp_path: Path) -> None:
    """SIGTERM in the first second of `gctl up` (while it opened the database and claimed its
    Node) killed it without a word. Here the claim waits on a write lock held by another
    process: the signal comes meanwhile, and once the lock is released `gctl up` starts its
    parts, stops them, says why and exits 0."""
    with _up_while_its_claim_waits(tmp_path) as (process, lock, log):
        wait_for(lambda: "controller on" in log.read_text(), "the controller to be built")
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert process.poll() is None, log.read_text()  # not killed by it
        lock.execute("ROLLBACK")
        code = process.wait(30)
    said = log.read_text()
    assert code == 0, said
    assert "received SIGTERM: shutting down; running jobs keep running" in said
    assert "Traceback" not in said


def test_a_controller_waits_for_its_database_to_come(pg_template: str, tmp_path: Path) -> None:
    """QA: a daemon started before its database server (a host that boots first) exited 1.
    It now says so and tries again until the database answers, then runs; a signal while it
    waits stops it."""
    name = f"gctl_t_{uuid.uuid4().hex[:10]}"  # not created yet
    log = tmp_path / "controller.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [GCTL_BIN, "controller", "run", "--db", _pg_url(name)],
            stdout=out,
            stderr=out,
        )
    try:
        with _reaped(process):
            wait_for(lambda: "starting failed; retrying" in log.read_text(), "the first try")
            assert process.poll() is None, log.read_text()
            _admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
            wait_for(lambda: "controller on" in log.read_text(), "the controller to start")
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, log.read_text()
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    said = log.read_text()
    assert f'database "{name}" does not exist' in said
    assert "Traceback" not in said


def test_an_agent_whose_claim_found_the_database_away_claims_again(
    pg_url: str, tmp_path: Path
) -> None:
    """The database answered the agent's opening and went away before its claim (here: the
    Node's row locked, and a lock_timeout): the claim is tried again, and the agent built
    again must not find its own first try holding the state directory ("another agent (pid
    <its own>) is running")."""
    database = db.Database.open(pg_url)
    with database.write() as session:
        put_ready_node(store.Store(session), "nb", 1, meta.utcnow())
    database.close()
    name = pg_url.rsplit("/", 1)[1]
    _admin(f"ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'")
    locker = psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql"))
    locker.execute("SELECT 1 FROM nodes WHERE name = 'nb' FOR UPDATE")
    log = tmp_path / "agent.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [
                *(GCTL_BIN, "agent", "run", "--db", pg_url, "--node-name", "nb"),
                *("--fake-gpus", "1", "--state-dir", str(tmp_path / "state")),
            ],
            stdout=out,
            stderr=out,
        )
    try:
        wait_for(lambda: "starting failed; retrying" in log.read_text(), "the first claim")
        locker.commit()  # the database is back
        wait_for(lambda: "state in" in log.read_text() or process.poll() is not None, "start")
        assert process.poll() is None, log.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    finally:
        locker.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert "another agent" not in log.read_text()


def test_a_daemon_on_a_database_of_a_newer_gctl_stops_at_once(tmp_path: Path) -> None:
    """Waiting for the database to come is for a database that is away, not for one whose
    schema this gctl does not know: no retry helps that, upgrading gctl does (review)."""
    database = tmp_path / "gctl.db"
    env = {**os.environ, "GCTL_DB": str(database)}
    subprocess.run([GCTL_BIN, "db", "upgrade"], env=env, check=True, capture_output=True)
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'from-the-future'")
    done = subprocess.run(
        [GCTL_BIN, "controller", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert "has schema from-the-future, newer than this gctl" in done.stderr
    assert "retrying" not in done.stderr


def _agent(gctl: Gctl, state: Path, log: Path) -> "subprocess.Popen[bytes]":
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                *(GCTL_BIN, "agent", "run", "--node-name", "nb", "--fake-gpus", "1"),
                *("--state-dir", str(state), "--heartbeat", "0.5"),
            ],
            stdout=out,
            stderr=out,
            env=gctl.env(),
        )


def _instance_pid(gctl: Gctl, node_name: str = "nb") -> int | None:
    """The pid of the agent its Node names, if it names one."""
    found = gctl.read("Node", node_name)
    if found is None:
        return None
    instance = found["status"].get("agentInstance")
    return None if instance is None else int(instance["pid"])


def test_a_second_agent_for_a_node_refuses_to_start_and_a_crashed_one_never_blocks(
    gctl: Gctl, tmp_path: Path
) -> None:
    """QA's case: two `gctl agent run --node-name nb` on the same state directory both ran.
    The second now exits 1 in one line; so does one with another state directory (another
    host) while the first heartbeats, and `gctl up` too. The first killed with SIGKILL, an
    agent on its state directory starts at once."""
    here, there = tmp_path / "state", tmp_path / "elsewhere"
    running = [_agent(gctl, here, tmp_path / "first.log")]
    try:
        first = running[0]
        wait_for(lambda: "Ready" in gctl.ok("get", "nodes"), "the first agent to heartbeat")
        refusals = {
            "same state directory": (
                ("agent", "run", "--node-name", "nb", "--fake-gpus", "1", "--state-dir", here),
                f"error: node nb: another agent (pid {first.pid}) is running with state "
                f"directory {here}; stop it first (one agent per node)",
            ),
            "another host": (
                ("agent", "run", "--node-name", "nb", "--fake-gpus", "1", "--state-dir", there),
                "error: node nb: another agent is running for it, on host ",
            ),
            "gctl up": (
                ("up", "--node-name", "nb", "--fake-gpus", "1", "--state-dir", there),
                "error: node nb: another agent is running for it, on host ",
            ),
        }
        for what, (argv, error) in refusals.items():
            refused = gctl(*map(str, argv), timeout=30)
            last = refused.err.strip().splitlines()[-1]
            assert refused.code == 1, f"{what}: {refused.err}"
            assert last.startswith(error), f"{what}: {refused.err}"
            assert "fake GPU" not in refused.err, what  # refused before it starts
            assert "Traceback" not in refused.err, what
        assert f"(pid {first.pid}), last heartbeat " in last
        first.kill()
        first.wait(10)
        restarted = _agent(gctl, here, tmp_path / "restarted.log")
        running.append(restarted)
        wait_for(lambda: _instance_pid(gctl) == restarted.pid, "the restarted agent to start")
        assert restarted.poll() is None
    finally:
        for process in running:
            if process.poll() is None:
                process.terminate()
                process.wait(10)


def test_an_agent_that_must_watch_another_ones_heartbeat_says_so_and_a_signal_ends_the_wait(
    gctl: Gctl, tmp_path: Path
) -> None:
    """The Node is held by an agent on another host whose heartbeat is an hour old by this
    host's clock: not enough to take it over (QA: clocks two minutes apart made a live agent
    look dead), so the agent watches that heartbeat, saying so, and SIGTERM ends the wait at
    once, taking nothing."""
    theirs = node.AgentInstance(
        id="elsewhere", hostname="gpu7", pid=4242, started=meta.utcnow(), heartbeat_seconds=0.5
    )
    beat = meta.utcnow() - timedelta(hours=1)
    database = db.Database.open(gctl.db_url)
    try:
        with database.write() as session:
            held = store.Store(session).create(node.Node(metadata=meta.ObjectMeta(name="nb")))
            held.status.agent_instance = theirs
            held.status.heartbeat_time = beat
            store.Store(session).update_status(held)
    finally:
        database.close()
    log = tmp_path / "agent.log"
    process = _agent(gctl, tmp_path / "state", log)
    try:
        wait_for(lambda: "waiting up to" in log.read_text(), "the agent to watch")
        assert (
            f"node nb: agent on host gpu7 pid 4242 last beat at {beat:%Y-%m-%dT%H:%M:%SZ}; "
            "waiting up to 10s to see whether it is alive\n"
        ) in log.read_text()
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert code == 0, log.read_text()
    assert took < SHUTDOWN_BOUND_S, f"took {took:.1f}s to stop\n{log.read_text()}"
    assert _instance_pid(gctl) == 4242


def test_up_whose_agent_is_refused_after_watching_another_ones_heartbeat_says_why_last(
    gctl: Gctl, tmp_path: Path
) -> None:
    """The agent's part is built while it watches another agent's stale heartbeat (`gctl up`'s
    parts then run); that heartbeat moves, so the Node is taken, and the agent is refused.
    `gctl up` stops, exit 1, its last line the agent's own refusal (review: it said only that
    the agent's process had ended)."""
    theirs = node.AgentInstance(
        id="elsewhere", hostname="gpu7", pid=4242, started=meta.utcnow(), heartbeat_seconds=0.5
    )
    database = db.Database.open(gctl.db_url)
    try:
        with database.write() as session:
            held = store.Store(session).create(node.Node(metadata=meta.ObjectMeta(name="nb")))
            held.status.agent_instance = theirs
            held.status.heartbeat_time = meta.utcnow() - timedelta(hours=1)
            store.Store(session).update_status(held)
        log = tmp_path / "up.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [
                    *(GCTL_BIN, "up", "--fake-gpus", "1", "--node-name", "nb"),
                    *("--state-dir", str(tmp_path / "state")),
                ],
                stdout=out,
                stderr=out,
                env=gctl.env(),
                cwd=tmp_path,
            )
        try:
            wait_for(lambda: "waiting up to" in log.read_text(), "the agent to watch")
            with database.write() as session:  # it beats: alive
                alive_again = store.Store(session).get(node.Node, "nb")
                alive_again.status.heartbeat_time = meta.utcnow()
                store.Store(session).update_status(alive_again)
            code = process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    finally:
        database.close()
    said = log.read_text()
    assert code == 1, said
    last = said.strip().splitlines()[-1]
    assert last.startswith("error: node nb: another agent is running for it, on host gpu7"), said
    assert said.count("another agent is running") == 2, said  # "agent stopped: ..." and last
    assert "Traceback" not in said


def test_up_whose_agent_dies_before_it_starts_runs_nothing_and_says_so(tmp_path: Path) -> None:
    """The agent's process killed while its claim waits for the database (a write lock held
    here): `gctl up` starts none of its parts and exits 1, naming what happened."""
    with _up_while_its_claim_waits(tmp_path) as (process, _, log):
        agent = wait_for(lambda: _children(process.pid), "the agent's process")[0]
        os.kill(agent, signal.SIGKILL)
        code = process.wait(30)
    said = log.read_text()
    assert code == 1, said
    last = said.strip().splitlines()[-1]
    assert last == (
        f"error: the node agent's process (pid {agent}) ended (killed by SIGKILL) before it started"
    ), said
    assert "shutting down" not in said  # nothing had started
    assert "Traceback" not in said


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


STUCK_DAEMONS = """
import sys, time
from gctl.cli import daemons

def stuck(stop):  # a step far longer than the grace, which does not look at `stop`
    time.sleep(120)

def prompt(stop):  # started once SIGTERM and SIGINT are handled
    print("running", flush=True)
    stop.wait()

daemons._logging()
daemons._run(lambda opened: [("prompt", prompt), ("controller", stuck)])
print("the interpreter's exit", flush=True)
"""


def _stuck_daemons(tmp_path: Path) -> "subprocess.Popen[str]":
    """`STUCK_DAEMONS` running, its signals handled."""
    process = subprocess.Popen(
        [sys.executable, "-c", STUCK_DAEMONS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "running\n"
    return process


def test_a_part_still_busy_after_the_grace_is_left_and_the_process_exits(tmp_path: Path) -> None:
    """The benchmark of 100,000 queued Jobs saw `gctl up` ignore SIGTERM for 10 s: its
    controller was in a pass. The parts get STOP_GRACE_S together, not ten seconds each; one
    still busy is left (its transaction rolls back, as at a crash) and the process exits."""
    from gctl.cli import daemons

    process = _stuck_daemons(tmp_path)
    try:
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert daemons.STOP_GRACE_S <= took < daemons.STOP_GRACE_S + SHUTDOWN_BOUND_S, err
    assert "received SIGTERM: shutting down" in err
    assert (
        "controller still busy after 5s: leaving it (what it had not committed is rolled back)"
        in err
    )
    assert "Traceback" not in err
    assert out == ""  # left at once: not the interpreter's exit, which would wait for it


def test_a_second_signal_leaves_at_once(tmp_path: Path) -> None:
    """Ctrl-C twice: the second does not wait out the grace for a busy part."""
    from gctl.cli import daemons

    process = _stuck_daemons(tmp_path)
    try:
        signalled = time.monotonic()
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert took < daemons.STOP_GRACE_S, err
    assert "received SIGINT again: leaving at once" in err
