"""The fixtures of the end-to-end tests: gctl's daemons, and a node's runtime alone."""

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from nodeagent import runtime
from tests.conftest import GCTL_BIN, Gctl
from tests.e2e.test_jobs import Cluster, wait_for

DEADLINE = 20.0
REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def until(check: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
    """Wait for `check` to return something true, at most `timeout` s; return it."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


@pytest.fixture
def node(tmp_path: Path) -> Iterator[runtime.Runtime]:
    """A node's runtime in a state directory of the test's; whatever it started is stopped."""
    attempts = runtime.Runtime(tmp_path / "state")
    yield attempts
    for uid in attempts.known():  # nothing outlives the test
        attempts.stop(uid, warn=False)
        attempts.kill_lost(uid)
    attempts.close()


@pytest.fixture
def cluster(gctl: Gctl, tmp_path: Path) -> Iterator[Cluster]:
    """A controller and agents that the test starts; stopped after it, and what they logged
    printed (pytest shows it with a failure's report only)."""
    running = Cluster(gctl, tmp_path)
    yield running
    running.stop()
    print(running.logs())


@pytest.fixture
def up(gctl: Gctl, tmp_path: Path) -> Iterator[None]:
    """`gctl up` with 8 fake GPUs, from the repository's root, until the node is Ready."""
    log = open(tmp_path / "up.log", "ab")  # noqa: SIM115 - the child keeps it
    process = subprocess.Popen(
        [
            *(GCTL_BIN, "up", "--fake-gpus", "8", "--state-dir", str(tmp_path / "state")),
            *("--heartbeat", "0.5", "--backoff", "0.2", "--grace-period", "1"),
        ],
        stdout=log,
        stderr=log,
        env={**gctl.env(), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=REPO,
    )
    log.close()
    try:
        wait_for(lambda: "Ready" in gctl.ok("get", "nodes"), "the node to be Ready")
        yield
    finally:
        stop(process)


def stop(process: "subprocess.Popen[bytes]") -> None:
    """SIGTERM to a daemon the test started, SIGKILL if it has not ended 10 s later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def launch_script(
    node: runtime.Runtime,
    uid: str,
    script: str,
    *,
    after: tuple[str, ...] = (),
    lease: Path | None = None,
) -> runtime.State:
    """Launch `bash -c SCRIPT` as attempt `uid`; armed behind the attempts `after`."""
    launch = runtime.Launch(
        uid=uid,
        argv=["bash", "-c", script],
        env=dict(os.environ),
        cwd=None,
        log_path=node.log_path("default", uid, "job-uid", 1),
        grace_seconds=2.0,
        lease_path=lease,
        fence_seconds=30.0 if lease else 0.0,
        wait_for=tuple(node.lock_path(before) for before in after),
    )
    return node.launch(launch)
