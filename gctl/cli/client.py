"""The `gctl` entry point: a short command runs in a warm command server when there is one.

Every `gctl` process pays for the same start before it does anything: Python, then typer,
pydantic and the models, YAML, the database driver (100-300 ms on a 2-core machine, against
about 20 ms for the work of `gctl apply` of one Job). A per-user command server
(gctl.cli.cmdserver) keeps those modules imported and forks a child for each command. The child
takes over this process's arguments, working directory, environment, umask, ignored and blocked
signals and standard streams, passed to it over a Unix socket, and runs the command as this
process would have; this process relays signals to it and exits with its status. Mercurial's
chg does the same for hg.

- Only short commands are served (SERVED). The daemons, and the options that make a command
  follow changes until it is stopped (STREAMING), run in this process, under the terminal's job
  control and the process tree that a supervisor of `gctl up` expects. So does a command in the
  background of a terminal, or one with a standard stream closed.
- No server yet, or a server that finds its modules changed on disk since it imported them:
  the command runs here, and a server is started in the background for the next one.
- Nothing runs twice: once the server has said which child runs the command, a lost server is
  an error, not a reason to run the command here as well.
- One server serves one identity: the same Python and gctl, the same variables that Python and
  the libraries read as they start (`PYTHON*`, the locale, HOME, TZ, `TYPER_*` ...), and the
  same credentials, namespaces, cgroup, resource limits and nice value (`identity`). The
  socket's name is a hash of them, and the server checks the caller's from /proc, so a
  process with fewer privileges than the server (other groups, a sandbox, lower limits) is
  never served by it.
- `GCTL_CLI_SERVER=0` turns it off. The socket lives in `$GCTL_CLI_SERVER_DIR`, else
  `$XDG_RUNTIME_DIR/gctl`, else `/tmp/gctl-UID`; a directory that is not the user's own with
  no permissions for group or others is not used.

The standard library only, and little of it: this module and gctl.cli.ctrlc (SIGINT's handler)
are all that a served command imports into this process.
"""

import marshal
import os
import signal
import socket
import stat
import struct
import sys
import zlib
from collections.abc import Sequence

from gctl.cli import ctrlc

TYPE_CHECKING = False  # typing's own import costs 3 ms, a tenth of a served command's start
if TYPE_CHECKING:
    from typing import Any

SWITCH_ENV = "GCTL_CLI_SERVER"  # "0": never use or start the command server
DIR_ENV = "GCTL_CLI_SERVER_DIR"
SERVER_MODULE = "gctl.cli.cmdserver"

SERVED = frozenset(
    {
        "version",
        "apply",
        "diff",
        "get",
        "describe",
        "delete",
        "cordon",
        "uncordon",
        "drain",
        "rerun",
        "logs",
        "run",
    }
)
STREAMING = {
    "get": ("-w", "--watch", "--watch-only"),
    "logs": ("-f", "--follow"),
    "run": ("--attach",),
    "drain": ("--wait", "--timeout"),
}
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH)
# What Python and the libraries read from the environment as they import: a server is started
# with these alone, and serves only callers whose values are the same.
STARTUP_PREFIXES = ("PYTHON", "LC_", "TYPER_", "_TYPER", "PYDANTIC_", "PSYCOPG_", "SQLALCHEMY_")
STARTUP_NAMES = ("LANG", "HOME", "TZ")
# Of /proc/PID/status: who the process is and what it may do.
CREDENTIALS = (
    b"Uid:",
    b"Gid:",
    b"Groups:",
    b"CapInh:",
    b"CapPrm:",
    b"CapEff:",
    b"CapBnd:",
    b"CapAmb:",
    b"NoNewPrivs:",
    b"Seccomp:",
)
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")
STDIO = (0, 1, 2)
HEADER = struct.Struct("!I")
MAX_MESSAGE = 1 << 24
MAX_SOCKET_PATH = 108  # sun_path, with its NUL


# -- what is served, and where -----------------------------------------------------------------


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand of `gctl ARGV`, past the root's `--db URL`; None when there is none."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--db":
            index += 2
        elif word.startswith("--db="):
            index += 1
        else:
            return None if word.startswith("-") else word
    return None


def _given(word: str, option: str) -> bool:
    if option.startswith("--"):
        return word == option or word.startswith(option + "=")
    # a short flag, alone or among others (`-Aw`); a false alarm only runs the command here
    return word.startswith("-") and not word.startswith("--") and option[1] in word[1:]


def is_served(argv: Sequence[str]) -> bool:
    """Whether `gctl ARGV` is a short command that the command server may run. Every word is
    looked at, past a `--` too (it may be an option's value): a word of `run`'s command that
    looks like `--attach` only runs that command here."""
    command = command_of(argv)
    if command not in SERVED:
        return False
    streaming = STREAMING.get(command, ())
    return not any(_given(word, option) for word in argv for option in streaming)


