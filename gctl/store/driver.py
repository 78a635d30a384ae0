"""A SQLite file through the DB-API driver alone: how gctl opens one, and the transaction of an
apply that only reads and creates.

Importing SQLAlchemy takes longer than the whole budget of `gctl apply -f one-job.yaml` (150 ms
on a 2-core machine), so `gctl apply` and `gctl diff` try this path first, as `gctl get` reads
through `listing`. The decision is `applying.decide`'s, the same function on both paths; what
this module does is the Store's part of it: read the objects the manifests name (rows become
wire objects through `listing.row_to_wire`, as for `get`) and create new objects as
`Store.create_many` does (one revision per transaction, the server fields, the columns derived
from spec and status, one change-feed row per object), then commit and ring the doorbell.

Everything else stays with the Store, and `run` answers None, having written nothing, when it
cannot do the whole of it: not SQLite, no file yet, a schema to create or upgrade, or work that
declines (`applying.apply_at` chooses, in one place).
"""

import contextlib
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gctl.api import errors
from gctl.store import jsontext, listing, locations, notify, schema, writers

if TYPE_CHECKING:
    from gctl.api import meta

    T = TypeVar("T", bound=meta.Resource)

R = TypeVar("R")

BUSY_TIMEOUT_MS = 30_000
# Every connection gctl opens to a SQLite file, through SQLAlchemy (gctl.store.db) or not.
PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
    "PRAGMA synchronous=FULL",  # a committed apply survives power loss (docs/decisions.md)
)

# The schema whose rows `Transaction.create_many` writes. A migration that changes it sends
# every write to the Store until this module is brought up to date (a test says so).
WRITES_SCHEMA = "0006"


def tune(conn: Any) -> None:
    """Set gctl's pragmas on a new connection (sqlite3's, or the one SQLAlchemy wraps)."""
    cursor = conn.cursor()
    for pragma in PRAGMAS:
        cursor.execute(pragma)
    cursor.close()


def connect(path: Path) -> sqlite3.Connection:
    """A connection that sends BEGIN, COMMIT and ROLLBACK only when told to."""
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    conn.row_factory = sqlite3.Row
    tune(conn)
    return conn


class Transaction:
    """What deciding and creating need of the Store, inside `run`'s transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._revision: int | None = None

    def clock(self) -> datetime:
        return datetime.now(UTC)

    def list_wire(
        self,
        cls: "type[meta.Resource]",
        namespace: str | None = None,
        *,
        names: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Objects in wire form, sorted by namespace and name, as `Store.list_wire` reads them."""
        if names is not None and not names:
            return []
        query, params = listing.query(cls.INFO, namespace, names, "?")
        return [listing.row_to_wire(cls.INFO, row) for row in self._conn.execute(query, params)]

    def create_many(self, objs: "Sequence[T]") -> "list[T]":
        """Create objects as `Store.create_many` does: all at this transaction's revision,
        each a microsecond after the one before it (the queue's order), each with its ADDED
        change."""
        if not objs:
            return []
        revision = self._write_revision()
        start = self.clock()
        created: list[T] = []
        wires: list[dict[str, Any]] = []
        rows: dict[str, list[dict[str, Any]]] = {}
        for position, obj in enumerate(objs):
            new, row, wire = creation(obj, revision, start + timedelta(microseconds=position))
            created.append(new)
            wires.append(wire)
            rows.setdefault(new.KIND, []).append(encoded(row))
        for kind, kind_rows in rows.items():
            self._conn.executemany(insert_sql(kind, list(kind_rows[0])), kind_rows)
        self._conn.executemany(
            APPEND_CHANGE,
            [
                {
                    "revision": revision,
                    "type": "ADDED",
                    "kind": o.KIND,
                    "namespace": o.namespace,
                    "name": o.name,
                    "uid": o.metadata.uid,
                    "object": _json(wire),
                }
                for o, wire in zip(created, wires, strict=True)
            ],
        )
        return created

    def _write_revision(self) -> int:
        """This transaction's revision: the first write bumps the counter, as the Store's."""
        if self._revision is None:
            cursor = self._conn.execute(
                "UPDATE revision SET revision = revision + 1 RETURNING revision"
            )
            self._revision = int(cursor.fetchone()[0])
        return self._revision


