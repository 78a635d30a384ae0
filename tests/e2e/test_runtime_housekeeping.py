"""The node runtime's housekeeping off the agent's pass, with real supervisors and processes:
the fork server's replies read after the launches, and ended attempts removed by a thread of
their own (nodeagent/runtime.py, nodeagent/forkserver.py)."""

import logging
import os
import signal
from pathlib import Path

import pytest

from nodeagent import runtime, supervisor
from tests.e2e.conftest import launch_script, until


def test_an_armed_supervisor_has_its_pid_noted_once_the_replies_are_read(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    launch_script(node, "first", f"while [ ! -e {release} ]; do sleep 0.02; done")
    launch_script(node, "second", "true", after=("first",))
    node.settle()
    pid = int((node.attempts_dir / "second" / supervisor.ARMED).read_text())
    record = node.attempts_dir / "second" / supervisor.LAUNCHED
    until(lambda: supervisor.read_json(record) is not None, "second's launch record")
    launched = supervisor.read_json(record)
    assert launched is not None
    assert launched["supervisor"] == pid
    release.touch()
    until(lambda: node.state("second").phase == "exited", "second to run after first")


def test_a_launch_the_fork_server_never_answered_is_absent_and_launched_again(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    launch_script(node, "warm-up", "true")  # starts the fork server
    node.settle()
    # The warm-up's supervisor is forked with the server's socket and closes its copy first
    # thing. Were that the socket's last close, `settle` could hear of it before the kernel has
    # let go of the job's lock queued there: the job would look running for a moment.
    until(lambda: node.state("warm-up").phase == "exited", "the warm-up to end")
    server = node._forker._process
    assert server is not None
    os.kill(server.pid, signal.SIGSTOP)  # it reads no more requests...
    launch_script(node, "job", f"date +%s.%N > {tmp_path}/ran")
    os.kill(server.pid, signal.SIGKILL)  # ...and dies with this one unread
    server.wait()
    node.settle()  # no reply: the server is let go
    assert node.state("job").phase == "absent"
    assert not (node.attempts_dir / "job" / supervisor.LAUNCHED).exists()
    launch_script(node, "job", f"date +%s.%N > {tmp_path}/ran")  # through a new fork server
    until(lambda: node.state("job").phase == "exited", "the job to run")
    assert node.state("job").exit_code == 0
    assert (tmp_path / "ran").exists()


def test_a_forgotten_attempt_is_gone_at_once_and_removed_by_the_tidier(
    node: runtime.Runtime,
) -> None:
    launch_script(node, "done", "true")
    until(lambda: node.state("done").phase == "exited", "the job to end")
    trash = node.attempts_dir.parent / "trash"
    node.forget("done")
    assert "done" not in node.known()
    assert node.state("done").phase == "absent"
    until(lambda: not any(trash.iterdir()), "the trash to be emptied")
    assert node.log_path("default", "done", "job-uid", 1).exists()  # the log stays


def test_what_a_killed_agent_left_in_the_trash_is_removed_at_start(tmp_path: Path) -> None:
    left = tmp_path / "state" / "trash" / "old-attempt.123.0"
    left.mkdir(parents=True)
    (left / "exit.json").write_text("{}")
    later = runtime.Runtime(tmp_path / "state")
    try:
        until(lambda: not left.exists(), "the leftover to be removed")
    finally:
        later.close()


def test_a_supervisor_that_fails_before_the_job_starts_reports_its_error(
    node: runtime.Runtime,
) -> None:
    """Its traceback goes to `supervisor.err` even from the fork server, whose children leave
    with os._exit, and the attempt ends with its last line instead of a bare "died"."""
    launch_script(node, "warm-up", "true")  # the next one comes from the fork server
    until(lambda: node.state("warm-up").phase == "exited", "the warm-up to end")
    launch = runtime.Launch(
        uid="broken",
        argv=["true"],
        env={},
        cwd=None,
        log_path=node.log_path("default", "broken", "job-uid", 1),
        grace_seconds=1.0,
    )
    node.prepare(launch)
    (node.attempts_dir / "broken" / supervisor.SPEC).write_text("{not json")
    node.launch(launch, prepared=True)
    until(lambda: node.state("broken").phase == "exited", "the supervisor to give up")
    state = node.state("broken")
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert "JSONDecodeError" in (state.message or "")


def test_an_attempt_forgotten_and_launched_again_reports_its_new_end(
    node: runtime.Runtime,
) -> None:
    """An ended attempt's state is read from its exit record once and kept (the record never
    changes), until the attempt is forgotten: launched again under its uid (an armed one
    given back and started anew), it reports how the new run ended, not the old one."""
    launch_script(node, "again", "exit 3")
    until(lambda: node.state("again").phase == "exited", "the first run to end")
    assert node.state("again").exit_code == 3
    assert node.state("again") is node.state("again")  # kept, not read again
    node.forget("again")
    assert node.state("again").phase == "absent"
    launch_script(node, "again", "exit 5")
    until(lambda: node.state("again").phase == "exited", "the second run to end")
    assert node.state("again").exit_code == 5


def test_a_forked_supervisor_that_says_nothing_makes_no_error_file(
    node: runtime.Runtime,
) -> None:
    """`supervisor.err` is made at its first write: an attempt whose supervisor wrote nothing
    (most) has none, one file fewer to make and remove for each."""
    launch_script(node, "warm-up", "true")  # the next ones come from the fork server
    until(lambda: node.state("warm-up").phase == "exited", "the warm-up to end")
    launch_script(node, "quiet", "echo to the log; echo to its stderr >&2; exit 3")
    until(lambda: node.state("quiet").phase == "exited", "the attempt to end")
    assert node.state("quiet").exit_code == 3
    assert not (node.attempts_dir / "quiet" / "supervisor.err").exists()
    log = node.log_path("default", "quiet", "job-uid", 1).read_text()
    assert log == "to the log\nto its stderr\n"


def test_a_command_with_a_nul_byte_cannot_start_and_says_why(node: runtime.Runtime) -> None:
    launch_script(node, "nul", "echo a\0b")
    until(lambda: node.state("nul").phase == "exited", "the attempt to end")
    state = node.state("nul")
    assert (state.exit_code, state.reason) == (127, "StartError")
    assert state.message == "embedded null byte"
    assert "embedded null byte" in node.log_path("default", "nul", "job-uid", 1).read_text()


def test_a_launch_record_torn_by_a_crash_reads_as_absent_and_is_written_whole_again(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    """A new attempt's launch record is written in place, not renamed (no one reads it before
    its supervisor starts): an agent that died halfway through leaves the attempt absent, and
    preparing it again replaces the record whole."""
    directory = node.attempts_dir / "torn"
    directory.mkdir()
    (directory / supervisor.SPEC).write_text('{"argv": ["bash", "-c", "ec')  # cut short
    assert node.state("torn").phase == "absent"
    assert node.launched_log("torn") is None

    launch_script(node, "torn", f"echo whole > {tmp_path}/ran")

    until(lambda: node.state("torn").phase == "exited", "the attempt to run")
    assert node.state("torn").exit_code == 0
    assert (tmp_path / "ran").read_text() == "whole\n"
    assert supervisor.read_json(directory / supervisor.SPEC) is not None


def test_a_running_job_whose_pid_record_is_damaged_is_still_stopped(
    node: runtime.Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """QA: a truncated `pid.json` made a running job impossible to delete (the stop found no
    pid to signal), and nothing said why. Its supervisor is named in its launch record too;
    the damaged record is said once, naming it."""
    launch_script(node, "warm-up", "true")  # the next one comes from the fork server
    until(lambda: node.state("warm-up").phase == "exited", "the warm-up to end")
    launch_script(node, "long", "sleep 60")
    record = node.attempts_dir / "long" / supervisor.PID
    until(record.exists, "the job to start")
    record.write_text('{"pid": 12')  # torn
    with caplog.at_level(logging.WARNING, logger="gctl.agent"):
        assert node.state("long").phase == "running"
        node.state("long")
        node.stop("long", warn=False)
        until(lambda: node.state("long").phase == "exited", "the job to be stopped")
    ended = node.state("long")
    assert (ended.exit_code, ended.stopped) == (143, True)
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert said == [f"attempt long: its record {record} cannot be read (empty or damaged)"]


@pytest.mark.parametrize("damaged", [supervisor.EXIT, supervisor.PID])
def test_an_attempt_whose_record_is_damaged_is_lost_and_says_which(
    node: runtime.Runtime, damaged: str
) -> None:
    """QA: an `exit.json` left empty (as a power cut may, it is not synced before the next job
    starts) read as "the supervisor died without recording the exit"; a damaged `pid.json`
    of a supervisor that died as a job that never started (Failed, exit 127, its GPU given to
    the next). Both are lost, saying which record cannot be read."""
    launch_script(node, "done", "exit 3")
    until(lambda: node.state("done").phase == "exited", "the job to end")
    if damaged == supervisor.PID:  # its supervisor died before it recorded the exit
        (node.attempts_dir / "done" / supervisor.EXIT).unlink()
    (node.attempts_dir / "done" / damaged).write_text("")
    node._ended.clear()  # what the agent read of it: gone, as after its restart
    state = node.state("done")
    assert state.phase == "lost"
    assert state.message == (
        f"its supervisor ended, and its {damaged} cannot be read (empty or damaged)"
    )


def test_the_fences_of_the_jobs_alive_here_are_those_they_were_launched_with(
    node: runtime.Runtime, tmp_path: Path
) -> None:
    """An agent restarted with a shorter --fence-after adopts jobs launched with a longer one:
    the node's record of how long its jobs outlive it must be theirs (QA's review)."""
    lease = tmp_path / "lease"
    lease.touch()
    launch_script(node, "fenced", "sleep 60", lease=lease)  # fence 30 s, grace 2 s
    launch_script(node, "unfenced", "sleep 60")
    launch_script(node, "ended", "true", lease=lease)
    until(lambda: node.state("ended").phase == "exited", "a job to end")
    assert sorted(node.fences(), key=str) == [32.0, None]
