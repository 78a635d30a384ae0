"""Listing stored objects in wire form through the DB-API driver alone (sqlite3 or psycopg).

`gctl get` prints thousands of objects and should answer in a blink; importing SQLAlchemy alone
takes half of that budget on a 2-core machine. So the read path of `get` opens the driver
itself and runs one SELECT, while writes, migrations and watches go through SQLAlchemy.
`row_to_wire` is shared with the Store, so both paths print the same object.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gctl.api import kinds
from gctl.store import jsontext, locations, schema

JSON_COLUMNS = frozenset(
    {"labels", "annotations", "finalizers", "owner_references", "spec", "status"}
)
COLUMNS = (
    "uid", "namespace", "name", "labels", "annotations", "finalizers", "owner_references",
    "generation", "resource_version", "created_at", "deleted_at", "spec", "status",
)  # fmt: skip


def namespace_of(info: kinds.KindInfo, namespace: str | None) -> str:
    """The stored namespace: "" for cluster-scoped kinds, `default` when none is given."""
    if not info.namespaced:
        return ""
    return namespace or kinds.DEFAULT_NAMESPACE


def timestamp(value: datetime | str) -> str:
    """RFC 3339 in UTC: from a datetime, or from SQLite's stored `YYYY-MM-DD HH:MM:SS.ffffff`."""
    if isinstance(value, str):
        return value.replace(" ", "T") + "Z"
    return value.isoformat().replace("+00:00", "Z")


_EMPTY: dict[str, Any] = {"{}": {}, "[]": []}


def document(value: Any, loads: Callable[[str], Any] = jsontext.loads) -> Any:
    """A JSON column's value: decoded already where SQLAlchemy or psycopg read it as JSON,
    else its text (`loads` reads it: `jsontext.loads_of` its kind)."""
    if not isinstance(value, str):
        return value
    empty = _EMPTY.get(value)
    return loads(value) if empty is None else type(empty)()


