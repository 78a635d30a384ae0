"""The processes of this node's attempts, one supervisor each, found again after any restart.

Each Binding gets a directory named by its uid. Before launching the supervisor the agent takes
an exclusive flock on `lock` in it and hands the locked descriptor to the supervisor, which
holds it until it exits. So "is the lock held" says whether the supervisor lives, with no pid
to trust and no window between launching it and it taking the lock; `pid.json` and `exit.json`
(written atomically by the supervisor) say what happened to the job.
"""

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent import supervisor

LOCK = "lock"


@dataclass(frozen=True)
class Launch:
    """What to run for one attempt."""

    uid: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    log_path: Path
    grace_seconds: float
    lease_path: Path | None = None
    fence_seconds: float = 0.0


@dataclass(frozen=True)
class State:
    """Where an attempt stands on this host.

    phase: absent (no trace: never launched here), running, exited, or lost (the supervisor
    died without recording an exit)."""

    phase: str
    pid: int | None = None
    started: float | None = None  # when the supervisor started the job (epoch seconds)
    exit_code: int | None = None
    signal: str | None = None
    stopped: bool = False
    reason: str | None = None
    message: str | None = None


class Runtime:
    def __init__(self, state_dir: Path) -> None:
        self.attempts_dir = state_dir / "attempts"
        self.logs_dir = state_dir / "logs"
        self.attempts_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def log_path(self, namespace: str, job: str, attempt: int) -> Path:
        return self.logs_dir / namespace / job / f"attempt-{attempt}.log"

    def known(self) -> list[str]:
        """Uids of every attempt this host has a directory for."""
        return sorted(p.name for p in self.attempts_dir.iterdir() if p.is_dir())

    def state(self, uid: str) -> State:
        directory = self.attempts_dir / uid
        if not (directory / supervisor.SPEC).exists():
            return State("absent")
        exit_record = _read(directory / supervisor.EXIT)
        pid_record = _read(directory / supervisor.PID)
        pid = int(pid_record["pid"]) if pid_record else None
        started = float(pid_record["started"]) if pid_record else None
        if exit_record is not None:
            return State(
                "exited",
                pid=pid,
                started=started,
                exit_code=exit_record.get("exitCode"),
                signal=exit_record.get("signal"),
                stopped=bool(exit_record.get("stopped")),
                reason=exit_record.get("reason"),
                message=exit_record.get("message"),
            )
        if _supervisor_alive(directory):
            return State("running", pid=pid, started=started)
        if pid_record is None and not (directory / supervisor.LAUNCHED).exists():
            return State("absent")  # the agent died between writing the spec and launching
        if pid_record is None:  # launched, but died before starting the job: do not relaunch
            return State(
                "exited",
                exit_code=127,
                reason="StartError",
                message=_tail(directory / "supervisor.err")
                or "the supervisor died before starting the job",
            )
        return State(
            "lost",
            pid=pid,
            started=started,
            message="the supervisor died without recording the exit",
        )

    def launch(self, launch: Launch) -> State:
        """Start an attempt, or report the one already there: never two supervisors."""
        current = self.state(launch.uid)
        if current.phase != "absent":
            return current
        directory = self.attempts_dir / launch.uid
        directory.mkdir(exist_ok=True, mode=0o700)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        supervisor.write_atomically(
            directory / supervisor.SPEC,
            {
                "argv": launch.argv,
                "env": launch.env,
                "cwd": launch.cwd,
                "logPath": str(launch.log_path),
                "gracePeriodSeconds": launch.grace_seconds,
                "leasePath": str(launch.lease_path) if launch.lease_path else None,
                "fenceSeconds": launch.fence_seconds,
            },
        )
        lock_fd = os.open(directory / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self.state(launch.uid)  # a supervisor holds it: already launched
            launched = subprocess.Popen(
                # The supervisor needs the standard library only: started isolated (-I) and without
                # site (-S) it is up in about half the time, which every job start waits for.
                [sys.executable, "-I", "-S", supervisor.__file__, str(directory)],
                pass_fds=(lock_fd,),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(directory / "supervisor.err", "ab"),  # noqa: SIM115
                close_fds=True,
            )
            supervisor.write_atomically(
                directory / supervisor.LAUNCHED,
                {
                    "supervisor": launched.pid,
                    "bootId": supervisor.boot_id(),
                },
            )
        finally:
            os.close(lock_fd)
        return State("running")

    def stop(self, uid: str) -> None:
        """Ask the supervisor to stop the job: SIGTERM, then SIGKILL after the grace period."""
        record = _read(self.attempts_dir / uid / supervisor.PID)
        if record is not None and self.state(uid).phase == "running":
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["supervisor"]), signal.SIGTERM)

    def kill_lost(self, uid: str) -> None:
        """End what is left of an attempt whose supervisor died: its whole process group."""
        record = _read(self.attempts_dir / uid / supervisor.PID)
        # Only in the boot that recorded it: after a reboot the pid is someone else's.
        if record is not None and record.get("bootId") == supervisor.boot_id():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(record["pid"]), signal.SIGKILL)

    def forget(self, uid: str) -> None:
        """Remove a finished attempt's directory (its log stays)."""
        shutil.rmtree(self.attempts_dir / uid, ignore_errors=True)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return document


def _tail(path: Path, limit: int = 300) -> str:
    try:
        return path.read_text(errors="replace").strip()[-limit:]
    except OSError:
        return ""


def _supervisor_alive(directory: Path) -> bool:
    try:
        fd = os.open(directory / LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
