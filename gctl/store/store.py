"""The Store: named operations on objects, each one guarded statement.

Every write bumps the global revision once per transaction, checks the resourceVersion it was
given (zero rows matched means Conflict), and appends the written object to the change feed.
Store methods take the session they are given and never commit: the caller owns the transaction.
"""

import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Row, Table, delete, exc, insert, select, update
from sqlalchemy.orm import Session

from gctl.api import binding, errors, event, job, meta, selector
from gctl.store import db, driver, listing, schema, tables

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


# uid -> (resourceVersion, wire) of pending Jobs decoded before, shared by this process's
# Stores; bounded, and emptied when full.
_DECODED: dict[str, tuple[int, dict[str, Any]]] = {}
_DECODED_MAX = 20_000


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

    # -- the revision --------------------------------------------------------------------------

    def lock_scheduling(self) -> None:
        """Serialize scheduling passes across controllers until this transaction ends.

        Two controllers on one PostgreSQL would otherwise read the same free GPU and bind
        different Jobs to it; SQLite's write transactions are serialized already."""
        if self._dialect == "postgresql":
            from sqlalchemy import func

            self.session.execute(select(func.pg_advisory_xact_lock(SCHEDULING_LOCK_KEY)))

    @property
    def written_revision(self) -> int | None:
        """The revision this Store's writes committed (or will commit) at; None if none."""
        return self._revision

    def current_revision(self) -> int:
        value = self.session.execute(select(_REVISION.c.revision)).scalar_one()
        return int(value)

    def _write_revision(self) -> int:
        """The revision of this transaction's writes; the first call locks the counter row."""
        if self._revision is None:
            statement = (
                update(_REVISION)
                .values(revision=_REVISION.c.revision + 1)
                .returning(_REVISION.c.revision)
            )
            self._revision = int(self.session.execute(statement).scalar_one())
            if self._dialect == "postgresql":
                from sqlalchemy import func

                self.session.execute(select(func.pg_notify(NOTIFY_CHANNEL, str(self._revision))))
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
            self.session.execute(insert(_CHANGES), rows)

    # -- reads ---------------------------------------------------------------------------------

    def _rows(
        self,
        cls: type[meta.Resource],
        namespace: str | None,
        names: Sequence[str] | None = None,
        *,
        for_update: bool = False,
    ) -> Sequence[Row[Any]]:
        table = _table(cls.KIND)
        query = select(table)
        if namespace is not None or not cls.NAMESPACED:
            query = query.where(table.c.namespace == namespace_of(cls, namespace))
        if names is not None:
            query = query.where(table.c.name.in_(names))
        if for_update and self._dialect == "postgresql":  # SQLite's writers are serial already
            query = query.with_for_update()
        return self.session.execute(query.order_by(table.c.namespace, table.c.name)).all()

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
        query = select(table).where(table.c.namespace == namespace_of(cls, namespace), matches)
        rows = self.session.execute(query.order_by(table.c.name)).all()
        return [row_to_wire(cls, row) for row in rows]

    def list_objects(
        self,
        cls: type[T],
        namespace: str | None = None,
        label_selector: selector.Selector | None = None,
    ) -> list[T]:
        return [cls.model_validate(w) for w in self.list_wire(cls, namespace, label_selector)]

    def lock_objects(self, cls: type[T], namespace: str | None = None) -> list[T]:
        """Read objects and hold them until this transaction ends, for a write that must not
        lose a race it cannot win by retrying: a cordon against an agent whose status writes
        come faster than a CLI process can read and write (PostgreSQL; on SQLite the write
        transaction holds the whole database already)."""
        if self._dialect == "postgresql":
            # Every writer locks the revision row first (its first write bumps it): so must
            # this one, before the objects, or it deadlocks with a writer waiting on them.
            self.session.execute(select(_REVISION.c.revision).with_for_update())
        rows = self._rows(cls, namespace, for_update=True)
        return [cls.model_validate(row_to_wire(cls, row)) for row in rows]

    def find(self, cls: type[T], name: str, namespace: str | None = None) -> T | None:
        rows = self._rows(cls, namespace_of(cls, namespace), [name])
        return cls.model_validate(row_to_wire(cls, rows[0])) if rows else None

    def get(self, cls: type[T], name: str, namespace: str | None = None) -> T:
        found = self.find(cls, name, namespace)
        if found is None:
            raise errors.NotFound(namespaced_not_found(cls, name, namespace))
        return found

    def pending_wires(self) -> list[dict[str, Any]]:
        """Jobs waiting for a place, unvalidated: higher priority first, then older first.

        The scheduler reads the whole queue at every pass, and decoding it cost more than the
        rest of a pass: so this reads uid and resourceVersion first, and decodes only the Jobs
        it has not seen in that version (`_DECODED`). The wires returned are shared: read them,
        never change them."""
        table = _table(job.Job.KIND)
        order = (table.c.priority.desc(), table.c.created_at, table.c.name)
        pending = select(table).where(table.c.phase == "Pending").order_by(*order)
        keys = self.session.execute(
            select(table.c.uid, table.c.resource_version)
            .where(table.c.phase == "Pending")
            .order_by(*order)
        ).all()
        if len(keys) > _DECODED_MAX:  # too many to keep: decode them all, as they come
            return [row_to_wire(job.Job, r) for r in self.session.execute(pending)]
        missing = [uid for uid, version in keys if _DECODED.get(uid, (None,))[0] != version]
        if len(_DECODED) + len(missing) > _DECODED_MAX:
            _DECODED.clear()
            missing = [uid for uid, _ in keys]
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            for row in self.session.execute(select(table).where(table.c.uid.in_(chunk))):
                _DECODED[row.uid] = (row.resource_version, row_to_wire(job.Job, row))
        # On PostgreSQL a Job may have changed, left the queue or gone between the two reads:
        # then the newer row stands, and a Job no longer Pending is left out.
        found = [_DECODED[uid][1] for uid, _ in keys if uid in _DECODED]
        return [w for w in found if w["status"].get("phase", "Pending") == "Pending"]

    def bindings_of(self, job_uid: str) -> list[binding.Binding]:
        """Every attempt of one Job, oldest first."""
        table = _table(binding.Binding.KIND)
        rows = self.session.execute(select(table).where(table.c.job_uid == job_uid)).all()
        found = [binding.Binding.model_validate(row_to_wire(binding.Binding, r)) for r in rows]
        return sorted(found, key=lambda b: b.spec.attempt)

    def active_bindings(
        self, node_name: str | None = None, phases: frozenset[str] = binding.ACTIVE_PHASES
    ) -> list[binding.Binding]:
        """Attempts that hold GPUs (bound, not yet exited or lost), or those in other phases."""
        table = _table(binding.Binding.KIND)
        query = select(table).where(table.c.phase.in_(sorted(phases)))
        if node_name is not None:
            query = query.where(table.c.node == node_name)
        rows = self.session.execute(query).all()
        return [binding.Binding.model_validate(row_to_wire(binding.Binding, r)) for r in rows]

    def any_queued_bindings(self) -> bool:
        """Whether some attempt is bound ahead and not yet taken by its agent."""
        table = _table(binding.Binding.KIND)
        rows = self.session.execute(select(table.c.spec).where(table.c.phase == "Pending"))
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
        rows = self.session.execute(query.order_by(_CHANGES.c.id).limit(limit)).all()
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
                self.session.execute(insert(_table(kind)), rows)
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

        The hot path of the controller and the agent, so one statement: an object read from
        the store carries its uid and resourceVersion, and while that version is current the
        stored spec and metadata are the object's own (its spec must hold no unsaved change).
        Only when the guarded UPDATE matches nothing is the row read, to say why."""
        uid, version = obj.metadata.uid, obj.metadata.resource_version
        if uid is None or version is None:
            current = self._current(obj)
            status = obj.wire()["status"]
            values = {"status": status} | schema.derived(obj.KIND, current.spec, status)
            return self._guarded_update(obj, current, values)
        wire = obj.wire()
        table = _table(obj.KIND)
        values = {"status": wire["status"]} | schema.derived(obj.KIND, wire["spec"], wire["status"])
        revision = self._write_revision()
        result = self.session.execute(
            update(table)
            .where(table.c.uid == uid, table.c.resource_version == int(version))
            .values(**values, resource_version=revision)
        )
        if result.rowcount == 0:  # type: ignore[attr-defined]
            self._current(obj)  # NotFound, or Conflict: someone wrote since it was read
            raise errors.Conflict(_stale(obj))
        wire["metadata"]["resourceVersion"] = str(revision)
        self._record("MODIFIED", [wire])
        metadata = obj.metadata.model_copy(update={"resource_version": str(revision)})
        return obj.model_copy(update={"metadata": metadata})

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
        result = self.session.execute(
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
        rows = self._rows(cls, namespace_of(cls, obj.metadata.namespace), [obj.name])
        if not rows or (obj.metadata.uid is not None and rows[0].uid != obj.metadata.uid):
            raise errors.NotFound(namespaced_not_found(cls, obj.name, obj.metadata.namespace))
        if obj.metadata.resource_version != str(rows[0].resource_version):
            raise errors.Conflict(_stale(obj))
        return rows[0]

    def _guarded_update(self, obj: T, current: Row[Any], values: dict[str, Any]) -> T:
        cls = type(obj)
        table = _table(cls.KIND)
        revision = self._write_revision()
        result = self.session.execute(
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
    ) -> event.Event:
        """Record what happened to an object; a repeat of the latest one bumps its count."""
        now = self.clock()
        namespace = involved.metadata.namespace or meta.DEFAULT_NAMESPACE
        table = _table("Event")
        latest = self.session.execute(
            select(table)
            .where(table.c.involved_uid == involved.metadata.uid)
            .order_by(table.c.created_at.desc(), table.c.resource_version.desc())
            .limit(1)
        ).first()
        if latest is not None:
            previous = event.Event.model_validate(row_to_wire(event.Event, latest))
            spec = previous.spec
            if (spec.type, spec.reason, spec.message) == (type_, reason, message):
                previous.spec = spec.model_copy(
                    update={"count": spec.count + 1, "last_timestamp": now}
                )
                return self.update(previous)
        new = event.Event(
            metadata=meta.ObjectMeta(
                name=f"{involved.name}.{uuid.uuid4().hex[:12]}", namespace=namespace
            ),
            spec=event.EventSpec(
                involved_object=event.ObjectReference(
                    kind=involved.KIND,
                    name=involved.name,
                    namespace=involved.metadata.namespace,
                    uid=involved.metadata.uid,
                ),
                type="Warning" if type_ == "Warning" else "Normal",
                reason=reason,
                message=message,
                source=source,
                first_timestamp=now,
                last_timestamp=now,
            ),
        )
        return self.create(new)

    def events_for(self, involved: meta.Resource, limit: int = 50) -> list[event.Event]:
        table = _table("Event")
        rows = self.session.execute(
            select(table)
            .where(table.c.involved_uid == involved.metadata.uid)
            .order_by(table.c.created_at.desc())
            .limit(limit)
        ).all()
        return [event.Event.model_validate(row_to_wire(event.Event, r)) for r in reversed(rows)]


def _values(obj: meta.Resource) -> dict[str, Any]:
    wire = obj.wire()
    spec, status = wire.get("spec", {}), wire.get("status", {})
    return {
        "labels": obj.metadata.labels,
        "annotations": obj.metadata.annotations,
        "finalizers": obj.metadata.finalizers,
        "owner_references": wire["metadata"].get("ownerReferences", []),
        "spec": spec,
        "status": status,
        **schema.derived(obj.KIND, spec, status),
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
