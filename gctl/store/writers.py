"""Writers of one SQLite file take turns: the threads of a process on a lock, the processes on
an flock of a file beside the database.

SQLite lets one writer in at a time. One that finds its lock taken sleeps in growing steps (up
to 100 ms) and looks again, so a process that writes again and again (the controller, pass
after pass) can keep another (an agent) out for seconds: the waiter is asleep in each short
moment the lock is free. A writer blocked on an flock is woken by the kernel the moment the
lock is released instead. So every gctl writer takes the flock first and only then asks SQLite
for its lock, which is still what keeps the file consistent: a writer that skips the flock
(another program, an older gctl) is merely back to SQLite's own waiting.

The file is `gctl.db-writers` (`locations.writers_path`); where it cannot be opened (a
directory someone else owns), writers fall back on SQLite's waiting alone.
"""

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path


class Turns:
    """Whose turn it is to write one SQLite file, among this process's threads and the other
    processes. Re-entrant within a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._threads = threading.RLock()
        self._depth = 0  # nesting of the thread holding `_threads`
        self._fd: int | None = None
        self._unopenable = False

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the turn for the block: other writers of the file wait until it ends."""
        with self._threads:
            if self._depth == 0:
                self._lock_file()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._unlock_file()

    def close(self) -> None:
        with self._threads:
            if self._fd is not None:
                os.close(self._fd)  # releases the flock too, if held
                self._fd = None

    def _lock_file(self) -> None:
        fd = self._open()
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)

    def _unlock_file(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _open(self) -> int | None:
        if self._fd is None and not self._unopenable:
            try:
                # Not inherited (Python's default): a child must not keep the lock alive.
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                self._unopenable = True
        return self._fd


@contextlib.contextmanager
def file_turn(path: Path) -> Iterator[None]:
    """One turn through a file opened for it alone, for a process that writes once (`gctl
    apply`'s sqlite3 path)."""
    turns = Turns(path)
    try:
        with turns.turn():
            yield
    finally:
        turns.close()
