"""Shared reads: rows a daemon reads again and again, decoded once per version and kept.

The scheduler reads the whole queue, every Node and every attempt holding GPUs at every pass,
and decoding those rows cost more than the rest of its work. A shared read asks for uid and
resourceVersion first and decodes (and, for objects, validates) only the rows it has not seen
in that version. What it returns is shared by the process's Stores: read it, never change it
(copy first). The Store's `pending_wires`, `shared_wires`, `shared_objects`,
`shared_active_bindings` and `shared_bindings_on` are the ways in (docs/decisions.md); a daemon
that follows the change feed hands it what the feed decoded (`note`), and one that does not
drops what it will not read again (`forget`).
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Executable, Result, Select, bindparam, select

from gctl.api import errors, meta
from gctl.store import listing, stored, tables

T = TypeVar("T", bound=meta.Resource)
Execute = Callable[[Executable, Any], Result[Any]]  # a statement and its parameters

# uid -> (resourceVersion, wire) of rows decoded before, and uid -> (resourceVersion, object)
# of those validated before: shared by this process's Stores; bounded, and emptied when full.
# A uid is unique across kinds.
_DECODED: dict[str, tuple[int, dict[str, Any]]] = {}
_VALIDATED: dict[str, tuple[int, meta.Resource]] = {}
MAX_KEPT = 30_000
CHUNK = 500  # uids in one IN list


@dataclass(frozen=True)
class Query:
    """The statements of one shared read, built once (`query`): building a statement and
    deriving its cache key takes SQLAlchemy longer than SQLite takes to run it. Each takes the
    read's own parameters; `missing` takes the list `uids` too."""

    keys: Select[Any]  # uid and resourceVersion of the rows that match, in order
    rows: Select[Any]  # those rows whole, in order
    missing: Select[Any]  # those of them among `uids`


def query(
    cls: type[meta.Resource],
    where: Sequence[Any],
    order: Sequence[Any],
    fetched: Sequence[Any] | None = None,
) -> Query:
    """A shared read of the objects of `cls` that match `where`, in `order`. `fetched`: the
    same conditions as the rows looked up by uid check them again (default `where`), written
    so that no index holds them where SQLite, which keeps no statistics, would otherwise take
    that index over the uids' (`reading._pending`)."""
    table = tables.table_of(cls.KIND)
    readable = select(*tables.readable(table))
    by_uid = readable.where(*(where if fetched is None else fetched))
    return Query(
        keys=select(table.c.uid, table.c.resource_version).where(*where).order_by(*order),
        rows=readable.where(*where).order_by(*order),
        missing=by_uid.where(table.c.uid.in_(bindparam("uids", expanding=True))),
    )


def note(change_type: str, uid: str, revision: int, wire: dict[str, Any]) -> None:
    """What a change of the feed tells the cache, given in the feed's order. A daemon that
    follows the feed has decoded each object it carries already (10,000 Jobs applied at once:
    130 ms of the next pass, read and decoded again).

    An ADDED change's object is the document its row was created with, whole (the row's
    columns are made from it); kept as decoded at `revision`, its first version, so that a
    shared read of that version decodes nothing. A later change of the object at the same
    revision (written twice in one transaction), or at any later one, or its deletion, drops
    what is kept of it up to there: a status write's change carries the spec as the model
    writes it, where the row keeps the spec it holds, which a hand edit may have written in
    another form, so only creations are kept. A caller that may not have seen every change of
    `revision` yet (the feed's page ended within it) notes none of its ADDED ones."""
    kept = _DECODED.get(uid)
    if change_type != "ADDED":
        if kept is not None and kept[0] <= revision:
            _DECODED.pop(uid, None)
        validated = _VALIDATED.get(uid)
        if validated is not None and validated[0] <= revision:
            _VALIDATED.pop(uid, None)
        return
    if kept is not None and kept[0] >= revision:
        return
    if len(_DECODED) >= MAX_KEPT:
        _DECODED.clear()
    _DECODED[uid] = (revision, wire)


def forget(uids: Iterable[str]) -> None:
    """Drop what is kept of these objects: for a reader that knows they no longer match what it
    reads again and again (the agent, its node's Bindings that ended), which nothing else would
    drop but the cache filling up."""
    for uid in uids:
        _DECODED.pop(uid, None)
        _VALIDATED.pop(uid, None)


def objects(
    execute: Execute,
    cls: type[T],
    read: Query,
    params: Mapping[str, Any] | None = None,
    skipped: list[errors.StoredInvalid] | None = None,
) -> list[T]:
    """The objects `read` finds, in its order, validated once per version. One that does not
    validate raises StoredInvalid, or with `skipped` goes there (and is validated again at
    the next read)."""
    found = []
    for w in wires(execute, cls, read, params):
        uid, version = w["metadata"]["uid"], int(w["metadata"]["resourceVersion"])
        cached = _VALIDATED.get(uid)
        if cached is None or cached[0] != version:
            valid = stored.validated_or_skipped(cls, w, skipped)
            if valid is None:
                continue
            if len(_VALIDATED) >= MAX_KEPT:
                _VALIDATED.clear()
            cached = _VALIDATED[uid] = (version, valid)
        found.append(cached[1])
    return found  # type: ignore[return-value]  # validated as `cls`, under its uid


def wires(
    execute: Execute,
    cls: type[meta.Resource],
    read: Query,
    params: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The rows `read` finds, in wire form, in its order."""
    params = dict(params or {})
    rows: Sequence[Any] = execute(read.keys, params).all()
    keys: list[tuple[str, int]] = [(row[0], row[1]) for row in rows]
    if len(keys) > MAX_KEPT:  # too many to keep: decode them all, as they come
        return [listing.row_to_wire(cls.INFO, r._mapping) for r in execute(read.rows, params)]
    # Of this read, in order (None where not decoded yet): another thread may empty the cache.
    found: list[dict[str, Any] | None] = []
    missing: dict[str, int] = {}  # uid -> its place in `found`
    for uid, version in keys:
        entry = _DECODED.get(uid)
        if entry is not None and entry[0] == version:
            found.append(entry[1])
        else:
            missing[uid] = len(found)
            found.append(None)
    if not missing:
        return found  # type: ignore[return-value]  # none is None
    if len(_DECODED) + len(missing) > MAX_KEPT:
        _DECODED.clear()
    uids = list(missing)
    for start in range(0, len(uids), CHUNK):
        # fetched at once: psycopg's fetchone is a call a row
        for row in execute(read.missing, params | {"uids": uids[start : start + CHUNK]}).all():
            found[missing[row.uid]] = wire = listing.row_to_wire(cls.INFO, row._mapping)
            _DECODED[row.uid] = (row.resource_version, wire)
    # On PostgreSQL a row may have changed, stopped matching or gone between the two reads:
    # then the newer row stands, and one that no longer matches is left out.
    return [w for w in found if w is not None]
