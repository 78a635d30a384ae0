"""The Store: named operations on objects, each one guarded statement.

Every write bumps the global revision once per transaction, checks the resourceVersion it was
given (zero rows matched means Conflict), and appends the written object to the change feed.
Store methods take the session they are given and never commit: the caller owns the transaction.
"""

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import (
    Executable,
    Result,
    Row,
    Table,
    and_,
    bindparam,
    delete,
    exc,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from gctl.api import binding, errors, event, job, meta, selector
from gctl.store import db, driver, events, listing, schema, shared, stored, tables

T = TypeVar("T", bound=meta.Resource)
R = TypeVar("R")

NOTIFY_CHANNEL = "gctl_changes"
SCHEDULING_LOCK_KEY = 0x67637463  # "gctc"
_REVISION = tables.Base.metadata.tables[tables.RevisionRow.__tablename__]
_CHANGES = tables.Base.metadata.tables[tables.ChangeRow.__tablename__]


@dataclass(frozen=True)
class Change:
    """One entry of the change feed: the object right after the write (or as it was deleted)."""

    id: int  # the feed's own order: ids are taken under the revision lock, so in commit order
    revision: int
    type: str  # ADDED | MODIFIED | DELETED
    kind: str
    namespace: str
    name: str
    uid: str
    object: dict[str, Any]


_WHERE_KEYS = frozenset({"b_uid", "b_version"})  # the parameters of `_write_many`'s guard
Occurrence = events.Occurrence


@dataclass
class _Batch:
    """Writes a Store in `batched` mode has queued: status writes (with the wires the change
    feed gets) and events."""

    statuses: list[tuple[meta.Resource, dict[str, Any]]] = field(default_factory=list)
    occurrences: list[events.Occurrence] = field(default_factory=list)


def _table(kind: str) -> Table:
    return tables.table_of(kind)


def namespace_of(cls: type[meta.Resource], namespace: str | None) -> str:
    return listing.namespace_of(cls.INFO, namespace)


def row_to_wire(cls: type[meta.Resource], row: Row[Any]) -> dict[str, Any]:
    return listing.row_to_wire(cls.INFO, row._mapping)


class Store:
    def __init__(self, session: Session, clock: Callable[[], datetime] = meta.utcnow) -> None:
        self.session = session
        self.clock = clock
        self._revision: int | None = None
        self._dialect = session.get_bind().dialect.name
        self._events = events.EventLog(self)
        self._batch: _Batch | None = None  # queued writes, in `batched` mode

    def execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        """Run one statement of the store's own (this module's and its helpers'), after the
        writes queued in `batched` mode, so that it sees them and follows them."""
        if self._batch is not None and (self._batch.statuses or self._batch.occurrences):
            self._flush()
        return self.session.execute(statement, params)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Queue status writes (`update_status` of objects read from the store) and events,
        and write them together, one statement per kind for all: when the block ends, or
        before any other statement. For a transaction that writes many objects in a loop (the
        controller's Jobs reconciled together, an agent's reports); the objects returned carry
        their new resourceVersion at once. A stale object raises Conflict at the flush."""
        if self._batch is not None:  # already batching: the outer block flushes
            yield
            return
        self._batch = _Batch()
        try:
            yield
            self._flush()
        finally:
            self._batch = None

    def _flush(self) -> None:
        batch, self._batch = self._batch, None  # its own statements run at once
        try:
            if batch is not None and batch.statuses:
                self._write_wires(batch.statuses, metadata=False)
            if batch is not None and batch.occurrences:
                self._events.record(batch.occurrences)
        finally:
            self._batch = _Batch() if batch is not None else None

    # -- the revision --------------------------------------------------------------------------

    def lock_scheduling(self) -> None:
        """Serialize scheduling passes across controllers until this transaction ends.

        Two controllers on one PostgreSQL would otherwise read the same free GPU and bind
        different Jobs to it; SQLite's write transactions are serialized already."""
        if self._dialect == "postgresql":
            from sqlalchemy import func

            self.execute(select(func.pg_advisory_xact_lock(SCHEDULING_LOCK_KEY)))

    @property
    def written_revision(self) -> int | None:
        """The revision this Store's writes committed (or will commit) at; None if none."""
        return self._revision

    def current_revision(self) -> int:
        value = self.execute(select(_REVISION.c.revision)).scalar_one()
        return int(value)

    def _write_revision(self) -> int:
        """The revision of this transaction's writes; the first call locks the counter row."""
        if self._revision is None:
            statement = (
                update(_REVISION)
                .values(revision=_REVISION.c.revision + 1)
                .returning(_REVISION.c.revision)
            )
            self._revision = int(self.execute(statement).scalar_one())
            if self._dialect == "postgresql":
                from sqlalchemy import func

                self.execute(select(func.pg_notify(NOTIFY_CHANNEL, str(self._revision))))
        return self._revision

    def _record(self, change_type: str, wires: Iterable[dict[str, Any]]) -> None:
        revision = self._write_revision()
        rows = [
            {
                "revision": revision,
                "type": change_type,
                "kind": wire["kind"],
                "namespace": wire["metadata"].get("namespace", ""),
                "name": wire["metadata"]["name"],
                "uid": wire["metadata"]["uid"],
                "object": wire,
            }
            for wire in wires
        ]
        if rows:
            self.execute(insert(_CHANGES), rows)

    # -- reads ---------------------------------------------------------------------------------

    def _rows(
        self,
        cls: type[meta.Resource],
        namespace: str | None,
        names: Sequence[str] | None = None,
        *,
        for_update: bool = False,
        decoded: bool = False,
    ) -> Sequence[Row[Any]]:
        """The rows, for `row_to_wire`; `decoded`: with the JSON documents decoded, to use."""
        table = _table(cls.KIND)
        query = select(table) if decoded else select(*tables.readable(table))
        if namespace is not None or not cls.NAMESPACED:
            query = query.where(table.c.namespace == namespace_of(cls, namespace))
        if names is not None:
            query = query.where(table.c.name.in_(names))
        if for_update and self._dialect == "postgresql":  # SQLite's writers are serial already
            query = query.with_for_update()
        return self.execute(query.order_by(table.c.namespace, table.c.name)).all()

    def list_wire(
        self,
        cls: type[meta.Resource],
        namespace: str | None = None,
        label_selector: selector.Selector | None = None,
        names: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Objects in wire form, sorted by namespace and name; `namespace=None` means all."""
        wires = [row_to_wire(cls, row) for row in self._rows(cls, namespace, names)]
        if label_selector is not None:
            wires = [w for w in wires if label_selector.matches(w["metadata"].get("labels", {}))]
        return wires

    def list_wire_labelled(
        self, cls: type[meta.Resource], namespace: str, key: str, value: str
    ) -> list[dict[str, Any]]:
        """Objects of one namespace whose label `key` is `value`, in wire form, sorted by name;
        the label is matched in SQL (a Sweep's Jobs, out of a namespace of many)."""
        from sqlalchemy import func, type_coerce
        from sqlalchemy.dialects import postgresql

        table = _table(cls.KIND)
        if self._dialect == "postgresql":  # JSONB containment, `labels @> '{key: value}'`
            matches = type_coerce(table.c.labels, postgresql.JSONB).contains({key: value})
        else:  # a quoted member name: `/` and `.` in the key are plain characters there
            if '"' in key:  # a label key never holds one (meta.Labels); SQLite cannot quote it
                raise ValueError(f"label key {key!r}: no double quotes")
            matches = func.json_extract(table.c.labels, f'$."{key}"') == value
        query = select(*tables.readable(table)).where(
            table.c.namespace == namespace_of(cls, namespace), matches
        )
        rows = self.execute(query.order_by(table.c.name)).all()
        return [row_to_wire(cls, row) for row in rows]

    def list_objects(
        self,
        cls: type[T],
        namespace: str | None = None,
        label_selector: selector.Selector | None = None,
    ) -> list[T]:
        return [stored.validated(cls, w) for w in self.list_wire(cls, namespace, label_selector)]

    def lock_objects(self, cls: type[T], namespace: str | None = None) -> list[T]:
        """Read objects and hold them until this transaction ends, for a write that must not
        lose a race it cannot win by retrying: a cordon against an agent whose status writes
        come faster than a CLI process can read and write (PostgreSQL; on SQLite the write
        transaction holds the whole database already)."""
        if self._dialect == "postgresql":
            # Every writer locks the revision row first (its first write bumps it): so must
            # this one, before the objects, or it deadlocks with a writer waiting on them.
            self.execute(select(_REVISION.c.revision).with_for_update())
        rows = self._rows(cls, namespace, for_update=True)
        return [stored.validated(cls, row_to_wire(cls, row)) for row in rows]

    def find(self, cls: type[T], name: str, namespace: str | None = None) -> T | None:
        rows = self._rows(cls, namespace_of(cls, namespace), [name])
        return stored.validated(cls, row_to_wire(cls, rows[0])) if rows else None

    def get(self, cls: type[T], name: str, namespace: str | None = None) -> T:
        found = self.find(cls, name, namespace)
        if found is None:
            raise errors.NotFound(namespaced_not_found(cls, name, namespace))
        return found

    def pending_wires(self) -> list[dict[str, Any]]:
        """Jobs waiting for a place, unvalidated: higher priority first, then older first. A
        shared read (`shared`): read them, never change them."""
        table = _table(job.Job.KIND)
        order = (table.c.priority.desc(), table.c.created_at, table.c.name)
        return shared.wires(self.execute, job.Job, [table.c.phase == "Pending"], order)

    def shared_wires(
        self, cls: type[meta.Resource], namespace: str, names: Sequence[str]
    ) -> list[dict[str, Any]]:
        """The named objects of one namespace in wire form, by a shared read: read them, never
        change them."""
        table = _table(cls.KIND)
        where = [table.c.namespace == namespace_of(cls, namespace), table.c.name.in_(names)]
        return shared.wires(self.execute, cls, where, (table.c.name,))

    def shared_objects(self, cls: type[T]) -> list[T]:
        """Every object of a kind, sorted by namespace and name, by a shared read: the objects
        are shared too, validated once per version; read them, never change them."""
        table = _table(cls.KIND)
        return shared.objects(self.execute, cls, [], (table.c.namespace, table.c.name))

    def shared_active_bindings(self) -> list[binding.Binding]:
        """`active_bindings()` by a shared read: read them, never change them (copy first)."""
        table = _table(binding.Binding.KIND)
        where = [table.c.phase.in_(sorted(binding.ACTIVE_PHASES))]
        order = (table.c.namespace, table.c.name)
        return shared.objects(self.execute, binding.Binding, where, order)

    def find_many(self, cls: type[T], namespace: str, names: Sequence[str]) -> list[T]:
        """The named objects of one namespace that exist, sorted by name."""
        found: list[T] = []
        ordered = sorted(set(names))
        for start in range(0, len(ordered), 500):
            rows = self._rows(cls, namespace_of(cls, namespace), ordered[start : start + 500])
            found.extend(stored.validated(cls, row_to_wire(cls, row)) for row in rows)
        return found

    def bindings_of_many(self, job_uids: Sequence[str]) -> dict[str, list[binding.Binding]]:
        """`bindings_of` for many Jobs at once, by Job uid (a Job with none is left out)."""
        table = _table(binding.Binding.KIND)
        found: dict[str, list[binding.Binding]] = {}
        ordered = sorted(set(job_uids))
        for start in range(0, len(ordered), 500):
            chunk = ordered[start : start + 500]
            for row in self.execute(
                select(*tables.readable(table)).where(table.c.job_uid.in_(chunk))
            ):
                b = stored.validated(binding.Binding, row_to_wire(binding.Binding, row))
                found.setdefault(row.job_uid, []).append(b)
        for attempts in found.values():
            attempts.sort(key=lambda b: b.spec.attempt)
        return found

    def bindings_of(self, job_uid: str) -> list[binding.Binding]:
        """Every attempt of one Job, oldest first."""
        table = _table(binding.Binding.KIND)
        rows = self.execute(select(*tables.readable(table)).where(table.c.job_uid == job_uid)).all()
        found = [stored.validated(binding.Binding, row_to_wire(binding.Binding, r)) for r in rows]
        return sorted(found, key=lambda b: b.spec.attempt)

    def active_bindings(
        self,
        node_name: str | None = None,
        phases: frozenset[str] = binding.ACTIVE_PHASES,
        *,
        skipped: list[errors.StoredInvalid] | None = None,
    ) -> list[binding.Binding]:
        """Attempts that hold GPUs (bound, not yet exited or lost), or those in other phases.
        One that no longer validates raises StoredInvalid, or with `skipped` goes there."""
        table = _table(binding.Binding.KIND)
        query = select(*tables.readable(table)).where(table.c.phase.in_(sorted(phases)))
        if node_name is not None:
            query = query.where(table.c.node == node_name)
        found = []
        for row in self.execute(query).all():
            try:
                found.append(stored.validated(binding.Binding, row_to_wire(binding.Binding, row)))
            except errors.StoredInvalid as exc:
                if skipped is None:
                    raise
                skipped.append(exc)
        return found

    def changed_since(self, revision: int, changes: Sequence[tuple[str, str]]) -> bool:
        """Whether, after `revision`, an object of one of these (kind, change type) pairs was
        written, as the change feed tells: ("Binding", "ADDED") ..."""
        query = (
            select(_CHANGES.c.id)
            .where(
                _CHANGES.c.revision > revision,
                or_(*(and_(_CHANGES.c.kind == k, _CHANGES.c.type == t) for k, t in changes)),
            )
            .limit(1)
        )
        return self.execute(query).first() is not None

    def any_queued_bindings(self) -> bool:
        """Whether some attempt is bound ahead and not started: not taken by its agent, or
        armed (the scheduler may still want either elsewhere)."""
        table = _table(binding.Binding.KIND)
        rows = self.execute(select(table.c.spec).where(table.c.phase.in_(("Pending", "Armed"))))
        return any(
            (json.loads(spec) if isinstance(spec, str) else spec or {}).get("after")
            for (spec,) in rows
        )

    def changes_since(
        self,
        revision: int,
        kinds: Iterable[str] | None = None,
        limit: int = 10_000,
        after_id: int | None = None,
    ) -> list[Change]:
        """Changes after a revision (or after a change id, to page through one large one)."""
        if after_id is None:
            query = select(_CHANGES).where(_CHANGES.c.revision > revision)
        else:
            query = select(_CHANGES).where(_CHANGES.c.id > after_id)
        if kinds is not None:
            query = query.where(_CHANGES.c.kind.in_(list(kinds)))
        rows = self.execute(query.order_by(_CHANGES.c.id).limit(limit)).all()
        return [
            Change(r.id, r.revision, r.type, r.kind, r.namespace, r.name, r.uid, r.object)
            for r in rows
        ]

    # -- writes --------------------------------------------------------------------------------

    def create_many(self, objs: Sequence[T]) -> list[T]:
        """Create objects; server fields are assigned here, whatever the input carried.

        Each object is created a microsecond after the one before it, so that Jobs applied
        together queue in the order they were given (the queue orders by creation time)."""
        if not objs:
            return []
        revision = self._write_revision()
        start = self.clock()
        created: list[T] = []
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for position, obj in enumerate(objs):
            new, row = driver.creation(obj, revision, start + timedelta(microseconds=position))
            created.append(new)
            by_kind.setdefault(obj.KIND, []).append(row)
        for kind, rows in by_kind.items():
            try:
                self.execute(insert(_table(kind)), rows)
            except exc.IntegrityError:
                names = ", ".join(repr(row["name"]) for row in rows[:3])
                raise errors.AlreadyExists(f"{kind} {names} already exists") from None
        self._record("ADDED", (obj.wire() for obj in created))
        return created

    def create(self, obj: T) -> T:
        return self.create_many([obj])[0]

    def update(self, obj: T) -> T:
        """Write metadata (labels, annotations, finalizers) and spec; generation moves only
        when the spec changes. A deleting object whose last finalizer goes is removed."""
        current = self._current(obj)
        if current.deleted_at is not None and not obj.metadata.finalizers:
            return self._remove(type(obj), obj)
        values = _values(obj)
        spec_changed = values["spec"] != current.spec
        generation = current.generation + 1 if spec_changed else current.generation
        values.pop("status")
        values |= schema.derived(obj.KIND, values["spec"], current.status)
        return self._guarded_update(obj, current, values | {"generation": generation})

    def update_status(self, obj: T) -> T:
        """Write status only; the generation never moves.

        The hot path of the controller and the agent, so one statement (and in `batched` mode
        one for many): an object read from the store carries its uid and resourceVersion, and
        while that version is current the stored spec and metadata are the object's own (its
        spec must hold no unsaved change). Only when the guarded UPDATE matches nothing is the
        row read, to say why."""
        uid, version = obj.metadata.uid, obj.metadata.resource_version
        if uid is None or version is None:
            current = self._current(obj)
            status = obj.wire()["status"]
            values = {"status": status} | schema.derived(obj.KIND, current.spec, status)
            return self._guarded_update(obj, current, values)
        revision = self._write_revision()
        if self._batch is not None:
            self._batch.statuses.append((obj, obj.wire()))
        else:
            self._write_wires([(obj, obj.wire())], metadata=False)
        metadata = obj.metadata.model_copy(update={"resource_version": str(revision)})
        return obj.model_copy(update={"metadata": metadata})

    def write_back(self, objs: Sequence[T]) -> list[T]:
        """Write the metadata (labels, annotations, finalizers, owners) and status of objects
        read from the store, in one statement per kind; their specs must be as read (not
        written: the generation does not move). Each write is guarded by the object's
        resourceVersion: Conflict if any of them changed since it was read. Not for an object
        being deleted whose last finalizer goes (`update` removes it)."""
        for obj in objs:
            if obj.metadata.deletion_timestamp is not None and not obj.metadata.finalizers:
                raise ValueError(f"{obj.KIND} {obj.name}: its last finalizer goes: update it")
        self._write_wires([(obj, obj.wire()) for obj in objs], metadata=True)
        revision = str(self._write_revision()) if objs else None
        return [
            obj.model_copy(
                update={"metadata": obj.metadata.model_copy(update={"resource_version": revision})}
            )
            for obj in objs
        ]

    def _write_wires(
        self, written: Sequence[tuple[meta.Resource, dict[str, Any]]], *, metadata: bool
    ) -> None:
        """Write the status (and with `metadata`, the metadata) of objects read from the store,
        each as its wire was when the write was asked for: one guarded statement per kind for
        all of them, and one change-feed insert. Conflict (or NotFound) if any was written
        since it was read, and then nothing of them is."""
        if not written:
            return
        revision = self._write_revision()
        by_kind: dict[str, list[dict[str, Any]]] = {}
        wires = []
        for obj, wire in written:
            uid, version = obj.metadata.uid, obj.metadata.resource_version
            if uid is None or version is None:
                raise ValueError(f"{obj.KIND} {obj.name}: write back only objects read")
            values = _wire_values(obj.KIND, wire)
            values.pop("spec")
            if not metadata:
                values = {k: v for k, v in values.items() if k not in _METADATA_COLUMNS}
            by_kind.setdefault(obj.KIND, []).append(
                {"b_uid": uid, "b_version": int(version)} | {f"b_{k}": v for k, v in values.items()}
            )
            wire["metadata"]["resourceVersion"] = str(revision)
            wires.append(wire)
        for kind, params in by_kind.items():
            table = _table(kind)
            columns = [key.removeprefix("b_") for key in params[0] if key not in _WHERE_KEYS]
            statement = (
                update(table)
                .where(table.c.uid == bindparam("b_uid"))
                .where(table.c.resource_version == bindparam("b_version"))
                .values({c: bindparam(f"b_{c}") for c in columns} | {"resource_version": revision})
            )
            result = self.execute(statement, params)
            if result.rowcount != len(params):  # type: ignore[attr-defined]
                for obj, _ in written:
                    if kind == obj.KIND:
                        self._current(obj)  # NotFound, or Conflict: written since it was read
                raise errors.Conflict(f"some of {len(params)} {kind}s were modified: retry")
        self._record("MODIFIED", wires)

    def delete(
        self,
        cls: type[T],
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
    ) -> tuple[T, bool]:
        """Delete now, or, while finalizers remain, mark it deleting. Returns (object, gone)."""
        obj = self.get(cls, name, namespace)
        if uid is not None and uid != obj.metadata.uid:
            raise errors.Conflict(f'{cls.KIND} "{name}" was replaced (uid {obj.metadata.uid})')
        if obj.metadata.finalizers:
            if obj.metadata.deletion_timestamp is not None:
                return obj, False
            current = self._current(obj)
            marked = self._guarded_update(obj, current, {"deleted_at": self.clock()})
            return marked, False
        return self._remove(cls, obj), True

    def remove(self, obj: T) -> T:
        """Delete exactly the version of an object that was read (finalizers are not looked
        at): Conflict if anyone wrote it since. For a decision that holds only while the object
        is as read: an attempt bound ahead is moved only while its agent has not taken it."""
        return self._remove(type(obj), obj)

    def _remove(self, cls: type[T], obj: T) -> T:
        table = _table(cls.KIND)
        revision = self._write_revision()  # the revision row first, as every writer locks it
        result = self.execute(
            delete(table).where(
                table.c.uid == obj.metadata.uid,
                table.c.resource_version == int(obj.metadata.resource_version or -1),
            )
        )
        if result.rowcount == 0:  # type: ignore[attr-defined]
            raise errors.Conflict(_stale(obj))
        metadata = obj.metadata.model_copy(
            update={
                "resource_version": str(revision),
                "deletion_timestamp": obj.metadata.deletion_timestamp or self.clock(),
            }
        )
        gone = obj.model_copy(update={"metadata": metadata})
        self._record("DELETED", [gone.wire()])
        return gone

    def _current(self, obj: meta.Resource) -> Row[Any]:
        cls = type(obj)
        rows = self._rows(cls, namespace_of(cls, obj.metadata.namespace), [obj.name], decoded=True)
        if not rows or (obj.metadata.uid is not None and rows[0].uid != obj.metadata.uid):
            raise errors.NotFound(namespaced_not_found(cls, obj.name, obj.metadata.namespace))
        if obj.metadata.resource_version != str(rows[0].resource_version):
            raise errors.Conflict(_stale(obj))
        return rows[0]

    def _guarded_update(self, obj: T, current: Row[Any], values: dict[str, Any]) -> T:
        cls = type(obj)
        table = _table(cls.KIND)
        revision = self._write_revision()
        result = self.execute(
            update(table)
            .where(table.c.uid == current.uid, table.c.resource_version == current.resource_version)
            .values(**values, resource_version=revision)
            .returning(*table.c)
        )
        row = result.first()
        if row is None:
            raise errors.Conflict(_stale(obj))
        wire = row_to_wire(cls, row)
        self._record("MODIFIED", [wire])
        return cls.model_validate(wire)

    def record_event(
        self,
        involved: meta.Resource,
        reason: str,
        message: str = "",
        *,
        type_: str = "Normal",
        source: str = "",
    ) -> None:
        """Record what happened to an object; a repeat of the latest one bumps its count. In
        `batched` mode it is written with the batch."""
        occurrence = events.Occurrence(involved, reason, message, type_, source)
        if self._batch is not None:
            self._batch.occurrences.append(occurrence)
        else:
            self._events.record([occurrence])

    def prefetch_events(self, uids: Sequence[str]) -> None:
        """Read the latest event of each object (by uid) in one query, for the events this
        transaction records about them to compare with (`events`)."""
        self._events.prefetch(uids)

    def record_events(self, occurrences: Sequence[events.Occurrence]) -> list[event.Event]:
        """`record_event` for many at once: one read of the objects' latest events, and the
        new ones written together."""
        if self._batch is not None:  # the queued ones first: they happened before
            self._flush()
        return self._events.record(occurrences)

    def events_for(self, involved: meta.Resource, limit: int = 50) -> list[event.Event]:
        return self._events.of(involved, limit)


_METADATA_COLUMNS = frozenset({"labels", "annotations", "finalizers", "owner_references"})


def _values(obj: meta.Resource) -> dict[str, Any]:
    return _wire_values(obj.KIND, obj.wire())


def _wire_values(kind: str, wire: dict[str, Any]) -> dict[str, Any]:
    """The columns of an object's row, from its wire form."""
    spec, status, metadata = wire.get("spec", {}), wire.get("status", {}), wire["metadata"]
    return {
        "labels": metadata.get("labels", {}),
        "annotations": metadata.get("annotations", {}),
        "finalizers": metadata.get("finalizers", []),
        "owner_references": metadata.get("ownerReferences", []),
        "spec": spec,
        "status": status,
        **schema.derived(kind, spec, status),
    }


def namespaced_not_found(cls: type[meta.Resource], name: str, namespace: str | None) -> str:
    where = f' in namespace "{namespace_of(cls, namespace)}"' if cls.NAMESPACED else ""
    return f'{cls.KIND.lower()} "{name}" not found{where}'


def _stale(obj: meta.Resource) -> str:
    return (
        f'{obj.KIND} "{obj.name}" was modified since it was read '
        f"(resourceVersion {obj.metadata.resource_version}): read it again and retry"
    )


def transact(
    database: db.Database,
    work: Callable[["Store"], R],
    *,
    retry_on: tuple[type[errors.GctlError], ...] = (errors.Conflict,),
    attempts: int = 10,
) -> R:
    """Run `work` in one write transaction; on a stale read, run it again from a fresh one."""
    for attempt in range(attempts):
        try:
            with database.write() as session:
                return work(Store(session))
        except retry_on:
            if attempt == attempts - 1:
                raise
            time.sleep(min(0.5, 0.005 * 2**attempt) * random.random())
    raise AssertionError("unreachable")
