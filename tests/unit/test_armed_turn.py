"""An armed supervisor's wait (`supervisor._Turn`) and its markers, in interleavings that real
processes hit only by chance: driven here in one process, with real files and flocks."""

import fcntl
import os
import threading
from pathlib import Path

from nodeagent import runtime, supervisor


def test_a_take_back_just_before_the_wait_blocks_is_not_missed(tmp_path: Path) -> None:
    """The agent renames the marker and signals after the loop saw it armed, before the
    supervisor blocked: the signal finds it not blocked (it raises nothing), so the wait must
    see the marker instead of blocking until the job before it ends."""
    attempt, before = tmp_path / "next", tmp_path / "before"
    attempt.mkdir()
    before.mkdir()
    (attempt / supervisor.ARMED).write_text("")
    lock = os.open(before / runtime.LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the job before it runs on
    spec = {"waitFor": [str(before / runtime.LOCK)]}
    turn = supervisor._Turn(attempt, spec, supervisor._Stopper(attempt, 1.0, None))
    looked = turn._still_armed

    def taken_back_right_after_the_first_look() -> bool:
        armed = looked()
        if (attempt / supervisor.ARMED).exists():
            os.rename(attempt / supervisor.ARMED, attempt / supervisor.DISARMED)
        return armed

    turn._still_armed = taken_back_right_after_the_first_look  # type: ignore[method-assign]
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(turn.wait()), daemon=True)
    try:
        waiter.start()
        waiter.join(5)
        assert not waiter.is_alive(), "the wait blocked on a job it was taken back from"
        assert outcome == [False]
        assert not (attempt / supervisor.FIRED).exists()
    finally:
        os.close(lock)  # releases the flock: a stuck waiter ends
        waiter.join(5)


def test_an_armed_marker_holds_only_its_own_supervisor_pid(tmp_path: Path) -> None:
    """A marker left by a supervisor that died armed is rewritten, not overwritten in part: a
    shorter pid after a longer one must not read as some other process's."""
    attempts = runtime.Runtime(tmp_path)
    try:
        launch = runtime.Launch(
            uid="next",
            argv=["true"],
            env={},
            cwd=None,
            log_path=attempts.log_path("default", "next", "job-uid", 1),
            grace_seconds=1.0,
            wait_for=(attempts.lock_path("before"),),
        )
        attempts.prepare(launch)
        marker = attempts.attempts_dir / "next" / supervisor.ARMED
        marker.write_text("4194303")  # the pid of the one that died
        attempts.prepare(launch)  # armed again
        runtime._note_armed_pid(marker.parent, 42)
        assert marker.read_text() == "42"
        assert runtime._armed_record(marker.parent) == {"supervisor": 42}
    finally:
        attempts.close()
