"""Pure rules of completion markers and re-runs: what decides success, what the agent reports,
when a success file counts, and when a rerun is asked for."""

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gctl.api import binding, job
from gctl.cli import rerunning
from nodeagent import reports, runtime, supervisor
from tests.builders import make_binding, make_job


@pytest.mark.parametrize(
    ("exit_code", "success_file", "succeeded"),
    [
        (0, None, True),
        (3, None, False),
        (0, "Found", True),
        (3, "Found", True),  # the file decides; the exit code is only recorded
        (0, "Missing", False),
        (3, "Missing", False),
    ],
)
def test_the_success_file_decides_when_there_is_one(
    exit_code: int, success_file: str | None, succeeded: bool
) -> None:
    status = binding.BindingStatus.model_validate(
        {"phase": "Exited", "exitCode": exit_code, "successFile": success_file}
    )
    assert binding.succeeded(status) is succeeded


@pytest.mark.parametrize(
    ("exit_code", "success_file", "reason", "message"),
    [
        (0, None, "Completed", None),
        (2, None, "Error", None),
        (0, "Found", "Completed", "exit code 0; success file /w/done was written"),
        (
            3,
            "Found",
            "Completed",
            "exit code 3, but success file /w/done was written, so the attempt succeeded",
        ),
        (
            0,
            "Missing",
            "SuccessFileMissing",
            "exit code 0; success file /w/done was not written after the attempt started",
        ),
    ],
)
def test_the_agent_says_what_decided(
    exit_code: int, success_file: str | None, reason: str, message: str | None
) -> None:
    state = runtime.State(
        "exited",
        exit_code=exit_code,
        success_file=success_file,
        success_path="/w/done" if success_file else None,
    )
    assert reports.exit_outcome(state) == (reason, message)


def test_no_success_file_no_record(tmp_path: Path) -> None:
    assert supervisor.success_file_record(None, str(tmp_path), 0) == {}


def test_a_success_file_counts_only_if_written_at_or_after_the_start(tmp_path: Path) -> None:
    done = tmp_path / "work" / "done"
    done.parent.mkdir()
    done.write_text("")
    stat = done.stat()
    written = max(stat.st_mtime_ns, stat.st_ctime_ns)

    # Written in the very tick the attempt started counts: file clocks are coarse.
    assert supervisor.success_file_record("done", str(tmp_path / "work"), written) == {
        "successFile": "Found",
        "successFilePath": str(done),
    }
    stale = supervisor.success_file_record(str(done), None, written + 1)
    assert stale["successFile"] == "Missing"
    assert supervisor.success_file_record("absent", str(tmp_path), 0) == {
        "successFile": "Missing",
        "successFilePath": str(tmp_path / "absent"),
    }


def test_the_start_is_taken_on_the_file_clock(tmp_path: Path) -> None:
    launched = tmp_path / supervisor.LAUNCHED  # the file it touches: stamped an hour ahead
    launched.write_text("{}")
    os.utime(launched, (time.time() + 3600, time.time() + 3600))
    since = supervisor.file_clock_now(launched)
    (tmp_path / "done").write_text("")
    assert supervisor.success_file_record("done", str(tmp_path), since)["successFile"] == "Found"


def test_a_relative_success_file_without_working_dir_is_the_supervisors_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    record = supervisor.success_file_record("out/done", None, 0)
    assert record["successFilePath"] == os.path.join(tmp_path, "out", "done")


def test_a_rerun_is_asked_for_by_a_token_not_yet_handled() -> None:
    j = make_job("j").build()
    assert job.rerun_requested(j) is None
    j.metadata.annotations[job.ANNOTATION_RERUN] = "t1"
    assert job.rerun_requested(j) == "t1"
    j.status.rerun = "t1"
    assert job.rerun_requested(j) is None
    j.metadata.annotations[job.ANNOTATION_RERUN] = ""
    assert job.rerun_requested(j) is None


def test_rerun_tokens_are_utc_to_the_microsecond() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert rerunning.token(moment) == "2026-01-02T03:04:05.000006Z"


def _lost(**status: object) -> binding.Binding:
    lost = make_binding("train", "n1", [0], phase="Lost", pid=40)
    lost.status.reason = "NodeLost"
    lost.status.finish_time = datetime(2026, 1, 1, 12, 5, tzinfo=UTC)  # when it was declared lost
    for name, value in status.items():
        setattr(lost.status, name, value)
    return lost


ENDED = datetime(2026, 1, 1, 12, 3, 4, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            runtime.State("exited", pid=40, finished=ENDED, exit_code=7),
            "exited with code 7 at 2026-01-01T12:03:04Z",
        ),
        (
            runtime.State(
                "exited", pid=40, finished=ENDED, exit_code=143, signal="SIGTERM", stopped=True
            ),
            "was still running when its agent came back, which stopped it: exit code 143 "
            "(SIGTERM) at 2026-01-01T12:03:04Z",
        ),
        (
            runtime.State(
                "exited",
                finished=ENDED,
                exit_code=143,
                signal="SIGTERM",
                stopped=True,
                reason=supervisor.FENCED,
            ),
            "was stopped by its supervisor, its agent silent past the fence: exit code 143 "
            "(SIGTERM) at 2026-01-01T12:03:04Z",
        ),
    ],
)
def test_a_lost_attempt_keeps_how_it_really_ended(state: runtime.State, said: str) -> None:
    learnt = reports.lost_and_ended(_lost(), state)

    assert learnt is not None
    status, message = learnt
    assert (status.phase, status.reason, status.exit_code) == ("Lost", "NodeLost", state.exit_code)
    assert status.finish_time == datetime.fromtimestamp(ENDED, UTC)
    assert message == f"attempt 1 on n1, lost while the node was silent, {said}"


@pytest.mark.parametrize(
    ("bound", "state"),
    [
        (_lost(), runtime.State("running", pid=40)),  # it has not ended: it is stopped first
        (_lost(), runtime.State("lost")),  # its supervisor died: no exit to tell
        (_lost(), runtime.State("exited", message=supervisor.NOT_STARTED)),  # never started
        (_lost(exit_code=7), runtime.State("exited", exit_code=7, finished=ENDED)),  # told
    ],
)
def test_a_lost_attempt_with_nothing_new_is_left_as_it_is(
    bound: binding.Binding, state: runtime.State
) -> None:
    assert reports.lost_and_ended(bound, state) is None
