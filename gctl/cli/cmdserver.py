"""The command server behind gctl/cli/client.py: gctl's CLI modules imported once, a child
forked for each command.

`python -P -m gctl.cli.cmdserver SOCKET` (the client starts it, detached, with the startup
environment alone):

1. takes the lock `SOCKET.lock` (another server holds it: exits at once) and writes its pid there;
2. imports what the served commands use (PRELOAD), then freezes those objects out of the cycle
   collector's sight, so that children do not copy the pages it would touch;
3. serves: for each connection from a process of its own identity (client.identity, read from
   /proc), reads the request (arguments, environment, umask, ignored and blocked signals, stream
   encodings; the three standard streams and the working directory come as descriptors)
   without waiting on a slow client, forks a child, tells the client the child's pid, and
   only then lets the child run the command (a child whose pid never reached its client runs
   nothing, so the client may run the command itself); when the child ends, it sends the
   client its wait status. A client that goes away first takes its child with it (SIGKILL to
   the child's process group), as a killed `gctl` process ends its command;
4. stops serving when a module it imported has changed on disk since it started importing (an
   edit, `git checkout`, `pip install`): it answers `stale`, gives up the socket and the lock,
   and exits once its children have ended; the client runs that command itself and starts a
   fresh server;
5. on SIGTERM, or after cmdloop.IDLE_S seconds with no command, does the same without the answer.

The server opens no database and starts no thread: a child starts from a process that holds
nothing but imported modules.

This module is the server's process: its lock, its socket file, its signals, what it imports
(PRELOAD). Step 3 and the staleness of step 4 are gctl/cli/cmdloop.py; the child, which becomes
the command, is gctl/cli/cmdchild.py.
"""

import contextlib
import fcntl
import gc
import importlib
import os
import signal
import socket
import sys
import time

from gctl.cli import client, cmdloop

# A file changed this close before the server started importing may be newer than what it
# imported (file times come from a clock that lags time.time() by a few ms): not served.
EDIT_MARGIN_NS = 2_000_000_000
PRELOAD = (
    "gctl.cli.main",
    "gctl.cli.commands",
    "gctl.cli.getting",
    "gctl.cli.apply",
    "gctl.cli.describe",
    "gctl.cli.draining",
    "gctl.cli.printers",
    "gctl.cli.rerunning",
    "gctl.cli.running",
    "gctl.cli.waiting",
    "gctl.cli.views",
    "gctl.api.kinds",
    "gctl.api.manifest",
    "gctl.api.node",
    "gctl.api.sweep",
    "gctl.store.applying",
    "gctl.store.db",
    "gctl.store.driver",
    "gctl.store.listing",
    "gctl.store.store",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
)


def preload(names: tuple[str, ...] = PRELOAD) -> None:
    for name in names:
        with contextlib.suppress(ImportError):  # an optional driver: its command says so
            importlib.import_module(name)


def _take_lock(path: str) -> int | None:
    """The server's lock, with its pid written in; None if another server holds it."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _listen(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """The listening socket, and its file's (st_dev, st_ino)."""
    with contextlib.suppress(FileNotFoundError):  # a dead server's: the lock is ours
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    info = os.stat(path)
    return listener, (info.st_dev, info.st_ino)


def stop_all(directory: str) -> list[int]:
    """SIGTERM to every live server whose lock is in `directory`; their pids."""
    stopped = []
    for name in os.listdir(directory):
        if not name.endswith(".lock"):
            continue
        try:
            with open(os.path.join(directory, name)) as lock:
                pid = int(lock.read())
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if client.SERVER_MODULE.encode() not in cmdline.read():
                    continue  # a dead server's lock, its pid since reused
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue  # gone already
        stopped.append(pid)
    return stopped


def _wakeup() -> tuple[socket.socket, socket.socket]:
    """Two ends of a socket pair; the first becomes readable when a signal arrives."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    return reader, writer


def main() -> None:
    path = sys.argv[1]
    # Whatever the gctl that started it had blocked (the server's own SIGTERM among them).
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    lock = _take_lock(path)
    if lock is None:
        return
    started = time.time_ns()
    preload()
    from gctl.cli import main as cli

    cli.command()
    files = cmdloop.watched_files()
    seen = cmdloop.fingerprint(files)
    listener, bound = _listen(path)
    server = cmdloop.Server(path, listener, lock, files, seen, bound=bound)
    # Edited while it was importing: what it imported may be older than the files say.
    server.stale = any(mtime >= started - EDIT_MARGIN_NS for _, mtime, _ in seen)

    def stop(_number: int, _frame: object) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    wakeup, _writer = _wakeup()
    gc.collect()
    gc.freeze()
    try:
        server.serve(wakeup)
    finally:
        server.retire()


if __name__ == "__main__":
    main()
