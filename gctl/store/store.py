"""The Store: named operations on objects, each one guarded statement.

Every write bumps the global revision once per transaction, checks the resourceVersion it was
given (zero rows matched means Conflict), and appends the written object to the change feed.
Store methods take the session they are given and never commit: the caller owns the transaction.

The Store is one class built in layers, a module for each state it handles, each layer a class
the next one inherits from (so a call costs what it would on one class): `revisions` (what a
transaction shares: the session, its revision, the change feed), `reading` (objects read), and
here, on top, the writes, the queue of `batched` mode and the events. `transact` runs work in
one transaction, and again from a fresh read when it read a stale object.
"""

import contextlib
import functools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Insert, Row, Table, Update, bindparam, delete, exc, insert, update
from sqlalchemy.orm import Session

from gctl.api import errors, event, meta
from gctl.store import bulk, db, driver, events, pgarrays, reading, revisions, schema, tables

T = TypeVar("T", bound=meta.Resource)
R = TypeVar("R")

_WHERE_KEYS = frozenset({"b_uid", "b_version"})  # the parameters of `_write_wires`'s guard
_NEW_VERSION = "new_version"  # and of the resourceVersion it writes (named as no column is)
# The types of the Store's API, where its callers have always found them.
Change = revisions.Change
Occurrence = events.Occurrence


