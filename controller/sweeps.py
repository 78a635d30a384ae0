"""The Sweep lifecycle: a Sweep's points become child Jobs, and their phases its progress.

`reconcile(store, namespace, name, now)` re-reads the Sweep and the Jobs labelled with its name
and moves them one step: it creates the Jobs of points that have none (keeping at most
`maxParallel` unfinished: later Jobs are created as earlier ones finish, so that `suspend`
stays the user's), brings children that have not started up to date with the template (when
it may have changed: a new generation, or a files Sweep), deletes
children of removed points that have not started (those that started are kept, as results),
and writes the counts and phase. A deleting Sweep deletes its children first (their own
finalizers stop those that run) and lets go once none is left. A `files` glob is expanded here,
on the controller's host, and looked at again every minute.

`dependency()` says what a name in a Job's `dependsOn` stands for now: a Job, else a Sweep.
"""

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gctl.api import job, meta, sweep
from gctl.store import store

SOURCE = "controller/sweeps"
RESCAN = timedelta(seconds=60)  # how soon a files Sweep sees a file that appeared
_CHUNK = 500
Wire = dict[str, Any]


@dataclass
class Plan:
    """What one reconcile writes to a Sweep's children."""

    create: list[job.Job] = field(default_factory=list)
    update: list[job.Job] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    taken: list[str] = field(default_factory=list)  # names held by Jobs the Sweep does not own


def reconcile(writer: store.Store, namespace: str, name: str, now: datetime) -> datetime | None:
    s = writer.find(sweep.Sweep, name, namespace)
    owned = children(writer, namespace, name)
    if s is None or s.metadata.deletion_timestamp is not None:
        _collect(writer, s, name, owned)
        return None
    mine: dict[str, Wire] = {}
    for child_name, wire in owned.items():
        owner = sweep.owner(wire)
        if owner is not None and owner[1] != s.metadata.uid:  # left by an earlier Sweep
            _delete(writer, wire)
        elif owner is not None:
            mine[child_name] = wire
    if sweep.FINALIZER not in s.metadata.finalizers:
        s.metadata.finalizers = [*s.metadata.finalizers, sweep.FINALIZER]
        s = writer.update(s)
    problem = None
    files = None
    if s.spec.files is not None:
        files = expand(s.spec)
        if not files:
            problem = (sweep.REASON_NO_FILES, _no_files_message(s.spec))
    points = sweep.points(s.spec, files)
    planned = problem is None  # never delete children because this host sees no files
    if planned:
        others = _others(writer, namespace, [sweep.child_name(name, p) for p in points], mine)
        decided = plan(s, points, mine, others, refresh=_template_may_differ(s))
        _write(writer, decided, namespace)
        if decided.taken:
            problem = (
                sweep.REASON_NAME_TAKEN,
                f"Job {decided.taken[0]} exists and is not this Sweep's: delete or rename it",
            )
    names = [sweep.child_name(name, p) for p in points]
    _report(writer, s, names, mine, problem=problem, planned=planned, now=now)
    return now + RESCAN if s.spec.files is not None else None


def children(reader: store.Store, namespace: str, name: str) -> dict[str, Wire]:
    """The Jobs labelled as this Sweep's, by name (the label is matched in SQL)."""
    return {
        w["metadata"]["name"]: w
        for w in reader.list_wire_labelled(job.Job, namespace, sweep.LABEL, name)
    }


def _template_may_differ(s: sweep.Sweep) -> bool:
    """Whether children made before may no longer be what the template renders: the spec
    changed since the last plan was written (observedGeneration moves only with one), or the
    points come from files, whose `{index}` shifts when a file appears or goes."""
    return s.status.observed_generation != s.metadata.generation or s.spec.files is not None


def expand(spec: sweep.SweepSpec, cwd: str | None = None) -> list[str]:
    """The regular files the glob matches, as matched (relative globs stay relative: the
    Jobs run in the same workingDir). A relative glob is taken from the template's
    workingDir, which apply made absolute unless it starts with `~` (expanded here); with no
    workingDir, apply made the glob absolute. A relative path that an older gctl stored is
    taken from this process's directory, as it was then."""
    pattern = os.path.expanduser(spec.files or "")
    # As the Jobs get it: `{{x}}` is a literal `{x}` (there are no placeholders: apply refuses
    # them in a workingDir that a glob is relative to).
    directory = sweep.fill(spec.template.spec.working_dir or "", {}, "workingDir")
    base = os.path.join(cwd or os.getcwd(), os.path.expanduser(directory))
    if os.path.isabs(pattern):
        matches = glob.glob(pattern, recursive=True)
    else:
        matches = glob.glob(pattern, root_dir=base, recursive=True)
    return sorted(m for m in matches if os.path.isfile(os.path.join(base, m)))


