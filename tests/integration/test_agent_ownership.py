"""One agent per node (nodeagent/ownership.py), against a real database: a second agent for a
node refuses to start, by the state directory's lock on one host and by the Node's fresh
heartbeat across hosts; a dead agent's lock or stale heartbeat never blocks."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gctl.api import node
from gctl.store import db, store
from nodeagent import agent, gpus, ownership

NOW = datetime.now(UTC)


class Agents:
    """Agents of node `nb` made by a test, each closed after it as a stopped agent is."""

    def __init__(self, database: db.Database, tmp_path: Path) -> None:
        self.database = database
        self.tmp_path = tmp_path
        self.made: list[agent.Agent] = []

    def __call__(self, state: str, clock: datetime = NOW) -> agent.Agent:
        made = agent.Agent(
            self.database,
            "nb",
            gpus.FakeGPUs(1),
            self.tmp_path / state,
            heartbeat_seconds=10,
            clock=lambda: clock,
        )
        self.made.append(made)
        return made


@pytest.fixture
def agents(database: db.Database, tmp_path: Path) -> Iterator[Agents]:
    made = Agents(database, tmp_path)
    yield made
    for each in made.made:
        each.runtime.close()
        each._state_lock.release()


def _instance(database: db.Database) -> node.AgentInstance | None:
    with database.read() as session:
        return store.Store(session).get(node.Node, "nb").status.agent_instance


def test_a_second_agent_on_the_same_state_directory_refuses_to_start(agents: Agents) -> None:
    agents("state")
    with pytest.raises(ownership.Taken, match=r"another agent \(pid \d+\) is running with "):
        agents("state")


def test_an_agent_whose_predecessor_died_on_its_state_directory_starts_at_once(
    agents: Agents, database: db.Database
) -> None:
    """A crashed agent (killed: its lock let go by the kernel, its heartbeat still fresh)
    never blocks its restart."""
    crashed = agents("state")
    crashed.claim()
    crashed.heartbeat()
    crashed._state_lock.release()  # what the kernel does when it dies
    restarted = agents("state")
    restarted.claim()
    restarted.heartbeat()
    assert _instance(database) == restarted.instance


def test_an_agent_of_another_host_refuses_a_node_whose_heartbeat_is_fresh(
    agents: Agents, database: db.Database
) -> None:
    first = agents("host-a")
    first.claim()
    first.heartbeat()
    second = agents("host-b", clock=NOW + timedelta(seconds=4))
    theirs = first.instance
    with pytest.raises(ownership.Taken) as refused:
        second.claim()
    assert str(refused.value) == (
        f"node nb: another agent is running for it, on host {theirs.hostname} (pid "
        f"{theirs.pid}), last heartbeat 4s ago; stop it first, or give this one another "
        "--node-name"
    )
    assert _instance(database) == theirs


def test_a_stale_heartbeat_does_not_block_and_its_agent_stops_if_it_comes_back(
    agents: Agents, database: db.Database
) -> None:
    """The first agent went silent for longer than three of its heartbeats: the second takes
    the Node. The first, back, finds it taken at its next heartbeat and must stop."""
    first = agents("host-a")
    first.claim()
    first.heartbeat()
    second = agents("host-b", clock=NOW + timedelta(seconds=31))
    second.claim()
    second.heartbeat()
    assert _instance(database) == second.instance
    first.clock = lambda: NOW + timedelta(seconds=32)
    with pytest.raises(ownership.Taken, match="another agent is running for it"):
        first.heartbeat()


def test_an_agent_that_stops_lets_go_of_its_node(agents: Agents, database: db.Database) -> None:
    first = agents("host-a")
    first.claim()
    first.heartbeat()
    first.close()
    assert _instance(database) is None
    second = agents("host-b", clock=NOW + timedelta(seconds=1))
    second.claim()
    assert _instance(database) == second.instance
