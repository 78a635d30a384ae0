"""Waking one host's processes when a file is touched: a doorbell, without polling.

A writer rings with `ring(path)` (it sets the file's times, creating it if needed); a `Bell`
on the same path wakes at once. On Linux the bell is inotify, read through ctypes, so that an
idle waiter sleeps in poll(2) and a ring reaches it in microseconds. Elsewhere it falls back
to watchfiles, which checks for events every `FALLBACK_STEP_MS`.

The SQLite change feed rings `<database>-notify` after every committed write transaction (the
commit is visible by then, unlike the WAL write that precedes it), and a job's supervisor rings
the agent's attempts directory when it records a start or an exit.
"""

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import math
import os
import select
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol

FALLBACK_STEP_MS = 10
# With a stop event, a waiter looks at it this often; a ring wakes it sooner.
STOP_CHECK_SECONDS = 0.5
MAX_POLL_SECONDS = 3600.0  # poll(2) takes an int of milliseconds: a longer wait polls again

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVE_SELF = 0x800
_IN_DELETE_SELF = 0x400
_IN_IGNORED = 0x8000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVE_SELF | _IN_DELETE_SELF


def ring(path: Path) -> None:
    """Wake every bell on `path` (and create it, if it is missing)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        with contextlib.suppress(OSError):  # the directory went away: nobody is listening
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    except PermissionError:
        pass  # someone else's file: their waiters fall back on their resync


class Stop(threading.Event):
    """A stop that a signal handler may set, and that a waiter sleeping in poll(2) or select(2)
    sees at once: `set` also makes `fileno()` readable (and it stays so until `clear`). A
    waiter given a plain threading.Event looks at it every STOP_CHECK_SECONDS instead. The
    daemons stop on one of these, so that SIGTERM ends them without waiting for any of their
    sleeps to run out.

    It takes no lock. A signal handler runs in the main thread between two of its bytecodes,
    and threading.Event.set() takes the Event's lock: if the main thread held it at that
    moment (inside `wait`, as the daemons' main thread is twice a second), the handler waited
    for itself, and the process never stopped (python/cpython#126434 is the same deadlock
    with multiprocessing's Event). Here the flag is one attribute, and the wakeup a pipe: `wait`
    polls its reading end, which `set` makes readable."""

    def __init__(self) -> None:  # not Event's: its lock and condition would go unused
        self._set = False
        self._read, self._write = os.pipe()  # neither inherited by children (PEP 446)
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # Not at the interpreter's exit, where a daemon thread may still set it: the kernel
        # closes both then.
        weakref.finalize(self, _close_all, self._read, self._write).atexit = False

    def __repr__(self) -> str:  # Event's reads the attributes of Event.__init__ (3.13)
        return f"<{type(self).__name__} {'set' if self._set else 'unset'}>"

    def fileno(self) -> int:
        return self._read

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        with contextlib.suppress(BlockingIOError):  # full: readable already
            os.write(self._write, b"\0")

    def clear(self) -> None:
        """For the thread that waits on it, while no other thread may set it (a Timer's set:
        cancel and join the Timer first): `set` is two steps, and a `clear` between them leaves
        the descriptor readable and the flag down, which a waiter then polls without end. A
        signal handler's `set`, which runs in this thread, may come at any point of it: the
        flag and the descriptor then agree, set and readable or neither."""
        self._set = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass
        if self._set:  # set while it was being read empty: readable again
            with contextlib.suppress(BlockingIOError):
                os.write(self._write, b"\0")

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        while not self._set:  # readable but not set: a `clear` is between its two steps
            if deadline is None:
                poller.poll()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(math.ceil(min(left, MAX_POLL_SECONDS) * 1000))
        return True


def _close_all(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def stop_fd(stop: threading.Event | None) -> int | None:
    """The descriptor that becomes readable when `stop` is set, if it has one."""
    return stop.fileno() if isinstance(stop, Stop) else None


class Bell(Protocol):
    def wait(self, timeout: float) -> bool:
        """Sleep until rung (True) or `timeout` seconds or a stop (False)."""
        ...

    def close(self) -> None: ...


def bell(path: Path, stop: threading.Event | None = None) -> Bell:
    """A bell on `path`, armed now: a ring after this call is never missed."""
    if not path.exists():
        ring(path)
    if sys.platform == "linux" and _libc() is not None:
        return _InotifyBell(path, stop)
    return _WatchfilesBell(path, stop)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


class _InotifyBell:
    def __init__(self, path: Path, stop: threading.Event | None) -> None:
        libc = _libc()
        assert libc is not None
        self._libc = libc
        self._path = path
        self._stop = stop
        self._fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_init1: {os.strerror(ctypes.get_errno())}")
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._stop_fd = stop_fd(stop)
        if self._stop_fd is not None:
            self._poll.register(self._stop_fd, select.POLLIN)
        self._watching = False
        self._watch()

    def _watch(self) -> None:
        """Watch the file; after it was replaced or deleted, watch the new one."""
        if not self._path.exists():
            ring(self._path)
        if self._libc.inotify_add_watch(self._fd, os.fsencode(self._path), _MASK) >= 0:
            self._watching = True

    def _drain(self) -> bool:
        """Read the queued events; whether any says the file itself changed."""
        rung = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return rung
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            offset = 0
            while offset + 16 <= len(data):
                mask = int.from_bytes(data[offset + 4 : offset + 8], sys.byteorder)
                length = int.from_bytes(data[offset + 12 : offset + 16], sys.byteorder)
                offset += 16 + length
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    self._watching = False
                rung |= bool(mask & (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE))
            if not data:
                return rung

    def wait(self, timeout: float) -> bool:
        remaining = timeout
        while remaining > 0:
            if not self._watching:
                self._watch()
                if not self._watching:  # cannot watch it at all: sleep, then try again
                    if self._stop is not None and self._stop.wait(min(remaining, 1.0)):
                        return False
                    remaining -= 1.0
                    continue
            polled = self._stop is None or self._stop_fd is not None  # poll sees the stop
            step = remaining if polled else min(remaining, STOP_CHECK_SECONDS)
            ready = self._poll.poll(math.ceil(step * 1000))
            if any(fd == self._fd for fd, _ in ready) and self._drain():
                return True
            if self._stop is not None and self._stop.is_set():
                return False
            remaining -= step
        return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class _WatchfilesBell:
    """Where there is no inotify: watchfiles on the file's directory."""

    def __init__(self, path: Path, stop: threading.Event | None) -> None:
        from watchfiles._rust_notify import RustNotify

        self._name = path.name
        self._stop = stop
        self._notify = RustNotify([str(path.parent)], False, False, 300, False, False)

    def wait(self, timeout: float) -> bool:
        remaining_ms = int(timeout * 1000)
        while remaining_ms > 0:
            result = self._notify.watch(50, FALLBACK_STEP_MS, min(remaining_ms, 1000), self._stop)
            if result == "signal":  # watchfiles caught SIGINT while waiting: honour Ctrl-C
                raise KeyboardInterrupt
            if isinstance(result, set):
                if any(Path(changed).name == self._name for _, changed in result):
                    return True
            elif result != "timeout" or (self._stop is not None and self._stop.is_set()):
                return False
            remaining_ms -= 1000
        return False

    def close(self) -> None:
        self._notify.close()
