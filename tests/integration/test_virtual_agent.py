"""The virtual agent's passes on a real database with a fake clock: no processes, no sleeping.

Each test plays the scheduler by writing a Binding, then calls `sync()` as the agent's loop
would after the change feed or a timer woke it, moving the injected clocks by hand.
"""

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gctl.api import binding, job, meta, node
from gctl.store import db, store
from nodeagent import agent, gpus, ownership, virtual
from tests.builders import bind_first_attempt

START = datetime(2026, 1, 1, tzinfo=UTC)


class FakeTime:
    def __init__(self) -> None:
        self.seconds = 0.0

    def wall(self) -> datetime:
        return START + timedelta(seconds=self.seconds)

    def monotonic(self) -> float:
        return self.seconds


def make_agent(database: db.Database, clock: FakeTime) -> virtual.VirtualAgent:
    return virtual.VirtualAgent(
        database,
        nodes=2,
        gpus_per_node=4,
        time_scale=10,
        clock=clock.wall,
        monotonic=clock.monotonic,
    )


def bind(
    database: db.Database, name: str, annotations: dict[str, str], after: list[str] | None = None
) -> str:
    """A Job and its first attempt on vnode-0002 GPU 0, as the scheduler writes them (bound
    ahead when `after` names attempts); returns the attempt's uid."""
    with database.write() as session:
        writer = store.Store(session)
        owner = writer.create(
            job.Job(
                metadata=meta.ObjectMeta(name=name, annotations=annotations),
                spec=job.JobSpec(command="true"),
            )
        )
        bound = bind_first_attempt(writer, owner, "vnode-0002", [0], after or [])
        return bound.metadata.uid or ""


def attempt(database: db.Database, name: str) -> binding.BindingStatus:
    with database.read() as session:
        return store.Store(session).get(binding.Binding, f"{name}-1", "default").status


def ask_to_stop(database: db.Database, name: str) -> None:
    """The scheduler asks the Job's attempt 1 to stop (preempted), as it writes it."""
    with database.write() as session:
        writer = store.Store(session)
        current = writer.get(binding.Binding, f"{name}-1", "default")
        current.spec.stop_reason = binding.STOP_PREEMPTED
        writer.update(current)


def step(agent: virtual.VirtualAgent) -> None:
    agent.resync()
    agent.sync()


def test_heartbeats_register_nodes_with_fake_gpus(database: db.Database) -> None:
    clock = FakeTime()
    agent = make_agent(database, clock)
    agent.heartbeat()
    with database.write() as session:
        store.Store(session).delete(node.Node, "vnode-0001")
    agent.heartbeat()  # registers the deleted Node again
    with database.read() as session:
        nodes = store.Store(session).list_objects(node.Node)
    assert [n.name for n in nodes] == ["vnode-0001", "vnode-0002"]
    for n in nodes:
        assert n.metadata.labels[virtual.VIRTUAL_LABEL] == "true"
        assert [g.index for g in n.status.gpus] == [0, 1, 2, 3]
        assert all(g.fake for g in n.status.gpus)
        assert n.status.heartbeat_time == START
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)


def test_an_attempt_runs_for_its_scaled_duration(database: db.Database) -> None:
    clock = FakeTime()
    agent = make_agent(database, clock)
    bind(database, "train", {virtual.DURATION_ANNOTATION: "30", virtual.EXIT_CODE_ANNOTATION: "3"})
    step(agent)
    running = attempt(database, "train")
    assert (running.phase, running.start_time) == ("Running", START)
    assert agent.next_wake(next_beat=100) == pytest.approx(3.0)  # 30 s at time scale 10
    clock.seconds = 2.9
    step(agent)
    assert attempt(database, "train").phase == "Running"
    clock.seconds = 3.2  # woken a little late: the finish time is still the simulated one
    agent.sync()  # the timer alone names the attempt
    done = attempt(database, "train")
    assert (done.phase, done.exit_code, done.reason) == ("Exited", 3, "Error")
    assert done.finish_time == START + timedelta(seconds=3)


class TickingTime(FakeTime):
    """A loaded host: every reading of the wall clock is 10 ms later than the one before."""

    def wall(self) -> datetime:
        self.seconds += 0.01
        return super().wall()


