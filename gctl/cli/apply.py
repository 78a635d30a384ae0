"""`gctl apply`, `gctl diff` and `gctl delete -f`: manifests against what the database holds.

Apply is compute-then-apply: read the objects the manifests name, decide each one's action
with a pure function, then write every action in one transaction. A stale read (someone wrote
in between) makes the transaction fail and the whole apply run again from a fresh read.
"""

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gctl.api import errors, job, manifest, meta
from gctl.cli import printers
from gctl.store import db, store

Verb = Literal["created", "configured", "unchanged", "replaced"]
Key = tuple[str, str, str]  # kind, namespace, name
_CHUNK = 500  # names per IN (...) query


@dataclass(frozen=True)
class Action:
    verb: Verb
    source: manifest.Source
    desired: meta.Resource  # what the object will be (server fields from `current` if any)
    current: meta.Resource | None


def key_of(obj: meta.Resource) -> Key:
    return (obj.KIND, store.namespace_of(type(obj), obj.metadata.namespace), obj.name)


def snapshot(reader: store.Store, manifests: Sequence[manifest.Manifest]) -> dict[Key, Any]:
    """The stored objects the manifests name, read in as few queries as possible."""
    wanted: dict[tuple[type[meta.Resource], str], list[str]] = {}
    for m in manifests:
        cls = type(m.obj)
        wanted.setdefault((cls, store.namespace_of(cls, m.obj.metadata.namespace)), []).append(
            m.obj.name
        )
    found: dict[Key, meta.Resource] = {}
    for (cls, namespace), names in wanted.items():
        for start in range(0, len(names), _CHUNK):
            for wire in reader.list_wire(cls, namespace, names=names[start : start + _CHUNK]):
                obj = cls.model_validate(wire)
                found[key_of(obj)] = obj
    return found


def plan(
    manifests: Sequence[manifest.Manifest], current: dict[Key, meta.Resource], force: bool
) -> list[Action]:
    """Decide what applying each manifest does; pure, so dry runs and tests share it."""
    actions = []
    for m in manifests:
        existing = current.get(key_of(m.obj))
        if existing is None:
            actions.append(Action("created", m.source, m.obj, None))
            continue
        _check_preconditions(m, existing)
        desired = existing.model_copy(
            update={
                "spec": m.obj.spec,
                "metadata": existing.metadata.model_copy(
                    update={
                        "labels": m.obj.metadata.labels,
                        "annotations": m.obj.metadata.annotations,
                    }
                ),
            }
        )
        if _applied_fields(desired) == _applied_fields(existing):
            actions.append(Action("unchanged", m.source, existing, existing))
            continue
        frozen = _frozen_field_changed(existing, desired)
        if frozen is not None and not force:
            raise errors.Forbidden(
                f'{m.source} ({existing.KIND} "{existing.name}"): {frozen}: cannot change a '
                f"started Job (phase {existing.status.phase}); apply with --force to delete "
                "and recreate it"
            )
        actions.append(Action("replaced" if frozen else "configured", m.source, desired, existing))
    return actions


def _applied_fields(obj: meta.Resource) -> tuple[Any, ...]:
    return obj.spec, obj.metadata.labels, obj.metadata.annotations


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
            return "spec." + _first_difference(name, old.get(name), new.get(name))
    return None


def _first_difference(path: str, old: Any, new: Any) -> str:
    # An empty mapping is dropped from the wire: `resources` absent is `resources: {}`.
    if isinstance(old, dict) and new is None:
        new = {}
    elif isinstance(new, dict) and old is None:
        old = {}
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                return _first_difference(f"{path}.{key}", old.get(key), new.get(key))
    return path


def execute(writer: store.Store, actions: Sequence[Action]) -> list[meta.Resource]:
    """Write a plan; returns the objects as stored, in the order of the actions."""
    results: list[meta.Resource | None] = [None] * len(actions)
    creations = [i for i, a in enumerate(actions) if a.verb == "created"]
    for action_index, obj in zip(
        creations, writer.create_many([actions[i].desired for i in creations]), strict=True
    ):
        results[action_index] = obj
    for index, action in enumerate(actions):
        if action.verb == "unchanged":
            results[index] = action.desired
        elif action.verb == "configured":
            results[index] = writer.update(action.desired)
        elif action.verb == "replaced":
            assert action.current is not None
            _, gone = writer.delete(
                type(action.current), action.current.name, action.current.metadata.namespace
            )
            if not gone:
                raise errors.Conflict(
                    f'{action.current.KIND} "{action.current.name}" is still being deleted; '
                    "apply again once it is gone"
                )
            desired = action.desired
            fresh = desired.model_copy(
                update={  # a new object: new uid, fresh status
                    "metadata": meta.ObjectMeta(
                        name=desired.name,
                        namespace=desired.metadata.namespace,
                        labels=desired.metadata.labels,
                        annotations=desired.metadata.annotations,
                    ),
                    "status": type(desired.status)(),
                }
            )
            results[index] = writer.create(fresh)
    return [obj for obj in results if obj is not None]


def apply(
    database: db.Database, manifests: Sequence[manifest.Manifest], force: bool, dry_run: bool
) -> list[tuple[Action, meta.Resource]]:
    if dry_run:
        with database.read() as session:
            actions = plan(manifests, snapshot(store.Store(session), manifests), force)
        return [(a, a.desired) for a in actions]

    def work(writer: store.Store) -> list[tuple[Action, meta.Resource]]:
        actions = plan(manifests, snapshot(writer, manifests), force)
        return list(zip(actions, execute(writer, actions), strict=True))

    return store.transact(database, work, retry_on=(errors.Conflict, errors.AlreadyExists))


def diff(database: db.Database, manifests: Sequence[manifest.Manifest], force: bool) -> str:
    """A unified diff of each object as stored against what apply would make it."""
    with database.read() as session:
        actions = plan(manifests, snapshot(store.Store(session), manifests), force)
    chunks: list[str] = []
    for action in actions:
        if action.verb == "unchanged":
            continue
        name = "/".join(part for part in key_of(action.desired) if part)
        before = _diffable(action.current) if action.current and action.verb != "replaced" else ""
        after = _diffable(action.desired)
        chunks.extend(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"live/{name}" if action.current else "/dev/null",
                tofile=f"merged/{name}",
            )
        )
    return "".join(chunks)


def _diffable(obj: meta.Resource) -> str:
    """The object as it would read after apply, without fields that apply does not decide."""
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
