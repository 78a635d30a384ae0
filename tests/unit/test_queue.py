"""A pool's queue from stored Jobs (gctl.api.queue): which Jobs are in it, as the scheduler
decides, and their places as `get jobs -o wide` and `describe job` number them."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gctl.api import queue

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _job(name: str, priority: int = 0, phase: str = "Pending", **fields: Any) -> queue.Wire:
    """A stored Job; `fields` go to its spec, but `retryAfter`, `deleting` and `status`."""
    status: dict[str, Any] = {"phase": phase, **fields.pop("status", {})}
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if retry := fields.pop("retryAfter", None):
        status["retryAfter"] = retry.isoformat()
    if fields.pop("deleting", False):
        metadata["deletionTimestamp"] = NOW.isoformat()
    spec = {"command": ["true"], "priority": priority, **fields}
    return {"kind": "Job", "metadata": metadata, "spec": spec, "status": status}


def _sweep(name: str, phase: str, observed: int | None = 1) -> queue.Wire:
    return {
        "kind": "Sweep",
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"items": ["a"], "template": {"spec": {"command": ["true"]}}},
        "status": {"phase": phase, "observedGeneration": observed},
    }


@pytest.mark.parametrize(
    ("why", "wire", "held"),
    [
        ("plain", _job("a"), False),
        ("suspended", _job("a", suspend=True), True),
        ("being deleted", _job("a", deleting=True), True),
        ("backing off", _job("a", retryAfter=NOW + timedelta(seconds=10)), True),
        ("back-off over", _job("a", retryAfter=NOW - timedelta(seconds=1)), False),
        ("waits for a Job", _job("a", dependsOn=["train"]), True),
        ("its dependency succeeded", _job("a", dependsOn=["done"]), False),
        ("one of two succeeded", _job("a", dependsOn=["done", "train"]), True),
    ],
)
def test_held_jobs_are_those_the_scheduler_leaves_alone(
    why: str, wire: queue.Wire, held: bool
) -> None:
    assert queue.held(wire, NOW, {("default", "done")}) is held, why
    assert queue.queued(wire, NOW, {("default", "done")}) is not held, why


def test_only_queued_jobs_are_numbered() -> None:
    """QA's case: a Job waiting for dependsOn (priority 100) and one in back-off (priority 50)
    were numbered 1 and 2, and the only Job the scheduler considered 3."""
    jobs = [
        _job("aa-waiter", 100, dependsOn=["ghost"]),
        _job("flaky", 50, retryAfter=NOW + timedelta(seconds=20), status={"failed": 1}),
        _job("paused", 60, suspend=True),
        _job("running", 70, phase="Running"),
        _job("after-done", 10, dependsOn=["done"]),
        _job("zz-big"),
        _job("done", 5, phase="Succeeded"),
    ]
    succeeded = queue.succeeded(jobs)
    assert queue.positions(jobs, NOW, succeeded) == {
        ("default", "after-done"): 1,
        ("default", "zz-big"): 2,
    }
    later = NOW + timedelta(seconds=30)  # flaky's back-off is over: it is queued again
    assert queue.positions(jobs, later, succeeded)[("default", "flaky")] == 1


def test_a_longest_first_pool_numbers_the_longest_time_limit_first() -> None:
    """Priority first; then, in a LongestFirst pool, the longest activeDeadlineSeconds (none
    counts as longest; one past what apply accepts counts as none), then the oldest; a FIFO
    pool beside it keeps its order."""
    jobs = [
        _job("old-short", activeDeadlineSeconds=60),
        _job("urgent", 5, activeDeadlineSeconds=1),
        _job("long", activeDeadlineSeconds=3600),
        _job("open"),
        _job("stale", activeDeadlineSeconds=10**20),
        _job("fifo-short", pool="other", activeDeadlineSeconds=60),
        _job("fifo-long", pool="other", activeDeadlineSeconds=3600),
    ]
    for place, wire in enumerate(jobs):
        wire["metadata"]["creationTimestamp"] = (NOW + timedelta(seconds=place)).isoformat()
    pools = [{"metadata": {"name": "default"}, "spec": {"queueOrder": "LongestFirst"}}]
    pools.append({"metadata": {"name": "other"}, "spec": {}})
    places = queue.positions(jobs, NOW, set(), queue.orders(pools))
    ranked = sorted(places, key=lambda k: (queue.pool_of(_named(jobs, k[1])), places[k]))
    assert [name for _, name in ranked] == [
        "urgent",
        "open",
        "stale",
        "long",
        "old-short",
        "fifo-short",
        "fifo-long",
    ]


def _named(jobs: list[queue.Wire], name: str) -> queue.Wire:
    return next(w for w in jobs if w["metadata"]["name"] == name)


def test_what_pending_jobs_wait_for() -> None:
    jobs = [
        _job("a", dependsOn=["x", "y"]),
        _job("b", phase="Running", dependsOn=["z"]),  # started: it waits for nothing now
        _job("c", suspend=True, dependsOn=["w"]),
    ]
    assert queue.needed(jobs) == {("default", "x"), ("default", "y"), ("default", "w")}


def test_a_dependency_succeeded_as_the_scheduler_counts_it() -> None:
    """A Job once Succeeded; a Sweep once Succeeded for its current generation; a name is a
    Job first, so a Sweep of the name of a Job that has not succeeded does not count."""
    found = [
        _job("train", phase="Succeeded"),
        _job("eval", phase="Running"),
        _sweep("grid", "Succeeded"),
        _sweep("changed", "Succeeded", observed=None),
        _sweep("eval", "Succeeded"),
        _sweep("lr", "Running"),
    ]
    assert queue.succeeded(found) == {("default", "train"), ("default", "grid")}


# -- Jobs stored in a form gctl refuses (an older gctl wrote them, or a hand edit) -----------

_SPEC_LIST = {**_job("a"), "spec": []}
_DEPENDS_NUMBER = _job("a", dependsOn=5)
_RETRY_NUMBER = _job("a", status={"retryAfter": 5})  # validates only as a number of seconds


@pytest.mark.parametrize(
    ("why", "wire"),
    [
        ("a spec that is a list", _SPEC_LIST),
        ("dependsOn a number", _DEPENDS_NUMBER),
        ("retryAfter a number", _RETRY_NUMBER),
        ("a priority that is a word", _job("a", priority="high")),  # type: ignore[arg-type]
    ],
)
def test_a_job_the_queue_cannot_read_is_out_of_it(why: str, wire: queue.Wire) -> None:
    """`get` numbers and counts the others: it is not queued, has no place, waits for
    nothing that must be looked up."""
    assert not queue.queued(wire, NOW, set()), why
    assert queue.positions([wire, _job("b")], NOW, set()) == {("default", "b"): 1}, why
    assert queue.needed([wire, _job("c", dependsOn=["x"])]) == {("default", "x")}, why


@pytest.mark.parametrize("wire", [_SPEC_LIST, _DEPENDS_NUMBER, _RETRY_NUMBER])
def test_the_scheduling_pass_reads_the_queue_strictly(wire: queue.Wire) -> None:
    """Held for the CLI; for the scheduling pass (`strict`) an error, which makes it set that
    Job aside (controller.reading.raise_invalid)."""
    assert queue.held(wire, NOW, set())
    with pytest.raises(queue.UNREADABLE):
        queue.held(wire, NOW, set(), strict=True)
    if wire is not _RETRY_NUMBER:  # what it needs is in its spec
        with pytest.raises(queue.UNREADABLE):
            queue.needed([wire], strict=True)


def test_a_dependency_the_queue_cannot_read_has_not_succeeded() -> None:
    broken = {**_job("train", phase="Succeeded"), "status": ["Succeeded"]}
    assert queue.succeeded([broken, _job("eval", phase="Succeeded")]) == {("default", "eval")}


def test_a_pool_the_queue_cannot_read_orders_its_queue_fifo() -> None:
    pools = [{"metadata": {"name": "p"}, "spec": []}]
    pools.append({"metadata": {"name": "q"}, "spec": {"queueOrder": "LongestFirst"}})
    assert queue.orders(pools) == {"q": "LongestFirst"}
