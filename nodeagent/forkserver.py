"""How the agent starts supervisors: through its fork server, or in a fresh interpreter.

Starting a Python interpreter costs about 30 ms per job, so the agent keeps one stdlib-only
`supervisor.py --fork-server` process (`supervisor.serve`) that forks each supervisor; the
attempt's locked `lock` descriptor (runtime.py) passes to it over a Unix socket. If the server
fails, the runtime starts that supervisor in a fresh interpreter (`start_supervisor`) and the
server again next time (docs/decisions.md).
"""

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from nodeagent import supervisor

log = logging.getLogger("gctl.agent")
REPLY_TIMEOUT_S = 10.0
SERVER_ARGV = (sys.executable, "-I", "-S", supervisor.__file__, "--fork-server")


class ForkServer:
    """The agent's end of `supervisor.serve`, started on first use and again if it died.

    A request is sent without waiting for its reply (the new supervisor's pid), and `replies`
    collects them later, in order. A request the server never answers (it died) leaves its
    attempt launched by nobody: its lock is free and it has no `launched.json`, so it is
    absent, and launched again by the next pass."""

    MAX_ASKED = 64  # unanswered requests: then their replies are read before the next one

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._asked: list[tuple[Path, bool]] = []  # (directory, armed) of unanswered requests
        self._armed: list[tuple[Path, int]] = []  # (directory, pid) of armed ones answered

    def fork(self, directory: Path, *, armed: bool, lock_fd: int) -> bool:
        """Ask for a supervisor for `directory`: False if the server failed (the caller starts
        one directly; the server is started again next time)."""
        with self._lock:
            if len(self._asked) >= self.MAX_ASKED:
                self._collect()
            try:
                server = self._socket or self._start()
                socket.send_fds(server, [os.fsencode(directory)], [lock_fd])
            except OSError as exc:
                log.warning("supervisor fork server failed (%s); starting one directly", exc)
                self._stop()
                return False
            self._asked.append((directory, armed))
            return True

    def replies(self) -> list[tuple[Path, int]]:
        """(directory, pid) of the armed supervisors asked for since the last call."""
        with self._lock:
            self._collect()
            armed, self._armed = self._armed, []
            return armed

    def _collect(self) -> None:
        asked, self._asked = self._asked, []
        for directory, armed in asked:
            try:
                reply = self._socket.recv(64) if self._socket is not None else b""
                if not reply:
                    raise OSError("the fork server closed its socket")
                pid = int(reply)
            except (OSError, ValueError) as exc:
                log.warning("supervisor fork server failed (%s)", exc)
                self._stop()
                return
            if armed:
                self._armed.append((directory, pid))

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [*SERVER_ARGV, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # Ctrl-C on `gctl up` is the agent's to handle
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)  # a server that hangs is stopped, and started again
        self._socket = ours
        return ours

    def _stop(self) -> None:
        self._asked = []  # never answered now
        if self._socket is not None:
            self._socket.close()  # the server reads EOF and exits
            self._socket = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
            self._process = None

    def close(self) -> None:
        self.replies()
        with self._lock:
            self._stop()


def start_supervisor(directory: Path, lock_fd: int) -> subprocess.Popen[bytes]:
    """A supervisor in a fresh interpreter: the fork server's fallback."""
    with open(directory / "supervisor.err", "ab") as errors:
        return subprocess.Popen(
            # The supervisor needs the standard library only: started isolated (-I) and without
            # site (-S) it is up in about half the time.
            [sys.executable, "-I", "-S", supervisor.__file__, str(directory), str(lock_fd)],
            pass_fds=(lock_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            close_fds=True,
        )
