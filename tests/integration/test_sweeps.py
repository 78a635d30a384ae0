"""Sweeps and dependsOn against a real database (SQLite and PostgreSQL): the real reconcilers,
one step at a time, with a fixed clock and no processes."""

import logging
import math
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from controller import jobs, manager, scheduling, sweeps
from gctl.api import binding, job, kinds, manifest, meta, sweep
from gctl.cli import printers
from gctl.store import applying, db, feed, listing, store
from tests.builders import corrupt, make_job, put_ready_node, warnings_about

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _sweep(name: str, **spec: Any) -> sweep.Sweep:
    spec.setdefault("template", {"spec": {"command": ["echo", "{item}"], "resources": {"gpus": 0}}})
    return sweep.Sweep.model_validate(
        {"metadata": {"name": name, "namespace": "default"}, "spec": spec}
    )


def _create(database: db.Database, *objects: meta.Resource) -> None:
    with database.write() as session:
        store.Store(session).create_many(list(objects))


def _reapply(database: db.Database, name: str, **spec: Any) -> None:
    """What `apply` does to a changed Sweep: a new spec on the stored object."""
    with database.write() as session:
        writer = store.Store(session)
        current = writer.get(sweep.Sweep, name, "default")
        current.spec = _sweep(name, **spec).spec
        writer.update(current)


def _reconcile_sweep(database: db.Database, name: str) -> None:
    store.transact(database, lambda w: sweeps.reconcile(w, "default", name, T0))


def _reconcile_job(database: db.Database, name: str) -> None:
    store.transact(database, lambda w: jobs.reconcile(w, "default", name, T0))


def _children(database: db.Database, name: str) -> dict[str, dict[str, Any]]:
    with database.read() as session:
        return sweeps.children(store.Store(session), "default", name)


def _get_sweep(database: db.Database, name: str) -> sweep.Sweep | None:
    with database.read() as session:
        return store.Store(session).find(sweep.Sweep, name, "default")


def _get_job(database: db.Database, name: str) -> job.Job:
    with database.read() as session:
        return store.Store(session).get(job.Job, name, "default")


def _finish(database: db.Database, name: str, phase: str) -> None:
    """A child's end, as its own reconciler would write it."""
    with database.write() as session:
        writer = store.Store(session)
        found = writer.get(job.Job, name, "default")
        found.status.phase = "Succeeded" if phase == "Succeeded" else "Failed"
        found.status.attempts = 1
        writer.update_status(found)


def test_a_sweep_creates_one_owned_labelled_job_per_item(database: db.Database) -> None:
    _create(database, _sweep("lr", items=["a", "b", "c"]))
    _reconcile_sweep(database, "lr")
    created = _children(database, "lr")
    assert sorted(created) == ["lr-a", "lr-b", "lr-c"]
    owner = _get_sweep(database, "lr")
    assert owner is not None
    assert sweep.FINALIZER in owner.metadata.finalizers
    child = created["lr-b"]
    assert child["spec"]["command"] == ["echo", "b"]
    assert child["metadata"]["labels"] == {sweep.LABEL: "lr"}
    assert child["metadata"]["ownerReferences"] == [
        {"kind": "Sweep", "name": "lr", "uid": owner.metadata.uid, "controller": True}
    ]
    counts = owner.status
    assert (counts.total, counts.pending, counts.phase) == (3, 3, "Pending")


def test_a_sweep_whose_job_waits_to_retry_stays_running(database: db.Database) -> None:
    """QA: Running, then Pending again while its one Job waited out its back-off."""
    _create(database, _sweep("retry", items=["x"]))
    _reconcile_sweep(database, "retry")
    with database.write() as session:
        writer = store.Store(session)
        waiting = writer.get(job.Job, "retry-x", "default")
        waiting.status.attempts, waiting.status.failed = 1, 1  # in back-off: Pending
        writer.update_status(waiting)
    _reconcile_sweep(database, "retry")
    found = _get_sweep(database, "retry")
    assert found is not None
    assert (found.status.pending, found.status.running, found.status.phase) == (1, 0, "Running")


