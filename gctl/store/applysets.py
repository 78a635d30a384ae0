"""The ApplySet side of applying: which objects are a set's members, and the set itself.

`members` reads every object labelled as a member of a set. `ensure_set`, `record_set` and
`record_failure` write the stored ApplySet: its spec from what `--applyset` (or a sync) asked,
its status from how the pass went. A set whose name was defaulted (a sync names it after its
directory) is never taken over from another source: `check_source` refuses. gctl.store.applying
decides and writes the members, and calls these.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from gctl.api import applyset, errors, kinds, meta
from gctl.store import listing, stored

if TYPE_CHECKING:
    from gctl.store import planning, store

Key = tuple[str, str, str]  # kind, namespace, name


@dataclass(frozen=True)
class SetOptions:
    """What `--applyset NAME` (or a sync) asks of an apply."""

    name: str
    prune: bool = False
    on_spec_change: applyset.OnSpecChange | None = None  # None: the stored set's policy
    source: str | None = None  # None: keep the stored one
    source_hash: str | None = None
    default_name: bool = False  # the name was not given but made from the directory's


class OtherSource(errors.Forbidden):
    """A set named by default already follows another source: it is not this source's."""


def key_of(obj: meta.Resource) -> Key:
    return (obj.KIND, listing.namespace_of(obj.INFO, obj.metadata.namespace), obj.name)


def members(reader: "store.Store", name: str) -> list[meta.Resource]:
    """Every object of an appliable kind labelled as a member of the set, in any namespace."""
    from sqlalchemy import select

    from gctl.store import reading, tables

    found: list[meta.Resource] = []
    for kind in sorted(kinds.APPLIABLE):
        cls = kinds.model(kind)
        table = tables.table_of(kind)
        label = table.c.labels[applyset.LABEL].as_string()
        rows = reader.session.execute(
            select(*tables.readable(table))
            .where(label == name)
            .order_by(table.c.namespace, table.c.name)
        ).all()
        for row in rows:
            obj = stored.validated(cls, reading.row_to_wire(cls, row))
            # Objects owned by another (a Sweep's Jobs, which copy its labels) go with their
            # owner: they are never the set's own members.
            if not any(owner.controller for owner in obj.metadata.owner_references):
                found.append(obj)
    return found


def check_source(stored: applyset.ApplySet | None, options: SetOptions) -> None:
    """Two directories of one base name (`a/jobs`, `b/jobs`) would share the default set
    `jobs`, and each pass would prune the other's members: refuse the second. A name given
    on purpose may move a set to another source."""
    if stored is None or not options.default_name or options.source is None:
        return
    if stored.spec.source is not None and stored.spec.source != options.source:
        raise OtherSource(
            f'applyset "{options.name}" already follows {stored.spec.source}, not '
            f"{options.source}: give this one its own set with --applyset NAME"
        )


def ensure_set(writer: "store.Store", options: SetOptions) -> applyset.ApplySet:
    """The ApplySet as stored, created or with its spec brought up to date."""
    stored = writer.find(applyset.ApplySet, options.name)
    check_source(stored, options)
    if stored is None:
        return writer.create(
            applyset.ApplySet(
                metadata=meta.ObjectMeta(name=options.name),
                spec=applyset.ApplySetSpec(
                    source=options.source,
                    on_spec_change=options.on_spec_change or applyset.REFUSE,
                ),
            )
        )
    spec = stored.spec.model_copy(
        update={
            "source": options.source or stored.spec.source,
            "on_spec_change": options.on_spec_change or stored.spec.on_spec_change,
        }
    )
    if spec == stored.spec:
        return stored
    return writer.update(stored.model_copy(update={"spec": spec}))


def record_set(
    writer: "store.Store",
    options: SetOptions,
    results: Sequence[tuple["planning.Action", meta.Resource]],
    now: datetime,
    *,
    held: Iterable[meta.Resource],
    drift_reverted: int = 0,
) -> applyset.ApplySet:
    """Create or update the ApplySet's spec, then its status after a successful apply.
    `held` is the set's members as read before the pass (`members`)."""
    the_set = ensure_set(writer, options)
    status = the_set.status
    listed = {key_of(obj): obj for obj in held}
    for action, obj in results:  # what was just created or pruned, whatever the read saw
        if action.verb == "pruned":
            listed.pop(key_of(obj), None)
        else:
            listed[key_of(obj)] = obj
    status.members = [
        applyset.MemberRef(kind=kind, namespace=ns or None, name=name)
        for kind, ns, name in sorted(listed)
    ]
    status.observed_generation = the_set.metadata.generation
    status.last_sync_time = status.last_applied_time = now
    status.source_hash = options.source_hash
    status.summary = summary(action for action, _ in results)
    status.last_error = None
    status.drift_reverted += drift_reverted
    meta.set_condition(
        status.conditions,
        applyset.CONDITION_SYNCED,
        "True",
        applyset.REASON_APPLIED,
        status.summary,
        generation=the_set.metadata.generation,
        now=now,
    )
    return writer.update_status(the_set)


def record_failure(
    writer: "store.Store",
    options: SetOptions,
    reason: str,
    error: applyset.SourceError,
    now: datetime,
) -> applyset.ApplySet:
    """A pass that applied nothing: the last good state stays, the status says why."""
    the_set = ensure_set(writer, options)
    status = the_set.status
    status.last_sync_time = now
    status.last_error = error
    meta.set_condition(
        status.conditions,
        applyset.CONDITION_SYNCED,
        "False",
        reason,
        error.message,
        generation=the_set.metadata.generation,
        now=now,
    )
    return writer.update_status(the_set)


def summary(actions: Iterable["planning.Action"]) -> str:
    """`2 created, 1 configured, 3 unchanged, 1 pruned`, in that order."""
    counts: dict[str, int] = {}
    for action in actions:
        counts[action.verb] = counts.get(action.verb, 0) + 1
    order = ("created", "configured", "replaced", "unchanged", "pruned")
    return ", ".join(f"{counts[v]} {v}" for v in order if counts.get(v)) or "nothing to apply"
