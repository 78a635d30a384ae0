"""A child of the command server (gctl/cli/cmdserver.py): it takes over its client's process
state and becomes the command.

The request a client sends (`Request`): its arguments, environment, umask, ignored and blocked
signals and stream encodings, with the three standard streams and the working directory as
descriptors. `become` makes them the child's own (new sys.stdin/stdout/stderr as Python makes
them at its start), runs `gctl.cli.main`, and exits with the command's code.
"""

import atexit
import io
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from gctl.cli import client, ctrlc

# The signals a mask may name. Not all of 1..NSIG-1: glibc keeps 32 and 33 for itself, and a
# client started with them blocked (by a raw rt_sigprocmask before its exec) reports them, which
# pthread_sigmask refuses with a RuntimeWarning (an error under -W error).
MASKABLE = frozenset(int(n) for n in signal.valid_signals())
FDS = len(client.STDIO) + 1  # the standard streams and the working directory


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
    ctrlc.install()
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