def test_reapplying_with_one_more_item_adds_exactly_one_job(database: db.Database) -> None:
    _create(database, _sweep("lr", items=["a", "b"]))
    _reconcile_sweep(database, "lr")
    _finish(database, "lr-a", "Succeeded")
    before = {n: w["metadata"]["resourceVersion"] for n, w in _children(database, "lr").items()}
    _reapply(database, "lr", items=["a", "b", "c"])
    _reconcile_sweep(database, "lr")
    after = _children(database, "lr")
    assert sorted(after) == ["lr-a", "lr-b", "lr-c"]
    assert {n: after[n]["metadata"]["resourceVersion"] for n in before} == before
    _reapply(database, "lr", items=["a", "c"])  # b has not started: it goes; a is kept
    _reconcile_sweep(database, "lr")
    assert sorted(_children(database, "lr")) == ["lr-a", "lr-c"]


def test_a_template_change_reaches_only_jobs_not_started(database: db.Database) -> None:
    _create(database, _sweep("t", items=["a", "b"]))
    _reconcile_sweep(database, "t")
    _finish(database, "t-a", "Succeeded")
    template = {"spec": {"command": ["echo", "v2", "{item}"], "resources": {"gpus": 0}}}
    _reapply(database, "t", items=["a", "b"], template=template)
    _reconcile_sweep(database, "t")
    found = _children(database, "t")
    assert found["t-a"]["spec"]["command"] == ["echo", "a"]
    assert found["t-b"]["spec"]["command"] == ["echo", "v2", "b"]


def test_children_are_rendered_again_only_when_the_sweep_changes(database: db.Database) -> None:
    _create(database, _sweep("g", items=["a"]))
    _reconcile_sweep(database, "g")
    with database.write() as session:  # a change the next passes need not look for
        writer = store.Store(session)
        child = writer.get(job.Job, "g-a", "default")
        child.spec.command = ["echo", "by hand"]
        writer.update(child)
    _reconcile_sweep(database, "g")
    assert _get_job(database, "g-a").spec.command == ["echo", "by hand"]
    template = {"spec": {"command": ["echo", "v2", "{item}"], "resources": {"gpus": 0}}}
    _reapply(database, "g", items=["a"], template=template)
    _reconcile_sweep(database, "g")
    assert _get_job(database, "g-a").spec.command == ["echo", "v2", "a"]


def test_deleting_a_sweep_deletes_its_jobs_and_stops_the_running_one(
    database: db.Database,
) -> None:
    with database.write() as session:
        put_ready_node(store.Store(session), "n1", 1, T0)
    template = {"spec": {"command": ["run", "{item}"]}}
    _create(database, _sweep("gone", items=["x", "y"], template=template))
    _reconcile_sweep(database, "gone")
    store.transact(database, lambda w: scheduling.schedule(w, T0))  # gone-x runs on n1
    with database.write() as session:
        store.Store(session).delete(sweep.Sweep, "gone", "default")
    _reconcile_sweep(database, "gone")
    _reconcile_job(database, "gone-y")  # only bound ahead: taken back without its agent
    assert sorted(_children(database, "gone")) == ["gone-x"]
    _reconcile_job(database, "gone-x")
    with database.write() as session:  # the agent stops the attempt
        writer = store.Store(session)
        attempt = writer.get(binding.Binding, "gone-x-1", "default")
        assert attempt.spec.stop_reason == binding.STOP_DELETED
        attempt.status.phase = "Exited"
        attempt.status.exit_code = 143
        writer.update_status(attempt)
    _reconcile_job(database, "gone-x")
    _reconcile_sweep(database, "gone")
    assert _children(database, "gone") == {}
    assert _get_sweep(database, "gone") is None


