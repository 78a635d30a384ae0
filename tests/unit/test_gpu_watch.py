"""Which rows `gctl get gpus -w` prints again: those whose jobs, state, foreign processes or GPU
change, not those whose readings alone do; and a change the listing already held never takes
a row back in time."""

from typing import Any

from gctl.cli import gpus
from gctl.store import store

Wire = dict[str, Any]


def _node(version: int, utilization: int = 0, **spec: Any) -> Wire:
    return {
        "metadata": {"name": "n1", "resourceVersion": str(version)},
        "spec": spec,
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "gpus": [
                {"index": i, "uuid": f"u{i}", "model": "A100", "utilization": utilization}
                for i in range(2)
            ],
        },
    }


def _bound(job: str, version: int, phase: str = "Running", after: list[str] | None = None) -> Wire:
    return {
        "metadata": {"name": f"{job}-1", "namespace": "default", "resourceVersion": str(version)},
        "spec": {"jobName": job, "node": "n1", "gpus": [0], "after": after or []},
        "status": {"phase": phase},
    }


def _change(kind: str, wire: Wire, kind_of: str = "MODIFIED") -> store.Change:
    revision = int(wire["metadata"]["resourceVersion"])
    meta = wire["metadata"]
    return store.Change(
        0, revision, kind_of, kind, meta.get("namespace", ""), meta["name"], "", wire
    )


def _started(nodes: list[Wire], bindings: list[Wire]) -> gpus.Tracker:
    tracker = gpus.Tracker(lambda _node: True)
    tracker.start(nodes, bindings)
    assert len(tracker.changed(tracker.nodes)) == 2  # the listing: every row
    return tracker


def _printed(tracker: gpus.Tracker, *changes: store.Change) -> list[tuple[int, str, list[str]]]:
    return [
        (row["index"], row["status"], [j["name"] for j in row["jobs"]])
        for row in tracker.changed(tracker.apply(changes))
    ]


def test_readings_alone_print_nothing_and_state_and_jobs_do() -> None:
    tracker = _started([_node(1)], [])

    assert _printed(tracker, _change("Node", _node(2, utilization=97))) == []
    assert _printed(tracker, _change("Node", _node(3, cordonedGPUs=[1]))) == [(1, "Cordoned", [])]
    assert _printed(tracker, _change("Binding", _bound("a", 4, "Pending"))) == [(0, "Ready", ["a"])]
    assert _printed(tracker, _change("Binding", _bound("a", 5, "Running"))) == []
    assert _printed(tracker, _change("Binding", _bound("a", 6, "Exited"))) == [(0, "Ready", [])]


def test_a_job_bound_ahead_prints_nothing_until_it_holds_the_gpu() -> None:
    tracker = _started([_node(1)], [_bound("a", 2)])
    ahead = _bound("b", 3, "Pending", after=["uid-a"])

    assert _printed(tracker, _change("Binding", ahead)) == []
    done, started = _bound("a", 4, "Exited"), _bound("b", 5, "Starting", after=["uid-a"])
    assert _printed(tracker, _change("Binding", done), _change("Binding", started)) == [
        (0, "Ready", ["b"])
    ]


def test_a_change_the_listing_held_already_is_skipped() -> None:
    """The Bindings are listed after the Nodes, and the watch replays from the Nodes' revision:
    a Binding's older version must not bring back a job that has ended."""
    running, ended = _bound("a", 3), _bound("a", 5, "Exited")
    tracker = _started([_node(2)], [ended])

    assert _printed(tracker, _change("Binding", running), _change("Binding", ended)) == []
    assert _printed(tracker, _change("Node", _node(2, cordonedGPUs=[0]))) == []  # as listed


def test_a_deleted_node_prints_nothing_and_comes_back_whole() -> None:
    tracker = _started([_node(1)], [])

    assert _printed(tracker, _change("Node", _node(2), "DELETED")) == []
    back = _node(3)
    assert [row[0] for row in _printed(tracker, _change("Node", back, "ADDED"))] == [0, 1]
