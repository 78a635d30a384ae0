"""How a supervisor starts a job, through the node runtime with real processes: the command
found on the job's own PATH, in its working directory, with nothing of the supervisor but its
log on stdout and stderr, and no signal ignored or blocked; and what a job that cannot start
reports. Each case runs twice: started at once, and armed behind a running attempt (its
supervisor waits, then starts the job at the hand-off)."""

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent import runtime, supervisor
from tests.e2e.conftest import launch_script, until


@pytest.fixture(params=["direct", "armed"])
def armed(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "armed")


def launch(
    node: runtime.Runtime,
    uid: str,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    after: tuple[str, ...] = (),
) -> None:
    node.launch(
        runtime.Launch(
            uid=uid,
            argv=argv,
            env=dict(os.environ) if env is None else env,
            cwd=cwd,
            log_path=node.log_path("default", uid, "job-uid", 1),
            grace_seconds=2.0,
            wait_for=tuple(node.lock_path(before) for before in after),
        )
    )


def holding(node: runtime.Runtime, tmp: Path, before: str = "") -> Path:
    """Launch `first`, which runs `before` then until the returned file exists."""
    release = tmp / "release"
    launch_script(node, "first", f"{before}\nwhile [ ! -e {release} ]; do sleep 0.02; done")
    until(lambda: node.state("first").pid is not None, "first to run")
    return release


def run(
    node: runtime.Runtime,
    uid: str,
    argv: list[str],
    *,
    armed: bool,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    before: str = "",
) -> runtime.State:
    """Launch `argv` as attempt `uid` and wait for it to end: `armed`, behind an attempt that
    runs the shell commands `before` and ends once `uid` is armed."""
    if not armed:
        launch(node, uid, argv, env=env, cwd=cwd)
    else:
        release = holding(node, node.attempts_dir.parent, before)
        launch(node, uid, argv, env=env, cwd=cwd, after=("first",))
        until(lambda: node.state(uid).phase == "armed", f"{uid} to be armed")
        release.touch()
    until(lambda: node.state(uid).phase == "exited", f"{uid} to end")
    return node.state(uid)


def output(node: runtime.Runtime, uid: str) -> str:
    return node.log_path("default", uid, "job-uid", 1).read_text()


def tool(directory: Path, name: str, body: str, *, executable: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(stat.S_IRWXU if executable else stat.S_IRUSR | stat.S_IWUSR)
    return path


def reaped(node: runtime.Runtime) -> bool:
    """Whether every supervisor the runtime started itself (not through the fork server) has
    ended and been reaped."""
    node.settle()
    return not node._direct


@pytest.mark.parametrize("server", ["fork server", "fresh interpreter"])
def test_the_job_holds_only_stdin_stdout_and_stderr(
    node: runtime.Runtime, armed: bool, server: str
) -> None:
    """Not the attempt's lock above all: a job that left a process behind holding it would
    keep the job armed behind it from ever starting. A supervisor in a fresh interpreter (the
    fork server's fallback) inherits the lock as a plain descriptor."""
    if server == "fresh interpreter":
        node._forker.fork = lambda *args, **kwargs: False  # type: ignore[method-assign]
    code = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    state = run(node, "fds", [sys.executable, "-c", code], armed=armed)
    assert state.exit_code == 0
    assert output(node, "fds").strip() == "[0, 1, 2, 3]"  # 3: the listing's own
    until(lambda: reaped(node), "the supervisors to end")  # none left running after the test


GLIBC_SIGNAL = 32  # glibc's own (SIGCANCEL): Python's signal module refuses it


@pytest.mark.parametrize(
    "inherited",
    ["", "SIGHUP and SIGQUIT ignored (nohup)", "signal 32 ignored (GNU make's posix_spawn)"],
)
@pytest.mark.parametrize("server", ["fork server", "fresh interpreter"])
def test_no_signal_is_ignored_or_blocked_in_the_job(
    node: runtime.Runtime, armed: bool, inherited: str, server: str
) -> None:
    """Whatever the agent inherited: the fork server (which takes the signals back once, for
    every supervisor it forks) and a supervisor in a fresh interpreter inherit it from this
    process, started after the change."""
    if server == "fresh interpreter":
        node._forker.fork = lambda *args, **kwargs: False  # type: ignore[method-assign]
    ignored = (signal.SIGHUP, signal.SIGQUIT) if inherited.startswith("SIGHUP") else ()
    before = {number: signal.signal(number, signal.SIG_IGN) for number in ignored}
    glibc_before = GLIBC_SIGNAL in supervisor.ignored_signals()
    if inherited.startswith("signal 32") and not supervisor.set_disposition(
        GLIBC_SIGNAL, ignore=True
    ):
        pytest.skip(f"no rt_sigaction number known for {os.uname().machine}")
    try:
        argv = ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]
        state = run(node, "signals", argv, armed=armed)
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
        supervisor.set_disposition(GLIBC_SIGNAL, ignore=glibc_before)
    assert state.exit_code == 0
    masks = dict(line.split(":") for line in output(node, "signals").splitlines())
    assert {name: int(mask, 16) for name, mask in masks.items()} == {"SigBlk": 0, "SigIgn": 0}
    until(lambda: reaped(node), "the supervisors to end")  # none left running after the test


def test_the_command_is_looked_up_on_the_jobs_path_in_order(
    node: runtime.Runtime, tmp_path: Path, armed: bool
) -> None:
    tool(tmp_path / "first", "mytool", "echo first", executable=False)  # skipped
    tool(tmp_path / "second", "mytool", "echo second")
    tool(tmp_path / "third", "mytool", "echo third")
    path = os.pathsep.join(str(tmp_path / d) for d in ("none", "first", "second", "third"))
    state = run(node, "path", ["mytool"], env={"PATH": f"{path}:/usr/bin:/bin"}, armed=armed)
    assert state.exit_code == 0
    assert output(node, "path") == "second\n"