def test_max_parallel_creates_jobs_as_earlier_ones_finish(database: db.Database) -> None:
    _create(database, _sweep("p", items=["a", "b", "c", "d", "e"], maxParallel=2))
    _reconcile_sweep(database, "p")
    assert sorted(_children(database, "p")) == ["p-a", "p-b"]
    status = _get_sweep(database, "p")
    assert status is not None
    assert (status.status.total, status.status.pending) == (5, 5)
    _finish(database, "p-a", "Succeeded")
    _finish(database, "p-b", "Failed")
    _reconcile_sweep(database, "p")
    assert sorted(_children(database, "p")) == ["p-a", "p-b", "p-c", "p-d"]
    counted = _get_sweep(database, "p")
    assert counted is not None
    assert (counted.status.succeeded, counted.status.failed, counted.status.pending) == (1, 1, 3)
    assert counted.status.phase == "Running"


def test_a_files_sweep_expands_its_glob_on_the_controller(
    database: db.Database, tmp_path: Path
) -> None:
    for stem in ("small", "large"):
        (tmp_path / f"{stem}.toml").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("")
    template = {"spec": {"command": "train {file} {stem}", "workingDir": str(tmp_path)}}
    _create(database, _sweep("cfg", files="*.toml", template=template))
    _reconcile_sweep(database, "cfg")
    found = _children(database, "cfg")
    assert sorted(found) == ["cfg-large", "cfg-small"]
    assert found["cfg-small"]["spec"]["command"] == "train small.toml small"


