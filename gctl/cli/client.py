"""The `gctl` entry point: a short command runs in a warm command server when there is one.

Every `gctl` process pays for the same start before it does anything: Python, then typer,
pydantic and the models, YAML, the database driver (100-300 ms on a 2-core machine, against
about 20 ms for the work of `gctl apply` of one Job). A per-user command server
(gctl.cli.cmdserver) keeps those modules imported and forks a child for each command. The child
takes over this process's arguments, working directory, environment, umask and standard
streams, passed to it over a Unix socket, and runs the command as this process would have; this
process relays signals to it and exits with its status. Mercurial's chg does the same for hg.

- Only short commands are served (SERVED). The daemons, and the options that make a command
  follow changes until it is stopped (STREAMING), run in this process, under the terminal's job
  control and the process tree that a supervisor of `gctl up` expects.
- No server yet, or a server that finds its modules changed on disk since it imported them:
  the command runs here, and a server is started in the background for the next one.
- Nothing runs twice: once the server has said which child runs the command, a lost server is
  an error, not a reason to run the command here as well.
- `GCTL_CLI_SERVER=0` turns it off. The socket lives in `$GCTL_CLI_SERVER_DIR`, else
  `$XDG_RUNTIME_DIR/gctl`, else `/tmp/gctl-UID`; a directory that is not the user's own with
  mode 0700 is not used. One server serves one Python, one gctl and one set of `PYTHON*` and
  locale variables: the socket's name is a hash of them.

The standard library only, and little of it: this module is all that a served command imports
into this process.
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
    """Whether `gctl ARGV` is a short command that the command server may run."""
    command = command_of(argv)
    if command not in SERVED:
        return False
    streaming = STREAMING.get(command, ())
    for word in argv:
        if word == "--":
            break
        if any(_given(word, option) for option in streaming):
            return False
    return True


def _key() -> str:
    """What one server must share with its clients: the Python, the gctl and the variables
    that Python reads when it starts (PYTHON*, the locale)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = sorted(
        (name, value)
        for name, value in os.environ.items()
        if name.startswith(("PYTHON", "LC_")) or name == "LANG"
    )
    text = marshal.dumps((sys.executable, package, env))
    return f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}"


def socket_dir() -> str | None:
    """The directory of this user's server sockets, made if missing; None if it is not safe
    (not a directory of this user's own that only they can enter)."""
    base = os.environ.get(DIR_ENV)
    if not base:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = os.path.join(runtime, "gctl") if runtime else f"/tmp/gctl-{os.getuid()}"
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
    path = os.path.join(where, f"cli-{_key()}.sock")
    return path if len(os.fsencode(path)) < MAX_SOCKET_PATH else None


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


def receive_message(sock: socket.socket) -> "dict[str, Any] | None":
    header = receive_exactly(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes")
    data = receive_exactly(sock, size)
    if data is None:
        return None
    message = marshal.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a message that is not a dict")
    return message


# -- the client --------------------------------------------------------------------------------


def _request(argv: Sequence[str]) -> "dict[str, Any]":
    mask = os.umask(0o022)
    os.umask(mask)
    streams = (sys.stdin, sys.stdout, sys.stderr)
    return {
        "argv": [sys.argv[0], *argv],
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": mask,
        "stdio": [[getattr(s, "encoding", None), getattr(s, "errors", None)] for s in streams],
    }


def _start_server(path: str) -> None:
    """Start a server for `path` in the background, detached; it exits at once if another
    one holds the path's lock."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
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
        try:  # noqa: SIM105 (contextlib's import would cost more than this whole module's)
            os.kill(child, number)
        except OSError:
            pass  # it has ended
    except OSError:
        pass  # it has ended


class _Relay:
    """Passes the signals this process gets to the child's process group while it runs."""

    def __init__(self, child: int) -> None:
        self.child = child

    def __enter__(self) -> "_Relay":
        for number in RELAYED:
            signal.signal(number, self._relay)
        signal.signal(signal.SIGTSTP, self._stop)
        signal.signal(signal.SIGCONT, self._relay)
        return self

    def __exit__(self, *_: object) -> None:
        for number in (*RELAYED, signal.SIGTSTP, signal.SIGCONT):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _send(self, number: int) -> None:
        signal_command(self.child, number)

    def _relay(self, number: int, _frame: object) -> None:
        self._send(number)

    def _stop(self, _number: int, _frame: object) -> None:
        # The child has no terminal, so a stop from the keyboard would not stop it: SIGSTOP does.
        # Then this process stops as it would have; where the kernel discards that stop (an
        # orphaned process group), it goes on at once, and so must the child.
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


def run_served(argv: Sequence[str], path: str) -> int | None:
    """Run `gctl ARGV` in the server at `path` and return its exit code; None when it was not
    run there (no server, or a stale one), and so must run here."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            sock.connect(path)
        except OSError:
            _start_server(path)
            return None
        try:
            request = marshal.dumps(_request(argv))
            socket.send_fds(sock, [HEADER.pack(len(request))], [0, 1, 2])
            sock.sendall(request)
            reply = receive_message(sock)
        except (OSError, ValueError):
            return None
        if reply is None or "pid" not in reply:
            if reply is not None and reply.get("refused") == "stale":
                _start_server(path)
            return None
        with _Relay(int(reply["pid"])):
            try:
                ended = receive_message(sock)
            except (OSError, ValueError):
                ended = None
    if ended is None or "status" not in ended:
        print("error: gctl's command server went away while it ran the command", file=sys.stderr)
        return 1
    return _exit_like(int(ended["status"]))


def main() -> None:
    argv = sys.argv[1:]
    if os.environ.get(SWITCH_ENV) != "0" and hasattr(os, "pidfd_open") and is_served(argv):
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