def test_the_attempts_a_pass_starts_start_at_one_moment(database: db.Database) -> None:
    """As the members of a multi-node attempt start together: read one by one, a loaded host
    had them start apart, and a replay at a time scale of 1,000 counted the gap, in trace
    seconds, on each of their GPUs."""
    clock = TickingTime()
    agent = make_agent(database, clock)
    with database.write() as session:
        writer = store.Store(session)
        for name, node_name in (("a", "vnode-0001"), ("b", "vnode-0002")):
            annotations = {virtual.DURATION_ANNOTATION: "30"}
            owner = writer.create(
                job.Job(
                    metadata=meta.ObjectMeta(name=name, annotations=annotations),
                    spec=job.JobSpec(command="true"),
                )
            )
            bind_first_attempt(writer, owner, node_name, [0], [])
    step(agent)
    a, b = attempt(database, "a"), attempt(database, "b")
    assert (a.phase, b.phase) == ("Running", "Running")
    assert a.start_time == b.start_time


def test_an_attempt_bound_after_one_stopped_in_the_same_pass_starts_once_it_ended(
    database: db.Database,
) -> None:
    """The pass is one moment: the stop ends the first then, and the second starts then, never
    before the first's end (with the clock read at each step, a loaded host had the second
    start before the first's recorded end)."""
    clock = TickingTime()
    agent = make_agent(database, clock)
    first = bind(database, "first", {virtual.DURATION_ANNOTATION: "1e6"})
    bind(database, "second", {virtual.DURATION_ANNOTATION: "10"}, after=[first])
    step(agent)
    ask_to_stop(database, "first")
    step(agent)
    ended, started = attempt(database, "first"), attempt(database, "second")
    assert (ended.phase, started.phase) == ("Exited", "Running")
    assert ended.finish_time is not None
    assert started.start_time is not None
    assert started.start_time >= ended.finish_time


def test_a_stop_request_ends_the_attempt_as_sigterm_would(database: db.Database) -> None:
    clock = FakeTime()
    agent = make_agent(database, clock)
    bind(database, "long", {virtual.DURATION_ANNOTATION: "1e6"})
    step(agent)
    ask_to_stop(database, "long")
    clock.seconds = 5
    step(agent)
    done = attempt(database, "long")
    assert (done.phase, done.exit_code, done.signal) == ("Exited", 143, "SIGTERM")
    assert (done.reason, done.finish_time) == (binding.STOP_PREEMPTED, START + timedelta(seconds=5))


def test_a_restarted_agent_adopts_running_attempts(database: db.Database) -> None:
    clock = FakeTime()
    bind(database, "train", {virtual.DURATION_ANNOTATION: "50"})
    step(make_agent(database, clock))
    clock.seconds = 2
    again = make_agent(database, clock)  # a new process knows nothing of the attempt
    step(again)
    assert attempt(database, "train").phase == "Running"
    clock.seconds = 5
    again.sync()
    assert attempt(database, "train").finish_time == START + timedelta(seconds=5)


def test_an_attempt_bound_ahead_starts_when_the_one_before_ends(database: db.Database) -> None:
    clock = FakeTime()
    agent = make_agent(database, clock)
    first = bind(database, "first", {virtual.DURATION_ANNOTATION: "20"})
    bind(database, "second", {virtual.DURATION_ANNOTATION: "10"}, after=[first])
    step(agent)
    assert (attempt(database, "first").phase, attempt(database, "second").phase) == (
        "Running",
        "Pending",
    )
    assert agent.next_wake(next_beat=100) == pytest.approx(2.0)
    clock.seconds = 2.5  # woken late: the first ended at its simulated time, the second starts now
    agent.sync()  # the first's timer alone: the attempt waiting for it is read with it
    ended, started = attempt(database, "first"), attempt(database, "second")
    assert (ended.phase, ended.finish_time) == ("Exited", START + timedelta(seconds=2))
    assert (started.phase, started.start_time) == ("Running", START + timedelta(seconds=2.5))


def test_a_chain_of_attempts_bound_ahead_runs_one_after_another(database: db.Database) -> None:
    """`second` was placed on its freed GPU in the pass that bound `third` ahead of it: both
    wait, and each starts when the one before it ends, on timers alone."""
    clock = FakeTime()
    agent = make_agent(database, clock)
    first = bind(database, "first", {virtual.DURATION_ANNOTATION: "10"})
    second = bind(database, "second", {virtual.DURATION_ANNOTATION: "10"}, after=[first])
    bind(database, "third", {virtual.DURATION_ANNOTATION: "10"}, after=[second])
    step(agent)
    phases = [attempt(database, n).phase for n in ("first", "second", "third")]
    assert phases == ["Running", "Pending", "Pending"]
    for seconds, running in ((1.0, "second"), (2.0, "third")):
        clock.seconds = seconds
        agent.sync()  # the timer of the one that ends names it, and what waits for it
        assert attempt(database, running).phase == "Running"
    clock.seconds = 3.0
    agent.sync()
    assert attempt(database, "third").finish_time == START + timedelta(seconds=3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "'soon' is not a number of seconds"),
        ("-1", "is not a finite, non-negative"),
        ("nan", "is not a finite, non-negative"),
        ("1e300", "1e+300 is more than a year (31536000 seconds)"),
        ("code 300", "'300' is not an exit code: give a whole number from 0 to 255"),
        ("code 99999999999999999999", "'99999999999999999999' is not an exit code"),
        ("code -1", "'-1' is not an exit code"),
    ],
)
def test_a_bad_duration_is_a_start_error(database: db.Database, value: str, message: str) -> None:
    """A Job stored with annotations `gctl apply` refuses (written by other means, or before
    apply checked them): its attempt ends, and the GPU is free; it does not hang Running."""
    agent = make_agent(database, FakeTime())
    code = value.removeprefix("code ")
    annotation = virtual.EXIT_CODE_ANNOTATION if code != value else virtual.DURATION_ANNOTATION
    bind(database, "bad", {annotation: code})
    step(agent)
    done = attempt(database, "bad")
    assert (done.phase, done.exit_code, done.reason) == ("Exited", 127, "StartError")
    assert message in (done.message or "")