def _no_files_message(spec: sweep.SweepSpec) -> str:
    pattern = spec.files or ""
    under = ""
    if not os.path.isabs(os.path.expanduser(pattern)):
        under = f" under {spec.template.spec.working_dir or os.getcwd()}"
    return (
        f"files {pattern} matches no file{under} on the controller's host (the controller "
        "expands the glob: it must see the files, as on one box or a shared filesystem)"
    )


def plan(
    s: sweep.Sweep,
    points: Sequence[sweep.Point],
    mine: dict[str, Wire],
    others: set[str],
    *,
    refresh: bool = True,
) -> Plan:
    """Decide what to write; pure. New points get Jobs in order while fewer than maxParallel
    are unfinished; Jobs that have not started follow the template (rendered and compared
    only when `refresh`: the template may have changed since they were made); Jobs of
    removed points that have not started are deleted."""
    decided = Plan()
    wanted = {sweep.child_name(s.name, p): p for p in points}
    for child_name, wire in mine.items():
        if child_name not in wanted and _idle(wire):
            decided.delete.append(child_name)
    unfinished = sum(
        1
        for child_name, wire in mine.items()
        if child_name not in decided.delete and not _finished(wire)
    )
    budget = len(wanted) if s.spec.max_parallel is None else s.spec.max_parallel - unfinished
    for child_name, point in wanted.items():
        if child_name in others:
            decided.taken.append(child_name)
            continue
        existing = mine.get(child_name)
        if existing is None:
            if budget > 0:
                decided.create.append(sweep.child(s, point))
                budget -= 1
            continue
        if refresh and _idle(existing):
            changed = _changed(existing, sweep.child(s, point))
            if changed is not None:
                decided.update.append(changed)
    return decided


def _idle(wire: Wire) -> bool:
    """Never run and not being deleted: free to change or delete. A Job that failed before
    it ever ran (its dependency failed, or made a cycle) is idle too: it holds no result, and
    the README's way out, fixing the Sweep's dependsOn and `gctl rerun`, needs the fix to
    reach it (QA: the rerun ran the old template again, and failed as before)."""
    status = wire["status"]
    never_ran = status.get("phase", "Pending") in ("Pending", "Failed") and not int(
        status.get("attempts", 0)
    )
    return never_ran and not wire["metadata"].get("deletionTimestamp")


def _finished(wire: Wire) -> bool:
    return wire["status"].get("phase", "Pending") in job.FINISHED_PHASES or bool(
        wire["metadata"].get("deletionTimestamp")
    )


def _changed(existing: Wire, rendered: job.Job) -> job.Job | None:
    """The stored child with the rendered spec, labels and annotations, or None if equal."""
    wanted = rendered.wire()
    old_meta, new_meta = existing["metadata"], wanted["metadata"]
    if (
        existing["spec"] == wanted["spec"]
        and old_meta.get("labels", {}) == new_meta.get("labels", {})
        and old_meta.get("annotations", {}) == new_meta.get("annotations", {})
    ):
        return None
    current = job.Job.model_validate(existing)
    current.spec = rendered.spec
    current.metadata.labels = rendered.metadata.labels
    current.metadata.annotations = rendered.metadata.annotations
    return current


def _others(
    reader: store.Store, namespace: str, wanted: list[str], mine: dict[str, Wire]
) -> set[str]:
    """Names the Sweep wants that Jobs it does not own already hold."""
    missing = [n for n in wanted if n not in mine]
    found: set[str] = set()
    for start in range(0, len(missing), _CHUNK):
        chunk = missing[start : start + _CHUNK]
        found |= {w["metadata"]["name"] for w in reader.list_wire(job.Job, namespace, names=chunk)}
    return found


def _write(writer: store.Store, decided: Plan, namespace: str) -> None:
    writer.create_many(decided.create)
    for changed in decided.update:
        writer.update(changed)
    for child_name in decided.delete:
        writer.delete(job.Job, child_name, namespace)


def _delete(writer: store.Store, wire: Wire) -> bool:
    """Delete a child (a running one is stopped by its own finalizer); True once it is gone."""
    if wire["metadata"].get("deletionTimestamp"):
        return False
    _, gone = writer.delete(job.Job, wire["metadata"]["name"], wire["metadata"]["namespace"])
    return gone


