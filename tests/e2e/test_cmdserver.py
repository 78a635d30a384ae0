"""The command server (gctl/cli/client.py, gctl/cli/cmdserver.py), through the real console
script: a served command runs as its caller would have, signals reach it, a killed caller takes
it along, an edited gctl is never served stale, and the streaming commands stay in the caller.

A command that reads its manifest from stdin (`gctl apply -f -`) waits while the test holds the
pipe open, which lets the test find the server's child that runs it (by its working directory,
each test's own) and look at it in /proc.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import gctl
from gctl.api import job
from gctl.cli import client, cmdchild, cmdloop, cmdserver
from gctl.store import db, store
from tests.conftest import GCTL_BIN, Gctl
from tests.e2e.conftest import until

WAIT_S = 30.0
MANIFEST = """\
apiVersion: gctl/v1
kind: Job
metadata: {name: piped}
spec: {command: ["true"]}
"""


@pytest.fixture
def local(tmp_path: Path) -> Gctl:
    return Gctl(str(tmp_path / "gctl.db"), tmp_path)


def _server_pid(path: str) -> int | None:
    try:
        pid = int(Path(path + ".lock").read_text())
        alive = b"gctl.cli.cmdserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if alive and os.path.exists(path) else None


def warm(gctl: Gctl) -> int:
    """Start this session's command server if need be; its pid once it listens."""
    path = client.socket_path()
    assert path is not None
    gctl.ok("version")
    pid = until(lambda: _server_pid(path), "the command server", WAIT_S)
    assert isinstance(pid, int)
    return pid


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split()]


