"""Following the change feed without polling the tables.

A watcher arms its wake-up first, then reads every change after its revision, then sleeps until
woken: SQLite wakes it through a file-system notification on the database's write-ahead log
(watchfiles), PostgreSQL through LISTEN/NOTIFY. A write that lands between the read and the
sleep is never missed, because the wake-up was armed before the read. Idle, it uses no CPU.
"""

import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Protocol

from gctl.store import db, store

# A watcher re-reads the feed this often even without a wake-up: a safety net, not the mechanism.
RESYNC_SECONDS = 60.0
# watchfiles checks for file events this often (ms); a change is seen after about two steps.
# 10 ms: about 20 ms of latency, 100 cheap wake-ups a second while idle (a 1 ms step cost a
# visible share of a core).
WATCH_STEP_MS = 10
# SQLite writes a commit's WAL frames (the write that wakes a watcher), syncs them, and only
# then publishes the commit in its shared-memory index, which raises no file event. A watcher
# woken by the write may read before the commit is visible and then hear nothing more; so after
# a wake that found nothing it looks again at these delays (seconds) before it blocks.
SQLITE_SETTLE = (0.02, 0.05, 0.1, 0.25, 0.5)


class Waker(Protocol):
    def wait(self, timeout: float) -> None: ...
    def close(self) -> None: ...


class _SqliteWaker:
    """Wakes when the database file or its WAL changes (any commit writes the WAL)."""

    def __init__(self, path: Path, stop: threading.Event | None) -> None:
        from watchfiles._rust_notify import RustNotify  # watchfiles' own watcher, armed here

        self._names = {path.name, path.name + "-wal"}
        self._stop = stop
        self._notify = RustNotify([str(path.parent)], False, False, 300, False, False)

    def wait(self, timeout: float) -> None:
        remaining_ms = int(timeout * 1000)
        while remaining_ms > 0:
            result = self._notify.watch(50, WATCH_STEP_MS, min(remaining_ms, 1000), self._stop)
            if result == "signal":  # watchfiles caught SIGINT while waiting: honour Ctrl-C
                raise KeyboardInterrupt
            if isinstance(result, set):
                if any(Path(changed).name in self._names for _, changed in result):
                    return
            elif result != "timeout" or (self._stop is not None and self._stop.is_set()):
                return
            remaining_ms -= 1000

    def close(self) -> None:
        self._notify.close()


class _PostgresWaker:
    """Wakes on NOTIFY gctl_changes, which every write transaction sends as it commits."""

    def __init__(self, database: db.Database, stop: threading.Event | None) -> None:
        import psycopg
        from sqlalchemy import make_url

        url = make_url(database.url).set(drivername="postgresql")
        self._stop = stop
        self._conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
        self._conn.execute("LISTEN gctl_changes")  # store.NOTIFY_CHANNEL

    def wait(self, timeout: float) -> None:
        step = 0.5 if self._stop is not None else timeout
        waited = 0.0
        while waited < timeout:
            for _ in self._conn.notifies(timeout=min(step, timeout - waited), stop_after=1):
                return
            if self._stop is not None and self._stop.is_set():
                return
            waited += step

    def close(self) -> None:
        self._conn.close()


def waker(database: db.Database, stop: threading.Event | None = None) -> Waker:
    if database.sqlite_path is not None:
        return _SqliteWaker(database.sqlite_path, stop)
    return _PostgresWaker(database, stop)


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
        with db.translate_errors(database.url):
            self._waker = waker(database, stop)
        # PostgreSQL notifies at commit, when the change is visible: nothing to settle.
        self._settle = SQLITE_SETTLE if database.sqlite_path is not None else ()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._waker.close()

    def poll(self) -> list[store.Change]:
        """Every change after the current position, now, without waiting."""
        with self._db.read() as session:
            reader = store.Store(session)
            # Read the head first: on PostgreSQL each statement has its own snapshot, and a
            # commit between the two reads must not be skipped.
            head = reader.current_revision()
            changes = reader.changes_since(self.revision, self._kinds, after_id=self._after_id)
        if changes:
            self._after_id = changes[-1].id
            self.revision = changes[-1].revision
        elif self._after_id is None:
            self.revision = max(self.revision, head)
        return changes

    def __iter__(self) -> Iterator[list[store.Change]]:
        retries: Iterator[float] = iter(())
        while self._stop is None or not self._stop.is_set():
            changes = self.poll()
            if changes:
                yield changes
                continue
            # After a wake that found nothing, wait again only as long as the next settle
            # delay: a new write still wakes the watcher at once, as it always does.
            delay = next(retries, None)
            self._waker.wait(RESYNC_SECONDS if delay is None else delay)
            if delay is None:
                retries = iter(self._settle)
