"""A scheduling pass leaves out the stored objects that do not validate (an older gctl wrote
them, or a hand edit in the database) and schedules the rest, on SQLite and PostgreSQL: a
pending Job waits out of the queue, a Node takes no Jobs, a GPUPool or GPUProfile is as if it
were not there (its Jobs are told why), and the Node of an active Binding takes nothing new."""

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from controller import manager, reading, scheduling
from gctl.api import binding, errors, job, meta, node, pool, profile
from gctl.store import db, store
from tests.builders import corrupt, make_binding, make_job, put_ready_node, stored, warnings_about

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UNLIMITED = scheduling.Limits(seconds=None)


def _pass(database: db.Database, aside: reading.SetAside) -> None:
    """Passes until one leaves nothing for the next (one that starts Jobs leaves telling the
    waiting ones why to the next)."""
    for _ in range(5):
        due = store.transact(database, lambda w: scheduling.schedule(w, T0, UNLIMITED, aside))
        if due not in (T0, T0 + scheduling.FOLLOW_UP):
            return


def _create(database: db.Database, *objects: Any, nodes: dict[str, int]) -> None:
    with database.write() as session:
        writer = store.Store(session)
        for name, gpus in nodes.items():
            put_ready_node(writer, name, gpus, T0)
        for obj in objects:
            writer.create(obj)


def _no_binding_ahead() -> pool.GPUPool:
    return pool.GPUPool(
        metadata=meta.ObjectMeta(name="default"), spec=pool.GPUPoolSpec(bind_ahead=False)
    )


def _waiting(database: db.Database, name: str) -> tuple[str, str]:
    found = stored(database, job.Job, name)
    said = next(c for c in found.status.conditions if c.type == job.CONDITION_SCHEDULED)
    return said.reason or "", said.message or ""


def _bound(database: db.Database, name: str) -> tuple[str, list[int]]:
    attempt = stored(database, binding.Binding, f"{name}-1")
    return attempt.spec.node, attempt.spec.gpus


def test_the_controller_leaves_a_pending_job_that_does_not_validate_out_of_its_passes(
    database: db.Database,
) -> None:
    """The controller's own loop: the bad Job, first in the queue, would take the only GPU; the
    pass that meets it as it writes is set aside, and the next one, at once (not in a minute),
    binds the good Job. One Warning Event on the bad one."""
    _create(database, make_job("bad").build(), nodes={"n1": 1})
    _create(database, make_job("good").build(), nodes={})
    corrupt(database, "Job", "bad", spec={"command": ["true"], "colour": "blue"})
    controller = manager.Controller(database)
    stop = threading.Event()
    loop = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while stored(database, job.Job, "good").status.phase == "Pending":
            assert time.monotonic() < deadline, "the good Job was never bound"
            time.sleep(0.05)
        time.sleep(1.5)  # a pass or two more, which must not report it again
    finally:
        stop.set()
        loop.join(timeout=10)
    assert _bound(database, "good") == ("n1", [0])
    with database.read() as session:
        raw = store.Store(session).list_wire(job.Job, "default", names=["bad"])[0]
    assert raw["status"].get("phase", "Pending") == "Pending"
    assert warnings_about(database, "bad") == [
        (
            manager.REASON_INVALID,
            "stored Job does not validate (spec.colour: unknown field); left alone until it "
            "changes",
            1,
        )
    ]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"command": ["true"], "resources": {"gpus": "lots"}}, r"spec\.resources\.gpus"),
        # What the queue itself cannot read, which `get` leaves out of it (gctl.api.queue):
        ([], r"\(spec:"),
        ({"command": ["true"], "dependsOn": 5}, r"spec\.dependsOn"),
    ],
)
def test_a_malformed_pending_job_fails_a_pass_once_and_is_then_left_out(
    database: db.Database, spec: Any, field: str
) -> None:
    """A value the planner cannot even read (a GPU count that is not a number, a spec that is
    no mapping) fails as one that does not validate, naming the Job, not as a traceback of
    the planner."""
    _create(database, make_job("bad").build(), make_job("good").build(), nodes={"n1": 1})
    corrupt(database, "Job", "bad", spec=spec)
    with pytest.raises(errors.StoredInvalid, match=rf'job "bad" .*{field}') as failed:
        _pass(database, reading.SetAside())
    versions = {failed.value.key: failed.value.resource_version}
    _pass(database, reading.SetAside(versions))
    assert _bound(database, "good") == ("n1", [0])


def test_a_pending_job_that_validates_only_loosely_is_left_out_too(
    database: db.Database,
) -> None:
    """A back-off end stored as a number passes pydantic's lenient check (it converts it) but
    breaks the queue's reading: the pass checks it strictly, as the JSON it is stored as."""
    _create(database, make_job("bad").build(), make_job("good").build(), nodes={"n1": 1})
    corrupt(database, "Job", "bad", status={"phase": "Pending", "retryAfter": 5})
    with pytest.raises(errors.StoredInvalid, match=r'job "bad" .*status\.retryAfter') as failed:
        _pass(database, reading.SetAside())
    _pass(database, reading.SetAside({failed.value.key: failed.value.resource_version}))
    assert _bound(database, "good") == ("n1", [0])


