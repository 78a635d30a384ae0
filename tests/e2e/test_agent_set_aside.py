"""Stored objects that do not validate, met by real daemons (`gctl controller run`, `gctl agent
run`) with real jobs: the agent fails closed, never putting two jobs on one whole GPU, and keeps
its node beating, so that its running jobs are neither declared lost nor fenced
(docs/decisions.md). The rows are spoilt as a hand edit in the database would spoil them."""

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gctl.store import db
from tests.builders import corrupt, warnings_about
from tests.conftest import Gctl
from tests.e2e.test_jobs import Cluster, alive, apply_job, job, phase_is, wait_for

FENCE = 2.0  # the agent's --fence-after


@pytest.fixture
def database(gctl: Gctl) -> Iterator[db.Database]:
    opened = db.Database.open(gctl.db_url)
    yield opened
    opened.close()


def _attempt(gctl: Gctl, name: str) -> dict[str, Any]:
    return gctl.object("Binding", name)


def _waits(gctl: Gctl, name: str) -> bool:
    """Whether a scheduling pass told Job `name` why it waits."""
    return any(c["type"] == "Scheduled" for c in job(gctl, name)["status"].get("conditions", []))


def _sleepers(gctl: Gctl, *placed: tuple[str, int]) -> dict[str, int]:
    """Jobs that sleep, each on the GPU given, once running: their pids, by name."""
    for name, gpu in placed:
        apply_job(gctl, name, "sleep 600", placement={"gpus": [gpu]})
    for name, _ in placed:
        wait_for(phase_is(gctl, name, "Running"), f"{name} to run")
    return {name: _attempt(gctl, f"{name}-1")["status"]["pid"] for name, _ in placed}


def test_a_job_bound_after_one_whose_binding_does_not_validate_waits_for_its_end(
    cluster: Cluster, gctl: Gctl, database: db.Database
) -> None:
    """x1's Binding is spoilt; y1 is bound ahead behind it on GPU 0 (the scheduler validated x1
    in its last pass, and the edit changed no version, so it keeps what it read). An agent
    started after the edit cannot read x1 (the one before kept what it read, as the scheduler
    does), but x1 runs: y1 waits until it ends, rather than join it on its GPU."""
    cluster.controller()
    cluster.agent("n1", gpus=2, fence=30)  # its jobs outlive the restart below
    pids = _sleepers(gctl, ("x1", 0), ("x2", 1))
    apply_job(gctl, "big", "true", resources={"gpus": 4})  # never fits: a pass reads x1
    wait_for(lambda: _waits(gctl, "big"), "a scheduling pass")
    spec = _attempt(gctl, "x1-1")["spec"]
    corrupt(database, "Binding", "x1-1", spec=spec | {"bogus": 1})
    cluster.kill("n1", signal.SIGTERM)
    cluster.agent("n1", gpus=2, fence=30)
    apply_job(gctl, "y1", "sleep 600", placement={"gpus": [0]})
    wait_for(lambda: gctl("get", "binding", "y1-1").code == 0, "y1 to be bound")
    assert _attempt(gctl, "y1-1")["spec"]["after"] == [_attempt(gctl, "x1-1")["metadata"]["uid"]]
    said = 'binding "x1-1" in namespace "default" as stored does not validate (spec.bogus'
    log = cluster.tmp / "n1.log"
    wait_for(lambda: said in log.read_text(), "the restarted agent to find x1 unreadable")
    time.sleep(3)  # many agent passes
    assert job(gctl, "y1")["status"]["phase"] == "Scheduled"
    assert alive(pids["x1"])
    os.kill(pids["x1"], signal.SIGKILL)
    wait_for(phase_is(gctl, "y1", "Running"), "y1 to start once x1 ended")


def test_a_node_whose_spec_does_not_validate_keeps_its_jobs_and_takes_no_new_one(
    cluster: Cluster, gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    """n1's spec is spoilt: its heartbeat goes on (the status is the agent's), so its jobs run
    on past the fence and the node timeout, and nothing new is bound there (GPU 2 is free).
    The agent and the controller each say so once."""
    cluster.controller(node_timeout=2 * FENCE)
    cluster.agent("n1", gpus=3, fence=FENCE)
    pids = _sleepers(gctl, ("x1", 0), ("x2", 1))
    corrupt(database, "Node", "n1", spec={"bogus": 1})
    agent_log = tmp_path / "n1.log"
    said = "take no new attempt until it is fixed"
    wait_for(lambda: said in agent_log.read_text(), "the agent to say that n1's spec is unread")
    apply_job(gctl, "z", "sleep 600")
    time.sleep(3 * FENCE)
    for name, pid in pids.items():
        assert alive(pid), f"{name} was stopped"
        status = job(gctl, name)["status"]
        assert (status["phase"], status["attempts"]) == ("Running", 1)
    assert job(gctl, "z")["status"].get("phase", "Pending") == "Pending"
    assert gctl("get", "binding", "z-1").code != 0
    logged = agent_log.read_text()
    assert logged.count(said) == 1
    assert "heartbeat failed" not in logged
    # Each heartbeat is a new version of n1, its spec no different: said once, not at each.
    assert (tmp_path / "controller.log").read_text().count('node "n1" as stored') == 1
    assert [count for _, _, count in warnings_about(database, "n1")] == [1]