def startup_environment() -> "dict[str, str]":
    """The variables read as a server starts (STARTUP_PREFIXES, STARTUP_NAMES)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(STARTUP_PREFIXES) or name in STARTUP_NAMES
    }


def identity(pid: int | str = "self") -> bytes:
    """What a command inherits from its process beyond the environment, as /proc tells it:
    credentials, namespaces, cgroup, resource limits and nice value. A served command gets
    the server's, so the server serves only a caller whose identity is its own."""
    proc = f"/proc/{pid}"
    parts = []
    with open(f"{proc}/status", "rb") as status:
        parts += [line for line in status if line.startswith(CREDENTIALS)]
    parts += [os.readlink(f"{proc}/ns/{name}").encode() for name in NAMESPACES]
    for name in ("cgroup", "limits"):
        with open(f"{proc}/{name}", "rb") as handle:
            parts.append(handle.read())
    with open(f"{proc}/stat", "rb") as stat_file:
        parts.append(stat_file.read().rpartition(b")")[2].split()[16])  # nice
    return b"\0".join(parts)


def _key() -> str:
    """What one server must share with its callers: the Python, the gctl, the startup
    environment and the identity."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = marshal.dumps(
        (sys.executable, package, sorted(startup_environment().items()), identity())
    )
    return f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}"


def socket_dir() -> str | None:
    """The directory of this user's server sockets, made if missing; None if it is not safe
    (not a directory of this user's own that no one else may use)."""
    base = os.environ.get(DIR_ENV)
    if not base:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = os.path.join(runtime, "gctl") if runtime else f"/tmp/gctl-{os.getuid()}"
    base = os.path.abspath(base)
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        info = os.lstat(base)
    except OSError:
        return None
    private = stat.S_ISDIR(info.st_mode) and not info.st_mode & 0o077
    return base if private and info.st_uid == os.getuid() else None


def socket_path() -> str | None:
    where = socket_dir()
    if where is None:
        return None
    try:
        key = _key()
    except OSError:  # no /proc to say who this process is
        return None
    path = os.path.join(where, f"cli-{key}.sock")
    return path if len(os.fsencode(path)) < MAX_SOCKET_PATH else None


def _servable_here() -> bool:
    """Whether this process's state can be handed over as it is: its standard streams are
    open, none is a terminal this process is in the background of (a served command has no
    terminal, so the kernel would not stop it as it stops this process), and the module path
    names no directory relative to this one's working directory."""
    for fd in STDIO:
        try:
            os.fstat(fd)
            if os.isatty(fd) and os.tcgetpgrp(fd) != os.getpgrp():
                return False
        except OSError:  # closed, or a terminal that is not this process's
            return False
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return all(os.path.isabs(entry) for entry in entries if entry or len(entries) > 1)


# -- messages: a 4-byte length, then a dict in marshal's format ---------------------------------
# (the server is the client's own Python and answers only its own user; json's import costs more)


def send_message(sock: socket.socket, message: "dict[str, Any]") -> None:
    data = marshal.dumps(message)
    sock.sendall(HEADER.pack(len(data)) + data)


def receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    """`size` bytes, or None if the peer closed the connection first."""
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def decode(data: bytes) -> "dict[str, Any]":
    message = marshal.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a message that is not a dict")
    return message


def receive_message(sock: socket.socket) -> "dict[str, Any] | None":
    header = receive_exactly(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    data = receive_exactly(sock, size)
    return None if data is None else decode(data)


# -- the client --------------------------------------------------------------------------------


def _ignored() -> list[int]:
    """The signals of RELAYED this process ignores (`nohup`, a shell's `trap '' INT`)."""
    return [int(n) for n in RELAYED if signal.getsignal(n) == signal.SIG_IGN]


def _request(argv: Sequence[str]) -> "dict[str, Any]":
    mask = os.umask(0o022)
    os.umask(mask)
    streams = (sys.stdin, sys.stdout, sys.stderr)
    return {
        "argv": [sys.argv[0], *argv],
        "env": dict(os.environ),
        "umask": mask,
        "ignored": _ignored(),
        "blocked": sorted(int(n) for n in signal.pthread_sigmask(signal.SIG_BLOCK, ())),
        "stdio": [[getattr(s, "encoding", None), getattr(s, "errors", None)] for s in streams],
    }


def _start_server(path: str) -> None:
    """Start a server for `path` in the background, detached, with the startup environment
    only; it exits at once if another one holds the path's lock."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = startup_environment()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:  # noqa: SIM105 (contextlib's import would cost more than this whole module's)
        subprocess.Popen(
            [sys.executable, "-P", "-m", SERVER_MODULE, path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env=env,
            start_new_session=True,
        )
    except OSError:
        pass  # the command still runs here


def signal_command(child: int, number: int) -> None:
    """Signal a served command: its process group, or the child alone in the moment before it
    leads a group of its own (it blocks the signal until it has its handlers)."""
    try:
        os.killpg(child, number)
    except ProcessLookupError:
        try:  # noqa: SIM105 (as above)
            os.kill(child, number)
        except OSError:
            pass  # it has ended
    except OSError:
        pass  # it has ended


class _Relay:
    """Passes the signals this process gets to the child's process group while it runs (not
    those it ignores: the child ignores them too). It is in place before the request is sent:
    a signal that comes before the server has said which child runs the command waits for
    that answer (`attach`), and is taken by this process itself if none comes, so that a
    Ctrl-C or Ctrl-Z in that moment is neither lost nor leaves the command running alone."""

    def __init__(self, ignored: Sequence[int]) -> None:
        self.child: int | None = None
        self.pending: list[int] = []
        self.relayed = [n for n in RELAYED if n not in ignored]

    def attach(self, child: int) -> None:
        self.child = child
        pending, self.pending = self.pending, []
        for number in pending:
            if number == signal.SIGTSTP:
                self._stop(number, None)  # the command and this process stop together
            else:
                signal_command(child, number)

    def __enter__(self) -> "_Relay":
        for number in self.relayed:
            signal.signal(number, self._relay)
        signal.signal(signal.SIGTSTP, self._stop)
        signal.signal(signal.SIGCONT, self._relay)
        if signal.SIGINT in self.relayed and ctrlc.take():
            self.pending.append(signal.SIGINT)  # one whose KeyboardInterrupt Python dropped
        return self

    def __exit__(self, *_: object) -> None:
        for number in (*self.relayed, signal.SIGTSTP, signal.SIGCONT):
            signal.signal(number, signal.SIG_DFL)
        if signal.SIGINT in self.relayed:
            signal.signal(signal.SIGINT, ctrlc.handler)
        pending, self.pending = self.pending, []
        for left in pending:  # no child took them: they are this process's own again
            os.kill(os.getpid(), left)

    def _send(self, number: int) -> None:
        if self.child is None:
            self.pending.append(number)
        else:
            signal_command(self.child, number)

    def _relay(self, number: int, _frame: object) -> None:
        self._send(number)

    def _stop(self, number: int, _frame: object) -> None:
        # The child has no terminal, so a stop from the keyboard would not stop it: SIGSTOP does.
        # Then this process stops as it would have; where the kernel discards that stop (an
        # orphaned process group), it goes on at once, and so must the child. Before the child
        # is known, the stop waits for it: stopping alone would leave the command running.
        if self.child is None:
            self.pending.append(number)
            return
        self._send(signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, self._stop)  # here again: continued, or never stopped
        self._send(signal.SIGCONT)


def _exit_like(status: int) -> int:
    """This process's exit code for the child's wait status; a child ended by a signal ends
    this process by the same signal, as a shell expects of the command it ran."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    number = -code
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    return 128 + number  # a signal that does not end a process


def _hand_over(sock: socket.socket, argv: Sequence[str]) -> "dict[str, Any] | None":
    """Send the request, with descriptors 0-2 and the working directory; the server's first
    answer, or None when it gave none."""
    request = _request(argv)
    here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        data = marshal.dumps(request)
        socket.send_fds(sock, [HEADER.pack(len(data))], [*STDIO, here])
    finally:
        os.close(here)
    sock.sendall(data)
    return receive_message(sock)


def run_served(argv: Sequence[str], path: str) -> int | None:
    """Run `gctl ARGV` in the server at `path` and return its exit code; None when it was not
    run there (no server, a stale one, one of another identity), and so must run here."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            sock.connect(path)
        except OSError:
            _start_server(path)
            return None
        with _Relay(_ignored()) as relay:
            try:
                reply = _hand_over(sock, argv)
            except (OSError, ValueError, EOFError):
                return None
            if reply is None or "pid" not in reply:
                if reply is not None and reply.get("refused") == "stale":
                    _start_server(path)
                return None
            relay.attach(int(reply["pid"]))
            try:
                ended = receive_message(sock)
            except (OSError, ValueError, EOFError):
                ended = None
    if ended is None or "status" not in ended:
        print("error: gctl's command server went away while it ran the command", file=sys.stderr)
        return 1
    return _exit_like(int(ended["status"]))


def main() -> None:
    ctrlc.install()
    argv = sys.argv[1:]
    if (
        os.environ.get(SWITCH_ENV) != "0"
        and hasattr(os, "pidfd_open")
        and is_served(argv)
        and _servable_here()
    ):
        path = socket_path()
        if path is not None:
            try:
                code = run_served(argv, path)
            except KeyboardInterrupt:
                raise SystemExit(130) from None
            if code is not None:
                raise SystemExit(code)
    from gctl.cli import main as cli

    cli.main()


if __name__ == "__main__":
    main()
