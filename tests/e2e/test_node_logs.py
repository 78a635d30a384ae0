"""`gctl logs` and `gctl run --attach` through the node's agent, as from another host: the
output travels through the database (gctl.store.logstreams), sent by the real agent of a real
`gctl up` to a real `gctl` subprocess, on SQLite and PostgreSQL.

`--from-node` makes the log "not on this machine" honestly: it is the option a user on another
host sharing the state directory (NFS) needs, and it takes the same path as a log whose
directory is missing here. Jobs write with Python so that the bytes are exact.
"""

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from gctl.store import db
from tests.conftest import GCTL_BIN, Gctl
from tests.e2e.conftest import stop
from tests.e2e.test_running import DEADLINE, finish, poll, running_attempt

SLOW_PRINTER = (
    "import sys, time\n"
    "for i in range(1, {n} + 1):\n"
    "    print(f'line {{i}}', flush=True)\n"
    "    time.sleep({every})\n"
)


@pytest.fixture
def agent_host(gctl: Gctl, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`gctl up` (controller and the agent of this host) until the test ends; the test may stop
    it sooner."""
    log = open(tmp_path / "up.log", "ab")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [
            *(GCTL_BIN, "up", "--fake-gpus", "2", "--state-dir", str(tmp_path / "state")),
            *("--heartbeat", "1", "--grace-period", "1", "--backoff", "0.2"),
        ],
        stdout=log,
        stderr=log,
        env=gctl.env(),
        cwd=tmp_path,
    )
    log.close()
    try:
        poll(lambda: "Ready" in gctl.ok("get", "nodes"), "the node to be Ready")
        yield process
    finally:
        stop(process)
        print((tmp_path / "up.log").read_text(errors="replace"))


def _raw(gctl: Gctl, *args: str) -> tuple[int, bytes, str]:
    """Run gctl; its exit code, stdout as bytes, stderr."""
    done = subprocess.run(
        [GCTL_BIN, *args],
        capture_output=True,
        env=gctl.env(),
        cwd=gctl.cwd,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr.decode()


def _python(source: str) -> list[str]:
    return [sys.executable, "-c", source]


def _log_of(database: db.Database, name: str) -> bytes:
    from tests.e2e.test_running import attempts

    (attempt,) = attempts(database, name)
    assert attempt.status.log_path is not None
    return Path(attempt.status.log_path).read_bytes()


def _requests_left(database: db.Database) -> tuple[int, int]:
    with database.read() as session:
        requests = session.execute(text("SELECT count(*) FROM log_requests")).scalar_one()
        chunks = session.execute(text("SELECT count(*) FROM log_chunks")).scalar_one()
    return requests, chunks


def test_logs_of_a_finished_attempt_come_whole_and_byte_exact(
    gctl: Gctl, agent_host: subprocess.Popen[bytes], database: db.Database
) -> None:
    """Text, every byte value and invalid UTF-8, as the job wrote them; nothing left behind."""
    source = (
        "import sys\n"
        "sys.stdout.write('hello from the node\\n'); sys.stdout.flush()\n"
        "sys.stdout.buffer.write(bytes(range(256)) + b'\\xff\\xfe\\r\\n\\x00end')\n"
    )
    gctl.ok("run", "--name", "bytes", "--", *_python(source))
    gctl.ok("wait", "job/bytes", "--for=condition=Complete", "--timeout=30s")

    code, out, err = _raw(gctl, "logs", "bytes", "--from-node")

    assert code == 0, err
    assert out == b"hello from the node\n" + bytes(range(256)) + b"\xff\xfe\r\n\x00end"
    assert out == _log_of(database, "bytes")
    assert _requests_left(database) == (0, 0)


def test_a_large_log_arrives_whole_and_in_order(
    gctl: Gctl, agent_host: subprocess.Popen[bytes], database: db.Database
) -> None:
    """Several MiB, more than the agent sends before the reader takes some: all of it, once,
    in order."""
    source = (
        "import random, sys\n"
        "r = random.Random(7)\n"
        "for _ in range(48):\n"
        "    sys.stdout.buffer.write(r.randbytes(128 * 1024 + 17))\n"
    )
    gctl.ok("run", "--name", "big", "--", *_python(source))
    gctl.ok("wait", "job/big", "--for=condition=Complete", "--timeout=30s")
    written = _log_of(database, "big")
    assert len(written) > 6 << 20

    code, out, err = _raw(gctl, "logs", "big", "--from-node")

    assert code == 0, err
    assert len(out) == len(written)
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(written).hexdigest()
    assert _requests_left(database) == (0, 0)


# Prints a line every 0.3 s until the file {release} exists (3 minutes at most), then two more.
PRINTER_UNTIL_RELEASED = (
    "import os, time\n"
    "i = 0\n"
    "while not os.path.exists({release!r}) and i < 600:\n"
    "    i += 1\n"
    "    print(f'line {{i}}', flush=True)\n"
    "    time.sleep(0.3)\n"
    "print('released', flush=True)\n"
    "print('done', flush=True)\n"
)


def test_follow_prints_the_output_as_it_is_written_then_exits(
    gctl: Gctl, agent_host: subprocess.Popen[bytes], database: db.Database, tmp_path: Path
) -> None:
    """-f on a running job: lines come while it runs, not at its end, and the command ends
    when the attempt does. The job runs until the test has seen the first line (a follower
    started on a loaded machine took longer than a job of 6 s)."""
    release = tmp_path / "release"
    source = PRINTER_UNTIL_RELEASED.format(release=str(release))
    gctl.ok("run", "--name", "ticker", "--", *_python(source))
    poll(lambda: running_attempt(database, "ticker"), "ticker to run")
    follower = gctl.popen("logs", "ticker", "-f", "--from-node")
    assert follower.stdout is not None
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(follower.stdout.readline()))
    reader.start()
    reader.join(DEADLINE)

    assert first, "no line in time"
    assert first[0].startswith("line "), first
    assert running_attempt(database, "ticker") is not None, "the first line came at the end"
    release.touch()
    rest: list[str] = []  # read through the same buffered stream as the first line
    reader = threading.Thread(target=lambda: rest.append(follower.stdout.read()))
    reader.start()
    reader.join(DEADLINE)
    result = finish(follower)
    assert result.code == 0, result.err
    assert rest, "not ended in time"
    assert first[0] + rest[0] == _log_of(database, "ticker").decode()
    assert rest[0].endswith("released\ndone\n")
    assert _requests_left(database) == (0, 0)


def test_run_attach_streams_from_the_node_and_exits_with_the_job_code(
    gctl: Gctl, agent_host: subprocess.Popen[bytes]
) -> None:
    source = SLOW_PRINTER.format(n=3, every=0.2) + "sys.exit(3)\n"
    code, out, err = _raw(gctl, "run", "--attach", "--from-node", "--", *_python(source))

    assert code == 3, err
    assert out == b"line 1\nline 2\nline 3\n"
    assert "failed" in err


def test_an_agent_that_is_down_gives_a_one_line_error_quickly(
    gctl: Gctl, agent_host: subprocess.Popen[bytes], database: db.Database
) -> None:
    gctl.ok("run", "--name", "done", "--", "echo", "hi")
    gctl.ok("wait", "job/done", "--for=condition=Complete", "--timeout=30s")
    agent_host.terminate()
    agent_host.wait(5)  # promptly: the log server's loop wakes on the stop too
    node = gctl.ok("get", "nodes", "-o", "name").strip().removeprefix("node.gctl/")

    began = time.monotonic()
    code, out, err = _raw(gctl, "logs", "done", "--from-node")

    assert time.monotonic() - began < 15
    assert (code, out) == (1, b"")
    assert err.count("\n") == 1, err
    assert err.startswith(f"error: node {node} is not answering"), err
    assert _requests_left(database) == (0, 0)


def test_a_killed_follower_is_cleaned_up_by_the_agent(
    gctl: Gctl, agent_host: subprocess.Popen[bytes], database: db.Database
) -> None:
    """SIGKILL leaves the request behind; the agent drops it once its lease lapses."""
    gctl.ok("run", "--name", "endless", "--", *_python(SLOW_PRINTER.format(n=600, every=0.1)))
    poll(lambda: running_attempt(database, "endless"), "endless to run")
    follower = gctl.popen("logs", "endless", "-f", "--from-node")
    assert follower.stdout is not None
    assert follower.stdout.readline() == "line 1\n"
    assert _requests_left(database)[0] == 1

    follower.send_signal(signal.SIGKILL)
    follower.wait(5)
    follower.stdout.close()
    if follower.stderr is not None:
        follower.stderr.close()

    poll(lambda: _requests_left(database) == (0, 0), "the request to be dropped", timeout=30)
    assert running_attempt(database, "endless") is not None  # the job itself runs on


def test_a_follower_whose_agent_is_killed_says_so_and_ends(
    gctl: Gctl, agent_host: subprocess.Popen[bytes], database: db.Database
) -> None:
    """`gctl up` killed whole (no controller left to declare the attempt lost): the follower
    sees the agent's heartbeat stop and ends in one line, though its own renewals ring the
    logs' doorbell on SQLite all the while."""
    gctl.ok("run", "--name", "orphan", "--", *_python(SLOW_PRINTER.format(n=450, every=0.1)))
    attempt = poll(lambda: running_attempt(database, "orphan"), "orphan to run")
    node = attempt.spec.node
    follower = gctl.popen("logs", "orphan", "-f", "--from-node")
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "line 1\n"
        agent_host.send_signal(signal.SIGKILL)
        agent_host.wait(5)
        began = time.monotonic()
        _, err = follower.communicate(timeout=45)

        assert time.monotonic() - began < 30
        assert follower.returncode == 1, err
        assert err.count("\n") == 1, err
        assert err.startswith(
            f"error: node {node} is not answering: its agent stopped sending the log of "
            "attempt 1 of job orphan and has not heartbeated for "
        ), err
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate(timeout=5)
        if attempt.status.pid is not None:  # the job outlives its agent, as it should
            with contextlib.suppress(OSError):
                os.killpg(attempt.status.pid, signal.SIGKILL)
