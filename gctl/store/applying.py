"""Applying manifests: read a snapshot, decide on it, and write the decision in one transaction.

Compute, then apply: read the objects the manifests name (and, for an ApplySet, its members),
decide each one's action with a pure function (`plan`, `prune`: gctl.store.planning), then
write every action in one transaction. A stale read makes the transaction fail and the whole
apply run again from a fresh read. One thing cannot be done in one transaction: replacing
(`--force`) a started Job, whose finalizer holds its deletion until the controller has stopped
its attempts; `apply` marks it deleted in a transaction of its own, waits, and then applies
everything in one. `gctl apply` and `gctl diff` (gctl.cli.apply) and the GitOps sync
(controller.sync) share it; the set's members and the ApplySet object itself are
gctl.store.applysets'.

The reading and writing go through the Store (SQLAlchemy), or, for the common case of a CLI
apply that only creates objects in a SQLite file, through the driver alone (gctl.store.driver),
which starts in a fraction of the time. `apply_at` chooses, in one place; the decision is
`decide` on both paths. This module imports SQLAlchemy only where the Store's path runs.
"""

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gctl.api import applyset, errors, manifest, meta
from gctl.store import applysets, bulk, driver, listing, planning, stored

if TYPE_CHECKING:  # SQLAlchemy's side: imported where the Store's path runs
    from gctl.store import db, store

T = TypeVar("T", bound=meta.Resource)
_CHUNK = 500  # names per IN (...) query

# The set's names, as apply's callers have always found them here.
Key = applysets.Key
SetOptions = applysets.SetOptions
key_of = applysets.key_of


@dataclass(frozen=True)
class Deleting:
    """A forced apply's first step: the objects it replaces that finalizers hold (a started Job
    until the controller has stopped its attempts), marked for deletion by a transaction that
    wrote nothing else. The apply is done again, from a fresh read, once they are gone."""

    objects: tuple[meta.Resource, ...]
    since: int  # a revision read before they were marked: their removal comes after it


# How the caller of `apply` waits for what a forced apply deletes first: it returns once they
# are gone (the change feed says so after `since`), or raises to give up.
WaitGone = Callable[["db.Database", Deleting], None]


class Reader(Protocol):
    """What deciding reads: the Store, or the driver's transaction (gctl.store.driver)."""

    def list_wire(
        self,
        cls: type[meta.Resource],
        namespace: str | None = None,
        *,
        names: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]: ...


class Creator(Reader, Protocol):
    """What writing creations and unchanged objects needs: either path has it."""

    def create_many(self, objs: Sequence[T]) -> list[T]: ...


# -- reading -----------------------------------------------------------------------------------


def snapshot(reader: Reader, manifests: Sequence[manifest.Manifest]) -> dict[Key, Any]:
    """The stored objects the manifests name, read in as few queries as possible."""
    wanted: dict[tuple[type[meta.Resource], str], list[str]] = {}
    for m in manifests:
        cls = type(m.obj)
        wanted.setdefault(
            (cls, listing.namespace_of(cls.INFO, m.obj.metadata.namespace)), []
        ).append(m.obj.name)
    found: dict[Key, meta.Resource] = {}
    for (cls, namespace), names in wanted.items():
        for start in range(0, len(names), _CHUNK):
            for wire in reader.list_wire(cls, namespace, names=names[start : start + _CHUNK]):
                obj = stored.validated(cls, wire)
                found[key_of(obj)] = obj
    return found


# -- writing -----------------------------------------------------------------------------------


def decide(
    reader: Reader,
    manifests: Sequence[manifest.Manifest],
    force: bool,
    options: SetOptions | None,
    now: datetime | None = None,
    *,
    held: Sequence[meta.Resource] | None = None,
) -> list[planning.Action]:
    """Read what the manifests (and the set) touch, then plan: one action per manifest, in
    order, then one per member to prune. `held`: the set's members, if the caller read them."""
    if options is None:
        return planning.plan(manifests, snapshot(reader, manifests), force, now=now)
    from gctl.store import store

    if not isinstance(reader, store.Store):  # a set's members are found in SQL: the Store's
        raise TypeError("an ApplySet is applied through the Store")
    stored = reader.find(applyset.ApplySet, options.name)
    applysets.check_source(stored, options)
    policy = options.on_spec_change or (stored.spec.on_spec_change if stored else None)
    current = snapshot(reader, manifests)
    # Sets the objects name that are gone (deleted, their members left): no longer a claim.
    others = {
        obj.metadata.labels[applyset.LABEL]
        for obj in current.values()
        if obj.metadata.labels.get(applyset.LABEL, options.name) != options.name
    }
    gone = frozenset(n for n in others if reader.find(applyset.ApplySet, n) is None)
    actions = planning.plan(
        manifests,
        current,
        force,
        set_name=options.name,
        set_policy=policy,
        now=now,
        gone_sets=gone,
    )
    if options.prune:
        if held is None:
            held = applysets.members(reader, options.name)
        actions += planning.prune(held, manifests)
    return actions


