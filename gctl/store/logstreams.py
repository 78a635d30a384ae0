"""An attempt's log sent through the database, on demand: the requests a `gctl logs` on any
host writes for the agent of the attempt's node, and the chunks the agent answers with.

The database is the only channel between hosts, so a log that is not on the reader's machine
travels through it, and only while someone reads it: a requester writes a request row
(Pending); the node's agent takes it (Serving, or Failed with why), writes the file's bytes as
chunks of at most a window ahead of what the requester has taken, and marks it Done once it
has sent everything (for a followed log: once the attempt has ended and its file is read to
the end). The requester takes chunks in order, deletes them as it prints them, and deletes the
request when it is done. It renews its lease while it reads; an agent that sees no renewal for
the lease's length (measured on its own clock, so that hosts' clocks need not agree) deletes
the request, so that a requester killed with SIGKILL leaves nothing streaming. A request left
by a requester that died while its agent was away too is collected, after `ABANDONED_AFTER`,
by the next request anyone makes.

Wake-ups travel apart from the change feed (these rows are not objects and carry no
revision): on SQLite a doorbell file of their own (`locations.logs_notify_path`), on PostgreSQL
NOTIFY on `CHANNEL`, whose payload says whom it is for: `node:NAME` (the agent) or
`request:ID` (the requester). Store functions take the session they are given and never
commit; `writing` is the transaction that rings that doorbell once committed.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from gctl.store import db, feed, locations, tables

CHANNEL = "gctl_logs"
PENDING, SERVING, DONE, FAILED = "Pending", "Serving", "Done", "Failed"
# A request not renewed for this long (by the requester's clock) is collected by anyone.
ABANDONED_AFTER = timedelta(hours=1)

_REQUESTS = tables.Base.metadata.tables[tables.LogRequestRow.__tablename__]
_CHUNKS = tables.Base.metadata.tables[tables.LogChunkRow.__tablename__]


@dataclass(frozen=True)
class Request:
    id: int
    node: str
    binding_uid: str
    path: str
    follow: bool
    lease_seconds: float
    renewed_at: datetime
    state: str
    message: str | None
    sent: int
    received: int


@dataclass(frozen=True)
class Chunk:
    position: int
    data: bytes


def for_node(node: str) -> str:
    """The wake-up payload of a node's agent."""
    return f"node:{node}"


def for_request(request_id: int) -> str:
    """The wake-up payload of a request's requester."""
    return f"request:{request_id}"


def _bell(database: db.Database) -> Path | None:
    return locations.logs_notify_path(database.sqlite_path) if database.sqlite_path else None


@contextmanager
def writing(database: db.Database) -> Iterator[Session]:
    """A write transaction whose commit wakes the waiters on logs (not the change feed's)."""
    with database.write(bell=_bell(database)) as session:
        yield session


def waker(database: db.Database, stop: threading.Event | None, payload: str) -> feed.Waker:
    """Wakes on the writes of logs meant for `payload` (on SQLite: on any write of logs)."""
    return feed.channel_waker(
        database, stop, bell=_bell(database), channel=CHANNEL, payloads=frozenset({payload})
    )


