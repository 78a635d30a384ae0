"""Following the change feed without polling the tables.

A watcher arms its wake-up first, then reads every change after its revision, then sleeps until
woken: on SQLite every committed write rings a file next to the database (`notify`), on
PostgreSQL it sends NOTIFY. A write that lands between the read and the
sleep is never missed, because the wake-up was armed before the read. Idle, it uses no CPU.
"""

import contextlib
import math
import select
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from gctl.api import errors
from gctl.store import db, jsontext, locations, notify, revisions

# A watcher re-reads the feed this often even without a wake-up: a safety net, not the mechanism.
RESYNC_SECONDS = 60.0
PAGE = 10_000  # changes read at once


class Page(list[revisions.Change]):
    """Changes read at once, in the feed's order. `continues`: the last one's revision goes on
    in the next page (one transaction wrote more changes than a page holds), which a reader
    that waits for a whole transaction reads before it acts (`controller.manager`)."""

    continues: bool = False


def resume_after(page: Sequence[revisions.Change]) -> int:
    """The last revision wholly read once `page` is handled, which a new watch (a reconnect)
    is to read after: its last one's, or the one before where the next page goes on with it,
    since a watch reads whole revisions and would skip the rest of that transaction."""
    return page[-1].revision - (1 if isinstance(page, Page) and page.continues else 0)