def test_a_node_that_does_not_validate_takes_no_jobs(database: db.Database) -> None:
    """And those that wait are told why (in a pool that does not bind ahead)."""
    _create(database, _no_binding_ahead(), make_job("one").build(), nodes={"n1": 1, "n2": 1})
    corrupt(database, "Node", "n1", spec={"unschedulable": "sometimes"})
    aside = reading.SetAside()
    _pass(database, aside)
    assert _bound(database, "one") == ("n2", [0])
    assert {exc.key for exc in aside.found} == {("Node", "", "n1")}
    _create(database, make_job("two").build(), nodes={})
    _pass(database, aside)
    assert _waiting(database, "two") == (
        job.REASON_UNSCHEDULABLE,
        "0/2 GPUs fit: 1 in use, 1 on a node that does not validate",
    )


def test_jobs_of_a_pool_that_does_not_validate_are_told_why_and_others_run(
    database: db.Database,
) -> None:
    research = make_job("research").build()
    research.spec.pool = "research"
    named = make_job("named").build()
    named.spec.resources = job.Resources(profile="big")
    _create(
        database,
        pool.GPUPool(metadata=meta.ObjectMeta(name="research")),
        profile.GPUProfile(
            metadata=meta.ObjectMeta(name="big"), spec=profile.GPUProfileSpec(gpus=1)
        ),
        research,
        named,
        make_job("free").build(),
        nodes={"n1": 2},
    )
    corrupt(database, "GPUPool", "research", spec={"colour": "blue"})
    corrupt(database, "GPUProfile", "big", spec={"gpus": 1, "colour": "blue"})
    aside = reading.SetAside()
    _pass(database, aside)
    assert _bound(database, "free") == ("n1", [0])
    assert _waiting(database, "research") == (
        job.REASON_POOL_NOT_FOUND,
        'GPUPool "research" as stored does not validate (spec.colour: unknown field): fix or '
        "delete its row in the database",
    )
    assert _waiting(database, "named") == (
        job.REASON_PROFILE_NOT_FOUND,
        'GPUProfile "big" as stored does not validate (spec.colour: unknown field): fix or '
        "delete its row in the database",
    )
    assert {exc.key[0] for exc in aside.found} == {"GPUPool", "GPUProfile"}


def test_nothing_new_goes_to_the_node_of_an_active_binding_that_does_not_validate(
    database: db.Database,
) -> None:
    """What that attempt holds is not known: n1's free GPU 1, which binpack would choose, is
    left alone, and the Job goes to n2."""
    running = make_binding("running", "n1", [0])
    _create(database, _no_binding_ahead(), nodes={})
    _create(
        database,
        running,
        make_job("next").build(),
        nodes={"n1": 2, "n2": 1},
    )
    spec = running.spec.model_dump(mode="json", by_alias=True) | {"colour": "blue"}
    corrupt(database, "Binding", "running-1", spec=spec)
    aside = reading.SetAside()
    _pass(database, aside)
    assert _bound(database, "next") == ("n2", [0])
    assert {exc.key for exc in aside.found} == {("Binding", "default", "running-1")}
    _create(database, make_job("last").build(), nodes={})
    _pass(database, aside)
    assert _waiting(database, "last")[1] == (
        "0/3 GPUs fit: 2 beside an attempt that does not validate, 1 in use"
    )


def test_an_active_binding_that_names_no_node_still_fails_the_pass(
    database: db.Database,
) -> None:
    """Where its GPUs are is not known at all: nothing is placed, as before."""
    _create(
        database,
        make_binding("running", "n1", [0]),
        make_job("next").build(),
        nodes={"n1": 1},
    )
    corrupt(database, "Binding", "running-1", spec={"gpus": [0]})
    with pytest.raises(errors.StoredInvalid, match=r'binding "running-1"'):
        _pass(database, reading.SetAside())


def test_while_something_is_set_aside_the_controller_passes_again_in_a_minute(
    database: db.Database,
) -> None:
    """A row fixed by hand wakes nothing: the pass after one that left a Node out is due in
    INVALID_RECHECK, though nothing else is; once fixed (and its version moved), the Job
    waiting for it starts at that pass."""
    _create(database, _no_binding_ahead(), make_job("one").build(), nodes={"n1": 1})
    good = stored(database, node.Node, "n1", "").model_dump(mode="json", by_alias=True)["spec"]
    corrupt(database, "Node", "n1", spec={"unschedulable": "sometimes"})
    controller = manager.Controller(database, clock=lambda: T0)
    controller.reconcile(manager.SCHEDULE)
    assert controller._timers == [(T0 + manager.INVALID_RECHECK, manager.SCHEDULE)]
    corrupt(database, "Node", "n1", spec=good, resource_version=10_000)  # fixed by hand
    controller.reconcile(manager.SCHEDULE)
    assert _bound(database, "one") == ("n1", [0])
