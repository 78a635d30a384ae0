"""The Store's bottom layer: what one transaction shares, its revision and the change feed.

The Store (gctl.store.store) is one class built in layers, each a class the next one inherits
from: this one, `reading` (objects read), and `store.Store` (objects written, the writes queued
in `batched` mode, the events). Here: what every layer shares (the session, the clock, the
dialect, the queue), the door every statement goes through (`execute`), the global revision
that a transaction's writes bump once, and the change feed, which every write appends to and
watchers read.
"""

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Dialect,
    Executable,
    Result,
    String,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from gctl.api import meta
from gctl.store import driver, events, jsontext, pgarrays, tables

NOTIFY_CHANNEL = "gctl_changes"
SCHEDULING_LOCK_KEY = 0x67637463  # "gctc"
REVISION = tables.Base.metadata.tables[tables.RevisionRow.__tablename__]
_CHANGES = tables.Base.metadata.tables[tables.ChangeRow.__tablename__]
Bulk = Callable[[], tuple[str, list[Any]] | None]  # one statement for many rows, or None
# The statements every transaction runs, built once: SQLAlchemy builds a statement and derives
# its cache key in 100-150 us, several times what SQLite takes to run one of these.
_CURRENT = select(REVISION.c.revision)
_NEXT = update(REVISION).values(revision=REVISION.c.revision + 1).returning(REVISION.c.revision)
_APPEND = insert(_CHANGES)
_NOTIFY = select(func.pg_notify(NOTIFY_CHANNEL, bindparam("revision", type_=String)))
_SCHEDULING_LOCK = select(func.pg_advisory_xact_lock(SCHEDULING_LOCK_KEY))


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


@dataclass
class Batch:
    """Writes a Store in `batched` mode has queued: status writes (with the wires the change
    feed gets) and events."""

    statuses: list[tuple[meta.Resource, dict[str, Any]]] = field(default_factory=list)
    occurrences: list[events.Occurrence] = field(default_factory=list)


class Revisions:
    """What every layer of the Store shares, and the revision and change feed it writes."""

    # Set by `store.Store.__init__`, for all the layers.
    session: Session
    clock: Callable[[], datetime]
    _revision: int | None  # this transaction's, once it wrote
    _dialect: Dialect  # SQLAlchemy's, of the session's database
    _batch: Batch | None  # queued writes, in `batched` mode

    if TYPE_CHECKING:  # the queued writes are written by the top layer, `store.Store`

        def _flush(self) -> None: ...

    def execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        """Run one statement of the store's own (its layers' and their helpers'), after the
        writes queued in `batched` mode, so that it sees them and follows them."""
        self._flush_queued()
        return self.session.execute(statement, params)

    def _flush_queued(self) -> None:
        """Write what `batched` mode has queued, if anything: before any other statement."""
        if self._batch is not None and (self._batch.statuses or self._batch.occurrences):
            self._flush()

    def execute_many(
        self, statement: Executable, params: list[dict[str, Any]], bulk: Bulk
    ) -> Result[Any]:
        """`execute` a statement for each of `params`: on PostgreSQL as the one statement
        `bulk` makes of them (gctl.store.pgarrays), where it makes one."""
        if self._dialect.name == "postgresql" and len(params) > 1 and (made := bulk()) is not None:
            self._flush_queued()
            sql, arrays = made
            return self.session.connection().exec_driver_sql(sql, tuple(arrays))
        return self.execute(statement, params)

    def execute_driver_many(self, sql: str, params: list[dict[str, Any]]) -> None:
        """`sql` for each of `params` through the DB-API driver, as they are: what SQLAlchemy's
        types would make of Python values, already made (SQLite's writes of many rows)."""
        self._flush_queued()
        self.session.connection().exec_driver_sql(sql, params)

    # -- the revision --------------------------------------------------------------------------

    def lock_scheduling(self) -> None:
        """Serialize scheduling passes across controllers until this transaction ends.

        Two controllers on one PostgreSQL would otherwise read the same free GPU and bind
        different Jobs to it; SQLite's write transactions are serialized already."""
        if self._dialect.name == "postgresql":
            self.execute(_SCHEDULING_LOCK)

    @property
    def written_revision(self) -> int | None:
        """The revision this Store's writes committed (or will commit) at; None if none."""
        return self._revision

    def current_revision(self) -> int:
        value = self.execute(_CURRENT).scalar_one()
        return int(value)

    def _write_revision(self) -> int:
        """The revision of this transaction's writes; the first call locks the counter row."""
        if self._revision is None:
            self._revision = int(self.execute(_NEXT).scalar_one())
            if self._dialect.name == "postgresql":
                self.execute(_NOTIFY, {"revision": str(self._revision)})
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
        if not rows:
            return
        # SQLAlchemy's statements spend more on each row's parameters (its types' processing,
        # in Python) than SQLite takes to insert it: on SQLite the rows go to the driver as
        # SQLAlchemy's JSON type writes them, encoded once, by gctl.
        if self._dialect.name == "sqlite":
            for row in rows:
                row["object"] = jsontext.dumps(row["object"])
            self.execute_driver_many(driver.APPEND_CHANGE, rows)
            return
        bulk = functools.partial(pgarrays.insert, self._dialect, _CHANGES, rows)
        self.execute_many(_APPEND, rows, bulk)

    # -- the change feed -----------------------------------------------------------------------

    def changed_since(self, revision: int, changes: Sequence[tuple[str, str]]) -> bool:
        """Whether, after `revision`, an object of one of these (kind, change type) pairs was
        written, as the change feed tells: ("Binding", "ADDED") ..."""
        query = _changed_since(tuple(changes))
        return self.execute(query, {"revision": revision}).first() is not None

    def changed_uids(self, kind: str, revision: int, limit: int) -> list[str] | None:
        """The uids of the objects of a kind written after `revision`, as the change feed
        tells (deleted ones too); None when there are more than `limit`."""
        query = _changed_uids(limit + 1)
        found = list(self.execute(query, {"revision": revision, "kind": kind}).scalars())
        return None if len(found) > limit else found

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


@functools.cache
def _changed_since(changes: tuple[tuple[str, str], ...]) -> Executable:
    """`changed_since`'s query for these (kind, change type) pairs, built once."""
    return (
        select(_CHANGES.c.id)
        .where(
            _CHANGES.c.revision > bindparam("revision"),
            or_(*(and_(_CHANGES.c.kind == k, _CHANGES.c.type == t) for k, t in changes)),
        )
        .limit(1)
    )


@functools.cache
def _changed_uids(limit: int) -> Executable:
    """`changed_uids`'s query, at most `limit` rows, built once."""
    return (
        select(_CHANGES.c.uid)
        .where(_CHANGES.c.revision > bindparam("revision"), _CHANGES.c.kind == bindparam("kind"))
        .distinct()
        .limit(limit)
    )
