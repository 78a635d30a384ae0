"""How a supervisor starts a job, through the node runtime with real processes: the command
found on the job's own PATH, in its working directory, with nothing of the supervisor but its
log on stdout and stderr, and no signal ignored or blocked; and what a job that cannot start
reports."""

import os
import stat
import sys
from pathlib import Path

from nodeagent import runtime
from tests.e2e.conftest import until


def run(
    node: runtime.Runtime,
    uid: str,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> runtime.State:
    """Launch `argv` as attempt `uid` and wait for it to end."""
    node.launch(
        runtime.Launch(
            uid=uid,
            argv=argv,
            env=dict(os.environ) if env is None else env,
            cwd=cwd,
            log_path=node.log_path("default", uid, 1),
            grace_seconds=2.0,
        )
    )
    until(lambda: node.state(uid).phase == "exited", f"{uid} to end")
    return node.state(uid)


def output(node: runtime.Runtime, uid: str) -> str:
    return node.log_path("default", uid, 1).read_text()


def tool(directory: Path, name: str, body: str, *, executable: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(stat.S_IRWXU if executable else stat.S_IRUSR | stat.S_IWUSR)
    return path


def test_the_job_holds_only_stdin_stdout_and_stderr(node: runtime.Runtime) -> None:
    """Not the attempt's lock above all: a job that left a process behind holding it would
    keep the job armed behind it from ever starting."""
    code = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    state = run(node, "fds", [sys.executable, "-c", code])
    assert state.exit_code == 0
    assert output(node, "fds").strip() == "[0, 1, 2, 3]"  # 3: the listing's own


def test_no_signal_is_ignored_or_blocked_in_the_job(node: runtime.Runtime) -> None:
    state = run(node, "signals", ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"])
    assert state.exit_code == 0
    masks = dict(line.split(":") for line in output(node, "signals").splitlines())
    assert {name: int(mask, 16) for name, mask in masks.items()} == {"SigBlk": 0, "SigIgn": 0}


def test_the_command_is_looked_up_on_the_jobs_path_in_order(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    tool(tmp_path / "first", "mytool", "echo first", executable=False)  # skipped
    tool(tmp_path / "second", "mytool", "echo second")
    tool(tmp_path / "third", "mytool", "echo third")
    path = os.pathsep.join(str(tmp_path / d) for d in ("none", "first", "second", "third"))
    state = run(node, "path", ["mytool"], env={"PATH": f"{path}:/usr/bin:/bin"})
    assert state.exit_code == 0
    assert output(node, "path") == "second\n"


def test_a_command_found_only_unexecutable_cannot_start_and_says_so(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    tool(tmp_path / "bin", "mytool", "echo never", executable=False)
    state = run(node, "denied", ["mytool"], env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == "[Errno 13] Permission denied: 'mytool'"
    assert output(node, "denied") == "gctl: cannot start 'mytool': Permission denied\n"


def test_a_command_found_nowhere_cannot_start_and_says_so(node: runtime.Runtime) -> None:
    state = run(node, "missing", ["no-such-tool-here"])
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == "[Errno 2] No such file or directory: 'no-such-tool-here'"


def test_the_job_runs_in_its_working_directory_and_relative_commands_resolve_there(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    tool(work, "step.sh", "pwd")
    state = run(node, "cwd", ["./step.sh"], cwd=str(work))
    assert state.exit_code == 0
    assert output(node, "cwd") == f"{work}\n"


def test_a_missing_working_directory_cannot_start_and_says_so(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    state = run(node, "nowhere", ["true"], cwd=str(gone))
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == f"[Errno 2] No such file or directory: '{gone}'"