def test_a_command_found_only_unexecutable_cannot_start_and_says_so(
    node: runtime.Runtime, tmp_path: Path, armed: bool
) -> None:
    tool(tmp_path / "bin", "mytool", "echo never", executable=False)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    state = run(node, "denied", ["mytool"], env=env, armed=armed)
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == "[Errno 13] Permission denied: 'mytool'"
    assert output(node, "denied") == "gctl: cannot start 'mytool': Permission denied\n"


def test_a_command_found_nowhere_cannot_start_and_says_so(
    node: runtime.Runtime, armed: bool
) -> None:
    state = run(node, "missing", ["no-such-tool-here"], armed=armed)
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == "[Errno 2] No such file or directory: 'no-such-tool-here'"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        pytest.param(lambda p: p / "none", "No such file or directory", id="missing"),
        pytest.param(lambda p: tool(p, "file", "true"), "Not a directory", id="a-file"),
    ],
)
def test_a_working_directory_that_cannot_be_entered_is_named_in_the_log(
    node: runtime.Runtime, tmp_path: Path, armed: bool, make: Callable[[Path], Path], why: str
) -> None:
    cwd = str(make(tmp_path))
    state = run(node, "cwd", ["echo", "hi"], cwd=cwd, armed=armed)
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert cwd in (state.message or "")
    assert output(node, "cwd") == f"gctl: cannot start in working directory {cwd!r}: {why}\n"


def test_the_job_runs_in_its_working_directory_and_relative_commands_resolve_there(
    node: runtime.Runtime, tmp_path: Path, armed: bool
) -> None:
    work = tmp_path / "work"
    tool(work, "step.sh", "pwd")
    state = run(node, "cwd", ["./step.sh"], cwd=str(work), armed=armed)
    assert state.exit_code == 0
    assert output(node, "cwd") == f"{work}\n"


def test_a_missing_working_directory_cannot_start_and_says_so(
    node: runtime.Runtime, tmp_path: Path, armed: bool
) -> None:
    gone = tmp_path / "gone"
    state = run(node, "nowhere", ["true"], cwd=str(gone), armed=armed)
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == f"[Errno 2] No such file or directory: '{gone}'"


def test_a_job_with_a_nul_byte_cannot_start_and_says_so(node: runtime.Runtime, armed: bool) -> None:
    state = run(node, "nul", ["echo", "a\0b"], armed=armed)
    assert (state.exit_code, state.reason, state.message) == (
        127,
        "StartError",
        "embedded null byte",
    )


def test_an_armed_job_finds_what_the_job_before_it_made(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    """Its directory and command are looked up as it starts, not when it was armed."""
    work, tools = tmp_path / "made" / "work", tmp_path / "made" / "bin"
    late = tools / "late"
    make = f"mkdir -p {work} {tools}; printf '#!/bin/sh\\npwd\\n' > {late}; chmod +x {late}"
    env = {"PATH": f"{tools}:/usr/bin:/bin"}
    state = run(node, "late", ["late"], env=env, cwd=str(work), armed=True, before=make)
    assert state.exit_code == 0
    assert output(node, "late") == f"{work}\n"


def test_a_supervisor_started_in_a_fresh_interpreter_is_reaped_once_it_ends(
    node: runtime.Runtime,
) -> None:
    """It is the agent's child (the fork server's children are the kernel's to reap): not left
    a zombie once it has ended."""
    node._forker.fork = lambda *args, **kwargs: False  # type: ignore[method-assign]
    run(node, "direct", ["true"], armed=False)
    launched = supervisor.read_json(node.attempts_dir / "direct" / supervisor.LAUNCHED)
    assert launched is not None
    gone = Path(f"/proc/{launched['supervisor']}")

    def reaped_at_last() -> bool:
        node.settle()  # reaps what has ended
        return not gone.exists()  # a zombie keeps its /proc entry

    until(reaped_at_last, "the supervisor to be reaped")


REHEARSAL = """
import json, os, resource, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import supervisor

spec = {"env": dict(os.environ), "cwd": None}
log = open(os.devnull, "ab", buffering=0)


def child(rehearse, out):
    fds = sorted(os.listdir("/proc/self/fd"))
    if rehearse:
        supervisor._rehearse(spec, log)
    try:
        os.waitpid(-1, os.WNOHANG)
        started = True
    except ChildProcessError:
        started = False
    same = sorted(os.listdir("/proc/self/fd")) == fds
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    job = supervisor._popen(spec, ["true"], log)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    job.wait()
    os.write(out, json.dumps([started, same, faults]).encode())


found = []
for rehearse in (True, False):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        child(rehearse, write)
        os._exit(0)
    os.close(write)
    found.append(json.loads(os.read(read, 1000)))
    os.waitpid(pid, 0)
print(json.dumps(found))
"""


def test_an_armed_supervisor_rehearses_the_start_without_starting_anything() -> None:
    """In a process forked as the fork server forks supervisors: the rehearsal starts no
    process and leaves no descriptor open, and the start after it copies fewer of the shared
    pages than a first start does (page faults: a count, not a time)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", REHEARSAL, supervisor.__file__],
        capture_output=True,
        text=True,
        check=True,
    )
    (started, same, rehearsed), (_, _, cold) = json.loads(done.stdout)
    assert not started
    assert same
    assert rehearsed * 2 < cold