def test_a_files_sweeps_relative_glob_is_the_manifests_directorys(
    database: db.Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied from one directory, reconciled by a controller in another: the glob is taken
    from the manifest's directory, through the template's workingDir or, with none, as an
    absolute glob whose `{file}` names the file wherever the Jobs run."""
    project = tmp_path / "proj"
    (project / "configs").mkdir(parents=True)
    for stem in ("small", "large"):
        (project / "configs" / f"{stem}.toml").write_text("x = 1\n")
    text = "".join(
        f"---\napiVersion: gctl/v1\nkind: Sweep\nmetadata: {{name: {name}}}\nspec:\n"
        f"  files: configs/*.toml\n  template:\n    spec:\n      command: t {{file}}\n{more}"
        for name, more in (("in-dir", "      workingDir: .\n"), ("alone", ""))
    )
    (project / "sweeps.yaml").write_text(text)
    for where in ("apply", "controller"):
        (tmp_path / where).mkdir()
    monkeypatch.chdir(tmp_path / "apply")
    loaded = manifest.load(["../proj/sweeps.yaml"], recursive=False, namespace="default")
    applying.apply(database, loaded, force=False, dry_run=False)
    monkeypatch.chdir(tmp_path / "controller")
    for name in ("in-dir", "alone"):
        _reconcile_sweep(database, name)
    in_dir, alone = _children(database, "in-dir"), _children(database, "alone")
    assert {n: w["spec"]["command"] for n, w in in_dir.items()} == {
        "in-dir-large": "t configs/large.toml",
        "in-dir-small": "t configs/small.toml",
    }
    assert {w["spec"]["workingDir"] for w in in_dir.values()} == {str(project)}
    assert {n: w["spec"]["command"] for n, w in alone.items()} == {
        "alone-large": f"t {project}/configs/large.toml",
        "alone-small": f"t {project}/configs/small.toml",
    }
    assert all("workingDir" not in w["spec"] for w in alone.values())  # the agent's, as before
    again = applying.apply(database, manifest.load([str(project)], False, "default"), False, False)
    assert [action.verb for action, _ in again] == ["unchanged", "unchanged"]


def test_a_files_sweep_that_matches_nothing_says_so(database: db.Database) -> None:
    template = {"spec": {"command": "train {file}", "workingDir": "/nonexistent-gctl"}}
    _create(database, _sweep("none", files="*.toml", template=template))
    _reconcile_sweep(database, "none")
    found = _get_sweep(database, "none")
    assert found is not None
    assert found.status.reason == sweep.REASON_NO_FILES
    assert "controller" in (found.status.message or "")


def test_a_name_taken_is_told_once_as_a_warning_and_shown_as_the_status(
    database: db.Database,
) -> None:
    _create(database, _sweep("x", items=["y", "z"]), make_job("x-y").build())
    _reconcile_sweep(database, "x")
    _reconcile_sweep(database, "x")  # again: told once
    found = _get_sweep(database, "x")
    assert found is not None
    assert (found.status.phase, found.status.reason) == ("Pending", sweep.REASON_NAME_TAKEN)
    with database.read() as session:
        told = store.Store(session).events_for(found)
    warnings = [
        (e.spec.type, e.spec.reason, e.spec.message) for e in told if e.spec.type == "Warning"
    ]
    message = "Job x-y exists and is not this Sweep's: delete or rename it"
    assert warnings == [("Warning", sweep.REASON_NAME_TAKEN, message)]
    table = printers.Table("Sweep", False, namespaces=False, show_labels=False)
    header, row = (line.split() for line in table.lines([found.wire()], T0, header=True))
    assert dict(zip(header, row, strict=True))["STATUS"] == "NameTaken"


def test_a_sweep_finishes_succeeded_or_failed(database: db.Database) -> None:
    _create(database, _sweep("ok", items=["a", "b"]), _sweep("bad", items=["a", "b"]))
    for name in ("ok", "bad"):
        _reconcile_sweep(database, name)
    for child in ("ok-a", "ok-b", "bad-a"):
        _finish(database, child, "Succeeded")
    _finish(database, "bad-b", "Failed")
    for name in ("ok", "bad"):
        _reconcile_sweep(database, name)
    ok, bad = _get_sweep(database, "ok"), _get_sweep(database, "bad")
    assert ok is not None
    assert bad is not None
    assert (ok.status.phase, ok.status.reason) == ("Succeeded", sweep.REASON_COMPLETED)
    assert (bad.status.phase, bad.status.message) == ("Failed", "1/2 Jobs failed")


def test_a_job_waits_for_a_sweep_then_runs(database: db.Database) -> None:
    with database.write() as session:
        put_ready_node(store.Store(session), "n1", 1, T0)
    collect = make_job("collect").build()
    collect.spec.depends_on = ["grid"]
    _create(database, collect, _sweep("grid", items=["a", "b"]))
    _reconcile_job(database, "collect")
    waiting = _get_job(database, "collect")
    assert waiting.status.reason == job.REASON_WAITING_DEPENDENCIES
    assert waiting.status.message == "waiting for sweep grid to succeed"
    _reconcile_sweep(database, "grid")
    for child in ("grid-a", "grid-b"):
        _finish(database, child, "Succeeded")
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    assert _get_job(database, "collect").status.phase == "Pending"  # the Sweep still says so
    _reconcile_sweep(database, "grid")
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    assert _get_job(database, "collect").status.phase == "Scheduled"


def test_a_job_fails_when_its_sweep_fails(database: db.Database) -> None:
    collect = make_job("collect").build()
    collect.spec.depends_on = ["grid", "later"]
    _create(database, collect, _sweep("grid", items=["a", "b", "c"]))
    _reconcile_job(database, "collect")
    assert "later: no such Job or Sweep yet" in (_get_job(database, "collect").status.message or "")
    _reconcile_sweep(database, "grid")
    _finish(database, "grid-a", "Failed")
    for child in ("grid-b", "grid-c"):
        _finish(database, child, "Succeeded")
    _reconcile_sweep(database, "grid")
    _reconcile_job(database, "collect")
    failed = _get_job(database, "collect")
    assert (failed.status.phase, failed.status.reason) == ("Failed", job.REASON_DEPENDENCY_FAILED)
    assert failed.status.message == "dependency sweep grid failed (1/3 children failed)"


def test_a_sweeps_depends_on_gates_its_jobs(database: db.Database) -> None:
    with database.write() as session:
        put_ready_node(store.Store(session), "n1", 2, T0)
    _create(
        database, make_job("prepare").build(), _sweep("after", items=["a"], dependsOn=["prepare"])
    )
    _reconcile_sweep(database, "after")
    assert _children(database, "after")["after-a"]["spec"]["dependsOn"] == ["prepare"]
    store.transact(database, lambda w: scheduling.schedule(w, T0))
    assert _get_job(database, "after-a").status.phase == "Pending"
    assert _get_job(database, "prepare").status.phase == "Scheduled"


def test_describe_shows_the_chain_and_a_sweeps_jobs(database: db.Database) -> None:
    from gctl.cli import describe

    collect = make_job("collect").build()
    collect.spec.depends_on = ["grid"]
    _create(
        database, make_job("prep").build(), collect, _sweep("grid", items=["a"], dependsOn=["prep"])
    )
    _reconcile_sweep(database, "grid")
    with database.read() as session:
        reader = store.Store(session)
        grid = reader.list_wire(sweep.Sweep, "default", names=["grid"])[0]
        lines = describe.related(reader, grid)
        prep = describe.related(reader, reader.list_wire(job.Job, "default", names=["prep"])[0])
        chain = describe.Chain(reader)  # as `gctl describe` shares it between objects
        every = [*reader.list_wire(job.Job, "default"), grid]
        shared = [describe.related(reader, w, chain) for w in every]
        alone = [describe.related(reader, w) for w in every]
    assert shared == alone
    text = "\n".join(lines)
    assert "Depends On:" in text
    assert "prep  Job   Pending" in text
    assert "collect  Job   Pending" in text  # Needed By
    assert "grid-a  Pending  a" in text  # Jobs
    assert "grid  Sweep  Pending" in "\n".join(prep)  # the Sweep stands for its Jobs


def _waits_for(name: str, *needs: str) -> job.Job:
    made = make_job(name).build()
    made.spec.depends_on = list(needs)
    return made


def _cycle_failure(database: db.Database, name: str) -> tuple[str, str | None, list[str]]:
    """(reason, message, the Job's events) of a Job the controller failed, and its condition."""
    with database.read() as session:
        reader = store.Store(session)
        found = reader.get(job.Job, name, "default")
        events = [
            f"{e.spec.type} {e.spec.reason}: {e.spec.message}" for e in reader.events_for(found)
        ]
    assert found.status.phase == "Failed"
    failed = next(c for c in found.status.conditions if c.type == job.CONDITION_FAILED)
    assert (failed.status, failed.reason, failed.message) == (
        "True",
        found.status.reason,
        found.status.message,
    )
    return found.status.reason or "", found.status.message, events


def test_each_job_of_a_dependency_cycle_fails_naming_the_cycle(database: db.Database) -> None:
    _create(database, _waits_for("a", "b"), _waits_for("b", "a"), _waits_for("after", "a"))
    for name in ("a", "b", "after"):
        _reconcile_job(database, name)
    reason, message, events = _cycle_failure(database, "a")
    assert (reason, message) == (
        job.REASON_DEPENDENCY_CYCLE,
        "dependsOn makes a cycle: default/a -> default/b -> default/a",
    )
    assert events == [f"Warning DependencyCycle: {message}"]
    # b is failed by the cycle too, though a failed first; what waits on the cycle fails as
    # with any failed dependency.
    assert _cycle_failure(database, "b")[:2] == (
        job.REASON_DEPENDENCY_CYCLE,
        "dependsOn makes a cycle: default/b -> default/a -> default/b",
    )
    assert _cycle_failure(database, "after")[:2] == (
        job.REASON_DEPENDENCY_FAILED,
        "dependency a failed",
    )


def test_one_pass_reads_a_long_chain_once_and_finds_the_cycle_beside_it(
    database: db.Database,
) -> None:
    """300 pending Jobs, each waiting on the one before, and a cycle, reconciled in one pass:
    each name is read once in the pass (a walk per Job that read the whole chain above it made
    about 45,000 statements here, and 500,000 for 1,000 Jobs)."""
    chain = [_waits_for(f"step-{i:03d}", f"step-{i - 1:03d}") for i in range(1, 300)]
    _create(database, make_job("step-000").build(), *chain)
    _create(database, _waits_for("a", "b"), _waits_for("b", "a"))
    statements = [0]

    def count(*_: Any) -> None:
        statements[0] += 1

    keys = [("default", j.name) for j in chain] + [("default", "a"), ("default", "b")]
    sqlalchemy.event.listen(database.engine, "before_cursor_execute", count)
    try:
        store.transact(database, lambda w: jobs.reconcile_many(w, keys, T0))
    finally:
        sqlalchemy.event.remove(database.engine, "before_cursor_execute", count)
    assert statements[0] < 10 * len(keys)
    assert _cycle_failure(database, "a")[0] == job.REASON_DEPENDENCY_CYCLE
    assert _cycle_failure(database, "b")[0] == job.REASON_DEPENDENCY_CYCLE
    with database.read() as session:
        last = store.Store(session).get(job.Job, "step-299", "default")
    assert (last.status.phase, last.status.reason) == ("Pending", job.REASON_WAITING_DEPENDENCIES)


def test_a_cycle_closed_by_a_later_apply_fails_both_jobs(database: db.Database) -> None:
    _create(database, _waits_for("a", "b"))
    _reconcile_job(database, "a")
    assert _get_job(database, "a").status.reason == job.REASON_WAITING_DEPENDENCIES
    _create(database, _waits_for("b", "a"))
    for name in ("b", "a"):
        _reconcile_job(database, name)
        assert _cycle_failure(database, name)[0] == job.REASON_DEPENDENCY_CYCLE


def test_a_stored_job_that_waits_for_itself_fails(database: db.Database) -> None:
    """Apply refuses it; one stored before that was so is failed by the controller."""
    _create(database, _waits_for("itself", "itself"))
    _reconcile_job(database, "itself")
    assert _cycle_failure(database, "itself")[:2] == (
        job.REASON_DEPENDENCY_CYCLE,
        "dependsOn makes a cycle: default/itself -> default/itself",
    )


def test_a_cycle_through_a_sweep_fails_its_jobs_and_then_the_sweep(database: db.Database) -> None:
    _create(
        database,
        _waits_for("collect", "grid"),
        _sweep("grid", items=["a", "b"], dependsOn=["collect"]),
    )
    _reconcile_sweep(database, "grid")
    for name in ("grid-a", "collect", "grid-b"):
        _reconcile_job(database, name)
    messages = {n: _cycle_failure(database, n)[1] for n in ("grid-a", "collect", "grid-b")}
    assert messages == {
        "grid-a": "dependsOn makes a cycle: default/grid-a -> default/collect -> sweep "
        "default/grid -> default/grid-a",
        "collect": "dependsOn makes a cycle: default/collect -> sweep default/grid -> "
        "default/collect",
        "grid-b": "dependsOn makes a cycle: default/grid-b -> default/collect -> sweep "
        "default/grid -> default/grid-b",
    }
    _reconcile_sweep(database, "grid")
    grid = _get_sweep(database, "grid")
    assert grid is not None
    assert (grid.status.phase, grid.status.message) == ("Failed", "2/2 Jobs failed")


def test_a_stored_sweep_that_no_longer_validates_holds_back_no_other(
    database: db.Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller's own loop, from its resync on start: the good Sweep gets its Jobs, and
    the Sweep (and the Node) whose rows were corrupted get one Warning Event and one log line
    each, not one a second."""
    with database.write() as session:
        put_ready_node(store.Store(session), "n1", 1, meta.utcnow())
        put_ready_node(store.Store(session), "n2", 1, meta.utcnow())
    _create(database, _sweep("bad", items=["x"]), _sweep("good", items=["a", "b"]))
    bad_template = {"spec": {"command": ["echo"], "resources": {"gpus": 0}}}
    corrupt(database, "Sweep", "bad", spec={"items": ["x"], "retired": 1, "template": bad_template})
    corrupt(database, "Node", "n2", spec={"unschedulable": "sometimes"})
    controller = manager.Controller(database)
    stop = threading.Event()
    loop = threading.Thread(target=controller.run, args=(stop,), daemon=True)
    caplog.set_level(logging.WARNING, logger="gctl.controller")
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while len(_children(database, "good")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3.5)  # three of the loop's one-second retries, were it retrying
    finally:
        stop.set()
        loop.join(timeout=10)

    assert sorted(_children(database, "good")) == ["good-a", "good-b"]
    assert _children(database, "bad") == {}
    assert warnings_about(database, "bad") == [
        (
            manager.REASON_INVALID,
            "stored Sweep does not validate (spec.retired: unknown field); left alone until it"
            " changes",
            1,
        )
    ]
    assert [(r, c) for r, _, c in warnings_about(database, "n2")] == [(manager.REASON_INVALID, 1)]
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if '"bad"' in m] == [
        'sweep "bad" in namespace "default" as stored does not validate (spec.retired: unknown'
        " field): written by an older gctl or edited by hand; fix or delete its row in the"
        " database; set aside until it changes"
    ]
    assert len([m for m in said if '"n2"' in m]) == 1
    assert all(r.exc_info is None for r in caplog.records)  # no traceback


def _written_again(database: db.Database, name: str) -> sweep.Sweep | None:
    """The Sweep written whole again (as a finalizer put back writes it), then read."""
    with database.write() as session:
        writer = store.Store(session)
        again = writer.get(sweep.Sweep, name, "default")
        again.metadata.labels["touched"] = "yes"
        writer.update(again)
    return _get_sweep(database, name)


def test_a_sweep_stored_with_a_number_beyond_64_bits_reads_it_exactly(
    database: db.Database,
) -> None:
    """Apply refuses such a matrix value now; an older gctl stored it (gctl.store.jsontext).
    Read as a double, it would name and run other children than the ones made before."""
    seed = 12345678901234567890123
    old = _sweep("big", matrix={"seed": [1, seed]}, template={"spec": {"command": "t {seed}"}})
    _create(database, old)  # as an older gctl stored it: apply takes no such number now
    _reconcile_sweep(database, "big")
    assert sorted(_children(database, "big")) == ["big-seed1", f"big-seed{seed}"]
    read = _written_again(database, "big")
    assert read is not None
    assert read.spec.matrix == {"seed": [1, seed]}
    with feed.Watch(database, since=0, kinds=["Sweep"]) as changes:
        copies = [c.object["spec"]["matrix"]["seed"] for c in changes.poll()]
    assert copies
    assert all(c == [1, seed] for c in copies)
    listed = listing.read(database.url, kinds.SWEEP, "default")
    assert listed is not None
    assert listed.wires[0]["spec"]["matrix"]["seed"] == [1, seed]


def test_a_sweep_stored_with_a_nan_keeps_it_when_written_again(tmp_path: Path) -> None:
    """SQLite held the NaN json.dumps wrote (PostgreSQL refused it); orjson would write it
    as null, which no longer reads as a matrix value."""
    database = db.Database.open(str(tmp_path / "gctl.db"))
    stored = _sweep("nan", matrix={"lr": [0.1]}, template={"spec": {"command": "t {lr}"}})
    stored.spec.matrix = {"lr": [0.1, float("nan")]}
    _create(database, stored)
    read = _written_again(database, "nan")
    assert read is not None
    assert read.spec.matrix is not None
    assert read.spec.matrix["lr"][0] == 0.1
    assert math.isnan(read.spec.matrix["lr"][1])
    database.close()
