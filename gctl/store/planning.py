"""Planning an apply: what applying each manifest does, decided by pure functions.

`plan` takes the manifests and a snapshot of the stored objects they name and returns one
`Action` per manifest: created, configured, unchanged, replaced (`--force`), or configured
with a re-run of a started Job (`onSpecChange: Rerun`); or it refuses, naming the manifest,
the field and the fix. `prune` picks the members of an ApplySet that the input no longer
holds; `applied_fingerprint` is what apply decides of an object, for a sync to tell drift.
Nothing here reads or writes: gctl.store.applying reads the snapshot, calls these and writes
the actions, so a dry run, `gctl diff`, the GitOps sync and the tests share them.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from gctl.api import applyset, errors, job, kinds, manifest, meta
from gctl.store import applysets

Verb = Literal["created", "configured", "unchanged", "replaced", "pruned"]
# The annotations gctl writes, a re-run's token and reason: apply keeps the stored values and
# ignores a manifest's (an old token in a `get -o yaml` dump must not run the Job again).
# Every other annotation, `gctl/` ones included, is the manifest's.
SERVER_OWNED = frozenset({job.ANNOTATION_RERUN, job.ANNOTATION_RERUN_REASON})


@dataclass(frozen=True)
class Action:
    verb: Verb
    source: manifest.Source | None  # None for a pruned object
    desired: meta.Resource  # what the object will be (server fields from `current` if any)
    current: meta.Resource | None
    rerun: str | None = None  # why a started Job runs again with its new spec


def ref_of(obj: meta.Resource) -> str:
    """`job.gctl/hello`, with the namespace when it is not the default one."""
    namespace = obj.metadata.namespace
    where = f"{namespace}/" if namespace and namespace != kinds.DEFAULT_NAMESPACE else ""
    return f"{obj.KIND.lower()}.gctl/{where}{obj.name}"


def plan(
    manifests: Sequence[manifest.Manifest],
    current: dict[applysets.Key, meta.Resource],
    force: bool,
    *,
    set_name: str | None = None,
    set_policy: applyset.OnSpecChange | None = None,
    now: datetime | None = None,
    gone_sets: frozenset[str] = frozenset(),
) -> list[Action]:
    """Decide what applying each manifest does; pure, so dry runs and tests share it.

    With `set_name`, every object becomes a member of that ApplySet (its label); an object
    that belongs to another set is refused, unless that set is gone (`gone_sets`: deleted,
    its members left behind). `set_policy` is the set's `onSpecChange`."""
    actions = []
    for m in manifests:
        existing = current.get(applysets.key_of(m.obj))
        labels = _labels(m, existing, set_name, gone_sets)
        if applyset.LABEL in labels:
            _check_no_ttl(m, labels[applyset.LABEL])
        given = without_server_owned(m.obj.metadata.annotations)
        if existing is None:
            created = _with_metadata(m.obj, labels, given)
            actions.append(Action("created", m.source, created, None))
            continue
        _check_preconditions(m, existing)
        annotations = given | _server_owned(existing.metadata.annotations)
        desired = _with_metadata(existing, labels, annotations).model_copy(
            update={"spec": m.obj.spec}
        )
        if _applied_fields(desired) == _applied_fields(existing):
            actions.append(Action("unchanged", m.source, existing, existing))
            continue
        frozen = _frozen_field_changed(existing, desired)
        # Written into an object on its way out, a change would be gone with it (QA: a Sweep
        # applied while being deleted said `configured`, then was gone): replaced, or refused.
        deleting = existing.metadata.deletion_timestamp is not None
        if frozen is None and not deleting:
            actions.append(Action("configured", m.source, desired, existing))
        elif force:
            actions.append(Action("replaced", m.source, desired, existing))
        elif deleting or frozen is None:  # (frozen is None only for one being deleted)
            raise _being_deleted(m, existing, frozen or changed_field(existing, desired))
        elif _policy(desired, set_policy) == applyset.RERUN:
            actions.append(
                _rerun(
                    m.source,
                    desired,
                    existing=existing,
                    frozen=frozen,
                    set_name=set_name,
                    now=now,
                )
            )
        else:
            raise errors.Forbidden(
                f'{m.source} ({existing.KIND} "{existing.name}"): {frozen}: cannot change a '
                f"started Job (phase {existing.status.phase}); apply with --force to delete "
                "and recreate it, or set spec.onSpecChange: Rerun to stop it and run the new spec"
            )
    return actions


