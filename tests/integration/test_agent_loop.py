"""The agent's loop against a real database: a pass that fails does not silence the node, nor
does a failed heartbeat make it spin; and stored objects that do not validate (an older gctl,
a hand edit in the database) make it fail closed: an attempt whose Binding it cannot read
still holds its GPUs while it runs here, and a Node whose spec it cannot read keeps beating
but takes no new attempt. An agent back from a long outage does not fence what it starts."""

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy

from controller import scheduling
from gctl.api import binding, errors, node
from gctl.store import db, shared, store, tables
from nodeagent import agent, gpus
from tests.builders import bind_first_attempt, corrupt, make_job, stored

WAIT = 15.0


def _heartbeat(database: db.Database) -> object:
    with database.read() as session:
        return store.Store(session).get(node.Node, "n1").status.heartbeat_time


def test_a_binding_that_no_longer_validates_does_not_stop_the_heartbeat(
    database: db.Database, tmp_path: Path
) -> None:
    """The agent's pass fails on it, every time; the node must still beat, or after the node
    timeout its running jobs would be declared lost and, past the fence, stopped."""
    node_agent = agent.Agent(
        database, "n1", gpus.FakeGPUs(1), tmp_path / "state", heartbeat_seconds=0.2
    )
    node_agent.heartbeat()
    with database.write() as session:
        store.Store(session).create(make_job("train").build())
    store.transact(database, lambda w: scheduling.schedule(w, node_agent.clock()))
    table = tables.table_of(binding.Binding.KIND)
    with database.engine.begin() as connection:  # as an older gctl or a hand edit leaves it
        done = connection.execute(  # Running: the heartbeat tells its processes from others
            sqlalchemy.update(table).values(
                spec={"node": "n1", "gpus": "not a list"}, phase="Running"
            )
        )
        assert done.rowcount == 1
    before = _heartbeat(database)
    stop = threading.Event()
    loop = threading.Thread(target=node_agent.run, args=(stop,), daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + WAIT
        while _heartbeat(database) == before:
            assert time.monotonic() < deadline, "the node stopped beating"
            time.sleep(0.1)
    finally:
        stop.set()
        node_agent.wake.set()
        loop.join(timeout=WAIT)


# -- stored objects that do not validate: the agent fails closed (docs/decisions.md) ---------


@pytest.fixture
def n1(database: db.Database, tmp_path: Path) -> Iterator[agent.Agent]:
    """n1's agent with two fake GPUs, heartbeated once; whatever it started is stopped after
    the test."""
    node_agent = agent.Agent(
        database, "n1", gpus.FakeGPUs(2), tmp_path / "state", heartbeat_seconds=0.2
    )
    node_agent.heartbeat()
    yield node_agent
    attempts = node_agent.runtime
    for uid in attempts.known():
        attempts.stop(uid, warn=False)
        attempts.kill_lost(uid)
    node_agent.close()


def _bind(
    database: db.Database, name: str, gpu: int, after: Sequence[binding.Binding] = ()
) -> binding.Binding:
    """Job `name` (it sleeps), and its attempt 1 on n1's GPU `gpu`, bound ahead of `after`."""
    with database.write() as session:
        writer = store.Store(session)
        owner = writer.create(make_job(name).command("sleep", "600").build())
        uids = [b.metadata.uid or "" for b in after]
        return bind_first_attempt(writer, owner, "n1", [gpu], uids)


def _spoil(database: db.Database, bound: binding.Binding, **spec: object) -> None:
    """The attempt's Binding as an older gctl or a hand edit leaves it: it does not validate.
    A new resourceVersion, as a hand edit must write (the agent reads a row once a version)."""
    wire = bound.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    with database.read() as session:
        (row,) = store.Store(session).list_wire(binding.Binding, names=[bound.name])
    version = int(row["metadata"]["resourceVersion"]) + 1000
    corrupt(database, "Binding", bound.name, spec=wire | spec, resource_version=version)


def _phase_here(node_agent: agent.Agent, bound: binding.Binding) -> str:
    return node_agent.runtime.state(bound.metadata.uid or "").phase


def _end(node_agent: agent.Agent, bound: binding.Binding) -> None:
    """Stop the attempt's job, once its supervisor started it, and wait for its end."""
    uid, deadline = bound.metadata.uid or "", time.monotonic() + WAIT
    while node_agent.runtime.state(uid).pid is None:
        assert time.monotonic() < deadline, f"{bound.name} did not start"
        time.sleep(0.05)
    node_agent.runtime.stop(uid, warn=False)
    while _phase_here(node_agent, bound) != "exited":
        assert time.monotonic() < deadline, f"{bound.name} did not end"
        time.sleep(0.05)


def test_the_agent_keeps_only_the_bindings_it_still_reads(
    database: db.Database, n1: agent.Agent
) -> None:
    """Its node's Bindings are read by a shared read, kept from pass to pass; one that ended
    leaves the read, and what was kept of it goes too (no change feed drops it in the agent's
    process: a long-lived agent would otherwise keep every attempt it ever ran)."""
    # Emptied first: a cache filled by this worker's earlier tests would be emptied whole the
    # moment it is full, which could be in the middle of this one.
    shared._DECODED.clear()
    shared._VALIDATED.clear()
    x1, x2 = _bind(database, "x1", 0), _bind(database, "x2", 1)
    n1.sync()
    kept = {uid for uid in (x1.metadata.uid, x2.metadata.uid) if uid in shared._VALIDATED}
    assert kept == {x1.metadata.uid, x2.metadata.uid}
    _end(n1, x1)
    n1.sync()  # reports x1 Exited
    n1.sync()  # reads it no more
    assert stored(database, binding.Binding, "x1-1").status.phase == "Exited"
    assert x1.metadata.uid not in shared._VALIDATED
    assert x1.metadata.uid not in shared._DECODED
    assert x2.metadata.uid in shared._VALIDATED


def test_an_attempt_bound_after_one_whose_binding_does_not_validate_waits_for_it(
    database: db.Database, n1: agent.Agent
) -> None:
    """x1's Binding is left alone, but its job still runs on GPU 0: y1, bound ahead behind it,
    must not start there until it ended (not taken, nor armed on a lock it cannot name)."""
    x1, x2 = _bind(database, "x1", 0), _bind(database, "x2", 1)
    n1.sync()
    assert (_phase_here(n1, x1), _phase_here(n1, x2)) == ("running", "running")
    y1 = _bind(database, "y1", 0, after=[x1])
    _spoil(database, x1, bogus=1)
    n1.sync()
    assert _phase_here(n1, y1) == "absent"
    assert stored(database, binding.Binding, "y1-1").status.phase == "Pending"
    _end(n1, x1)
    n1.sync()
    assert _phase_here(n1, y1) == "running"


def test_an_attempt_whose_binding_does_not_validate_holds_the_gpus_its_row_names(
    database: db.Database, n1: agent.Agent
) -> None:
    """z1, bound to x1's GPU 0 (a race with the scheduler, say), waits while x1 runs; z2, on
    GPU 1, which x1's row does not name, starts."""
    x1 = _bind(database, "x1", 0)
    n1.sync()
    _spoil(database, x1, bogus=1)
    z1, z2 = _bind(database, "z1", 0), _bind(database, "z2", 1)
    n1.sync()
    assert (_phase_here(n1, z1), _phase_here(n1, z2)) == ("absent", "running")


def test_an_attempt_whose_gpus_cannot_be_read_holds_every_gpu(
    database: db.Database, n1: agent.Agent
) -> None:
    """x2's row names no GPUs that can be read: while it runs, y1 may not take GPU 0 though
    x1, which it waited for, has ended."""
    x1, x2 = _bind(database, "x1", 0), _bind(database, "x2", 1)
    n1.sync()
    y1 = _bind(database, "y1", 0, after=[x1])
    _spoil(database, x2, gpus="all")
    _end(n1, x1)
    n1.sync()
    assert stored(database, binding.Binding, "x1-1").status.phase == "Exited"
    assert _phase_here(n1, y1) == "absent"
    _end(n1, x2)
    n1.sync()
    assert _phase_here(n1, y1) == "running"


def _spoil_node(database: db.Database) -> dict[str, object]:
    """n1's spec (the user's: cordons, drains) as a hand edit leaves it; returns it."""
    spec: dict[str, object] = {"cordonedGPUs": [1], "bogus": 1}
    corrupt(database, "Node", "n1", spec=spec)
    return spec


def test_a_node_whose_spec_does_not_validate_keeps_beating_and_its_spec(
    database: db.Database, n1: agent.Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """The status is the agent's: written as ever, the stored spec left as it is (and the
    change feed says so, not a default one); said once, not at every beat."""
    spec = _spoil_node(database)
    with database.read() as session:
        reader = store.Store(session)
        since, (before,) = reader.current_revision(), reader.list_wire(node.Node, names=["n1"])
    n1.heartbeat()
    n1.heartbeat()
    with database.read() as session:
        reader = store.Store(session)
        (raw,) = reader.list_wire(node.Node, names=["n1"])
        changes = reader.changes_since(since, kinds=[node.Node.KIND])
    assert raw["status"]["heartbeatTime"] != before["status"]["heartbeatTime"]
    assert raw["spec"] == spec
    assert [c.object["spec"] for c in changes] == [spec, spec]
    said = [r.getMessage() for r in caplog.records if "take no new attempt" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith('node "n1" as stored does not validate (spec.bogus: unknown field)')


def test_a_node_whose_spec_does_not_validate_takes_no_new_attempt(
    database: db.Database, n1: agent.Agent
) -> None:
    """Which GPUs are cordoned cannot be read: every one is taken to be. An attempt armed on
    one is given back, one bound ahead is not taken though the GPU freed; x1 runs on."""
    x1, x2 = _bind(database, "x1", 0), _bind(database, "x2", 1)
    n1.sync()
    _bind(database, "y2", 1, after=[x2])
    n1.sync()
    assert stored(database, binding.Binding, "y2-1").status.phase == "Armed"
    _spoil_node(database)
    n1._node_changes += 1  # what the feed tells a running agent
    y1 = _bind(database, "y1", 0, after=[x1])
    _end(n1, x1)
    n1.sync()
    assert _phase_here(n1, y1) == "absent"
    assert stored(database, binding.Binding, "y1-1").status.phase == "Pending"
    assert stored(database, binding.Binding, "y2-1").status.phase == "Pending"  # given back
    assert _phase_here(n1, x2) == "running"


def _run_loop(node_agent: agent.Agent, seconds: float) -> None:
    """The agent's loop, in a thread, for `seconds`."""
    stop = threading.Event()
    loop = threading.Thread(target=node_agent.run, args=(stop,), daemon=True)
    loop.start()
    try:
        time.sleep(seconds)
    finally:
        stop.set()
        node_agent.wake.set()
        loop.join(timeout=WAIT)


def test_a_failed_heartbeat_is_retried_shortly_not_at_once(
    database: db.Database, n1: agent.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat that fails left the next one due at once: the loop spun, trying again
    thousands of times a minute. Now it tries again a second later (the period being 5 s)."""
    n1.heartbeat_seconds = 5.0
    tries = []

    def failing() -> None:
        tries.append(time.monotonic())
        if len(tries) > 1:  # the first, before the loop, must succeed for it to start
            raise errors.Unavailable("the database is away")

    monkeypatch.setattr(n1, "heartbeat", failing)
    _run_loop(n1, 2.5)
    assert 2 <= len(tries) <= 4, f"{len(tries)} heartbeats in 2.5 s"


def test_a_job_that_no_longer_validates_neither_spins_the_loop_nor_holds_back_the_others(
    database: db.Database, n1: agent.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both attempts wait to start; y's Job as stored does not validate. Reading the Jobs of
    a pass failed for both: the error was told as x's, and y's attempt was recorded as ended
    because "the Job was deleted". A pass that failed for an attempt asked for the next at
    once, which spun while the fault lasted. Now x starts, y waits, Pending (its agent cannot
    build its command), and the pass runs again only shortly after."""
    n1.heartbeat_seconds = 5.0  # passes come from the feed, the retry, or this
    x, y = _bind(database, "x", 0), _bind(database, "y", 1)
    corrupt(database, "Job", "y", spec={"command": 5})
    passes = []
    sync = n1.sync

    def counted() -> None:
        passes.append(time.monotonic())
        sync()

    monkeypatch.setattr(n1, "sync", counted)
    _run_loop(n1, 2.5)
    assert _phase_here(n1, x) == "running"
    assert _phase_here(n1, y) == "absent"
    assert stored(database, binding.Binding, "y-1").status.phase == "Pending"
    assert len(passes) <= 8, f"{len(passes)} agent passes in 2.5 s"


def test_the_agent_says_when_an_armed_attempt_started_and_what_it_adopted(
    database: db.Database, n1: agent.Agent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """QA: the log said when an attempt was armed, never when it started; nor what a
    restarted agent found still running."""
    caplog.set_level(logging.INFO, logger="gctl.agent")
    x = _bind(database, "x", 0)
    n1.sync()
    y = _bind(database, "y", 0, after=[x])
    n1.sync()
    _end(n1, x)
    deadline = time.monotonic() + WAIT
    # Its pid, not only its phase: an armed supervisor is running once it fired, a moment
    # before its job's pid is recorded, and the agent says it started once it has the pid.
    while (pid := n1.runtime.state(y.metadata.uid or "").pid) is None:
        assert time.monotonic() < deadline, "y did not start"
        time.sleep(0.05)
    n1.sync()
    assert (
        f"default/y attempt 1 started on GPUs [0] as the attempt before it ended (armed; pid {pid})"
        in caplog.messages
    )
    n1.close()  # stops cleanly: y runs on
    again = agent.Agent(database, "n1", gpus.FakeGPUs(2), tmp_path / "state")
    again.heartbeat_seconds = 5.0
    _run_loop(again, 0.5)
    assert "node n1: 1 attempt(s) still running here: adopted" in caplog.messages
    assert _phase_here(again, y) == "running"


def test_an_attempt_started_right_after_a_long_outage_is_not_fenced(
    database: db.Database, tmp_path: Path
) -> None:
    """Chaos QA: an agent back after an outage longer than its fence starts its first attempts
    (`_settle_lost`'s pass) before its first heartbeat; the lease was still the one its dead
    predecessor left, so each of them was stopped as Fenced 0.2 s into its run."""
    node_agent = agent.Agent(database, "n1", gpus.FakeGPUs(1), tmp_path / "state", fence_seconds=30)
    try:
        node_agent.lease.touch()
        long_ago = time.time() - 120  # the predecessor's last heartbeat
        os.utime(node_agent.lease, (long_ago, long_ago))
        with database.write() as session:
            writer = store.Store(session)
            owner = writer.create(make_job("train").command("sleep", "1").build())
            bound = bind_first_attempt(writer, owner, "n1", [0], [])
        node_agent.claim()
        node_agent.sync()
        uid, deadline = bound.metadata.uid or "", time.monotonic() + WAIT
        while (state := node_agent.runtime.state(uid)).phase != "exited":
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(0.05)
        assert (state.exit_code, state.reason) == (0, None)
    finally:
        node_agent.close()
