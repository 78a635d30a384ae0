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
5. on SIGTERM, or after IDLE_S seconds with no command, does the same without the answer.

The server opens no database and starts no thread: a child starts from a process that holds
nothing but imported modules.
"""

import atexit
import contextlib
import fcntl
import gc
import importlib
import io
import os
import selectors
import signal
import socket
import struct
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from gctl.cli import client

IDLE_S = 3600.0
REQUEST_TIMEOUT_S = 5.0
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
BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
# The signals a mask may name. Not all of 1..NSIG-1: glibc keeps 32 and 33 for itself, and a
# client started with them blocked (by a raw rt_sigprocmask before its exec) reports them, which
# pthread_sigmask refuses with a RuntimeWarning (an error under -W error).
MASKABLE = frozenset(int(n) for n in signal.valid_signals())
FDS = len(client.STDIO) + 1  # the standard streams and the working directory


# -- what the server imported, and whether it changed --------------------------------------


Fingerprint = tuple[tuple[str, int, int], ...]


def preload(names: tuple[str, ...] = PRELOAD) -> None:
    for name in names:
        with contextlib.suppress(ImportError):  # an optional driver: its command says so
            importlib.import_module(name)


def watched_files(roots: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The files whose change makes the server stale: every imported module's file under
    `roots` (default: gctl's package), and the directories packages are installed in (an
    install or upgrade changes them). Taken once, after the preload: what a child imports
    later is read fresh from disk by that child."""
    if roots is None:
        roots = tuple(os.path.join(p, "") for p in importlib.import_module("gctl").__path__)
    files = {
        path
        for module in list(sys.modules.values())
        if (path := getattr(module, "__file__", None)) and path.startswith(roots)
    }
    files.update(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib"))
    return tuple(sorted(files))


def fingerprint(files: tuple[str, ...]) -> Fingerprint:
    """The modification time and size of each of `files` (-1 for one that is gone)."""
    seen = []
    for path in files:
        try:
            info = os.stat(path)
        except OSError:
            seen.append((path, -1, -1))
        else:
            seen.append((path, info.st_mtime_ns, info.st_size))
    return tuple(seen)


# -- the child: it becomes the command -----------------------------------------------------


@dataclass
class Request:
    argv: list[str]
    env: dict[str, str]
    umask: int
    ignored: list[int]
    blocked: list[int]  # the client's signal mask
    stdio: list[tuple[str | None, str | None]]
    fds: list[int]  # 0-2 and the working directory

    @classmethod
    def parse(cls, message: dict[str, Any], fds: list[int]) -> "Request":
        """The request in `message`; ValueError (or KeyError, TypeError) when malformed."""
        stdio = [(enc, err) for enc, err in message["stdio"]]
        if len(fds) != FDS or len(stdio) != len(client.STDIO):
            raise ValueError("a request must bring the standard streams and a directory")
        argv = [str(word) for word in message["argv"]]
        env = {str(k): str(v) for k, v in dict(message["env"]).items()}
        ignored = [int(n) for n in message["ignored"] if int(n) in client.RELAYED]
        blocked = [int(n) for n in message["blocked"] if int(n) in MASKABLE]
        return cls(argv, env, int(message["umask"]), ignored, blocked, stdio, fds)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


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


def _take_over(request: Request) -> None:
    """The client's process state, in the child: streams, directory, umask, environment,
    arguments, signal dispositions (its ignored ones too); then its signal mask, so that the
    signals the server blocked for the fork come through (and those the client blocks stay
    blocked, whatever the process that started the server blocked)."""
    *stdio, here = request.fds
    for fd, received in enumerate(stdio):
        os.dup2(received, fd)
    os.fchdir(here)
    request.close()
    os.umask(request.umask)
    os.environ.clear()
    os.environ.update(request.env)
    time.tzset()
    sys.argv = request.argv
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for ignored in request.ignored:
        signal.signal(ignored, signal.SIG_IGN)
    signal.set_wakeup_fd(-1)
    _streams(request.stdio)
    signal.pthread_sigmask(signal.SIG_SETMASK, request.blocked)


def become(request: Request) -> NoReturn:
    """In the child: take over the client's process state, run the command, exit."""
    code = 1
    try:
        _take_over(request)
        from gctl.cli import main as cli

        cli.main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:  # a Ctrl-C before the command's own handling
        code = 130
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
class Incoming:
    """A connection whose request is still arriving."""

    conn: socket.socket
    peer: int
    since: float = field(default_factory=time.monotonic)
    data: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.conn.close()


@dataclass
class Server:
    path: str
    listener: socket.socket | None
    lock: int | None
    files: tuple[str, ...]  # watched_files()
    seen: Fingerprint
    stale: bool = False
    stopping: bool = False
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    children: dict[int, Child] = field(default_factory=dict)
    incoming: dict[int, Incoming] = field(default_factory=dict)  # by the connection's fd
    last: float = field(default_factory=time.monotonic)
    me: bytes = field(default_factory=client.identity)
    bound: tuple[int, int] | None = None  # the socket file's (st_dev, st_ino)

    def serve(self, wakeup: socket.socket) -> None:
        assert self.listener is not None
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        self.selector.register(wakeup, selectors.EVENT_READ, self._woken)
        while self.listener is not None or self.children:
            events = self.selector.select(timeout=1.0)
            for key, _ in events:
                handler: Callable[[Any], None] = key.data
                handler(key.fileobj)
            self._expire()
            idle = not self.children and time.monotonic() - self.last > IDLE_S
            if self.stopping or idle:
                self.retire()
        self.retire()

    def retire(self) -> None:
        """Serve no more: give up the socket file (if still ours), the listener, the lock and
        the requests not yet read. Children already running are seen to their end."""
        if self.listener is not None:
            self.selector.unregister(self.listener)
            with contextlib.suppress(OSError):
                info = os.stat(self.path)
                if (info.st_dev, info.st_ino) == self.bound:
                    os.unlink(self.path)
            self.listener.close()
            self.listener = None
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None
        for pending in list(self.incoming.values()):
            self._drop(pending)

    def _woken(self, wakeup: Any) -> None:
        with contextlib.suppress(OSError):
            wakeup.recv(64)

    def _accept(self, listener: Any) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:  # out of descriptors, or the client gave up: it runs the command
            return
        self.last = time.monotonic()
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                conn.close()
                return
            conn.setblocking(False)
        except OSError:
            conn.close()
            return
        pending = Incoming(conn, peer)
        self.incoming[conn.fileno()] = pending
        self.selector.register(conn, selectors.EVENT_READ, lambda _: self._receive(pending))

    def _receive(self, pending: Incoming) -> None:
        """Read what arrived of a request; once it is whole, answer it."""
        try:
            chunk, fds, _flags, _addr = socket.recv_fds(pending.conn, 1 << 16, FDS)
        except BlockingIOError:
            return
        except OSError:
            self._drop(pending)
            return
        pending.fds.extend(fds)
        if not chunk:
            self._drop(pending)
            return
        pending.data += chunk
        size = client.HEADER.size
        if len(pending.data) < size:
            return
        (length,) = client.HEADER.unpack_from(pending.data)
        if length > client.MAX_MESSAGE:
            self._drop(pending)
        elif len(pending.data) >= size + length:
            self._answer(pending, bytes(pending.data[size : size + length]))

    def _drop(self, pending: Incoming) -> None:
        self.incoming.pop(pending.conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(pending.conn)
        pending.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for pending in list(self.incoming.values()):
            if now - pending.since > REQUEST_TIMEOUT_S:
                self._drop(pending)

    def _answer(self, pending: Incoming, data: bytes) -> None:
        self.incoming.pop(pending.conn.fileno(), None)
        self.selector.unregister(pending.conn)
        conn, fds = pending.conn, pending.fds
        pending.fds = []
        try:
            request = Request.parse(client.decode(data), fds)
        except (ValueError, TypeError, KeyError, EOFError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        refusal = self._refusal(pending.peer)
        if refusal is not None:
            request.close()
            if refusal == "stale":
                self.retire()  # before the answer: the client starts the next server at once
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                client.send_message(conn, {"refused": refusal})
            conn.close()
            return
        self._fork(conn, request)

    def _refusal(self, peer: int) -> str | None:
        """Why this server must not run the command: stale, or a caller of another identity."""
        if self.stale or fingerprint(self.files) != self.seen:
            self.stale = True
            return "stale"
        try:
            same = client.identity(peer) == self.me
        except OSError:  # gone already
            same = False
        return None if same else "identity"

    def _fork(self, conn: socket.socket, request: Request) -> None:
        # Signals wait until the child has its own handlers, so that none can end up in the
        # server's code in the child. The child runs nothing until its client knows its pid:
        # a server stopped between the fork and that answer leaves a child that exits, and a
        # client that may run the command itself.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        go_read, go_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go_write)
            self._forget(conn)
            os.setsid()
            if not os.read(go_read, 1):
                os._exit(0)
            os.close(go_read)
            become(request)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(go_read)
        request.close()
        child = Child(pid, os.pidfd_open(pid), conn)
        self.children[pid] = child
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda _: self._reap(child))
        try:
            conn.setblocking(True)
            conn.settimeout(REQUEST_TIMEOUT_S)
            client.send_message(conn, {"pid": pid})
        except OSError:
            os.close(go_write)  # the child exits without running the command
            child.conn = None
            conn.close()
            return
        os.write(go_write, b"g")
        os.close(go_write)
        self.selector.register(conn, selectors.EVENT_READ, lambda _: self._gone(child))

    def _forget(self, conn: socket.socket) -> None:
        """In a new child: close what belongs to the server, so nothing of it outlives it."""
        self.selector.close()
        conn.close()
        if self.listener is not None:
            self.listener.close()
        if self.lock is not None:
            os.close(self.lock)
        for child in self.children.values():
            os.close(child.pidfd)
            if child.conn is not None:
                child.conn.close()
        for pending in self.incoming.values():
            pending.close()

    def _gone(self, child: Child) -> None:
        """The client left before its command ended: end the command too."""
        if child.conn is None or child.pid not in self.children:
            return
        client.signal_command(child.pid, signal.SIGKILL)
        self.selector.unregister(child.conn)
        child.conn.close()
        child.conn = None

    def _reap(self, child: Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        del self.children[child.pid]
        self.last = time.monotonic()
        conn, child.conn = child.conn, None
        if conn is None:
            return
        self.selector.unregister(conn)
        with contextlib.suppress(OSError):  # the client is gone
            client.send_message(conn, {"status": status})
        conn.close()


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
    files = watched_files()
    seen = fingerprint(files)
    listener, bound = _listen(path)
    server = Server(path, listener, lock, files, seen, bound=bound)
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
