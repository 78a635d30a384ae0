"""Events: what happened to an object and why, as one transaction records them.

A repeat of an object's latest event (same type, reason and message) bumps that event's count
and last time instead of adding one, as Kubernetes aggregates events. To compare, a
transaction reads each object's latest event once (`prefetch`, one query for many objects)
and from then on knows it, since every event it writes goes through here.

An event is named as Kubernetes names them: the object's name, a dot, and the time it was made
in nanoseconds, in hex (`train.1879f2d0a1b2c3d4`). So `gctl get events` lists each object's
events in the order they happened.
"""

import functools
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Select, bindparam, select

from gctl.api import errors, event, kinds, meta
from gctl.store import jsontext, listing, stored, tables

if TYPE_CHECKING:
    from gctl.store import store

CHUNK = 500  # uids in one IN list


class Occurrence(NamedTuple):
    """What happened to an object, for `Store.record_events`."""

    involved: meta.Resource
    reason: str
    message: str = ""
    type_: str = "Normal"
    source: str = ""


def standin(kind: str, name: str, namespace: str | None, uid: str | None) -> meta.Resource:
    """An object known by its names and uid alone, to record an Event about it without reading
    it: its stored document may not validate, or need not be read for an Event."""
    names: dict[str, Any] = {"name": name, "namespace": namespace or None, "uid": uid}
    known: dict[str, Any] = {"metadata": meta.ObjectMeta.model_construct(**names)}
    return kinds.model(kind).model_construct(**known)


class EventLog:
    """The events of one Store's transaction: the latest of each object it read or wrote."""

    def __init__(self, writer: "store.Store") -> None:
        self._writer = writer
        # By the involved object's uid: its latest event, or, as read and until a repeat
        # needs it whole, what it said and its stored row (validating every object's latest
        # event to compare three of its fields took a third of the prefetch).
        self._latest: dict[str, event.Event | _Stored] = {}
        self._read: set[str] = set()  # uids whose latest event was read

    def prefetch(self, uids: Sequence[str]) -> None:
        """Read the latest event of each object (by uid) not read yet in this transaction, in
        one query for all."""
        wanted = sorted(set(uids) - self._read)
        self._read.update(wanted)
        for start in range(0, len(wanted), CHUNK):
            rows = self._writer.execute(_latest_query(), {"uids": wanted[start : start + CHUNK]})
            last = {row.involved_uid: row for row in rows}  # the last one of each object
            for uid, row in last.items():  # decoded alone: a Job has several events
                spec = listing.document(row.spec, jsontext.loads_of(event.Event.KIND))
                if not isinstance(spec, dict):  # a hand edit: it repeats nothing
                    continue
                said = (spec.get("type", "Normal"), spec.get("reason"), spec.get("message", ""))
                self._latest[uid] = _Stored(said, row._mapping)

    def record(self, occurrences: Sequence[Occurrence]) -> list[event.Event]:
        """Record each occurrence: a repeat of the object's latest event (stored, or recorded
        earlier in this same call) bumps its count; the new events are written together."""
        writer = self._writer
        now = writer.clock()
        self.prefetch([o.involved.metadata.uid or "" for o in occurrences])
        latest = self._latest
        recorded: list[event.Event | int] = []  # an event, or the position of a new one
        new: list[event.Event] = []
        for o in occurrences:
            uid = o.involved.metadata.uid or ""
            type_ = "Warning" if o.type_ == "Warning" else "Normal"
            said = (type_, o.reason, o.message)
            latest_one = latest.get(uid)
            if isinstance(latest_one, _Stored):  # read whole only for a repeat
                previous = _whole(latest_one) if latest_one.said == said else None
            else:
                previous = latest_one
            if previous is not None and _said(previous) == said:
                previous.spec = previous.spec.model_copy(
                    update={"count": previous.spec.count + 1, "last_timestamp": now}
                )
                if previous.metadata.uid is not None:  # stored before: write the count now
                    previous = latest[uid] = writer.update(previous)
                recorded.append(previous if previous.metadata.uid else new.index(previous))
                continue
            latest[uid] = made = _new_event(o, now)
            recorded.append(len(new))
            new.append(made)
        created = writer.create_many(new)
        for made in created:  # in order: the last one of each object stands
            latest[made.spec.involved_object.uid or ""] = made
        return [created[r] if isinstance(r, int) else r for r in recorded]

    def of(
        self,
        involved: meta.Resource,
        limit: int = 50,
        skipped: list[errors.StoredInvalid] | None = None,
    ) -> list[event.Event]:
        """The object's latest events, oldest first. One that does not validate as stored
        raises StoredInvalid, or with `skipped` goes there."""
        table = tables.table_of(event.Event.KIND)
        rows = self._writer.execute(
            select(*tables.readable(table))
            .where(table.c.involved_uid == involved.metadata.uid)
            .order_by(table.c.created_at.desc())
            .limit(limit)
        ).all()
        found = (
            stored.validated_or_skipped(event.Event, _wire(r._mapping), skipped)
            for r in reversed(rows)
        )
        return [e for e in found if e is not None]


class _Stored(NamedTuple):
    """An object's latest event as a transaction read it: its type, reason and message, and
    its row, validated only if the transaction repeats it."""

    said: tuple[str, str | None, str]
    row: Mapping[Any, Any]


def _whole(latest: _Stored) -> event.Event | None:
    """The stored event, validated; None if it does not validate (a hand edit): a repeat of
    it is then recorded as a new event, rather than failing the transaction that records it."""
    return stored.validated_or_skipped(event.Event, _wire(latest.row), [])


def _wire(row: Mapping[Any, Any]) -> dict[str, Any]:
    return listing.row_to_wire(event.Event.INFO, row)


def _said(latest: event.Event) -> tuple[str, str | None, str]:
    """An event's type, reason and message, which a repeat has the same of."""
    return latest.spec.type, latest.spec.reason, latest.spec.message


@functools.cache
def _latest_query() -> Select[Any]:
    """The events of the objects whose uids are the list `uids`, oldest first; built once."""
    table = tables.table_of(event.Event.KIND)
    return (
        select(*tables.readable(table))
        .where(table.c.involved_uid.in_(bindparam("uids", expanding=True)))
        # An object's events of one transaction share both; names grow in time.
        .order_by(table.c.created_at, table.c.resource_version, table.c.name)
    )


class _Nanoseconds:
    """Now in nanoseconds since the epoch, later than any this process gave before: two events
    made in the same nanosecond still get two names, in the order they were made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def __call__(self) -> int:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            return self._last


_nanoseconds = _Nanoseconds()


def _new_event(o: Occurrence, now: datetime) -> event.Event:
    involved = o.involved
    return event.Event(
        metadata=meta.ObjectMeta(
            name=f"{involved.name}.{_nanoseconds():016x}",
            namespace=involved.metadata.namespace or meta.DEFAULT_NAMESPACE,
        ),
        spec=event.EventSpec(
            involved_object=event.ObjectReference(
                kind=involved.KIND,
                name=involved.name,
                namespace=involved.metadata.namespace,
                uid=involved.metadata.uid,
            ),
            type="Warning" if o.type_ == "Warning" else "Normal",
            reason=o.reason,
            message=o.message,
            source=o.source,
            first_timestamp=now,
            last_timestamp=now,
        ),
    )
