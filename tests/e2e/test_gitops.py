"""GitOps for real: `gctl apply --applyset --prune`, `gctl diff`, and `gctl sync --watch` on a
real directory whose files the test adds, edits, breaks and deletes, with `gctl up` running the
Jobs on fake GPUs. Every command is the real console script; waits poll with a deadline.
"""

import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gctl.api import applyset, job
from gctl.store import db, store
from tests.builders import make_job
from tests.conftest import GCTL_BIN, Gctl
from tests.e2e.test_cli import Lines, error_line, seed, table

WAIT = 20.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def jobs(database: db.Database) -> dict[str, dict[str, Any]]:
    """The Jobs as stored, read in-process (a gctl process per poll costs half a second)."""
    with database.read() as session:
        return {w["metadata"]["name"]: w for w in store.Store(session).list_wire(job.Job)}


def the_set(database: db.Database, name: str = "exp") -> dict[str, Any]:
    with database.read() as session:
        return store.Store(session).get(applyset.ApplySet, name).wire()


def synced(database: db.Database) -> dict[str, Any]:
    conditions = the_set(database)["status"].get("conditions", [])
    return next(c for c in conditions if c["type"] == "Synced")


def write_job(directory: Path, name: str, *command: str, **spec: Any) -> None:
    builder = make_job(name).command(*command)
    builder.spec.update(spec)
    (directory / f"{name}.yaml").write_text(builder.yaml())


# -- apply --applyset, --prune, --dry-run, diff ----------------------------------------------


