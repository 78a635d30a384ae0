"""`gctl apply`, `gctl diff` and `gctl delete -f`: manifests against what the database holds.

The decision and its one-transaction write live in `gctl.store.applying`, shared with the
GitOps sync; this module is the CLI's side of them: the lines apply prints, diff's text, and
how `apply --force` waits for the started Jobs it replaces to be gone (`DeletionWait`).
"""

import difflib
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gctl.api import applyset, errors, job, manifest, meta
from gctl.store import applying, applysets, planning

if TYPE_CHECKING:
    from gctl.store import db, store

# How long `apply --force` waits for what it replaces, by default: a stop takes the Job's grace
# period (SIGTERM to SIGKILL) on top of this.
DELETION_TIMEOUT_S = 60.0
PROGRESS_AFTER_S = 1.0  # a wait longer than this is said on stderr
PROGRESS_EVERY_S = 10.0

# `gctl apply` (gctl.cli.commands) calls the engine through this module: it chooses whether the
# driver alone or the Store does the work.
apply_at = applying.apply_at


def set_options(
    name: str | None, prune: bool, on_spec_change: str | None, files: Sequence[str]
) -> applying.SetOptions | None:
    """`--applyset NAME [--prune] [--on-spec-change P]` as the engine takes them."""
    if name is None:
        if prune:
            raise errors.Invalid(
                "--prune needs --applyset NAME: gctl prunes only the objects a set applied"
            )
        if on_spec_change is not None:
            raise errors.Invalid(
                "--on-spec-change needs --applyset NAME; a Job can say spec.onSpecChange itself"
            )
        return None
    policy = checked_set_flags(name, on_spec_change)
    sources = [f if f == manifest.STDIN else str(Path(f).resolve()) for f in files]
    return applying.SetOptions(
        name=name, prune=prune, on_spec_change=policy, source=", ".join(sources)
    )


def checked_set_flags(name: str, on_spec_change: str | None) -> applyset.OnSpecChange | None:
    """`--applyset NAME` and `--on-spec-change P`, as `apply` and `sync` both take them."""
    try:
        applyset.check_name(name)
    except ValueError as exc:
        raise errors.Invalid(f"--applyset: {exc}") from None
    try:
        return applyset.policy(on_spec_change) if on_spec_change is not None else None
    except ValueError as exc:
        raise errors.Invalid(f"--on-spec-change: {exc}") from None


def line(action: planning.Action, obj: meta.Resource, suffix: str) -> str:
    """`job.gctl/hello created`, `job.gctl/old pruned (dry run)`, and why a Job runs again."""
    why = f" (rerun: {action.rerun})" if action.rerun else ""
    return f"{obj.ref()} {action.verb}{why}{suffix}"


def diff(
    url: str,
    manifests: Sequence[manifest.Manifest],
    force: bool,
    options: applying.SetOptions | None = None,
) -> str:
    """A unified diff of each object as stored against what apply would make it; a pruned
    object is diffed against nothing."""
    actions = applying.decide_at(url, manifests, force, options)
    chunks: list[str] = []
    for action in actions:
        if action.verb == "unchanged":
            continue
        name = "/".join(part for part in applysets.key_of(action.desired) if part)
        before = _diffable(action.current) if action.current and action.verb != "replaced" else ""
        after = "" if action.verb == "pruned" else _diffable(action.desired)
        chunks.extend(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"live/{name}" if action.current else "/dev/null",
                tofile="/dev/null" if action.verb == "pruned" else f"merged/{name}",
            )
        )
    return "".join(chunks)


def _diffable(obj: meta.Resource) -> str:
    """The object as it would read after apply, without fields that apply does not decide."""
    from gctl.cli import printers

    wire = obj.wire()
    metadata = {
        k: v
        for k, v in wire["metadata"].items()
        if k in ("name", "namespace", "labels", "annotations")
    }
    document = {
        "apiVersion": wire["apiVersion"],
        "kind": wire["kind"],
        "metadata": metadata,
        "spec": wire["spec"],
    }
    return printers.dump_yaml(document)