class Waker(Protocol):
    def wait(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


class _PostgresWaker:
    """Wakes on NOTIFY `channel` (gctl_changes, which every write transaction sends as it
    commits, unless told another); with `payloads`, only on a notification carrying one."""

    def __init__(
        self,
        database: db.Database,
        stop: threading.Event | None,
        channel: str = revisions.NOTIFY_CHANNEL,
        payloads: frozenset[str] | None = None,
    ) -> None:
        from psycopg import sql
        from sqlalchemy import make_url

        url = make_url(database.url).set(drivername="postgresql")
        self._url = database.url
        self._conninfo = url.render_as_string(hide_password=False)
        self._listen_sql = sql.SQL("LISTEN {}").format(sql.Identifier(channel))
        self._stop = stop
        self._payloads = payloads
        self._conn = self._listen()

    def _listen(self) -> Any:
        """A connection of its own that LISTENs; errors.Unavailable if there is none."""
        import psycopg

        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
            conn.execute(self._listen_sql)
        except psycopg.Error as exc:
            raise unavailable(self._url, exc) from None
        return conn

    def wait(self, timeout: float) -> bool:
        """Whether a wanted notification came within `timeout`. A connection that dropped (the
        server restarted, its backend was ended) is made again at once, and the wait returns
        True: what was sent meanwhile is lost to LISTEN, so the caller must read again. Where
        no new one can be made, errors.Unavailable."""
        import psycopg

        try:
            return self._wait(timeout)
        except psycopg.Error:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = self._listen()
            return True

    def _wait(self, timeout: float) -> bool:
        stop_fd = notify.stop_fd(self._stop)
        if stop_fd is not None:  # a stop that select sees: no need to look at it in steps
            return self._poll(stop_fd, timeout)
        step = 0.5 if self._stop is not None else timeout
        waited = 0.0
        while waited < timeout:
            for notice in self._conn.notifies(timeout=min(step, timeout - waited)):
                if self._wanted(notice.payload):
                    return True
            if self._stop is not None and self._stop.is_set():
                return False
            waited += step
        return False

    def _poll(self, stop_fd: int, timeout: float) -> bool:
        """`wait`, sleeping in poll(2) on the connection and the stop's descriptor."""
        poller = select.poll()
        poller.register(self._conn.fileno(), select.POLLIN)
        poller.register(stop_fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready = poller.poll(math.ceil(left * 1000))
            if not ready or any(fd == stop_fd for fd, _ in ready):
                return False
            # Readable: notifications, or something else the server sent (read and dropped).
            # All of them are read, so that one for someone else is not left to wake the
            # next wait; a wanted one among them wakes this one, else it sleeps on.
            wanted = False
            for notice in self._conn.notifies(timeout=0):
                wanted = wanted or self._wanted(notice.payload)
            if wanted:
                return True
        return False

    def _wanted(self, payload: str) -> bool:
        return self._payloads is None or payload in self._payloads

    def close(self) -> None:
        self._conn.close()


def unavailable(url: str, exc: BaseException) -> errors.Unavailable:
    """A driver's error as the project's, on one line (psycopg's messages run to three)."""
    lines = str(exc).strip().splitlines()
    return errors.Unavailable(f"database {db.display_url(url)}: {lines[0] if lines else exc}")


def waker(database: db.Database, stop: threading.Event | None = None) -> Waker:
    if database.notify_path is not None:
        return notify.bell(database.notify_path, stop)
    return _PostgresWaker(database, stop)


def channel_waker(
    database: db.Database,
    stop: threading.Event | None,
    *,
    bell: Path | None,
    channel: str,
    payloads: frozenset[str],
) -> Waker:
    """A waker of its own, for writes that the change feed does not carry: on SQLite the
    doorbell `bell`, on PostgreSQL NOTIFY on `channel` with one of `payloads`."""
    database.must_exist("watch")
    if database.sqlite_path is not None:
        assert bell is not None, "a SQLite database needs a doorbell"
        return notify.bell(bell, stop)
    return _PostgresWaker(database, stop, channel, payloads)


class Watch(AbstractContextManager["Watch"]):
    """`for changes in Watch(db, since=rev): ...` yields batches of changes in revision order."""

    def __init__(
        self,
        database: db.Database,
        since: int,
        kinds: Iterable[str] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._db = database
        self.revision = since
        self._after_id: int | None = None
        self._kinds = list(kinds) if kinds is not None else None
        self._stop = stop
        database.must_exist("watch")  # its doorbell and its reader would create the file
        with db.translate_errors(database.url):
            self._waker = waker(database, stop)
        try:
            self._reader = _ChangeReader(database)
        except BaseException:
            self._waker.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._waker.close()
        self._reader.close()

    def poll(self) -> Page:
        """Every change after the current position, now, without waiting (a page at most)."""
        head, changes = self._reader.read(self.revision, self._kinds, self._after_id)
        if changes:
            self._after_id = changes[-1].id
            self.revision = changes[-1].revision
        elif self._after_id is None:
            self.revision = max(self.revision, head)
        return changes

    def __iter__(self) -> Iterator[Page]:
        while self._stop is None or not self._stop.is_set():
            changes = self.poll()
            if changes:
                yield changes
                if len(changes) >= PAGE:
                    continue  # more may be waiting already
            # A commit made since the read above has rung the waker already: it returns at
            # once. So there is no need to read again before waiting.
            self._waker.wait(RESYNC_SECONDS)


class _ChangeReader:
    """Reads the change feed through the DB-API driver on a connection of its own: a watcher
    reads after every write anyone makes, and SQLAlchemy's per-query cost would dominate."""

    def __init__(self, database: db.Database) -> None:
        self._url = database.url
        self._sqlite = database.sqlite_path is not None
        # The objects as text, decoded here as their kind is read (`jsontext.loads_of`), not
        # by psycopg, which would decode every kind alike.
        self._text = "" if self._sqlite else "::text"
        try:
            if database.sqlite_path is not None:
                import sqlite3

                self._conn: Any = sqlite3.connect(
                    str(database.sqlite_path),
                    timeout=db.SQLITE_BUSY_TIMEOUT_MS / 1000,
                    isolation_level=None,
                    check_same_thread=False,  # made by the caller, read by a feed thread
                )
                self._mark = "?"
            else:
                import psycopg

                conninfo = locations.libpq_url(database.url) or database.url
                self._conn = psycopg.connect(conninfo, autocommit=True)
                self._mark = "%s"
        except Exception as exc:  # sqlite3.Error or psycopg.Error, imported lazily
            raise unavailable(database.url, exc) from None

    def read(
        self, revision: int, kinds: list[str] | None, after_id: int | None
    ) -> tuple[int, Page]:
        """(the head revision, the changes after `after_id` or else after `revision`: a page,
        and whether the last one's revision goes on after it)."""
        mark = self._mark
        where = f"id > {mark}" if after_id is not None else f"revision > {mark}"
        params: list[object] = [after_id if after_id is not None else revision]
        if kinds is not None:
            where += f" AND kind IN ({', '.join([mark] * len(kinds))})"
            params.extend(kinds)
        query = (
            f"SELECT id, revision, type, kind, namespace, name, uid, object{self._text} "
            "FROM changes "
            f"WHERE {where} ORDER BY id LIMIT {PAGE + 1}"  # the one after: its revision
        )
        try:
            if self._sqlite:
                self._conn.execute("BEGIN")  # one snapshot for both reads
            try:
                # The head first: on PostgreSQL each statement has its own snapshot, and a
                # commit between the two reads must not be skipped.
                head = int(self._conn.execute("SELECT revision FROM revision").fetchone()[0])
                rows = self._conn.execute(query, params).fetchall()
            finally:
                if self._sqlite:
                    self._conn.execute("COMMIT")
        except Exception as exc:  # sqlite3.Error or psycopg.Error, imported lazily
            raise unavailable(self._url, exc) from None
        page = Page(
            revisions.Change(
                int(r[0]),
                int(r[1]),
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                jsontext.loads_of(r[3])(r[7]) if isinstance(r[7], str) else r[7],
            )
            for r in rows[:PAGE]
        )
        page.continues = len(rows) > PAGE and int(rows[PAGE][1]) == page[-1].revision
        return head, page

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