def _in(pid: int, cwd: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(cwd)
    except OSError:
        return False


def served_child(server: int, cwd: Path) -> int:
    """The server's child that runs a command started in `cwd` (each test has its own)."""
    found = until(
        lambda: next((c for c in _children(server) if _in(c, cwd)), None),
        f"the server's child in {cwd}",
        WAIT_S,
    )
    assert found is not None
    return found


def _state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return text.rpartition(")")[2].split()[0]


def wait_gone(pid: int) -> None:
    until(lambda: _state(pid) == "gone", f"process {pid} to end", WAIT_S)


@contextmanager
def waiting_apply(
    gctl: Gctl,
    group: int = -1,
    session: bool = False,
    before: Callable[[], object] | None = None,
) -> Iterator["subprocess.Popen[str]"]:
    """`gctl apply -f -` started with its stdin held open, so that it waits (`group=0`: in a
    process group of its own, as a shell starts a command; `session`: in a session of its own;
    `before`: run in the new process before gctl starts)."""
    process = subprocess.Popen(
        [GCTL_BIN, "apply", "-f", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=gctl.env(),
        cwd=gctl.cwd,
        umask=0o027,
        process_group=group,
        start_new_session=session,
        preexec_fn=before,  # noqa: PLW1509 (a test's own process, no threads of its own run)
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=WAIT_S)


def test_a_short_command_runs_in_the_server_as_its_caller(local: Gctl) -> None:
    server = warm(local)
    with waiting_apply(local) as process:
        child = served_child(server, local.cwd)
        assert child != process.pid
        status = Path(f"/proc/{child}/status").read_text()
        assert "Umask:\t0027" in status
        out, err = process.communicate(MANIFEST, timeout=WAIT_S)
    assert (process.returncode, out, err) == (0, "job.gctl/piped created\n", "")
    assert local.ok("get", "jobs", "-o", "name") == "job.gctl/piped\n"


def test_a_served_error_is_one_line_and_a_nonzero_exit(local: Gctl) -> None:
    warm(local)
    (local.cwd / "bad.yaml").write_text(MANIFEST.replace("command:", "comand:"))
    result = local("apply", "-f", "bad.yaml")
    assert result.code == 1
    assert result.err.startswith("error: bad.yaml")
    assert result.err.count("\n") == 1
    assert "spec.comand: unknown field" in result.err
    assert local.ok("get", "jobs", "-o", "name") == ""


@pytest.mark.parametrize(
    ("sent", "code"),
    [
        pytest.param(signal.SIGINT, 130, id="ctrl-c"),
        pytest.param(signal.SIGTERM, -signal.SIGTERM, id="sigterm"),
        pytest.param(signal.SIGKILL, -signal.SIGKILL, id="sigkill"),
    ],
)
def test_a_signal_to_the_caller_ends_its_command(local: Gctl, sent: int, code: int) -> None:
    server = warm(local)
    with waiting_apply(local) as process:
        child = served_child(server, local.cwd)
        process.send_signal(sent)
        assert process.wait(timeout=WAIT_S) == code
        wait_gone(child)  # SIGKILL cannot be relayed: the server ends the child of a lost caller
    assert local.ok("get", "jobs", "-o", "name") == ""


def test_a_command_has_its_callers_signal_mask_not_the_servers(
    local: Gctl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server inherits the signal mask of the process that started it, whichever that was:
    one started by a gctl with SIGINT blocked (a job's supervisor, a thread of a program that
    blocks it) gave every command it served SIGINT blocked, so that Ctrl-C never ended them."""
    where = tmp_path / "servers"
    where.mkdir(mode=0o700)
    monkeypatch.setenv(client.DIR_ENV, str(where))
    try:
        blocked = subprocess.run(
            [GCTL_BIN, "version"],
            env=local.env(),
            cwd=local.cwd,
            capture_output=True,
            timeout=WAIT_S,
            check=True,
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}),
        )
        assert blocked.returncode == 0
        server = warm(local)
        assert _blocked(server) == 0  # the only server of `where`: the one gctl above started
        with waiting_apply(local, before=_unblock_all) as process:
            child = served_child(server, local.cwd)
            until(lambda: _blocked(child) == 0, "the caller's empty mask", WAIT_S)
            process.send_signal(signal.SIGINT)
            assert _exit_code(process, child) == 130
            wait_gone(child)
        usr1 = {signal.SIGUSR1}
        with waiting_apply(local, before=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, usr1)):
            child = served_child(server, local.cwd)
            usr1_only = 1 << (signal.SIGUSR1 - 1)
            until(lambda: _blocked(child) == usr1_only, "the caller's SIGUSR1 blocked", WAIT_S)
    finally:
        cmdserver.stop_all(str(where))


def _block_glibcs_own() -> None:
    """Block signals 32 and 33, which glibc's pthread_sigmask will not: by the raw system call,
    as a program that does not use glibc may have, before it runs gctl."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_uint64((1 << 31) | (1 << 32))
    rt_sigprocmask, sig_block = 14, 0  # x86-64
    assert libc.syscall(rt_sigprocmask, sig_block, ctypes.byref(mask), None, 8) == 0


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="rt_sigprocmask's number is x86-64's")
def test_a_caller_with_glibcs_own_signals_blocked_is_served_without_a_warning(
    local: Gctl,
) -> None:
    server = warm(local)
    with waiting_apply(local, before=_block_glibcs_own) as process:
        child = served_child(server, local.cwd)
        out, err = process.communicate(MANIFEST, timeout=WAIT_S)
    assert child != process.pid
    assert (process.returncode, out, err) == (0, "job.gctl/piped created\n", "")


def _unblock_all() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _signals(pid: int) -> str:
    """A process's state and signal masks from /proc, for a failure's message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return f"{pid}: gone"
    kept = [line for line in lines if line.startswith(("State", "SigPnd", "ShdPnd", "Sig"))]
    return f"{pid} (waits in {wchan}): " + ", ".join(" ".join(line.split()) for line in kept)


def _exit_code(process: "subprocess.Popen[str]", child: int) -> int | None:
    """The caller's exit code; where it does not end, what it and its command were doing."""
    try:
        return process.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        doing = f"caller {_signals(process.pid)}; command {_signals(child)}"
    process.kill()  # and the server ends its command, so that what it printed can be read
    try:
        _, err = process.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        err = "(the command did not end)"
    raise AssertionError(f"the caller did not end: {doing}; the command printed {err[-2000:]!r}")


def _blocked(pid: int) -> int:
    """The process's blocked signals, as a bit mask (signal n is bit n - 1)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigBlk for {pid}")


def test_a_stopped_caller_stops_its_command(local: Gctl) -> None:
    """Ctrl-Z and `fg`. The caller leads a group whose parent (the test) is in another group
    of its session, so that the group is not orphaned: an orphaned group is not stopped by
    SIGTSTP, and the command is not either (checked below)."""
    server = warm(local)
    with waiting_apply(local, group=0) as process:
        child = served_child(server, local.cwd)
        process.send_signal(signal.SIGTSTP)
        until(lambda: _state(child) == "T", "the command to stop", WAIT_S)
        until(lambda: _state(process.pid) == "T", "the caller to stop", WAIT_S)
        process.send_signal(signal.SIGCONT)
        until(lambda: _state(child) not in ("T", "gone"), "the command to go on", WAIT_S)
        out, _ = process.communicate(MANIFEST, timeout=WAIT_S)
    assert (process.returncode, out) == (0, "job.gctl/piped created\n")


def test_a_caller_that_cannot_stop_keeps_its_command_running(local: Gctl) -> None:
    """A caller that leads a session of its own is an orphaned process group: the kernel
    discards its SIGTSTP, and so the command must go on too."""
    server = warm(local)
    with waiting_apply(local, session=True) as process:
        child = served_child(server, local.cwd)
        process.send_signal(signal.SIGTSTP)
        time.sleep(0.5)  # a stop would have happened by now
        assert _state(process.pid) != "T"
        assert _state(child) != "T"
        out, _ = process.communicate(MANIFEST, timeout=WAIT_S)
    assert (process.returncode, out) == (0, "job.gctl/piped created\n")


def test_a_streaming_command_runs_in_the_callers_process(local: Gctl) -> None:
    server = warm(local)
    local.ok("db", "upgrade")  # a watch follows a database that exists (it makes none)
    process = subprocess.Popen(
        [GCTL_BIN, "get", "jobs", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=local.env(),
        cwd=local.cwd,
    )
    try:
        until(lambda: _opened(process.pid, local.db_url), "the watch to open the database", WAIT_S)
        assert not any(_in(c, local.cwd) for c in _children(server))
    finally:
        process.terminate()
        process.communicate(timeout=WAIT_S)


def _opened(pid: int, path: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == path for fd in fds)
    except OSError:
        return False


def test_the_caller_imports_nothing_heavy(local: Gctl) -> None:
    warm(local)
    probe = (
        "import sys\n"
        "sys.argv = ['gctl', 'version']\n"
        "from gctl.cli import client\n"
        "try:\n"
        "    client.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('typer', 'pydantic', 'yaml', 'sqlalchemy', 'psycopg', 'gctl.cli.main')\n"
        "print('LOADED=' + ','.join(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=local.env(),
        cwd=local.cwd,
        timeout=WAIT_S,
        check=True,
    )
    assert done.stdout.splitlines() == [f"gctl {gctl.__version__}", "LOADED="]


def test_turned_off_or_unsafe_it_starts_no_server(local: Gctl, tmp_path: Path) -> None:
    off = tmp_path / "off"
    off.mkdir(mode=0o700)
    for _ in range(2):
        subprocess.run(
            [GCTL_BIN, "version"],
            env={**local.env(), client.SWITCH_ENV: "0", client.DIR_ENV: str(off)},
            capture_output=True,
            check=True,
        )
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    unsafe.chmod(0o755)
    for _ in range(2):
        done = subprocess.run(
            [GCTL_BIN, "version"],
            env={**local.env(), client.DIR_ENV: str(unsafe)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout == f"gctl {gctl.__version__}\n"
    time.sleep(1.0)  # a server started by mistake would have made its lock by now
    assert list(off.iterdir()) == []
    assert list(unsafe.iterdir()) == []


def test_an_edited_gctl_is_never_served_stale(local: Gctl, tmp_path: Path) -> None:
    """A copy of the gctl package, found first through PYTHONPATH: its own server, which
    hands over to a fresh one when a file it imported changes."""
    copy = tmp_path / "src" / "gctl"
    shutil.copytree(Path(gctl.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**local.env(), "PYTHONPATH": str(copy.parent)}
    where = Path(os.environ[client.DIR_ENV])
    others = set(where.glob("*.sock"))

    def version() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gctl.cli.client", "version"],
            env=env,
            cwd=local.cwd,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=True,
        )
        return done.stdout

    assert version() == f"gctl {gctl.__version__}\n"
    made = until(lambda: sorted(set(where.glob("*.sock")) - others), "the copy's server", WAIT_S)
    assert isinstance(made, list)
    path = str(made[0])
    first = until(lambda: _server_pid(path), "the copy's server to listen", WAIT_S)
    assert version() == f"gctl {gctl.__version__}\n"  # served

    init = copy / "__init__.py"
    info = init.stat()
    init.write_text(init.read_text().replace(gctl.__version__, "9.9.9"))
    if init.stat().st_mtime_ns == info.st_mtime_ns:  # a file system with coarse times
        os.utime(init, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    assert version() == "gctl 9.9.9\n"  # the stale server refused; the caller ran it
    assert isinstance(first, int)
    wait_gone(first)
    second = until(lambda: _server_pid(path), "a fresh server", WAIT_S)
    assert second != first
    assert version() == "gctl 9.9.9\n"


# -- what the review of the first version found ------------------------------------------------


def test_a_child_whose_pid_never_reached_its_client_runs_nothing(tmp_path: Path) -> None:
    """Else the client, with no pid, would run the command itself: twice in all."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(MANIFEST)
    url = str(tmp_path / "gctl.db")
    mine, theirs = socket.socketpair()
    theirs.close()  # the client is gone before the pid can reach it
    fds = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
    fds.append(os.open(tmp_path, os.O_PATH | os.O_DIRECTORY))
    request = cmdchild.Request(
        ["gctl", "apply", "-f", str(manifest)],
        {**os.environ, "GCTL_DB": url},
        0o022,
        [],
        [],
        [("utf-8", "strict")] * 3,
        fds,
    )
    server = cmdloop.Server(str(tmp_path / "x.sock"), None, None, (), ())
    server._fork(mine, request)
    [child] = server.children.values()
    _, status = os.waitpid(child.pid, 0)
    os.close(child.pidfd)
    assert os.waitstatus_to_exitcode(status) == 0
    database = db.Database.open(url)
    try:
        with database.read() as session:
            assert store.Store(session).list_objects(job.Job) == []
    finally:
        database.close()


def test_a_stopped_server_sees_its_commands_to_their_end(local: Gctl) -> None:
    server = warm(local)
    path = client.socket_path()
    assert path is not None
    with waiting_apply(local) as process:
        served_child(server, local.cwd)
        os.kill(server, signal.SIGTERM)
        until(lambda: not os.path.exists(path), "the socket file to go", WAIT_S)
        out, err = process.communicate(MANIFEST, timeout=WAIT_S)
    assert (process.returncode, out, err) == (0, "job.gctl/piped created\n", "")
    wait_gone(server)
    assert warm(local) != server  # the next command starts another


def test_a_signal_the_caller_ignores_is_ignored_by_its_command(local: Gctl) -> None:
    """As under nohup: SIGHUP to the caller ends nothing."""
    server = warm(local)
    ignore_hangups = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731
    with waiting_apply(local, before=ignore_hangups) as process:
        served_child(server, local.cwd)
        process.send_signal(signal.SIGHUP)
        out, _ = process.communicate(MANIFEST, timeout=WAIT_S)
    assert (process.returncode, out) == (0, "job.gctl/piped created\n")


def test_a_caller_with_a_closed_stream_runs_its_command_itself(local: Gctl) -> None:
    """The server would have passed it the socket in the closed stream's place."""
    warm(local)
    results = [
        subprocess.run(
            f"'{GCTL_BIN}' get jobs 2>&-",
            shell=True,
            capture_output=True,
            text=True,
            env={**local.env(), client.SWITCH_ENV: switch},
            cwd=local.cwd,
            timeout=WAIT_S,
            check=False,
        )
        for switch in ("1", "0")
    ]
    served, alone = ((r.returncode, r.stdout) for r in results)
    assert served == alone
    assert served[0] == 0


def test_a_served_usage_error_names_gctl(local: Gctl) -> None:
    warm(local)
    result = local("get")
    assert result.code == 2
    assert result.err == "error: Missing argument 'resource' (see 'gctl get -h')\n"


def test_a_caller_of_another_identity_is_not_served_by_this_server(local: Gctl) -> None:
    """A nicer caller (and so one with other limits, groups or namespaces) gets a server of
    its own, never the children of one with more than it has."""
    server = warm(local)
    where = Path(os.environ[client.DIR_ENV])
    others = set(where.glob("*.sock"))

    def nicer_apply() -> "contextlib.AbstractContextManager[subprocess.Popen[str]]":
        return waiting_apply(local, before=lambda: os.nice(5))

    with nicer_apply() as first:  # no server of its identity yet: it starts one
        assert first.communicate(MANIFEST, timeout=WAIT_S)[0] == "job.gctl/piped created\n"
    made = until(lambda: sorted(set(where.glob("*.sock")) - others), "its server", WAIT_S)
    nicer = until(lambda: _server_pid(str(made[0])), "its server to listen", WAIT_S)
    assert nicer is not None
    assert _nice(nicer) == 5
    with nicer_apply() as second:
        child = served_child(nicer, local.cwd)
        assert _nice(child) == 5
        assert not any(_in(c, local.cwd) for c in _children(server))
        assert second.communicate(MANIFEST, timeout=WAIT_S)[0] == "job.gctl/piped unchanged\n"


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[16])


def test_a_slow_caller_does_not_hold_up_the_others(local: Gctl) -> None:
    """A connection that sends its request a byte a second is dropped after a while; those
    that come meanwhile are served at once."""
    server = warm(local)
    path = client.socket_path()
    assert path is not None
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(path)
    stop = threading.Event()

    def dribble() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(1.0):
                slow.send(b"\0")

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    try:
        with waiting_apply(local) as process:
            served_child(server, local.cwd)
            out, _ = process.communicate(MANIFEST, timeout=WAIT_S)
        assert out == "job.gctl/piped created\n"
    finally:
        stop.set()
        thread.join()
        slow.close()


def test_a_terminal_the_caller_does_not_lead_keeps_the_command_in_the_caller(
    local: Gctl,
) -> None:
    """Served, a command reading a terminal it is in the background of would take the shell's
    input; a terminal that is not the caller's own is such a one."""
    warm(local)
    leader, follower = os.openpty()
    process = subprocess.Popen(
        [GCTL_BIN, "apply", "-f", "-"],
        stdin=follower,
        stdout=subprocess.PIPE,
        text=True,
        env=local.env(),
        cwd=local.cwd,
    )
    os.close(follower)
    try:
        # Running the command itself, it has imported pydantic; a served caller never does.
        until(lambda: b"pydantic_core" in _maps(process.pid), "the caller to import", WAIT_S)
        os.write(leader, MANIFEST.encode() + b"\x04")
        out, _ = process.communicate(timeout=WAIT_S)
    finally:
        os.close(leader)
    assert (process.returncode, out) == (0, "job.gctl/piped created\n")


def _maps(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return b""