def creation(obj: "T", revision: int, now: datetime) -> "tuple[T, dict[str, Any], dict[str, Any]]":
    """`obj` as created at `revision` and `now` (its server fields assigned, whatever it
    carried: a new uid, generation 1), the values of its row, JSON columns as Python values,
    and its wire form (for its change): what `Store.create_many` makes of an object, in a form
    without SQLAlchemy."""
    metadata = obj.metadata.model_copy(
        update={
            "namespace": listing.namespace_of(obj.INFO, obj.metadata.namespace) or None,
            "uid": str(uuid.uuid4()),
            "generation": 1,
            "resource_version": str(revision),
            "creation_timestamp": now,
            "deletion_timestamp": None,
        }
    )
    new = obj.model_copy(update={"metadata": metadata})
    wire = new.wire()
    spec, status = wire.get("spec", {}), wire.get("status", {})
    return (
        new,
        {
            "uid": metadata.uid,
            "namespace": metadata.namespace or "",
            "name": metadata.name,
            "labels": metadata.labels,
            "annotations": metadata.annotations,
            "finalizers": metadata.finalizers,
            "owner_references": wire["metadata"].get("ownerReferences", []),
            "generation": 1,
            "resource_version": revision,
            "created_at": now,
            "deleted_at": None,
            "spec": spec,
            "status": status,
            **schema.derived(new.KIND, spec, status),
        },
        wire,
    )


def encoded(row: dict[str, Any]) -> dict[str, Any]:
    """A new row's values as SQLAlchemy's JSON and DateTime types store them in SQLite."""
    encoded = {k: _json(v) if k in listing.JSON_COLUMNS else v for k, v in row.items()}
    encoded["created_at"] = _timestamp(row["created_at"])  # deleted_at: None, as created
    return encoded


# A change-feed row on SQLite, its columns as named parameters, the object as text: this
# module's creations and the Store's every write (`revisions`) append with it.
APPEND_CHANGE = (
    "INSERT INTO changes (revision, type, kind, namespace, name, uid, object) "
    "VALUES (:revision, :type, :kind, :namespace, :name, :uid, :object)"
)


def insert_sql(kind: str, columns: list[str]) -> str:
    """The INSERT of new rows of `kind`, these columns named as its parameters."""
    return (
        f"INSERT INTO {schema.TABLES[kind]} ({', '.join(columns)}) "
        f"VALUES ({', '.join(':' + c for c in columns)})"
    )


def _json(value: Any) -> str:
    return jsontext.dumps(value)  # as the Store's JSON columns write it (db.Database)


def _timestamp(value: datetime) -> str:
    """A UTC time as SQLAlchemy's DateTime stores it in SQLite, which `listing` reads back."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def run(url: str, work: "Callable[[Transaction], R | None]", *, write: bool) -> R | None:
    """`work` in one transaction on the SQLite file at `url` (BEGIN IMMEDIATE when it may
    write, so that it reads and writes under the write lock): committed, and the doorbell rung,
    when it returns a value; rolled back when it returns None or raises.

    None, with nothing done, when this path cannot answer: not SQLite, no file yet, a schema
    to create or upgrade (or one this module does not write), or a row that already exists."""
    path = locations.sqlite_path(url)
    if path is None or not path.exists() or (write and schema.HEAD != WRITES_SCHEMA):
        return None
    try:
        conn = connect(path)
    except sqlite3.Error:
        return None  # the Store's path says what is wrong, in its own words
    turn = writers.file_turn(locations.writers_path(path)) if write else contextlib.nullcontext()
    with turn, contextlib.closing(conn):  # closing without COMMIT rolls back
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:  # locked for longer than the busy timeout
            raise _unavailable(url, exc) from None
        except sqlite3.Error:
            return None
        try:
            version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.Error:
            return None  # no schema yet, or not gctl's: the Store creates it, or says why not
        if version is None or version[0] != schema.HEAD:
            return None
        try:
            result = work(Transaction(conn))
            if result is None:
                return None
            conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            return None  # the Store's path reads again, and names what already exists
        except sqlite3.OperationalError as exc:
            raise _unavailable(url, exc) from None
    if write:
        notify.ring(locations.notify_path(path))  # committed: wake this host's watchers
    return result


def _unavailable(url: str, exc: sqlite3.Error) -> errors.Unavailable:
    """As gctl.store.db words a driver error: the database (a SQLite URL holds no password)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return errors.Unavailable(f"database {url}: {first}")