def _being_deleted(m: manifest.Manifest, existing: meta.Resource, frozen: str) -> errors.Forbidden:
    """A change to an object on its way out (Terminating): neither the change nor a rerun
    would outlive it."""
    kind = existing.KIND
    return errors.Forbidden(
        f'{m.source} ({kind} "{existing.name}"): {frozen}: cannot change a {kind} that '
        "is being deleted (object is being deleted; its processes may still be stopping); wait "
        "for it to be gone and apply again, or apply with --force to replace it once it is gone"
    )


def changed_field(current: meta.Resource, desired: meta.Resource) -> str:
    """The first field apply decides (spec, labels, annotations) that differs."""
    old, new = current.wire(), desired.wire()
    if old.get("spec") != new.get("spec"):
        return first_difference("spec", old.get("spec"), new.get("spec"))
    for part in ("labels", "annotations"):
        before, after = old["metadata"].get(part, {}), new["metadata"].get(part, {})
        if before != after:
            return first_difference(f"metadata.{part}", before, after)
    return "metadata"


def prune(members: Iterable[meta.Resource], manifests: Sequence[manifest.Manifest]) -> list[Action]:
    """The members the input no longer holds: deleted, as `gctl delete` deletes them.

    Objects owned by another (a Sweep's Jobs) go with their owner and are never pruned, and
    an object already being deleted needs nothing more."""
    wanted = {applysets.key_of(m.obj) for m in manifests}
    return [
        Action("pruned", None, obj, obj)
        for obj in members
        if applysets.key_of(obj) not in wanted
        and not any(owner.controller for owner in obj.metadata.owner_references)
        and obj.metadata.deletion_timestamp is None
    ]


