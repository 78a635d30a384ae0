"""The agent's loop against a real database: a pass that fails does not silence the node."""

import threading
import time
from pathlib import Path

import sqlalchemy

from controller import scheduling
from gctl.api import binding, node
from gctl.store import db, store, tables
from nodeagent import agent, gpus
from tests.builders import make_job

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