def _collect(writer: store.Store, s: sweep.Sweep | None, name: str, owned: dict[str, Wire]) -> None:
    """A deleted or deleting Sweep: delete what it owns, then let it go."""
    doomed = [w for w in owned.values() if (o := sweep.owner(w)) is not None and o[0] == name]
    left = [w for w in doomed if not _delete(writer, w)]
    if s is not None and not left and sweep.FINALIZER in s.metadata.finalizers:
        s.metadata.finalizers = [f for f in s.metadata.finalizers if f != sweep.FINALIZER]
        writer.update(s)


def _report(
    writer: store.Store,
    s: sweep.Sweep,
    names: list[str],
    mine: dict[str, Wire],
    *,
    problem: tuple[str, str] | None,
    planned: bool,
    now: datetime,
) -> None:
    """Write the counts, phase and conditions, if they changed. The generation is observed
    only once its plan was written: with no files seen, the children wait for the next one.
    A problem that stops it (a name taken, no files) is told once, as a Warning event."""
    told = (s.status.reason, s.status.message)
    statuses = [mine[n]["status"] for n in names if n in mine]
    phases = [status.get("phase", "Pending") for status in statuses]
    again = sum(
        1 for st in statuses if st.get("phase", "Pending") == "Pending" and job.has_started(st)
    )
    counted = sweep.progress(len(names), phases, again)
    status = s.status.model_copy(deep=True)
    before = status.phase
    status.phase = counted.phase
    status.total, status.succeeded = counted.total, counted.succeeded
    status.failed, status.running, status.pending = (
        counted.failed,
        counted.running,
        counted.pending,
    )
    if planned:
        status.observed_generation = s.metadata.generation
    status.reason, status.message = problem or _outcome(counted)
    finished = counted.phase in job.FINISHED_PHASES
    status.completion_time = (status.completion_time or now) if finished else None
    _set_outcome(status, s.metadata.generation, now)
    if status == s.status:
        return
    s.status = status
    s = writer.update_status(s)
    if problem is not None and problem != told:
        writer.record_event(s, problem[0], problem[1], type_="Warning", source=SOURCE)
    if finished and before != counted.phase:
        writer.record_event(
            s,
            status.reason or counted.phase,
            status.message or "",
            type_="Normal" if counted.phase == "Succeeded" else "Warning",
            source=SOURCE,
        )


def _set_outcome(status: sweep.SweepStatus, generation: int | None, now: datetime) -> None:
    """Complete or Failed true for the phase reached; false again once it is left (a new
    point added to a finished Sweep)."""
    for condition, phase in (
        (sweep.CONDITION_COMPLETE, "Succeeded"),
        (sweep.CONDITION_FAILED, "Failed"),
    ):
        if status.phase == phase:
            reason, message = status.reason or "", status.message or ""
            meta.set_condition(
                status.conditions,
                condition,
                "True",
                reason,
                message,
                generation=generation,
                now=now,
            )
        elif any(c.type == condition for c in status.conditions):
            meta.set_condition(
                status.conditions, condition, "False", "Progressing", generation=generation, now=now
            )


def _outcome(counted: sweep.Progress) -> tuple[str | None, str | None]:
    if counted.phase == "Succeeded":
        return sweep.REASON_COMPLETED, f"{counted.succeeded}/{counted.total} Jobs succeeded"
    if counted.phase == "Failed":
        return sweep.REASON_CHILDREN_FAILED, f"{counted.failed}/{counted.total} Jobs failed"
    return None, None


def dependency(reader: store.Store, namespace: str, name: str) -> sweep.Dependency:
    """What a name in `dependsOn` stands for now: a Job of that name, else a Sweep. A Sweep
    changed since its status was written has not succeeded yet (it may have new points)."""
    found = reader.list_wire(job.Job, namespace, names=[name])
    if found:
        return sweep.Dependency(name, job.Job.KIND, found[0]["status"].get("phase", "Pending"))
    # The stored form only: validating a Sweep expands all its points.
    others = reader.list_wire(sweep.Sweep, namespace, names=[name])
    if not others:
        return sweep.Dependency(name, None)
    status, generation = others[0]["status"], others[0]["metadata"].get("generation")
    phase = str(status.get("phase", "Pending"))
    if status.get("observedGeneration") != generation:
        phase = "Pending"
    return sweep.Dependency(
        name, sweep.Sweep.KIND, phase, int(status.get("failed", 0)), int(status.get("total", 0))
    )
