"""The command server's loop (gctl/cli/cmdserver.py): its connections, the requests arriving
on them, the children it forks for them, and whether what it imported has changed.

`Server.serve` waits on the listening socket, the connections whose request is still arriving
(`Incoming`: none waits on a slow client), the children (`Child`, by pidfd) and the connections
of their clients; it refuses a request when it is stale (`fingerprint` of `watched_files`) or
from another identity, forks a child (gctl/cli/cmdchild.py) for the others, and stops serving
when it is told to, stale, or idle.
"""

import contextlib
import importlib
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
from typing import Any

from gctl.cli import client, cmdchild

IDLE_S = 3600.0
REQUEST_TIMEOUT_S = 5.0
BLOCKED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}


# -- whether what the server imported has changed ------------------------------------------


Fingerprint = tuple[tuple[str, int, int], ...]


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
            chunk, fds, _flags, _addr = socket.recv_fds(pending.conn, 1 << 16, cmdchild.FDS)
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
            request = cmdchild.Request.parse(client.decode(data), fds)
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

    def _fork(self, conn: socket.socket, request: cmdchild.Request) -> None:
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
            cmdchild.become(request)
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