def execute(writer: "store.Store", actions: Sequence[planning.Action]) -> list[meta.Resource]:
    """Write a plan; returns the objects as stored, in the order of the actions."""
    results = _created_or_kept(writer, actions)
    for index, action in enumerate(actions):
        if action.verb == "configured":
            results[index] = writer.update(action.desired)
        elif action.verb == "replaced":
            results[index] = _replace(writer, action)
        elif action.verb == "pruned":
            # The door `gctl delete` uses: a running Job is marked, and the controller stops
            # its process before it goes.
            obj = action.desired
            results[index], _ = writer.delete(
                type(obj), obj.name, obj.metadata.namespace, uid=obj.metadata.uid
            )
    return [obj for obj in results if obj is not None]


def _created_or_kept(
    writer: Creator, actions: Sequence[planning.Action]
) -> list[meta.Resource | None]:
    """The creations, written together, and the unchanged objects as they are; None in the
    place of every other action, for `execute` to write."""
    results: list[meta.Resource | None] = [
        action.desired if action.verb == "unchanged" else None for action in actions
    ]
    creations = [i for i, a in enumerate(actions) if a.verb == "created"]
    for action_index, obj in zip(
        creations, writer.create_many([actions[i].desired for i in creations]), strict=True
    ):
        results[action_index] = obj
    return results


def _replace(writer: "store.Store", action: planning.Action) -> meta.Resource:
    """The object anew: the old one deleted first, in this transaction if nothing holds it;
    None as `current` when it was deleted before (`apply_in`'s first step)."""
    current = action.current
    if current is not None:
        _, gone = writer.delete(
            type(current), current.name, current.metadata.namespace, uid=current.metadata.uid
        )
        if not gone:  # `apply_in` deletes those first, in a transaction of their own
            raise ValueError(f"{planning.ref_of(current)}: its finalizers hold it: delete it first")
    desired = action.desired
    fresh = desired.model_copy(
        update={  # a new object: new uid, fresh status
            "metadata": meta.ObjectMeta(
                name=desired.name,
                namespace=desired.metadata.namespace,
                labels=desired.metadata.labels,
                annotations=planning.without_server_owned(desired.metadata.annotations),
            ),
            "status": type(desired.status)(),
        }
    )
    return writer.create(fresh)


def apply_in(
    writer: "store.Store",
    manifests: Sequence[manifest.Manifest],
    force: bool,
    options: SetOptions | None,
    now: datetime | None = None,
    *,
    replacing: Collection[Key] = (),
) -> list[tuple[planning.Action, meta.Resource]] | Deleting:
    """Decide and write, inside the caller's transaction; with a set, record it too.

    An object to replace that finalizers hold cannot be deleted and created anew in one
    transaction: its deletion finishes only when the controller has taken the finalizer off.
    Then this marks those objects for deletion, writes nothing else, and returns them; the
    caller commits, waits until they are gone, and calls again with their keys as
    `replacing`, so that their creation reads `replaced`."""
    since = writer.current_revision() if force else 0  # before anything that this reads
    held = applysets.members(writer, options.name) if options is not None else []
    actions = decide(writer, manifests, force, options, now, held=held)
    finalized = [
        a.current
        for a in actions
        if a.verb == "replaced" and a.current is not None and a.current.metadata.finalizers
    ]
    if finalized:
        return _delete_first(writer, finalized, since)
    actions = [
        planning.Action("replaced", a.source, a.desired, None)
        if a.verb == "created" and key_of(a.desired) in replacing
        else a
        for a in actions
    ]
    results = list(zip(actions, execute(writer, actions), strict=True))
    if options is not None:
        applysets.record_set(writer, options, results, now or writer.clock(), held=held)
    return results


def _delete_first(writer: "store.Store", objs: Sequence[meta.Resource], since: int) -> Deleting:
    """Mark for deletion, as `gctl delete` does, exactly the objects that were read."""
    for obj in objs:
        # Gone since it was read (PostgreSQL reads each statement afresh): as wanted.
        with contextlib.suppress(errors.NotFound):
            writer.delete(type(obj), obj.name, obj.metadata.namespace, uid=obj.metadata.uid)
    return Deleting(tuple(objs), since)


