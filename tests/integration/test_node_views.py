"""`gctl get nodes`' GPU counts over a real database (SQLite and PostgreSQL): the Bindings the
scheduler wrote, read back as the command reads them, counted as the scheduler counts them."""

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from controller import reading, scheduling
from gctl.api import meta, node
from gctl.cli import getting, gpus
from gctl.store import db, store
from tests.builders import make_job, put_ready_node, report_attempt

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _flags(database: db.Database, output: str = "") -> getting.GetFlags:
    return getting.GetFlags(
        output=output,
        selector_text=None,
        namespace=None,
        all_namespaces=False,
        watch=False,
        watch_only=False,
        show_labels=False,
        db_url=database.url,
    )


def _schedule(database: db.Database) -> None:
    store.transact(database, lambda w: scheduling.schedule(w, T0, scheduling.Limits(seconds=None)))


def _cluster(database: db.Database) -> None:
    """n1's two GPUs: one runs `whole`, the other `half-a` and `half-b` (0.5 each), and `next`
    is bound ahead of `whole`. n2: GPU 0 cordoned, 1 held by someone's notebook, 2 free (`done`
    ran there and exited). n3 is NotReady."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 2, T0)
        put_ready_node(writer, "n2", 3, T0)
        n2 = writer.get(node.Node, "n2")
        n2.spec.cordoned_gpus = [0]
        writer.update(n2)
        n2 = writer.get(node.Node, "n2")
        n2.status.gpus[1].processes = [node.GPUProcess(pid=4242, used_memory=2**30)]
        writer.update_status(n2)
        writer.create(node.Node(metadata=meta.ObjectMeta(name="n3")))
        n3 = writer.get(node.Node, "n3")
        n3.status.gpus = [node.GPUInfo(index=0, uuid="n3-0", model="A100")]
        meta.set_condition(n3.status.conditions, "Ready", "False", "NodeLost", now=T0)
        writer.update_status(n3)
        whole = make_job("whole").on("n1", 0).build()
        whole.spec.active_deadline_seconds = 60
        writer.create_many(
            [
                whole,
                make_job("half-a").gpus(0.5).on("n1", 1).build(),
                make_job("half-b").gpus(0.5).on("n1", 1).build(),
                make_job("done").on("n2", 2).build(),
            ]
        )
    _schedule(database)
    for name in ("whole", "half-a", "half-b"):
        report_attempt(database, f"{name}-1", "Running", T0)
    report_attempt(database, "done-1", "Exited", T0, exit_code=0)
    with database.write() as session:
        store.Store(session).create(make_job("next").on("n1").build())
    _schedule(database)


def _get(
    database: db.Database, capsys: pytest.CaptureFixture[str], resource: str, output: str = ""
) -> str:
    """`gctl get RESOURCE -o OUTPUT` in this process, as the command server's child runs it."""
    if resource == "gpus":
        gpus.get_gpus(
            nodes=[],
            output=output,
            selector_text=None,
            watch=False,
            watch_only=False,
            show_labels=False,
            db_url=database.url,
        )
    else:
        getting.get(resource=resource, names=[], flags=_flags(database, output))
    return capsys.readouterr().out


def test_get_nodes_counts_gpus_as_the_scheduler_holds_them(
    database: db.Database, capsys: pytest.CaptureFixture[str]
) -> None:
    _cluster(database)

    header, *rows = [line.split() for line in _get(database, capsys, "nodes", "wide").splitlines()]

    columns = ["NAME", "STATUS", "GPUS", "MODEL", "AGE", "FREE", "CORDONED", "OTHER"]
    assert header[:8] == columns
    counted = {row[0]: [row[1], row[2], *row[5:8]] for row in rows}
    assert counted == {
        "n1": ["Ready", "2/2", "0", "0", "0"],  # `next`, bound ahead, holds nothing yet
        "n2": ["Ready", "0/3", "1", "1", "1"],
        "n3": ["NotReady", "0/1", "0", "1", "0"],
    }
    # The scheduler's own reading: GPUs its attempts hold, those bound ahead left out.
    with database.read() as session:
        world = reading.read_world(store.Store(session))
    held = {(a.node, i) for a in world.snapshot.allocations if not a.queued for i in a.gpus}
    assert held == {("n1", 0), ("n1", 1)}
    assert any(a.queued for a in world.snapshot.allocations)
    # ... which `get gpus` shows with their jobs.
    gpu_rows = json.loads(_get(database, capsys, "gpus", "json"))
    assert {(g["node"], g["index"]) for g in gpu_rows if g["jobs"]} == held
    # -o yaml is the stored objects, without the counts.
    listed: dict[str, Any] = yaml.safe_load(_get(database, capsys, "nodes", "yaml"))
    assert [n["metadata"]["name"] for n in listed["items"]] == ["n1", "n2", "n3"]
    assert all(
        set(n) == {"apiVersion", "kind", "metadata", "spec", "status"} for n in listed["items"]
    )
