"""One agent per node (nodeagent/ownership.py), against a real database: a second agent for a
node refuses to start, by the state directory's lock on one host and by the Node's heartbeat
across hosts; a dead agent's lock never blocks, nor does a heartbeat this agent watched stand
still for the other agent's whole silence window. The hosts' clocks need not agree: an agent
whose clock is minutes off refuses a live agent's Node, and one taken over stops."""

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gctl.api import meta, node
from gctl.store import db, store
from nodeagent import agent, gpus, heartbeat, ownership

NOW = datetime.now(UTC)
SKEW = timedelta(minutes=2)  # QA's case: `faketime -f +120s gctl agent run ...`
SHORT_BEAT = 0.1  # seconds: a silence window of SHORT_SILENCE, where the test shortens it
SHORT_SILENCE = 0.5


class Agents:
    """Agents of node `nb` made by a test, each closed after it as a stopped agent is."""

    def __init__(self, database: db.Database, tmp_path: Path) -> None:
        self.database = database
        self.tmp_path = tmp_path
        self.made: list[agent.Agent] = []

    def __call__(
        self,
        state: str,
        clock: datetime | Callable[[], datetime] = NOW,
        heartbeat_seconds: float = 10,
        fence_seconds: float = 0,
        grace_seconds: float = 10,
    ) -> agent.Agent:
        """An agent with no fence unless asked (it runs no jobs here): taken over at its
        silence window alone."""
        made = agent.Agent(
            self.database,
            "nb",
            gpus.FakeGPUs(1),
            self.tmp_path / state,
            heartbeat_seconds=heartbeat_seconds,
            fence_seconds=fence_seconds,
            grace_seconds=grace_seconds,
            clock=clock if callable(clock) else lambda: clock,
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


def test_an_agent_killed_before_its_claim_does_not_block_the_next_one(
    agents: Agents, database: db.Database
) -> None:
    """Chaos QA: `gctl up` killed with SIGKILL again and again, one of them after it locked the
    state directory but before its claim committed. The Node still named the agent before it,
    which the lock file no longer did: the next restart was refused as "another agent", at
    once, its predecessor's heartbeat being fresh, and the node stayed without an agent."""
    crashed = agents("state")
    crashed.claim()
    crashed.heartbeat()
    crashed._state_lock.release()  # killed
    agents("state")._state_lock.release()  # killed before its claim
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


@pytest.fixture
def short_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents beating every SHORT_BEAT go silent after SHORT_SILENCE, not 10 s."""
    monkeypatch.setattr(node, "SILENT_MIN_S", SHORT_SILENCE)


@pytest.mark.parametrize(
    ("taken_at", "back_at"),
    [
        (NOW + timedelta(seconds=31), NOW + timedelta(seconds=32)),
        (NOW + SKEW, NOW + timedelta(seconds=1)),
    ],
    ids=["clocks-in-step", "the-second-agents-clock-2-minutes-ahead"],
)
def test_a_silent_agent_is_taken_over_once_watched_and_stops_if_it_comes_back(
    agents: Agents,
    database: db.Database,
    short_silence: None,
    taken_at: datetime,
    back_at: datetime,
) -> None:
    """The first agent went silent: the second, its clock past the first's heartbeat by more
    than the silence window, takes the Node only once it watched the heartbeat stand still for
    the whole window on its own clock. The first, back, finds the Node taken at its next
    heartbeat and must stop, whatever its clock says (QA: one whose clock was behind never
    noticed, and both ran the same jobs)."""
    first = agents("host-a", heartbeat_seconds=SHORT_BEAT)
    first.claim()
    first.heartbeat()
    second = agents("host-b", clock=taken_at)
    assert not second.claim()  # nothing to watch with: left as it is, for `run` to claim
    assert _instance(database) == first.instance
    began = time.monotonic()
    assert second.claim(threading.Event())
    assert time.monotonic() - began >= SHORT_SILENCE
    second.heartbeat()
    assert _instance(database) == second.instance
    first.clock = lambda: back_at
    with pytest.raises(ownership.Taken, match="another agent is running for it"):
        first.heartbeat()
    assert _instance(database) == second.instance


def test_a_silent_agent_is_taken_over_only_once_its_fence_has_stopped_its_jobs(
    agents: Agents, database: db.Database, short_silence: None
) -> None:
    """A silent agent's jobs run until its fence and their grace period are over: its Node
    is not taken over before then (and one heartbeat more), though its silence window ended
    long before; the new agent would report those attempts lost, and their Jobs would run
    again beside them."""
    first = agents("host-a", heartbeat_seconds=SHORT_BEAT, fence_seconds=1.0, grace_seconds=0.5)
    first.claim()
    first.heartbeat()
    stored = _instance(database)
    assert stored is not None
    assert (stored.fence_seconds, stored.grace_seconds) == (1.0, 0.5)
    second = agents("host-b", clock=NOW + timedelta(seconds=31))
    began = time.monotonic()
    assert second.claim(threading.Event())
    assert time.monotonic() - began >= 1.0 + 0.5 + SHORT_BEAT > SHORT_SILENCE
    assert _instance(database) == second.instance


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_an_agent_whose_clock_is_off_refuses_a_live_agents_node(
    agents: Agents, database: db.Database, skew: timedelta
) -> None:
    """QA's case: an agent whose clock was two minutes ahead took a live node (its heartbeat
    looked stale by that clock) and both agents started the same job. It now watches the
    heartbeat, sees it move, and refuses, saying how far apart the clocks are."""
    first = agents("host-a", clock=meta.utcnow, heartbeat_seconds=SHORT_BEAT)
    first.claim()
    first.heartbeat()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(SHORT_BEAT):
            first.heartbeat()

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    second = agents("host-b", clock=lambda: meta.utcnow() + skew)
    try:
        with pytest.raises(ownership.Taken) as refused:
            second.claim(threading.Event())
    finally:
        done.set()
        beating.join()
    theirs = first.instance
    how = "behind" if skew > timedelta(0) else "ahead of"
    said = re.fullmatch(
        f"node nb: another agent is running for it, on host {re.escape(theirs.hostname)} "
        rf"\(pid {theirs.pid}\), last heartbeat at \S+Z by its clock, (\d+)s {how} ours; stop "
        "it first, or give this one another --node-name",
        str(refused.value),
    )
    assert said is not None, str(refused.value)
    # The clocks' difference, and how long ago it beat: a moment, on a loaded host.
    assert 0 <= abs(int(said[1]) - SKEW.total_seconds()) <= 5
    assert _instance(database) == first.instance
    first.heartbeat()  # still its own


def test_a_heartbeat_that_moved_since_it_was_watched_is_not_taken_over(
    agents: Agents, database: db.Database
) -> None:
    """The takeover is a compare-and-set on the heartbeat watched: one that beat since the
    last look is alive."""
    first = agents("host-a", clock=meta.utcnow)
    first.claim()
    first.heartbeat()
    second = agents("host-b", clock=NOW + SKEW)
    watched = heartbeat.held(database, "nb", second.instance, frozenset())
    assert watched is not None
    assert watched.instance == first.instance
    first.heartbeat()
    with pytest.raises(ownership.Taken, match="another agent is running for it"):
        heartbeat.claim(database, "nb", second.instance, frozenset(), NOW + SKEW, silent=watched)
    assert _instance(database) == first.instance


def test_an_agent_stopped_while_it_watches_takes_nothing(
    agents: Agents, database: db.Database
) -> None:
    first = agents("host-a")
    first.claim()
    first.heartbeat()
    second = agents("host-b", clock=NOW + SKEW)
    stop = threading.Event()
    stop.set()
    assert not second.claim(stop)
    assert _instance(database) == first.instance


def test_an_agent_that_stops_lets_go_of_its_node(agents: Agents, database: db.Database) -> None:
    """And leaves how long its jobs run on without it, for the controller to wait that long
    before it retries them elsewhere (controller/nodes.py)."""
    first = agents("host-a", fence_seconds=30, grace_seconds=5)
    first.claim()
    first.heartbeat()
    first.close()
    assert _instance(database) is None
    with database.read() as session:
        left = store.Store(session).get(node.Node, "nb").status
    assert left.jobs_outlive_seconds == 30 + 5 + 10  # fence, grace period, one heartbeat
    second = agents("host-b", clock=NOW + timedelta(seconds=1))
    second.claim()
    assert _instance(database) == second.instance


def test_a_gone_agent_of_this_host_is_watched_not_refused(
    agents: Agents, database: db.Database, short_silence: None
) -> None:
    """QA: an agent's state directory lock file emptied (a power cut may, or a hand), so that
    the next agent there did not know the Node's holder for its dead predecessor: refused at
    once as "another agent is running", pid and all, on this very host. An agent of this host
    whose process is gone is watched like a silent one, and taken over after its window."""
    first = agents("host-a", heartbeat_seconds=SHORT_BEAT)
    first.claim()
    first.heartbeat()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    with database.write() as session:
        writer = store.Store(session)
        held = writer.get(node.Node, "nb")
        assert held.status.agent_instance is not None
        held.status.agent_instance.pid = gone.pid
        writer.update_status(held)
    second = agents("host-b")  # its heartbeat looks fresh
    assert not second.claim()  # to be watched, with a stop: not refused
    assert second.claim(threading.Event())
    assert _instance(database) == second.instance


def test_the_state_directory_lock_file_is_on_disk_before_the_agent_acts(
    agents: Agents, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    made = agents("state")
    made.claim()
    lock = made._state_lock._fd
    assert lock is not None
    assert synced.count(lock) == 2  # taken, then claimed


def test_a_silent_agent_whose_jobs_outlive_it_longer_is_watched_that_long(
    agents: Agents, database: db.Database, short_silence: None
) -> None:
    """Jobs it adopted from an agent with a longer fence than its own run on that long (the
    Node records it): the Node is taken over only then (review)."""
    first = agents("host-a", heartbeat_seconds=SHORT_BEAT)
    first.claim()
    first.heartbeat()
    with database.write() as session:
        writer = store.Store(session)
        held = writer.get(node.Node, "nb")
        held.status.jobs_outlive_seconds = 3 * SHORT_SILENCE
        writer.update_status(held)
    second = agents("host-b", clock=NOW + timedelta(seconds=31))
    began = time.monotonic()
    assert second.claim(threading.Event())
    assert time.monotonic() - began >= 3 * SHORT_SILENCE
