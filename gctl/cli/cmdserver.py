"""The command server behind gctl/cli/client.py: gctl's CLI modules imported once, a child
forked for each command.

`python -P -m gctl.cli.cmdserver SOCKET` (the client starts it, detached):

1. takes the lock `SOCKET.lock` (another server holds it: exits at once) and writes its pid there;
2. imports what the served commands use (PRELOAD), then freezes those objects out of the cycle
   collector's sight, so that children do not copy the pages it would touch;
3. serves: for each connection from this user, reads the request (arguments, working directory,
   environment, umask, stream encodings; the three standard streams come as descriptors),
   forks a child that becomes the command, tells the client the child's pid, and, when the
   child ends, its wait status. A client that goes away first takes its child with it
   (SIGKILL to the child's process group), as a killed `gctl` process ends its command;
4. stops serving when a module it imported has changed on disk since (an edit, `git checkout`,
   `pip install`): it answers `stale`, gives up the socket and the lock, and exits once its
   children have ended; the client runs that command itself and starts a fresh server;
5. exits after IDLE_S seconds with no command, or on SIGTERM.

The server opens no database and starts no thread: a child starts from a process that holds
nothing but imported modules.
"""

import atexit
import contextlib
import fcntl
import gc
import importlib
import io
import marshal
import os
import selectors
import signal
import socket
import struct
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from gctl.cli import client

IDLE_S = 3600.0
REQUEST_TIMEOUT_S = 5.0
PRELOAD = (
    "gctl.cli.main",
    "gctl.cli.commands",
    "gctl.cli.apply",
    "gctl.cli.describe",
    "gctl.cli.draining",
    "gctl.cli.printers",
    "gctl.cli.rerunning",
    "gctl.cli.running",
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
PACKAGES = ("gctl",)
BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}


# -- what the server imported, and whether it changed --------------------------------------


Fingerprint = tuple[tuple[str, int, int], ...]


def preload(names: tuple[str, ...] = PRELOAD) -> None:
    for name in names:
        with contextlib.suppress(ImportError):  # an optional driver: its command says so
            importlib.import_module(name)


