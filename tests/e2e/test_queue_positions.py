"""End-to-end: the place in its pool's queue that `get jobs -o wide` (POS) and `describe job`
print, for the Jobs the scheduler queues and for those it leaves alone (suspended, in
back-off, waiting for dependsOn), which have none, as in Kueue's visibility API.

The real console script runs against SQLite and PostgreSQL; the Jobs are written in-process
through the Store, as the controller would leave them: no daemon runs."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gctl.api import job, meta, pool, sweep
from gctl.store import db
from tests.builders import make_job
from tests.conftest import Gctl
from tests.e2e.test_draining import put


def _pending(name: str, priority: int = 0, **status: Any) -> job.Job:
    made = make_job(name).priority(priority).build()
    made.status = job.JobStatus(**status)
    return made


def _waiting_for(name: str, priority: int, *needs: str) -> job.Job:
    made = _pending(name, priority, reason=job.REASON_WAITING_DEPENDENCIES)
    made.spec.depends_on = list(needs)
    return made


def _sweep(name: str) -> sweep.Sweep:
    """A Sweep that has succeeded, for the generation it has."""
    return sweep.Sweep.model_validate(
        {
            "apiVersion": "gctl/v1",
            "kind": "Sweep",
            "metadata": {"name": name},
            "spec": {"items": ["a"], "template": {"spec": {"command": ["true"]}}},
            "status": {"phase": "Succeeded", "observedGeneration": 1},
        }
    )


@pytest.fixture
def queue_of_seven(database: db.Database) -> None:
    """QA's queue, and more: three Jobs out of it ahead of three in it, by priority."""
    suspended = _pending("paused", 90)
    suspended.spec.suspend = True
    later = datetime.now(UTC) + timedelta(minutes=5)
    put(
        database,
        _waiting_for("aa-waiter", 100, "ghost"),
        suspended,
        _pending("flaky", 50, failed=1, retry_after=later, reason=job.REASON_BACKOFF),
        _pending("train", 5, phase="Succeeded"),
        _sweep("grid"),
        _waiting_for("after-train", 20, "train"),
        _waiting_for("after-grid", 10, "grid"),
        _pending("zz-big"),
    )


def _positions(out: str) -> dict[str, str]:
    header, *lines = out.splitlines()
    pos = header.split().index("POS")
    return {line.split()[0]: line.split()[pos] for line in lines}


@pytest.mark.usefixtures("queue_of_seven")
@pytest.mark.parametrize("scope", [[], ["-n", "default"]])
def test_only_queued_jobs_have_a_position(gctl: Gctl, scope: list[str]) -> None:
    positions = _positions(gctl.ok("get", "jobs", "-o", "wide", *scope))
    assert positions == {
        "aa-waiter": "<none>",
        "paused": "<none>",
        "flaky": "<none>",
        "train": "<none>",
        "after-train": "1",
        "after-grid": "2",
        "zz-big": "3",
    }
    named = _positions(gctl.ok("get", "jobs", "zz-big", "flaky", "-o", "wide", *scope))
    assert named == {"flaky": "<none>", "zz-big": "3"}


@pytest.mark.usefixtures("queue_of_seven")
def test_describe_numbers_the_queue_as_get_does(gctl: Gctl) -> None:
    assert "Queue:        position 3 in pool default" in gctl.ok("describe", "job", "zz-big")
    for held in ("aa-waiter", "flaky", "paused"):
        out = gctl.ok("describe", "job", held)
        assert "Queue:" not in out, held
        assert "Queue Position" not in out, held


@pytest.mark.parametrize("scope", [[], ["-n", "default"]])
def test_a_longest_first_pool_is_numbered_longest_first(
    gctl: Gctl, database: db.Database, scope: list[str]
) -> None:
    """`get jobs -o wide` and `describe job` number a LongestFirst pool's queue by time limit
    (none counts as longest), as the scheduling pass orders it; a FIFO pool beside it keeps
    its order."""
    spec = pool.GPUPoolSpec(queue_order="LongestFirst")
    put(database, pool.GPUPool(metadata=meta.ObjectMeta(name="batch"), spec=spec))
    for name, limit, where in (
        ("short", 60, "batch"),
        ("long", 3600, "batch"),
        ("open", None, "batch"),
        ("fifo-short", 60, None),
        ("fifo-long", 3600, None),
    ):
        made = _pending(name)
        made.spec.active_deadline_seconds = limit
        made.spec.pool = where
        put(database, made)  # one at a time: each is older than the next
    positions = _positions(gctl.ok("get", "jobs", "-o", "wide", *scope))
    assert positions == {
        "short": "3",
        "long": "2",
        "open": "1",
        "fifo-short": "1",
        "fifo-long": "2",
    }
    assert "Queue:        position 2 in pool batch (longest time limit first)\n" in gctl.ok(
        "describe", "job", "long"
    )
    assert "Queue:        position 3 in pool batch (longest" in gctl.ok("describe", "job", "short")
    assert "Queue:        position 2 in pool default\n" in gctl.ok("describe", "job", "fifo-long")
