"""Applysets on real SQLite files and a real PostgreSQL: membership, prune, the ApplySet's
status, and one sync pass over a real directory (drift reverted, a broken file kept out)."""

import threading
import time
from pathlib import Path

import pytest

from controller import sync
from gctl.api import applyset, errors, event, job, manifest, meta
from gctl.store import applying, db, store
from tests.builders import JobBuilder, make_job


def _manifests(*builders: JobBuilder) -> list[manifest.Manifest]:
    text = "---\n".join(b.yaml() for b in builders)
    found = manifest.parse("exp.yaml", text)
    for m in found:
        m.obj.metadata.namespace = m.obj.metadata.namespace or "default"
    return found


def _apply(
    database: db.Database, *builders: JobBuilder, name: str = "exp", prune: bool = True
) -> list[tuple[str, str]]:
    options = applying.SetOptions(name=name, prune=prune, source="/src")
    results = applying.apply(database, _manifests(*builders), False, False, options)
    return [(action.verb, obj.name) for action, obj in results]


def _jobs(database: db.Database) -> dict[str, job.Job]:
    with database.read() as session:
        return {j.name: j for j in store.Store(session).list_objects(job.Job)}


def _set(database: db.Database, name: str = "exp") -> applyset.ApplySet:
    with database.read() as session:
        return store.Store(session).get(applyset.ApplySet, name)


def test_apply_with_a_set_labels_members_and_records_the_set(database: db.Database) -> None:
    assert _apply(database, make_job("a"), make_job("b")) == [("created", "a"), ("created", "b")]
    jobs = _jobs(database)
    assert {j.metadata.labels[applyset.LABEL] for j in jobs.values()} == {"exp"}
    the_set = _set(database)
    assert the_set.spec.source == "/src"
    assert [m.name for m in the_set.status.members] == ["a", "b"]
    synced = the_set.status.conditions[0]
    assert (synced.type, synced.status, synced.reason) == ("Synced", "True", "Applied")


def test_prune_deletes_only_the_sets_own_members(database: db.Database) -> None:
    _apply(database, make_job("a"), make_job("b"))
    _apply(database, make_job("other"), name="elsewhere")
    applying.apply(database, _manifests(make_job("loose")), False, False)  # no set at all
    assert _apply(database, make_job("a")) == [("unchanged", "a"), ("pruned", "b")]
    assert sorted(_jobs(database)) == ["a", "loose", "other"]
    assert [m.name for m in _set(database).status.members] == ["a"]


def test_prune_of_a_started_job_goes_through_its_finalizer(database: db.Database) -> None:
    _apply(database, make_job("a"), make_job("b"))
    with database.write() as session:  # play the scheduler: b runs, held by the finalizer
        writer = store.Store(session)
        b = writer.get(job.Job, "b")
        b.metadata.finalizers = [job.FINALIZER]
        b = writer.update(b)
        b.status.phase = "Running"
        writer.update_status(b)
    assert _apply(database, make_job("a")) == [("unchanged", "a"), ("pruned", "b")]
    marked = _jobs(database)["b"]
    assert marked.metadata.deletion_timestamp is not None  # the controller stops it, then it goes
    assert _apply(database, make_job("a")) == [("unchanged", "a")]  # nothing more to do


def test_an_object_of_another_set_is_refused_and_nothing_written(database: db.Database) -> None:
    _apply(database, make_job("a"), name="first")
    with pytest.raises(errors.Forbidden, match="already belongs to applyset 'first'"):
        _apply(database, make_job("new"), make_job("a"), name="second")
    assert sorted(_jobs(database)) == ["a"]
    with database.read() as session:
        assert store.Store(session).find(applyset.ApplySet, "second") is None


def test_dry_run_lists_the_prune_and_writes_nothing(database: db.Database) -> None:
    _apply(database, make_job("a"), make_job("b"))
    with database.read() as session:
        before = store.Store(session).current_revision()
    options = applying.SetOptions(name="exp", prune=True)
    results = applying.apply(database, _manifests(make_job("a")), False, True, options)
    assert [(a.verb, o.name) for a, o in results] == [("unchanged", "a"), ("pruned", "b")]
    with database.read() as session:
        assert store.Store(session).current_revision() == before


# -- one sync pass over a real directory -----------------------------------------------------


def _syncer(database: db.Database, directory: Path) -> sync.Syncer:
    lines: list[str] = []
    options = sync.Options(directory=directory, name="exp")
    return sync.Syncer(database, options, report=lambda line, _error: lines.append(line))


def _events(database: db.Database, obj: meta.Resource) -> list[event.Event]:
    with database.read() as session:
        return store.Store(session).events_for(obj)