def apply(
    database: "db.Database",
    manifests: Sequence[manifest.Manifest],
    force: bool,
    dry_run: bool,
    options: SetOptions | None = None,
    *,
    wait_gone: WaitGone | None = None,
) -> list[tuple[planning.Action, meta.Resource]]:
    """Apply in one transaction, retried from a fresh read on a stale one; or, in a dry run,
    only decide.

    A forced apply that replaces objects held by finalizers takes more: one transaction marks
    them for deletion (`apply_in`), `wait_gone` waits outside any transaction until they are
    gone, and then the whole apply runs again in one transaction, from a fresh read. Without
    `wait_gone`, such an apply stops after the first step with an error."""
    from gctl.store import store

    if dry_run:
        with database.read() as session, bulk.collector_paused():
            actions = decide(store.Store(session), manifests, force, options)
        return [(a, a.desired) for a in actions]
    replacing: set[Key] = set()
    while True:
        with bulk.collector_paused():  # not `wait_gone`'s wait below
            done = store.transact(
                database,
                lambda writer: apply_in(writer, manifests, force, options, replacing=replacing),
                retry_on=(errors.Conflict, errors.AlreadyExists),
            )
        if not isinstance(done, Deleting):
            return done
        replacing.update(key_of(obj) for obj in done.objects)
        if wait_gone is None:
            refs = ", ".join(planning.ref_of(obj) for obj in done.objects)
            raise errors.Conflict(
                f"{refs}: marked for deletion, not yet gone (its finalizers hold it); "
                "apply again once it is gone"
            )
        wait_gone(database, done)


# -- choosing the path -------------------------------------------------------------------------

# What the driver's transaction writes itself (gctl.store.driver); a plan that holds anything
# else goes through the Store.
DIRECT: frozenset[planning.Verb] = frozenset({"created", "unchanged"})


def apply_at(
    url: str,
    manifests: Sequence[manifest.Manifest],
    force: bool,
    dry_run: bool,
    options: SetOptions | None = None,
    *,
    wait_gone: WaitGone | None = None,
) -> list[tuple[planning.Action, meta.Resource]]:
    """`apply` to the database at `url`, and the one place that chooses how: through the
    driver alone when it can do all of it (`apply_through_driver`), else through the Store,
    which creates or upgrades the schema, decides again from its own read, retries a stale
    one, writes every kind of change (replacing objects that finalizers hold with
    `wait_gone`'s help), applies sets, and says why a change is refused."""
    if options is None:
        with bulk.collector_paused():
            done = apply_through_driver(url, manifests, force, dry_run)
        if done is not None:
            return done
    from gctl.store import db

    database = db.Database.open(url, create=not dry_run)  # a dry run makes no database
    try:
        return apply(database, manifests, force, dry_run, options, wait_gone=wait_gone)
    finally:
        database.close()


def decide_at(
    url: str,
    manifests: Sequence[manifest.Manifest],
    force: bool,
    options: SetOptions | None = None,
) -> list[planning.Action]:
    """What applying would do to the database at `url` (`gctl diff`): a dry run's actions."""
    return [action for action, _ in apply_at(url, manifests, force, True, options)]


def apply_through_driver(
    url: str, manifests: Sequence[manifest.Manifest], force: bool, dry_run: bool
) -> list[tuple[planning.Action, meta.Resource]] | None:
    """`apply` without a set, in one transaction on the driver's connection (no SQLAlchemy to
    import), deciding with `decide` as the Store's path does. None, having written nothing,
    unless it could do all of it: a SQLite file with the current schema (`driver.run`), a plan
    decided without an error and, unless in a dry run, holding only creations and unchanged
    objects."""

    def work(tx: driver.Transaction) -> list[tuple[planning.Action, meta.Resource]] | None:
        try:
            actions = decide(tx, manifests, force, None)
        except errors.GctlError:
            return None  # refused: the Store's path decides again and says why
        if dry_run:
            return [(a, a.desired) for a in actions]
        if any(a.verb not in DIRECT for a in actions):
            return None
        written = _created_or_kept(tx, actions)  # every place filled: creations and unchanged
        return [(a, obj) for a, obj in zip(actions, written, strict=True) if obj is not None]

    return driver.run(url, work, write=not dry_run)