class DeletionWait:
    """How `apply --force` waits for the objects it replaces to be gone (`applying.WaitGone`):
    it follows the change feed until each one's removal, says on stderr what it waits for once
    that takes more than a moment, and gives up at `--timeout` (counted from the first wait of
    the command) with one line naming them; Ctrl-C stops it. Either way only their deletion
    was written; applying again finishes the work."""

    def __init__(self, timeout: str | None) -> None:
        from gctl.cli import waiting

        self._seconds = waiting.parse_timeout(timeout) if timeout is not None else None
        self._started = 0.0
        self._notes = 0  # progress lines printed

    def __call__(self, database: "db.Database", deleting: applying.Deleting) -> None:
        from gctl.cli import following
        from gctl.store import feed, notify

        if not self._started:  # the first wait of the command
            self._started = time.monotonic()
            if self._seconds is None:
                self._seconds = default_timeout(deleting.objects)
        seconds = self._seconds or 0.0
        deadline = self._started + seconds
        left = {obj.metadata.uid: obj for obj in deleting.objects}
        kinds = sorted({obj.KIND for obj in deleting.objects})
        stop = notify.Stop()
        with (
            following.interruptible(stop) as interrupted,
            feed.Watch(database, since=deleting.since, kinds=kinds, stop=stop) as changes,
        ):
            if _all_gone(left, changes.poll()):  # checked once, whatever the --timeout
                return
            while (now := time.monotonic()) < deadline:
                timer = threading.Timer(max(min(deadline, self._next_note()) - now, 0.0), stop.set)
                timer.daemon = True
                timer.start()
                try:  # until `stop`: the deadline, a note, or Ctrl-C
                    if any(_all_gone(left, batch) for batch in changes):
                        return
                finally:
                    timer.cancel()
                    timer.join()  # its set done, if it fired: a clear must not race it
                stop.clear()  # then look: a Ctrl-C's set after the look would be cleared
                if interrupted.is_set():
                    print(
                        f"interrupted: {_refs(left)} marked for deletion; nothing else applied",
                        file=sys.stderr,
                    )
                    raise SystemExit(following.INTERRUPTED)
                if self._next_note() <= time.monotonic() < deadline:
                    self._note(left)
        raise errors.GctlError(
            f"{_refs(left)} still being deleted after {seconds:g}s (is the controller "
            "running?); it stays marked for deletion and nothing else was applied: apply "
            "--force again to wait for it and create the new one"
        )

    def _next_note(self) -> float:
        """When the next progress line is due: after a moment, then every PROGRESS_EVERY_S."""
        return self._started + (PROGRESS_EVERY_S * self._notes if self._notes else PROGRESS_AFTER_S)

    def _note(self, left: dict[str | None, meta.Resource]) -> None:
        if self._notes:
            why = f"{time.monotonic() - self._started:.0f}s so far"
        else:
            why = "the controller stops its attempts first"
        self._notes += 1
        print(f"waiting for {_refs(left)} to be deleted: {why}", file=sys.stderr, flush=True)


def default_timeout(objs: Sequence[meta.Resource]) -> float:
    """DELETION_TIMEOUT_S, and the longest grace period that a replaced Job gives its process."""
    graces = [
        obj.spec.termination_grace_period_seconds or 0 for obj in objs if isinstance(obj, job.Job)
    ]
    return DELETION_TIMEOUT_S + max(graces, default=0)


def _all_gone(left: dict[str | None, meta.Resource], changes: Sequence["store.Change"]) -> bool:
    """Drop from `left` what `changes` deleted; whether nothing is left."""
    for change in changes:
        if change.type == "DELETED":
            left.pop(change.uid, None)
    return not left


def _refs(objs: dict[str | None, meta.Resource]) -> str:
    return ", ".join(planning.ref_of(obj) for obj in objs.values())