def _wake(session: Session, payload: str) -> None:
    """On PostgreSQL, NOTIFY the waiters for `payload` when this transaction commits."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_notify(CHANNEL, payload)))


def _request(row: Any) -> Request:
    return Request(
        id=row.id,
        node=row.node,
        binding_uid=row.binding_uid,
        path=row.path,
        follow=bool(row.follow),
        lease_seconds=float(row.lease_seconds),
        renewed_at=row.renewed_at,
        state=row.state,
        message=row.message,
        sent=int(row.sent),
        received=int(row.received),
    )


# -- the requester's side ------------------------------------------------------------------------


def open_request(
    session: Session,
    *,
    node: str,
    binding_uid: str,
    path: str,
    follow: bool,
    lease_seconds: float,
    now: datetime,
) -> int:
    """Ask `node`'s agent for the log at `path`; returns the request's id. Collects the
    requests abandoned long ago first."""
    session.execute(delete(_REQUESTS).where(_REQUESTS.c.renewed_at < now - ABANDONED_AFTER))
    request_id: int = session.execute(
        insert(_REQUESTS)
        .values(
            node=node,
            binding_uid=binding_uid,
            path=path,
            follow=follow,
            lease_seconds=lease_seconds,
            renewed_at=now,
            state=PENDING,
            message=None,
            sent=0,
            received=0,
        )
        .returning(_REQUESTS.c.id)
    ).scalar_one()
    _wake(session, for_node(node))
    return request_id


def read(
    session: Session, request_id: int, since: int, limit: int
) -> tuple[Request | None, list[Chunk]]:
    """The request (None: gone) and its chunks from byte `since` on, about `limit` bytes."""
    row = session.execute(select(_REQUESTS).where(_REQUESTS.c.id == request_id)).first()
    if row is None:
        return None, []
    chunks: list[Chunk] = []
    size = 0
    rows = session.execute(
        select(_CHUNKS.c.position, _CHUNKS.c.data)
        .where(_CHUNKS.c.request_id == request_id, _CHUNKS.c.position >= since)
        .order_by(_CHUNKS.c.position)
    )
    for position, data in rows:
        chunks.append(Chunk(int(position), bytes(data)))
        size += len(data)
        if size >= limit:
            break
    return _request(row), chunks


def take(session: Session, request: Request, upto: int) -> None:
    """The requester has printed every byte before `upto`: drop those chunks and tell the
    agent, whose window moves on."""
    session.execute(
        delete(_CHUNKS).where(_CHUNKS.c.request_id == request.id, _CHUNKS.c.position < upto)
    )
    session.execute(update(_REQUESTS).where(_REQUESTS.c.id == request.id).values(received=upto))
    _wake(session, for_node(request.node))


def renew(session: Session, request_id: int, now: datetime) -> bool:
    """The requester is still there; False if the request is gone."""
    done = session.execute(
        update(_REQUESTS).where(_REQUESTS.c.id == request_id).values(renewed_at=now)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]


def close(session: Session, request_id: int) -> None:
    """The request and what is left of its chunks, gone. The request first: on PostgreSQL that
    waits for an agent's write in flight, whose chunks the second statement then sees."""
    session.execute(delete(_REQUESTS).where(_REQUESTS.c.id == request_id))
    session.execute(delete(_CHUNKS).where(_CHUNKS.c.request_id == request_id))


# -- the agent's side ----------------------------------------------------------------------------


def requests_for(session: Session, node: str) -> list[Request]:
    rows = session.execute(
        select(_REQUESTS).where(_REQUESTS.c.node == node).order_by(_REQUESTS.c.id)
    )
    return [_request(row) for row in rows]


def answer(session: Session, request: Request, state: str, message: str | None = None) -> bool:
    """Move a request from the state it was read in to `state`; False if it is gone or moved."""
    done = session.execute(
        update(_REQUESTS)
        .where(_REQUESTS.c.id == request.id, _REQUESTS.c.state == request.state)
        .values(state=state, message=message)
    )
    _wake(session, for_request(request.id))
    return bool(done.rowcount)  # type: ignore[attr-defined]


def send(session: Session, request: Request, chunks: list[Chunk]) -> bool:
    """Append `chunks` (consecutive, from byte `request.sent` on); False, writing nothing, if
    the request is gone or another writer sent them already."""
    size = sum(len(c.data) for c in chunks)
    done = session.execute(
        update(_REQUESTS)
        .where(_REQUESTS.c.id == request.id, _REQUESTS.c.sent == request.sent)
        .values(sent=request.sent + size)
    )
    if not done.rowcount:  # type: ignore[attr-defined]
        return False
    session.execute(
        insert(_CHUNKS),
        [{"request_id": request.id, "position": c.position, "data": c.data} for c in chunks],
    )
    _wake(session, for_request(request.id))
    return True


def finish(session: Session, request: Request) -> bool:
    """Everything is sent (`request.sent` bytes): Done; False if the request is gone."""
    done = session.execute(
        update(_REQUESTS)
        .where(_REQUESTS.c.id == request.id, _REQUESTS.c.sent == request.sent)
        .values(state=DONE)
    )
    _wake(session, for_request(request.id))
    return bool(done.rowcount)  # type: ignore[attr-defined]