def fingerprint(roots: tuple[str, ...]) -> Fingerprint:
    """The modification time and size of every imported module's file under `roots`, and of
    the directories packages are installed in (an install or upgrade changes them)."""
    files = {
        path
        for module in list(sys.modules.values())
        if (path := getattr(module, "__file__", None)) and path.startswith(roots)
    }
    files.update(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib"))
    seen = []
    for path in sorted(files):
        try:
            info = os.stat(path)
        except OSError:
            seen.append((path, -1, -1))
        else:
            seen.append((path, info.st_mtime_ns, info.st_size))
    return tuple(seen)


def package_roots() -> tuple[str, ...]:
    roots: list[str] = []
    for name in PACKAGES:
        module = sys.modules.get(name) or importlib.import_module(name)
        roots.extend(os.path.join(p, "") for p in getattr(module, "__path__", []))
    return tuple(roots)


# -- the child: it becomes the command -----------------------------------------------------


@dataclass
class Request:
    argv: list[str]
    cwd: str
    env: dict[str, str]
    umask: int
    stdio: list[tuple[str | None, str | None]]
    fds: list[int]

    @classmethod
    def parse(cls, message: dict[str, Any], fds: list[int]) -> "Request":
        stdio = [(enc, err) for enc, err in message["stdio"]]
        if len(fds) != 3 or len(stdio) != 3:
            raise ValueError("a request must bring three standard streams")
        argv = [str(word) for word in message["argv"]]
        env = {str(k): str(v) for k, v in dict(message["env"]).items()}
        return cls(argv, str(message["cwd"]), env, int(message["umask"]), stdio, fds)


def _streams(stdio: list[tuple[str | None, str | None]]) -> None:
    """New sys.stdin/stdout/stderr over descriptors 0-2, as Python makes them at its start:
    stdout line-buffered on a terminal, stderr always, both written through with the client's
    PYTHONUNBUFFERED."""
    modes = (("r", False), ("w", os.isatty(1)), ("w", True))
    made = []
    for fd, ((mode, lines), (encoding, errors)) in enumerate(zip(modes, stdio, strict=True)):
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        made.append(
            io.TextIOWrapper(
                buffered,
                encoding=encoding or "utf-8",
                errors=errors if fd != 2 else "backslashreplace",
                line_buffering=lines,
                write_through=bool(os.environ.get("PYTHONUNBUFFERED")) and mode == "w",
            )
        )
    sys.stdin, sys.stdout, sys.stderr = made


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def become(request: Request, mask: Iterable[int]) -> NoReturn:
    """In the child: take over the client's process state, run the command, exit."""
    code = 1
    try:
        for fd, received in enumerate(request.fds):
            os.dup2(received, fd)
        for received in request.fds:
            os.close(received)
        os.chdir(request.cwd)
        os.umask(request.umask)
        os.environ.clear()
        os.environ.update(request.env)
        sys.argv = request.argv
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _streams(request.stdio)
        from gctl.cli import main as cli

        cli.main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass  # a reader gone away: nothing more can be said to it
        os._exit(code)


# -- the server ----------------------------------------------------------------------------


@dataclass
class Child:
    pid: int
    pidfd: int
    conn: socket.socket | None


@dataclass
class Server:
    path: str
    listener: socket.socket | None
    lock: int | None
    roots: tuple[str, ...]
    seen: Fingerprint
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    children: dict[int, Child] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)

    def serve(self) -> None:
        assert self.listener is not None
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        while self.listener is not None or self.children:
            events = self.selector.select(timeout=60.0)
            for key, _ in events:
                handler: Callable[[Any], None] = key.data
                handler(key.fileobj)
            if not self.children and time.monotonic() - self.last > IDLE_S:
                break
        self.retire()

    def retire(self) -> None:
        """Serve no more: give up the socket (if still ours) and the lock."""
        if self.listener is not None:
            self.selector.unregister(self.listener)
            try:
                if os.stat(self.path).st_ino == os.fstat(self.listener.fileno()).st_ino:
                    os.unlink(self.path)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def _accept(self, listener: Any) -> None:
        conn, _ = listener.accept()
        self.last = time.monotonic()
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != os.getuid():
                conn.close()
                return
            conn.settimeout(REQUEST_TIMEOUT_S)
            request = self._read(conn)
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            return
        if fingerprint(self.roots) != self.seen:
            self._refuse_stale(conn, request)
            return
        self._fork(conn, request)

    def _read(self, conn: socket.socket) -> Request:
        header, fds, _flags, _addr = socket.recv_fds(conn, client.HEADER.size, 3)
        try:
            if len(header) != client.HEADER.size:
                raise ValueError("a request without its length")
            (size,) = client.HEADER.unpack(header)
            data = client.receive_exactly(conn, size) if size <= client.MAX_MESSAGE else None
            if data is None:
                raise ValueError("a request cut short")
            return Request.parse(marshal.loads(data), fds)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def _refuse_stale(self, conn: socket.socket, request: Request) -> None:
        for fd in request.fds:
            os.close(fd)
        self.retire()  # before the answer: the client starts the next server at once
        with contextlib.suppress(OSError):
            client.send_message(conn, {"refused": "stale"})
        conn.close()

    def _fork(self, conn: socket.socket, request: Request) -> None:
        # Signals wait until the child has its own handlers, so that none can end up in the
        # server's code in the child; the parent's wait until it is done with the fork.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        pid = os.fork()
        if pid == 0:
            self._forget()
            os.setsid()
            become(request, mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in request.fds:
            os.close(fd)
        child = Child(pid, os.pidfd_open(pid), conn)
        self.children[pid] = child
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda _: self._reap(child))
        try:
            client.send_message(conn, {"pid": pid})
        except OSError:
            self._gone(child)
            return
        self.selector.register(conn, selectors.EVENT_READ, lambda _: self._gone(child))

    def _forget(self) -> None:
        """In a new child: close what belongs to the server, so nothing of it outlives it."""
        self.selector.close()
        if self.listener is not None:
            self.listener.close()
        if self.lock is not None:
            os.close(self.lock)
        for child in self.children.values():
            os.close(child.pidfd)
            if child.conn is not None:
                child.conn.close()

    def _gone(self, child: Child) -> None:
        """The client left before its command ended: end the command too."""
        if child.conn is None:
            return
        client.signal_command(child.pid, signal.SIGKILL)
        if child.conn.fileno() >= 0 and child.conn.fileno() in self.selector.get_map():
            self.selector.unregister(child.conn)
        child.conn.close()
        child.conn = None

    def _reap(self, child: Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        del self.children[child.pid]
        self.last = time.monotonic()
        if child.conn is None:
            return
        self.selector.unregister(child.conn)
        with contextlib.suppress(OSError):  # the client is gone
            client.send_message(child.conn, {"status": status})
        child.conn.close()


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


def _listen(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):  # a dead server's: the lock is ours
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    return listener


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


def _stop(_number: int, _frame: object) -> None:
    raise SystemExit(0)


def main() -> None:
    path = sys.argv[1]
    lock = _take_lock(path)
    if lock is None:
        return
    signal.signal(signal.SIGTERM, _stop)
    preload()
    from gctl.cli import main as cli

    cli.command()
    roots = package_roots()
    server = Server(path, _listen(path), lock, roots, fingerprint(roots))
    gc.collect()
    gc.freeze()
    try:
        server.serve()
    finally:
        server.retire()


if __name__ == "__main__":
    main()