def row_to_wire(info: kinds.KindInfo, row: Mapping[Any, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": row["name"]}
    if info.namespaced:
        metadata["namespace"] = row["namespace"]
    for key in ("labels", "annotations", "finalizers"):
        if value := document(row[key]):
            metadata[key] = value
    if owners := document(row["owner_references"]):
        metadata["ownerReferences"] = owners
    metadata["uid"] = row["uid"]
    metadata["generation"] = row["generation"]
    metadata["resourceVersion"] = str(row["resource_version"])
    metadata["creationTimestamp"] = timestamp(row["created_at"])
    if row["deleted_at"] is not None:
        metadata["deletionTimestamp"] = timestamp(row["deleted_at"])
    return {
        "apiVersion": kinds.API_VERSION,
        "kind": info.kind,
        "metadata": metadata,
        "spec": document(row["spec"], jsontext.loads_of(info.kind)),
        "status": document(row["status"]),
    }


@dataclass(frozen=True)
class Snapshot:
    revision: int
    wires: list[dict[str, Any]]


def query(
    info: kinds.KindInfo,
    namespace: str | None,
    names: Sequence[str] | None,
    mark: str,
    *,
    cast: str = "",
) -> tuple[str, list[Any]]:
    """The SELECT of `read`, of `read_pages` and of gctl.store.driver's reads, in key order
    (namespace, name): the order of the unique index on them."""
    where, params = [], []
    if namespace is not None or not info.namespaced:
        where.append(f"namespace = {mark}")
        params.append(namespace_of(info, namespace))
    if names:
        where.append(f"name IN ({', '.join([mark] * len(names))})")
        params.extend(names)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    table = schema.TABLES[info.kind]
    columns = ", ".join(f"{c}{cast} AS {c}" if c in JSON_COLUMNS and cast else c for c in COLUMNS)
    return f"SELECT {columns} FROM {table}{clause} ORDER BY namespace, name", params


def read(
    url: str, info: kinds.KindInfo, namespace: str | None, names: Sequence[str] | None = None
) -> Snapshot | None:
    """Objects of one kind (`namespace=None`: all) and the revision they were read at, or None
    when this path cannot answer: no directory for the database (the Store says so), or a
    schema that first needs migrating. An absent SQLite file in a directory that exists is
    an empty database at revision 0, as gctl.store.db reads it, with nothing created."""
    if (path := locations.sqlite_path(url)) is not None:
        if not path.exists():
            return Snapshot(0, []) if path.parent.is_dir() else None
        return _read_sqlite(str(path), info, namespace, names)
    if (conninfo := locations.libpq_url(url)) is not None:
        return _read_postgres(conninfo, info, namespace, names)
    return None


PAGE = 500  # rows per page when `gctl get` prints a long table as it reads (kubectl's chunks)


def read_pages(
    url: str, info: kinds.KindInfo, namespace: str | None, size: int = PAGE
) -> Iterator[list[dict[str, Any]]] | None:
    """`read` one page at a time, so that a table of 100,000 Jobs starts printing at once; None
    when this path cannot answer (as `read`).

    One SELECT, read `size` rows at a time from one snapshot: sqlite3 steps its statement as
    rows are fetched, and on PostgreSQL a server-side cursor, which the planner plans for the
    first rows (the name index, in order). Keyset pages, one SELECT each, were planned anew
    every time; right after a bulk apply, before PostgreSQL had statistics on the table, each
    was a scan and sort of the whole table: 20 pages of 10,000 Jobs took 260 ms."""
    if (path := locations.sqlite_path(url)) is not None:
        if not path.exists():
            return None
        import sqlite3

        try:
            lite = sqlite3.connect(str(path), timeout=30, isolation_level=None)
            lite.row_factory = sqlite3.Row
            lite.execute("BEGIN")
            current = _version(lite.execute("SELECT version_num FROM alembic_version"))
        except sqlite3.Error:
            return None
        return _pages(lite, lite.cursor(), current, info=info, namespace=namespace, size=size)
    if (conninfo := locations.libpq_url(url)) is not None:
        import psycopg
        from psycopg.rows import dict_row

        try:
            pg = psycopg.connect(conninfo, row_factory=dict_row, prepare_threshold=None)
            pg.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            current = _version(pg.execute("SELECT version_num FROM alembic_version"))
        except psycopg.Error:
            return None
        cursor = pg.cursor(name="gctl_get")
        return _pages(pg, cursor, current, info=info, namespace=namespace, size=size, pg=True)
    return None


def _pages(
    conn: Any,
    cursor: Any,
    version: str | None,
    *,
    info: kinds.KindInfo,
    namespace: str | None,
    size: int,
    pg: bool = False,
) -> Iterator[list[dict[str, Any]]] | None:
    if version != schema.HEAD:
        conn.close()
        return None

    def pages() -> Iterator[list[dict[str, Any]]]:
        with closing(conn), closing(cursor):
            sql, params = query(info, namespace, None, "%s" if pg else "?", cast=pg * "::text")
            cursor.execute(sql, params)
            while rows := cursor.fetchmany(size):
                yield [row_to_wire(info, row) for row in rows]

    return pages()


def _read_sqlite(
    path: str, info: kinds.KindInfo, namespace: str | None, names: Sequence[str] | None
) -> Snapshot | None:
    import sqlite3

    try:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("BEGIN")  # one snapshot for the revision and the rows
        if _version(conn.execute("SELECT version_num FROM alembic_version")) != schema.HEAD:
            return None
        revision = conn.execute("SELECT revision FROM revision").fetchone()[0]
        sql, params = query(info, namespace, names, "?")
        rows = conn.execute(sql, params).fetchall()
        return Snapshot(int(revision), [row_to_wire(info, row) for row in rows])
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _read_postgres(
    conninfo: str, info: kinds.KindInfo, namespace: str | None, names: Sequence[str] | None
) -> Snapshot | None:
    import psycopg
    from psycopg.rows import dict_row

    try:
        conn = psycopg.connect(conninfo, row_factory=dict_row, prepare_threshold=None)
    except psycopg.Error:
        return None  # the full path reports the error in its own words
    with conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            version = _version(conn.execute("SELECT version_num FROM alembic_version"))
        except psycopg.Error:
            return None
        if version != schema.HEAD:
            return None
        revision = conn.execute("SELECT revision FROM revision").fetchone()
        # JSON as text: most labels and annotations are empty, which _document skips decoding.
        sql, params = query(info, namespace, names, "%s", cast="::text")
        rows = conn.execute(sql, params).fetchall()
        return Snapshot(
            int(revision["revision"]) if revision else 0, [row_to_wire(info, row) for row in rows]
        )


def _version(cursor: Any) -> str | None:
    row = cursor.fetchone()
    return None if row is None else str(row[0] if not isinstance(row, dict) else row["version_num"])