class Store(reading.Reads):
    def __init__(self, session: Session, clock: Callable[[], datetime] = meta.utcnow) -> None:
        self.session = session
        self.clock = clock
        self._revision = None
        self._dialect = session.get_bind().dialect
        self._events = events.EventLog(self)
        self._batch = None  # queued writes, in `batched` mode

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
        self._batch = revisions.Batch()
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
            self._batch = revisions.Batch() if batch is not None else None

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
        wires: list[dict[str, Any]] = []
        by_kind: dict[str, list[dict[str, Any]]] = {}
        # Python's work alone, never a statement (which may wait on another transaction's
        # lock): a third of 10,000 Jobs' creation went to the collector's walks.
        with bulk.collector_paused():
            for position, obj in enumerate(objs):
                moment = start + timedelta(microseconds=position)
                new, row, wire = driver.creation(obj, revision, moment)
                created.append(new)
                wires.append(wire)
                by_kind.setdefault(obj.KIND, []).append(row)
        for kind, rows in by_kind.items():
            try:
                self._insert_rows(kind, rows)
            except exc.IntegrityError:
                names = ", ".join(repr(row["name"]) for row in rows[:3])
                raise errors.AlreadyExists(f"{kind} {names} already exists") from None
        self._record("ADDED", wires)
        return created

    def _insert_rows(self, kind: str, rows: list[dict[str, Any]]) -> None:
        if self._dialect.name == "sqlite":
            with bulk.collector_paused():
                encoded = [driver.encoded(row) for row in rows]
            self.execute_driver_many(driver.insert_sql(kind, list(encoded[0])), encoded)
            return
        table = tables.table_of(kind)
        bulk_insert = functools.partial(pgarrays.insert, self._dialect, table, rows)
        self.execute_many(_insert(table), rows, bulk_insert)

    def create(self, obj: T) -> T:
        return self.create_many([obj])[0]

    def update(self, obj: T) -> T:
        """Write metadata (labels, annotations, finalizers) and spec; generation moves only
        when the spec changes. A deleting object whose last finalizer goes is removed."""
        current = self._current(obj)
        if current.deleted_at is not None and not obj.metadata.finalizers:
            return self.remove(obj)
        values = _values(obj)
        spec_changed = values["spec"] != current.spec
        generation = current.generation + 1 if spec_changed else current.generation
        values.pop("status")
        values |= schema.derived(obj.KIND, values["spec"], current.status)
        return self._guarded_update(obj, current, values | {"generation": generation})

    def update_status(self, obj: T, *, stored_spec: dict[str, Any] | None = None) -> T:
        """Write status only; the generation never moves.

        The hot path of the controller and the agent, so one statement (and in `batched` mode
        one for many): an object read from the store carries its uid and resourceVersion, and
        while that version is current the stored spec and metadata are the object's own (its
        spec must hold no unsaved change). Only when the guarded UPDATE matches nothing is the
        row read, to say why. `stored_spec`: the spec as stored, for an object whose stored
        spec does not validate, written through a stand-in with a default one (the agent's
        Node): the row keeps it, and the change feed must record it, not the stand-in's."""
        uid, version = obj.metadata.uid, obj.metadata.resource_version
        if uid is None or version is None:
            current = self._current(obj)
            status = obj.wire()["status"]
            values = {"status": status} | schema.derived(obj.KIND, current.spec, status)
            return self._guarded_update(obj, current, values)
        revision = self._write_revision()
        wire = obj.wire()
        if stored_spec is not None:
            wire["spec"] = stored_spec
        if self._batch is not None:
            self._batch.statuses.append((obj, wire))
        else:
            self._write_wires([(obj, wire)], metadata=False)
        metadata = obj.metadata.model_copy(update={"resource_version": str(revision)})
        return obj.model_copy(update={"metadata": metadata})

    def write_back(self, objs: Sequence[T]) -> list[T]:
        """Write the metadata (labels, annotations, finalizers, owners) and status of objects
        read from the store, in one statement per kind; their specs must be as read (not
        written: the generation does not move). Each write is guarded by the object's
        resourceVersion: Conflict if any of them changed since it was read. Not for an object
        being deleted whose last finalizer goes (`update` removes it)."""
        return self._written_back(objs, spec=False)

    def update_many(self, objs: Sequence[T]) -> list[T]:
        """`write_back` objects read from the store whose spec the caller changed (a Binding
        asked to stop), their specs too: each one's generation moves by one, as `update`
        moves it for a changed spec. Their status goes back as read, in the form gctl writes
        it."""
        return self._written_back(objs, spec=True)

    def _written_back(self, objs: Sequence[T], *, spec: bool) -> list[T]:
        for obj in objs:
            if obj.metadata.deletion_timestamp is not None and not obj.metadata.finalizers:
                raise ValueError(f"{obj.KIND} {obj.name}: its last finalizer goes: update it")
            if spec and obj.metadata.generation is None:
                raise ValueError(f"{obj.KIND} {obj.name}: update many only objects read")
        written = [(obj, obj.wire()) for obj in objs]
        if spec:
            for _, wire in written:
                wire["metadata"]["generation"] += 1
        self._write_wires(written, metadata=True, spec=spec)
        revision = str(self._write_revision()) if objs else None
        return [
            obj.model_copy(
                update={
                    "metadata": obj.metadata.model_copy(
                        update={
                            "resource_version": revision,
                            "generation": wire["metadata"].get("generation"),
                        }
                    )
                }
            )
            for obj, wire in written
        ]

    def _write_wires(
        self,
        written: Sequence[tuple[meta.Resource, dict[str, Any]]],
        *,
        metadata: bool,
        spec: bool = False,
    ) -> None:
        """Write the status (and with `metadata`, the metadata; with `spec`, the spec and the
        generation) of objects read from the store, each as its wire was when the write was
        asked for: one guarded statement per kind for all of them, and one change-feed insert.
        Conflict (or NotFound) if any was written since it was read, and then nothing of them
        is."""
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
            if spec:
                values["generation"] = wire["metadata"]["generation"]
            else:
                values.pop("spec")
            if not metadata:
                values = {k: v for k, v in values.items() if k not in _METADATA_COLUMNS}
            by_kind.setdefault(obj.KIND, []).append(
                {"b_uid": uid, "b_version": int(version)} | {f"b_{k}": v for k, v in values.items()}
            )
            wire["metadata"]["resourceVersion"] = str(revision)
            wires.append(wire)
        for kind, params in by_kind.items():
            table = tables.table_of(kind)
            columns = tuple(key.removeprefix("b_") for key in params[0] if key not in _WHERE_KEYS)
            bulk = functools.partial(pgarrays.update, self._dialect, table, params, revision)
            each = [p | {_NEW_VERSION: revision} for p in params]
            result = self.execute_many(_guarded_status_update(table, columns), each, bulk)
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
        return self.remove(obj), True

    def remove(self, obj: T) -> T:
        """Delete exactly the version of an object that was read (finalizers are not looked
        at): Conflict if anyone wrote it since. For a decision that holds only while the object
        is as read: an attempt bound ahead is moved only while its agent has not taken it."""
        return self.remove_many([obj])[0]

    def remove_many(self, objs: Sequence[T]) -> list[T]:
        """`remove` each of `objs`, in one statement per kind: Conflict if any of them was
        written (or removed) since it was read, and then none of them is removed."""
        if not objs:
            return []
        revision = self._write_revision()  # the revision row first, as every writer locks it
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for obj in objs:
            version = int(obj.metadata.resource_version or -1)
            by_kind.setdefault(obj.KIND, []).append(
                {"b_uid": obj.metadata.uid, "b_version": version}
            )
        for kind, params in by_kind.items():
            table = tables.table_of(kind)
            statement = delete(table).where(
                table.c.uid == bindparam("b_uid"),
                table.c.resource_version == bindparam("b_version"),
            )
            bulk = functools.partial(pgarrays.delete, table, params)
            result = self.execute_many(statement, params, bulk)
            if result.rowcount != len(params):  # type: ignore[attr-defined]
                stale = _stale(objs[0]) if len(objs) == 1 else None
                raise errors.Conflict(
                    stale or f"some of {len(params)} {kind}s were modified: retry"
                )
        gone = [
            obj.model_copy(
                update={
                    "metadata": obj.metadata.model_copy(
                        update={
                            "resource_version": str(revision),
                            "deletion_timestamp": obj.metadata.deletion_timestamp or self.clock(),
                        }
                    )
                }
            )
            for obj in objs
        ]
        self._record("DELETED", [obj.wire() for obj in gone])
        return gone

    def _current(self, obj: meta.Resource) -> Row[Any]:
        cls, namespace = type(obj), obj.metadata.namespace
        rows = self._rows(cls, reading.namespace_of(cls, namespace), [obj.name], decoded=True)
        if not rows or (obj.metadata.uid is not None and rows[0].uid != obj.metadata.uid):
            raise errors.NotFound(reading.namespaced_not_found(cls, obj.name, namespace))
        if obj.metadata.resource_version != str(rows[0].resource_version):
            raise errors.Conflict(_stale(obj))
        return rows[0]

    def _guarded_update(self, obj: T, current: Row[Any], values: dict[str, Any]) -> T:
        cls = type(obj)
        table = tables.table_of(cls.KIND)
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
        wire = reading.row_to_wire(cls, row)
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

    def events_for(
        self,
        involved: meta.Resource,
        limit: int = 50,
        *,
        skipped: list[errors.StoredInvalid] | None = None,
    ) -> list[event.Event]:
        """`EventLog.of`."""
        return self._events.of(involved, limit, skipped)


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


# The statements of the hot writes, built once per table (and set of columns): building one and
# deriving its cache key takes SQLAlchemy 100-150 us, more than SQLite takes to run it.


@functools.cache
def _insert(table: Table) -> Insert:
    return insert(table)


@functools.cache
def _guarded_status_update(table: Table, columns: tuple[str, ...]) -> Update:
    """`_write_wires`'s statement: these columns of the row of uid `b_uid` and resourceVersion
    `b_version`, each from `b_<column>`, and its resourceVersion from `new_version`."""
    return (
        update(table)
        .where(table.c.uid == bindparam("b_uid"))
        .where(table.c.resource_version == bindparam("b_version"))
        .values(
            {c: bindparam(f"b_{c}") for c in columns}
            | {"resource_version": bindparam(_NEW_VERSION)}
        )
    )