def test_a_year_at_the_slowest_time_scale_still_has_an_end(database: db.Database) -> None:
    """A simulated year at time scale 1e-9 would end past the calendar: it ends when a year of
    real time has passed instead, and the other attempts run as usual."""
    clock = FakeTime()
    agent = virtual.VirtualAgent(
        database,
        nodes=2,
        gpus_per_node=4,
        time_scale=1e-9,
        clock=clock.wall,
        monotonic=clock.monotonic,
    )
    bind(database, "year", {virtual.DURATION_ANNOTATION: str(365 * 86_400)})
    step(agent)
    assert attempt(database, "year").phase == "Running"
    assert agent.next_wake(next_beat=10**12) == pytest.approx(365 * 86_400)


# -- one agent for these Nodes (nodeagent/ownership.py), as for a real one -----------------------


def held_by(database: db.Database) -> dict[str, str | None]:
    """Each Node's holder, by instance id."""
    with database.read() as session:
        found = store.Store(session).list_objects(node.Node)
    return {n.name: n.status.agent_instance.id if n.status.agent_instance else None for n in found}


def owned_agent(
    database: db.Database, state_dir: Path | None, clock: FakeTime, **kwargs: Any
) -> virtual.VirtualAgent:
    return virtual.VirtualAgent(
        database,
        nodes=2,
        gpus_per_node=4,
        clock=clock.wall,
        monotonic=clock.monotonic,
        state_dir=state_dir,
        **kwargs,
    )


@pytest.fixture
def made() -> Iterator[list[virtual.VirtualAgent]]:
    """Agents a test made: their state directories let go of after it."""
    agents: list[virtual.VirtualAgent] = []
    yield agents
    for each in agents:
        each.abandon()


def test_virtual_nodes_are_held_and_a_second_agent_on_this_host_refuses(
    database: db.Database, tmp_path: Path, made: list[virtual.VirtualAgent]
) -> None:
    """QA: a second `gctl agent run --simulate` for the same Nodes started beside the first,
    and rewrote their GPUs while the first acted for them."""
    clock = FakeTime()
    first = owned_agent(database, tmp_path / "a", clock)
    made.append(first)
    assert first.claim()
    first.heartbeat()
    assert held_by(database) == {"vnode-0001": first.instance.id, "vnode-0002": first.instance.id}
    with pytest.raises(ownership.Taken, match=r"node vnode-0001\.\.vnode-0002: another agent"):
        made.append(owned_agent(database, tmp_path / "a", clock))
    other = owned_agent(database, tmp_path / "b", clock)  # another host's, or another directory
    made.append(other)
    with pytest.raises(ownership.Taken) as refused:
        other.claim()
    assert str(refused.value).startswith("node vnode-0001: another agent is running for it")
    assert str(refused.value).endswith("give this one another --name-prefix")
    assert held_by(database)["vnode-0001"] == first.instance.id


def test_virtual_and_real_agents_refuse_each_others_nodes(
    database: db.Database, tmp_path: Path, made: list[virtual.VirtualAgent]
) -> None:
    """QA: a virtual agent named its Nodes as a live real agent's and took over its node: the
    real job was stopped and reported Succeeded at its simulated end."""
    real = agent.Agent(database, "vnode-0002", gpus.FakeGPUs(1), tmp_path / "real")
    try:
        real.claim()
        real.heartbeat()
        simulated = virtual.VirtualAgent(  # on the real clock, as the real agent's
            database, nodes=2, gpus_per_node=4, state_dir=tmp_path / "virtual"
        )
        made.append(simulated)
        with pytest.raises(ownership.Taken, match="node vnode-0002: another agent is running"):
            simulated.claim()
        assert held_by(database) == {"vnode-0002": real.instance.id}
    finally:
        real.close()
    simulated.claim()
    simulated.heartbeat()
    again = agent.Agent(database, "vnode-0001", gpus.FakeGPUs(1), tmp_path / "real")
    try:
        with pytest.raises(ownership.Taken, match="node vnode-0001: another agent is running"):
            again.claim()
    finally:
        again.abandon()