def test_apply_prune_touches_only_the_sets_members(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    for name in ("a", "b"):
        write_job(exp, name, "true")
    assert gctl.ok("apply", "-f", str(exp), "--applyset", "exp") == (
        "job.gctl/a created\njob.gctl/b created\n"
    )
    seed(database, make_job("loose"))  # no set
    other = tmp_path / "other"  # another set's member (a label alone, its set gone, is none)
    other.mkdir()
    write_job(other, "theirs", "true")
    gctl.ok("apply", "-f", str(other), "--applyset", "other")
    (exp / "b.yaml").unlink()

    result = gctl("diff", "-f", str(exp), "--applyset", "exp", "--prune")
    assert result.code == 1
    assert "--- live/Job/default/b\n+++ /dev/null\n" in result.out
    assert "loose" not in result.out
    assert "theirs" not in result.out
    dry = gctl.ok("apply", "-f", str(exp), "--applyset", "exp", "--prune", "--dry-run")
    assert dry == "job.gctl/a unchanged (dry run)\njob.gctl/b pruned (dry run)\n"
    assert sorted(jobs(database)) == ["a", "b", "loose", "theirs"]

    out = gctl.ok("apply", "-f", str(exp), "--applyset", "exp", "--prune")
    assert out == "job.gctl/a unchanged\njob.gctl/b pruned\n"
    assert sorted(jobs(database)) == ["a", "loose", "theirs"]

    # The same name in another set's input is refused in one line, and nothing is written.
    write_job(exp, "theirs", "true")
    refused = gctl("apply", "-f", str(exp), "--applyset", "exp", "--prune")
    assert "already belongs to applyset 'other'" in error_line(refused)
    assert jobs(database)["theirs"]["metadata"]["labels"]["gctl/applyset"] == "other"

    header, rows = table(gctl.ok("get", "applysets"))
    assert header == ["NAME", "SOURCE", "MEMBERS", "SYNCED", "LAST", "SYNC", "AGE"]
    assert [(row[0], row[2], row[3]) for row in rows] == [
        ("exp", "1", "True"),
        ("other", "1", "True"),
    ]
    assert rows[0][1].endswith("/exp")  # its source, the end kept when long
    described = gctl.ok("describe", "applyset", "exp")
    assert "Members:" in described
    assert "Job   default    a     Pending" in described


def test_get_applysets_fits_100_columns_with_a_long_name(gctl: Gctl, tmp_path: Path) -> None:
    """QA: a 26-character set name made the line 102 columns (SOURCE was cut to a fixed 36);
    SOURCE now gives way, its end kept."""
    name = "lr-search-batch128-lr0-001"
    deep = tmp_path / "a-rather-long-directory-of-experiments" / name
    deep.mkdir(parents=True)
    write_job(deep, "wj", "true")
    gctl.ok("apply", "-f", str(deep), "--applyset", name)
    lines = gctl.ok("get", "applysets").splitlines()
    assert max(len(line) for line in lines) <= 100, lines
    assert lines[1].split()[1].endswith(f"/{name}")


def test_a_deleted_sets_members_may_join_another(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    """QA: deleting an ApplySet left its members labelled as its own, and no other set could
    take them ("already belongs to applyset 'one'", a set that no longer existed)."""
    one, two = tmp_path / "one", tmp_path / "two"
    for directory in (one, two):
        directory.mkdir()
        write_job(directory, "orphan", "true")
    gctl.ok("apply", "-f", str(one), "--applyset", "one", "--prune")
    gctl.ok("delete", "applyset", "one")
    out = gctl.ok("apply", "-f", str(two), "--applyset", "two", "--prune")
    assert "job.gctl/orphan configured" in out, out
    assert jobs(database)["orphan"]["metadata"]["labels"]["gctl/applyset"] == "two"
    assert gctl.ok("get", "applyset", "two", "-o", "name") == "applyset.gctl/two\n"


def test_prune_needs_a_set(gctl: Gctl, tmp_path: Path) -> None:
    write_job(tmp_path, "a", "true")
    line = error_line(gctl("apply", "-f", str(tmp_path / "a.yaml"), "--prune"))
    assert "--prune needs --applyset NAME" in line


def test_a_member_job_with_a_ttl_is_refused(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    write_job(tmp_path, "a", "true", ttlSecondsAfterFinished=30)
    line = error_line(gctl("apply", "-f", str(tmp_path), "--applyset", "exp"))
    assert f'{tmp_path}/a.yaml: document 1 (Job "a"): spec.ttlSecondsAfterFinished:' in line
    assert "would recreate it" in line
    line = error_line(gctl("sync", str(tmp_path)))
    assert f"{tmp_path}/a.yaml:" in line
    assert "spec.ttlSecondsAfterFinished" in line
    assert jobs(database) == {}


def test_two_directories_of_one_name_need_their_own_sets(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    first, second = tmp_path / "a" / "jobs", tmp_path / "b" / "jobs"
    for directory, name in ((first, "a"), (second, "b")):
        directory.mkdir(parents=True)
        write_job(directory, name, "true")
    gctl.ok("sync", str(first))
    line = error_line(gctl("sync", str(second)))
    assert f'applyset "jobs" already follows {first}, not {second}' in line
    assert "--applyset NAME" in line
    assert sorted(jobs(database)) == ["a"]
    gctl.ok("sync", str(second), "--applyset", "b-jobs")
    assert sorted(jobs(database)) == ["a", "b"]
    assert the_set(database, "jobs")["spec"]["source"] == str(first)


def test_an_old_rerun_token_in_a_manifest_is_ignored(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    write_job(tmp_path, "a", "true")
    gctl.ok("apply", "-f", str(tmp_path), "--applyset", "exp")
    dumped = gctl.ok("get", "job", "a", "-o", "yaml")
    assert "gctl/rerun" not in dumped
    text = dumped.replace("metadata:\n", "metadata:\n  annotations: {gctl/rerun: old}\n", 1)
    assert gctl.ok("apply", "-f", "-", stdin=text) == "job.gctl/a unchanged\n"
    annotations = jobs(database)["a"]["metadata"].get("annotations", {})
    assert "gctl/rerun" not in annotations


# -- gctl up + gctl sync --watch ---------------------------------------------------------------


@contextmanager
def process(gctl: Gctl, *argv: str, log: Path | None = None) -> Iterator[tuple[Lines, Lines]]:
    """A gctl process for the block, its stdout and stderr read as lines; SIGTERM at the end
    must end it with 0."""
    proc = subprocess.Popen(
        [GCTL_BIN, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=gctl.env(),
        cwd=gctl.cwd,
        bufsize=1,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        yield out, err
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        out.rest()
        err.rest()
        proc.stdout.close()
        proc.stderr.close()
    assert code == 0, (code, out.seen, err.seen)
    assert not any("Traceback" in line for line in err.seen), err.seen


@pytest.fixture
def cluster(gctl: Gctl, tmp_path: Path) -> Iterator[None]:
    args = ["up", "--fake-gpus", "2", "--node-name", "n1", "--state-dir", str(tmp_path / "st")]
    with process(gctl, *args, "--heartbeat", "0.5", "--grace-period", "1", "--backoff", "0.2"):
        yield


def phase(database: db.Database, name: str, *phases: str) -> Callable[[], bool]:
    return lambda: jobs(database).get(name, {}).get("status", {}).get("phase") in phases


def test_sync_watch_follows_the_directory(
    gctl: Gctl, database: db.Database, tmp_path: Path, cluster: None
) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    write_job(exp, "keep", "sleep", "60")
    with process(gctl, "sync", str(exp), "--watch") as (out, err):
        out.wait_for(lambda line: line == "job.gctl/keep created", WAIT)
        # Add a file: its Job appears and runs.
        write_job(exp, "train", "sleep", "60", priority=1)
        out.wait_for(lambda line: line == "job.gctl/train created", WAIT)
        wait_for(phase(database, "train", "Running"), "train to run")

        # A priority change is applied to the running Job.
        write_job(exp, "train", "sleep", "60", priority=5)
        out.wait_for(lambda line: line == "job.gctl/train configured", WAIT)

        # A command change of a started Job is refused (the default), on the terminal and in
        # the status; everything else stays as it was.
        write_job(exp, "train", "sleep", "61", priority=5)
        line = err.wait_for(lambda line: line.startswith("error: "), WAIT)
        assert "spec.command: cannot change a started Job" in line
        assert f"{exp}/train.yaml" in line
        assert wait_for(lambda: synced(database)["reason"] == "ApplyRefused", "status")
        write_job(exp, "train", "sleep", "60", priority=5)
        out.wait_for(lambda line: line.startswith("applyset.gctl/exp synced"), WAIT)

        # A broken file: the error names file, line and field; nothing else changes.
        bad = exp / "bad.yaml"
        bad.write_text(
            "apiVersion: gctl/v1\nkind: Job\nmetadata: {name: bad}\n"
            "spec:\n  command: [x]\n  bogus: 1\n"
        )
        line = err.wait_for(lambda line: "bad.yaml" in line, WAIT)
        assert f"{bad}:6: " in line
        assert "spec.bogus: unknown field" in line
        wait_for(lambda: "spec.bogus" in gctl.ok("describe", "applyset", "exp"), "describe")
        bad.write_text("apiVersion: gctl/v1\nkind: Job\nmetadata: {name: bad\n")
        line = err.wait_for(lambda line: "invalid YAML" in line, WAIT)
        assert f"{bad}:" in line
        assert synced(database)["status"] == "False"
        assert "bad" not in jobs(database)
        bad.unlink()
        out.wait_for(lambda line: line.startswith("applyset.gctl/exp synced"), WAIT)
        assert wait_for(lambda: synced(database)["status"] == "True", "synced again")

        # Drift: a change by hand is reverted; a deletion by hand is undone.
        changed = make_job("train").command("sleep", "60").priority(9).label("gctl/applyset", "exp")
        gctl.ok("apply", "-f", "-", stdin=changed.yaml())
        out.wait_for(lambda line: "drift reverted: spec.priority changed by hand" in line, WAIT)
        assert jobs(database)["train"]["spec"]["priority"] == 5
        gctl.ok("delete", "job", "keep")
        out.wait_for(lambda line: line == "job.gctl/keep created (drift reverted: deleted by hand)")
        events = gctl.ok("describe", "applyset", "exp")
        assert "DriftReverted" in events

        # A deleted file prunes its Job, which stops as `gctl delete` stops it.
        (exp / "train.yaml").unlink()
        out.wait_for(lambda line: line == "job.gctl/train pruned", WAIT)
        wait_for(lambda: "train" not in jobs(database), "train to be stopped and gone")
    assert sorted(m["name"] for m in the_set(database)["status"]["members"]) == ["keep"]


def test_sync_watch_follows_a_directory_deleted_and_recreated(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    """A CI re-clone or `rm -rf` + `cp`: the directory's inode is gone, its name comes back
    (often with the same inode number), and the watcher follows the new one; the same when the
    directory's parent goes and comes back."""
    clone = tmp_path / "clone"
    exp = clone / "exp"
    exp.mkdir(parents=True)
    write_job(exp, "train", "sleep", "60", priority=9)
    saved = tmp_path / "saved"
    with process(gctl, "sync", str(exp), "--watch") as (out, err):
        out.wait_for(lambda line: line == "job.gctl/train created", WAIT)
        shutil.copytree(exp, saved)
        shutil.rmtree(exp)
        line = err.wait_for(lambda line: line.startswith("error: "), WAIT)
        assert f"{exp}: no such file or directory; the last good state stays" in line
        shutil.copytree(saved, exp)
        write_job(exp, "train", "sleep", "60", priority=10)
        out.wait_for(lambda line: line == "job.gctl/train configured", WAIT)
        assert jobs(database)["train"]["spec"]["priority"] == 10
        assert wait_for(lambda: synced(database)["status"] == "True", "synced again")

        # The parent goes too, and comes back a level at a time, as `git clone` makes it.
        shutil.rmtree(clone)
        err.wait_for(lambda line: line.startswith("error: "), WAIT)
        clone.mkdir()
        shutil.copytree(saved, exp)
        write_job(exp, "train", "sleep", "60", priority=11)
        out.wait_for(lambda line: line == "job.gctl/train configured", WAIT)
        assert jobs(database)["train"]["spec"]["priority"] == 11


def test_sync_watch_follows_a_symlink_swapped_to_another_directory(
    gctl: Gctl, database: db.Database, tmp_path: Path
) -> None:
    """The README's way to replace the truth at once: a symlink to a complete copy, swapped
    (`ln -sfn v2 new && mv -T new current`). QA: sync resolved the link once, at its start,
    and followed v1 for ever."""
    v1, v2, current = tmp_path / "v1", tmp_path / "v2", tmp_path / "current"
    v1.mkdir()
    v2.mkdir()
    write_job(v1, "a", "sleep", "60", priority=1)
    write_job(v2, "a", "sleep", "60", priority=2)
    write_job(v2, "b", "sleep", "60")
    current.symlink_to("v1")
    with process(gctl, "sync", str(current), "--applyset", "exp", "--watch") as (out, _):
        out.wait_for(lambda line: line == "job.gctl/a created", WAIT)
        new = tmp_path / "new"
        new.symlink_to("v2")
        new.replace(current)  # rename(2): the swap is atomic
        out.wait_for(lambda line: line == "job.gctl/b created", WAIT)
        assert jobs(database)["a"]["spec"]["priority"] == 2
        write_job(v2, "a", "sleep", "60", priority=3)  # and v2 is the one watched now
        out.wait_for(lambda line: line == "job.gctl/a configured", WAIT)
    assert the_set(database)["spec"]["source"] == str(current)


def test_sync_rerun_on_change(
    gctl: Gctl, database: db.Database, tmp_path: Path, cluster: None
) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    write_job(exp, "train", "sleep", "60")
    gctl.ok("sync", str(exp))  # one pass, then exit 0
    wait_for(phase(database, "train", "Running"), "train to run")
    with process(gctl, "sync", str(exp), "--watch", "--on-spec-change", "rerun") as (out, _):
        out.wait_for(lambda line: line.startswith("applyset.gctl/exp synced"), WAIT)
        write_job(exp, "train", "sleep", "61")
        line = out.wait_for(lambda line: line.startswith("job.gctl/train configured"), WAIT)
        assert line.endswith("(rerun: spec.command changed (applyset exp))")
    annotations = jobs(database)["train"]["metadata"]["annotations"]
    assert annotations["gctl/rerun-reason"] == "spec.command changed (applyset exp)"
    assert annotations["gctl/rerun"].endswith("Z")
    assert the_set(database)["spec"]["onSpecChange"] == "Rerun"
    # Applying the same directory again is no change: the rerun annotations are gctl's own.
    assert gctl.ok("diff", "-f", str(exp), "--applyset", "exp") == ""