def test_a_sync_pass_reverts_drift_and_says_so(database: db.Database, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(make_job("a").priority(1).yaml())
    syncer = _syncer(database, tmp_path)
    assert syncer.sync_once().error is None
    applying.apply(database, _manifests(make_job("a").priority(9)), False, False)  # by hand
    outcome = syncer.sync_once()
    assert "job.gctl/a configured (drift reverted: spec.priority changed by hand)" in outcome.lines
    assert _jobs(database)["a"].spec.priority == 1
    the_set = _set(database)
    assert the_set.status.drift_reverted == 1
    reasons = [e.spec.reason for e in _events(database, the_set)]
    assert reasons == [applyset.REASON_DRIFT_REVERTED]


def test_a_sync_passes_now_and_then_for_what_no_file_event_tells(
    database: db.Database, tmp_path: Path
) -> None:
    """QA: a directory of manifests moved into the synced one (no manifest file event: the
    watcher sees a directory) waited for some other save. A pass now and then (`PERIODIC_S`)
    takes it up; one that changes nothing says nothing."""
    (tmp_path / "a.yaml").write_text(make_job("a").yaml())
    lines: list[str] = []
    syncer = sync.Syncer(
        database,
        sync.Options(directory=tmp_path, name="exp"),
        report=lambda line, _error: lines.append(line),
    )
    syncer.periodic_s = 0.3
    stop = threading.Event()
    running = threading.Thread(target=syncer.run, args=(stop,))
    running.start()
    try:
        deadline = time.monotonic() + 20
        while "a" not in _jobs(database):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        staging = tmp_path.parent / f"{tmp_path.name}-staging"
        (staging / "more").mkdir(parents=True)
        (staging / "more" / "b.yaml").write_text(make_job("b").yaml())
        (staging / "more").rename(tmp_path / "more")
        while "b" not in _jobs(database):
            assert time.monotonic() < deadline, lines
            time.sleep(0.05)
        said = len(lines)
        time.sleep(1.0)  # some passes more, each changing nothing
        assert lines[said:] == []
    finally:
        stop.set()
        running.join(15)


def test_a_broken_file_applies_nothing(database: db.Database, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(make_job("a").yaml())
    syncer = _syncer(database, tmp_path)
    syncer.sync_once()
    (tmp_path / "b.yaml").write_text(make_job("b").yaml())
    (tmp_path / "c.yaml").write_text(
        "apiVersion: gctl/v1\nkind: Job\nmetadata: {name: c}\nspec:\n  command: [x]\n  bogus: 1\n"
    )
    outcome = syncer.sync_once()
    assert outcome.error is not None
    assert f"{tmp_path}/c.yaml:6:" in outcome.error
    assert sorted(_jobs(database)) == ["a"]
    status = _set(database).status
    assert status.last_error is not None
    assert (status.last_error.line, status.last_error.field) == (6, "spec.bogus")
    assert status.conditions[0].reason == applyset.REASON_INVALID_MANIFEST
    (tmp_path / "c.yaml").unlink()
    assert syncer.sync_once().error is None
    assert sorted(_jobs(database)) == ["a", "b"]
    assert _set(database).status.last_error is None


def test_a_synced_job_with_a_ttl_is_refused_and_nothing_written(
    database: db.Database, tmp_path: Path
) -> None:
    builder = make_job("a")
    builder.spec["ttlSecondsAfterFinished"] = 30
    (tmp_path / "a.yaml").write_text(builder.yaml())
    outcome = _syncer(database, tmp_path).sync_once()
    assert outcome.error is not None
    assert f"{tmp_path}/a.yaml:" in outcome.error
    assert "spec.ttlSecondsAfterFinished" in outcome.error
    assert _jobs(database) == {}
    status = _set(database).status
    assert status.last_error is not None
    assert status.last_error.field == "spec.ttlSecondsAfterFinished"


def _directory_sync(
    database: db.Database, directory: Path, name: str, default_name: bool
) -> sync.Syncer:
    options = sync.Options(directory=directory, name=name, default_name=default_name)
    return sync.Syncer(database, options, report=lambda _line, _error: None)


def test_two_directories_of_one_name_do_not_share_a_default_set(
    database: db.Database, tmp_path: Path
) -> None:
    first, second = tmp_path / "a" / "jobs", tmp_path / "b" / "jobs"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "a.yaml").write_text(make_job("a").yaml())
    assert _directory_sync(database, first, "jobs", True).sync_once().error is None
    (second / "b.yaml").write_text(make_job("b").yaml())
    outcome = _directory_sync(database, second, "jobs", True).sync_once()
    assert outcome.error is not None
    assert "\n" not in outcome.error
    assert f'applyset "jobs" already follows {first}' in outcome.error
    assert "--applyset NAME" in outcome.error
    assert sorted(_jobs(database)) == ["a"]  # nothing pruned, nothing created
    the_set = _set(database, "jobs")
    assert the_set.spec.source == str(first)
    assert the_set.status.last_error is None  # the other directory's set is not touched
    # Named on purpose, the set follows the new source.
    assert _directory_sync(database, second, "jobs", False).sync_once().error is None
    assert sorted(_jobs(database)) == ["b"]
    assert _set(database, "jobs").spec.source == str(second)


def test_a_pass_reads_the_sets_members_once(
    database: db.Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gctl.store import applysets

    calls: list[str] = []
    real = applysets.members

    def counted(reader: store.Store, name: str) -> list[meta.Resource]:
        calls.append(name)
        return real(reader, name)

    monkeypatch.setattr(applysets, "members", counted)
    _apply(database, make_job("a"), make_job("b"))
    assert _apply(database, make_job("a")) == [("unchanged", "a"), ("pruned", "b")]
    (tmp_path / "a.yaml").write_text(make_job("a").yaml())
    assert _syncer(database, tmp_path).sync_once().error is None
    assert calls == ["exp", "exp", "exp"]
    assert [m.name for m in _set(database).status.members] == ["a"]