def test_a_virtual_agent_after_a_dead_one_takes_its_nodes_at_once(
    database: db.Database, tmp_path: Path, made: list[virtual.VirtualAgent]
) -> None:
    """Killed, its hold on the state directory goes with it; the next one there knows the
    Nodes' hold as its predecessor's, and does not wait for its heartbeat to go stale."""
    clock = FakeTime()
    dead = owned_agent(database, tmp_path / "state", clock)
    dead.claim()
    dead.heartbeat()
    dead.abandon()  # what the kernel does when it dies
    restarted = owned_agent(database, tmp_path / "state", clock)
    made.append(restarted)
    assert restarted.claim()
    restarted.heartbeat()
    assert set(held_by(database).values()) == {restarted.instance.id}


def test_a_stopped_virtual_agent_lets_go_of_its_nodes(
    database: db.Database, tmp_path: Path
) -> None:
    simulated = virtual.VirtualAgent(
        database, nodes=2, gpus_per_node=1, state_dir=tmp_path / "state"
    )
    stop = threading.Event()
    running = threading.Thread(target=simulated.run, args=(stop,))
    running.start()
    try:
        deadline = time.monotonic() + 30
        while set(held_by(database).values()) != {simulated.instance.id}:
            assert time.monotonic() < deadline, "the agent never held its Nodes"
            time.sleep(0.02)
    finally:
        stop.set()
        running.join(30)
    assert held_by(database) == {"vnode-0001": None, "vnode-0002": None}
    nxt = virtual.VirtualAgent(database, nodes=2, gpus_per_node=1, state_dir=tmp_path / "next")
    try:
        assert nxt.claim()  # at once: no one holds them
    finally:
        nxt.abandon()


def test_a_virtual_agent_whose_node_is_taken_over_stops(
    database: db.Database, tmp_path: Path, made: list[virtual.VirtualAgent]
) -> None:
    clock = FakeTime()
    first = owned_agent(database, tmp_path / "a", clock)
    made.append(first)
    first.claim()
    first.heartbeat()
    with database.write() as session:  # another agent took one over (it watched it silent)
        writer = store.Store(session)
        taken = writer.get(node.Node, "vnode-0002")
        taken.status.agent_instance = ownership.new_instance(10, 0, 0, clock.wall())
        writer.update_status(taken)
    with pytest.raises(ownership.Taken, match="node vnode-0002: another agent"):
        first.heartbeat()


def test_holders_silent_for_their_window_are_taken_over_one_after_another(
    database: db.Database,
    tmp_path: Path,
    made: list[virtual.VirtualAgent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each Node held by a different agent gone silent (one that held the first Node, another
    the second): both watched, both taken over; with no stop to watch with, not yet."""
    monkeypatch.setattr(node, "SILENT_MIN_S", 0.3)
    clock = FakeTime()
    owned_agent(database, None, clock).heartbeat()  # the Nodes, as a virtual agent made them
    with database.write() as session:
        writer = store.Store(session)
        for name in ("vnode-0001", "vnode-0002"):
            held = writer.get(node.Node, name)
            held.status.agent_instance = ownership.new_instance(0.1, 0, 0, clock.wall())
            held.status.heartbeat_time = clock.wall() - timedelta(minutes=5)
            writer.update_status(held)
    taker = owned_agent(database, tmp_path / "taker", clock)
    made.append(taker)
    assert not taker.claim()  # it would have to watch them: later, with a stop
    started = time.monotonic()
    assert taker.claim(threading.Event())
    assert time.monotonic() - started >= 2 * 0.3
    assert set(held_by(database).values()) == {taker.instance.id}


def test_the_default_lock_of_virtual_nodes_is_one_per_database() -> None:
    """Two simulations on one host, each on its own database (two replays), do not refuse
    each other; the same database's next virtual agent finds its predecessor's lock."""
    one = agent.default_virtual_state_dir("vnode", "/tmp/a/gctl.db")
    assert one == agent.default_virtual_state_dir("vnode", "/tmp/a/gctl.db")
    assert one != agent.default_virtual_state_dir("vnode", "/tmp/b/gctl.db")
    assert one.parent.name == "_virtual"
    assert one.name.startswith("vnode-")