def _labels(
    m: manifest.Manifest,
    existing: meta.Resource | None,
    set_name: str | None,
    gone_sets: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """The manifest's labels and the membership label: the set applying it, or else the one
    it already has (a one-off `gctl apply` of a member does not take it out of its set). A
    label naming a set that is gone is no claim: another set may take the object (QA: a
    deleted set's members could join no other, and only deleting them got them out)."""
    labels = dict(m.obj.metadata.labels)
    given = labels.get(applyset.LABEL)
    held = existing.metadata.labels.get(applyset.LABEL) if existing is not None else None
    if set_name is not None and held in gone_sets:
        held = None
    where = f'{m.source} ({m.obj.KIND} "{m.obj.name}")'
    if set_name is None:
        if held is not None:
            labels[applyset.LABEL] = held
        return labels
    if given is not None and given != set_name:
        raise errors.Invalid(
            f"{where}: metadata.labels.{applyset.LABEL}: {given!r} is not the applyset "
            f"{set_name!r} being applied; remove the label, gctl sets it"
        )
    if held is not None and held != set_name:
        raise errors.Forbidden(
            f"{where}: {m.obj.KIND.lower()} {m.obj.name!r} already belongs to applyset "
            f"{held!r}; remove it from that set's input (and apply it) first"
        )
    labels[applyset.LABEL] = set_name
    return labels


def _check_no_ttl(m: manifest.Manifest, set_name: str) -> None:
    """A member Job's TTL would run it forever: the TTL deletes the finished Job, and the set,
    whose input still holds it, creates it again."""
    if isinstance(m.obj, job.Job) and m.obj.spec.ttl_seconds_after_finished is not None:
        raise errors.Invalid(
            f'{m.source} (Job "{m.obj.name}"): spec.ttlSecondsAfterFinished: not allowed in '
            f"applyset {set_name!r}: once the TTL deleted the finished Job, the set would "
            "recreate it and run it again; remove the field"
        )


def _with_metadata(
    obj: meta.Resource, labels: dict[str, str], annotations: dict[str, str]
) -> meta.Resource:
    metadata = obj.metadata.model_copy(update={"labels": labels, "annotations": annotations})
    return obj.model_copy(update={"metadata": metadata})


def _server_owned(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k in SERVER_OWNED}


def _applied_fields(obj: meta.Resource) -> tuple[Any, ...]:
    return obj.spec, obj.metadata.labels, obj.metadata.annotations


def applied_fingerprint(wire: dict[str, Any]) -> tuple[str, str, str]:
    """What apply decides of a stored object, comparable across reads: spec, labels and the
    annotations gctl does not own (a sync tells drift made by hand by it)."""
    import json

    metadata = wire["metadata"]
    annotations = without_server_owned(metadata.get("annotations", {}))
    return (
        json.dumps(wire.get("spec", {}), sort_keys=True),
        json.dumps(metadata.get("labels", {}), sort_keys=True),
        json.dumps(annotations, sort_keys=True),
    )


def without_server_owned(annotations: dict[str, str]) -> dict[str, str]:
    """The annotations a manifest gives (or a replacement keeps): all but `SERVER_OWNED`."""
    return {k: v for k, v in annotations.items() if k not in SERVER_OWNED}


def _policy(desired: meta.Resource, set_policy: applyset.OnSpecChange | None) -> str:
    own = desired.spec.on_spec_change if isinstance(desired, job.Job) else None
    return applyset.effective_policy(own, set_policy)


def _rerun(
    source: manifest.Source,
    desired: meta.Resource,
    *,
    existing: meta.Resource,
    frozen: str,
    set_name: str | None,
    now: datetime | None,
) -> Action:
    """The new spec, and a fresh re-run token: the Job controller stops the old run and
    starts the new one (once per token), saying why."""
    token = (now or meta.utcnow()).isoformat(timespec="microseconds").replace("+00:00", "Z")
    why = f"{frozen} changed" + (f" (applyset {set_name})" if set_name else "")
    annotations = desired.metadata.annotations | {
        job.ANNOTATION_RERUN: token,
        job.ANNOTATION_RERUN_REASON: why,
    }
    rerun = _with_metadata(desired, desired.metadata.labels, annotations)
    return Action("configured", source, rerun, existing, rerun=why)


def _check_preconditions(m: manifest.Manifest, existing: meta.Resource) -> None:
    """A uid or resourceVersion in the manifest (as `get -o yaml` writes) must still hold."""
    given = m.obj.metadata
    where = f'{m.source} ({existing.KIND} "{existing.name}")'
    if given.uid is not None and given.uid != existing.metadata.uid:
        raise errors.Conflict(
            f"{where}: metadata.uid {given.uid} is not the stored object's "
            f"({existing.metadata.uid}): it was deleted and recreated; remove uid to apply"
        )
    rv = given.resource_version
    if rv is not None and rv != existing.metadata.resource_version:
        raise errors.Conflict(
            f"{where}: metadata.resourceVersion {rv} is stale (now "
            f"{existing.metadata.resource_version}): get it again, or remove resourceVersion"
        )


def _frozen_field_changed(existing: meta.Resource, desired: meta.Resource) -> str | None:
    """The path of the first immutable field a change touches on a started Job, if any."""
    if not isinstance(existing, job.Job) or not job.has_started(existing.wire()["status"]):
        return None
    old, new = existing.wire()["spec"], desired.wire()["spec"]
    for name in job.IMMUTABLE_ONCE_STARTED:
        if old.get(name) != new.get(name):
            return "spec." + first_difference(name, old.get(name), new.get(name))
    return None


def first_difference(path: str, old: Any, new: Any) -> str:
    """The path of the first field in which two differing wire values differ."""
    # An empty mapping is dropped from the wire: `resources` absent is `resources: {}`.
    if isinstance(old, dict) and new is None:
        new = {}
    elif isinstance(new, dict) and old is None:
        old = {}
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                return first_difference(f"{path}.{key}", old.get(key), new.get(key))
    return path
