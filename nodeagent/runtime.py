"""The processes of this node's attempts, one supervisor each, found again after any restart.

Each Binding gets a directory named by its uid. Before launching the supervisor the agent takes
an exclusive flock on `lock` in it and hands the locked descriptor to the supervisor, which
holds it until it has recorded the job's exit (or exits without). So "is the lock held" says
whether the supervisor may still write, with no pid to trust and no window between launching it
and it taking the lock; `pid.json` and `exit.json` (written atomically by the supervisor) say
what happened to the job.

Supervisors are started through the agent's fork server (forkserver.py); the directories of
ended attempts are removed in a thread of their own (`_Tidier`).
"""

import contextlib
import fcntl
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent import forkserver, supervisor

LOCK = "lock"
log = logging.getLogger("gctl.agent")


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
    # The agent's --grace-period: at most this long between the SIGTERM and the SIGKILL of a
    # job its fence stops, whatever its own grace period. A node is taken over once a silent
    # agent's jobs are sure to be gone, counting the agent's grace (AgentInstance.gone_after).
    fence_grace_seconds: float | None = None
    stop_warning: tuple[str, int] | None = None  # (signal name, seconds before SIGTERM)
    success_file: str | None = None  # the Job's spec.successFile, checked by the supervisor
    # Armed: the `lock` files of the attempts that must end first (`Runtime.lock_path`). The
    # supervisor starts at once and waits for them, then starts the job (supervisor.py).
    wait_for: tuple[Path, ...] = ()


@dataclass(frozen=True)
class State:
    """Where an attempt stands on this host.

    phase: absent (never started here: no trace, or an armed supervisor that ended without
    starting it), armed (its supervisor waits for the attempts before it), disarming (taken
    back from its armed supervisor, which has yet to end), running, exited, or lost (the
    supervisor died without recording an exit). An attempt is not launched again while it is
    disarming, so that the old supervisor cannot mistake a new `armed` marker for its own."""

    phase: str
    pid: int | None = None
    started: float | None = None  # when the supervisor started the job (epoch seconds)
    finished: float | None = None  # when its supervisor saw it end (epoch seconds)
    exit_code: int | None = None
    signal: str | None = None
    stopped: bool = False
    reason: str | None = None
    message: str | None = None
    success_file: str | None = None  # Found or Missing, when the Job names a success file
    success_path: str | None = None  # that file, resolved as the job's working directory does


MAX_ENDED_KEPT = 10_000  # ended attempts' states kept; emptied when full


class Runtime:
    def __init__(self, state_dir: Path) -> None:
        self.attempts_dir = state_dir / "attempts"
        self._attempts = str(self.attempts_dir)
        self.logs_dir = state_dir / "logs"
        self.attempts_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._forker = forkserver.ForkServer()
        # Supervisors started in a fresh interpreter are this process's children: reaped by
        # `settle` once they end.
        self._direct: list[subprocess.Popen[bytes]] = []
        self._tidier = _Tidier(state_dir / "trash")
        # The states read from an exit record, by uid: a record that never changes, read at
        # each pass (and for the attempts bound after it) until the attempt is forgotten.
        self._ended: dict[str, State] = {}
        self._said_damaged: set[str] = set()  # the records said to be unreadable, by path

    def close(self) -> None:
        """Stop the fork server and the tidier. Supervisors keep running; those started in a
        fresh interpreter that have ended are reaped."""
        self._forker.close()
        self._tidier.close()
        self._direct = [started for started in self._direct if started.poll() is None]

    def log_path(self, namespace: str, job: str, job_uid: str, attempt: int) -> Path:
        """Where a new attempt's output goes: under the Job's uid as well as its name, so that
        a Job deleted and created again under its name (a new uid) starts with no log, as a
        Pod does, while a rerun's attempts (the same Job) sit beside each other."""
        return self.logs_dir / namespace / job / job_uid / f"attempt-{attempt}.log"

    def launched_log(self, uid: str) -> str | None:
        """The log an attempt's supervisor writes, as its launch record names it (None: never
        prepared here). What the agent reports, rather than `log_path` computed again: an
        attempt launched by an agent of an earlier version writes where that one said."""
        spec = supervisor.read_json(self.attempts_dir / uid / supervisor.SPEC)
        path = spec.get("logPath") if spec else None
        # None as well where the supervisor never opened it (it could not make the log, or
        # died first): there is no log to point at, and `gctl logs` says why it never started.
        return path if isinstance(path, str) and os.path.exists(path) else None

    def lock_path(self, uid: str) -> Path:
        """The file an attempt's supervisor holds locked until the job's exit is recorded."""
        return self.attempts_dir / uid / LOCK

    def known(self) -> list[str]:
        """Uids of every attempt this host has a directory for."""
        return sorted(p.name for p in self.attempts_dir.iterdir() if p.is_dir())

    def fences(self) -> list[float | None]:
        """For each attempt alive here (running or armed), how long its job may run on after
        the agent's lease was last renewed: its fence and the grace the fence gives it, as its
        supervisor read them at launch (an agent started since with other flags changes
        neither); None for one with no fence."""
        found: list[float | None] = []
        for uid in self.known():
            if self.state(uid).phase not in ("running", "armed", "disarming"):
                continue
            spec = supervisor.read_json(self.attempts_dir / uid / supervisor.SPEC) or {}
            fence = spec.get("fenceSeconds") if spec.get("leasePath") else None
            if not fence:
                found.append(None)
                continue
            grace = spec.get("fenceGraceSeconds")
            if grace is None:
                grace = spec.get("gracePeriodSeconds", 0)
            found.append(float(fence) + float(grace))
        return found

    def state(self, uid: str) -> State:
        if (ended := self._ended.get(uid)) is not None:
            return ended
        # Paths as strings: the agent asks every attempt's state at every pass, and pathlib's
        # joins took a third of it.
        directory = os.path.join(self._attempts, uid)
        if not os.path.exists(os.path.join(directory, supervisor.SPEC)):
            return State("absent")
        # Liveness first, then the records: a supervisor writes its exit record before it lets
        # go of its lock, so one whose lock is free has written whatever it ever will (read the
        # other way round, an attempt that ends between the two reads would look lost). A free
        # lock is "not alive" below even while the process finishes after its exit record.
        alive = _supervisor_alive(directory)
        damaged: list[str] = []
        exit_record = _record(os.path.join(directory, supervisor.EXIT), damaged)
        pid_record = _record(os.path.join(directory, supervisor.PID), damaged)
        pid = started = None
        if pid_record is not None:
            try:
                pid, started = int(pid_record["pid"]), float(pid_record["started"])
            except (KeyError, TypeError, ValueError):  # JSON, but not a pid record
                pid_record = None
                damaged.append(os.path.join(directory, supervisor.PID))
        if damaged:
            self._say_damaged(uid, damaged)
        if exit_record is not None:
            stopped = bool(exit_record.get("stopped"))
            stop = os.path.join(directory, supervisor.STOP)
            request = (supervisor.read_json(stop) or {}) if stopped else {}
            if len(self._ended) >= MAX_ENDED_KEPT:
                self._ended.clear()
            state = self._ended[uid] = State(
                "exited",
                pid=pid,
                started=started,
                exit_code=exit_record.get("exitCode"),
                signal=exit_record.get("signal"),
                stopped=stopped,
                reason=exit_record.get("reason") or request.get("reason"),
                message=exit_record.get("message") or request.get("message"),
                success_file=exit_record.get("successFile"),
                success_path=exit_record.get("successFilePath"),
                finished=_seconds(exit_record.get("finished")),
            )
            return state
        if alive:
            if pid_record is None and os.path.exists(os.path.join(directory, supervisor.ARMED)):
                return State("armed")
            if pid_record is None and os.path.exists(os.path.join(directory, supervisor.DISARMED)):
                return State("disarming")  # taken back; its supervisor has yet to end
            return State("running", pid=pid, started=started)
        if pid_record is None and any(
            os.path.exists(os.path.join(directory, marker))
            for marker in (supervisor.ARMED, supervisor.DISARMED, supervisor.CANCELLED)
        ):
            # An armed supervisor that died waiting, was taken back, or gave up because one
            # before it ended without an exit record: the job never started, and may be
            # launched again.
            return State("absent")
        if pid_record is None and not os.path.exists(os.path.join(directory, supervisor.LAUNCHED)):
            # Never launched (the agent died before), or the supervisor died before its first
            # write: the job did not start either way.
            return State("absent")
        if pid_record is None and not damaged:
            # Launched, but died before starting the job: do not relaunch.
            return State(
                "exited",
                exit_code=127,
                reason="StartError",
                message=_tail(Path(directory, "supervisor.err"))
                or "the supervisor died before starting the job",
            )
        if damaged:  # not the supervisor's doing: it writes each record whole, by a rename
            what = " and ".join(os.path.basename(path) for path in damaged)
            message = f"its supervisor ended, and its {what} cannot be read (empty or damaged)"
        else:
            message = "the supervisor died without recording the exit"
        return State("lost", pid=pid, started=started, message=message)

    def _say_damaged(self, uid: str, paths: list[str]) -> None:
        """Say once, in the agent's log, which records of an attempt cannot be read: a power
        cut may leave one empty (they are not all synced), a hand or a disk may damage one."""
        for path in paths:
            if path not in self._said_damaged:
                self._said_damaged.add(path)
                log.warning(
                    "attempt %s: its record %s cannot be read (empty or damaged)", uid, path
                )

    def prepare(self, launch: Launch) -> None:
        """Write what `launch` needs on disk ahead of it (the attempt stays absent until it is
        launched): `launch(prepared=True)` then only starts the supervisor."""
        self._ended.pop(launch.uid, None)
        directory = self.attempts_dir / launch.uid
        try:
            directory.mkdir(mode=0o700)
            fresh = True
        except FileExistsError:  # prepared before: an armed supervisor's records may be there
            fresh = False
            for stale in (
                supervisor.LAUNCHED,
                supervisor.FIRED,
                supervisor.CANCELLED,
                supervisor.DISARMED,
            ):
                (directory / stale).unlink(missing_ok=True)  # of one that gave up
        # The log's directories are the supervisor's to make (`supervisor.open_log`).
        # The launch records need not survive a power cut, which ends every job with them: an
        # attempt found without them after a reboot is absent (a Running one is reported lost,
        # a Starting one starts). Not syncing them takes two fsyncs off every job's start.
        # A new directory has no reader yet (its supervisor is started after): the record is
        # written in place, a rename less; a torn one left by a crash reads as absent, and is
        # replaced whole when the attempt is prepared again.
        write = supervisor.write_new if fresh else supervisor.write_atomically
        write(
            directory / supervisor.SPEC,
            {
                "argv": launch.argv,
                "env": launch.env,
                "cwd": launch.cwd,
                "logPath": str(launch.log_path),
                "gracePeriodSeconds": launch.grace_seconds,
                "leasePath": str(launch.lease_path) if launch.lease_path else None,
                "fenceSeconds": launch.fence_seconds,
                "fenceGraceSeconds": launch.fence_grace_seconds,
                "stopWarning": None
                if launch.stop_warning is None
                else {"signal": launch.stop_warning[0], "seconds": launch.stop_warning[1]},
                "successFile": launch.success_file,
                "waitFor": [str(path) for path in launch.wait_for],
            },
            durable=False,
        )
        marker = directory / supervisor.ARMED
        if launch.wait_for:
            marker.write_bytes(b"")  # its supervisor's pid is written into it once known
        elif not fresh:
            marker.unlink(missing_ok=True)

    def launch(self, launch: Launch, *, prepared: bool = False) -> State:
        """Start an attempt, or report the one already there: never two supervisors.
        `prepared`: `prepare(launch)` was called for it already."""
        current = self.state(launch.uid)
        if current.phase != "absent":
            return current
        if not prepared:
            self.prepare(launch)
        directory = self.attempts_dir / launch.uid
        lock_fd = os.open(directory / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self.state(launch.uid)  # a supervisor holds it: already launched
            # A forked supervisor writes `launched.json` first thing, off the agent's path. One
            # in a fresh interpreter may fail to start at all, so it is written for it here,
            # before it starts (after, the two writers would share the temporary file).
            if self._forker.fork(directory, armed=bool(launch.wait_for), lock_fd=lock_fd):
                return State("running")  # an armed one's pid is noted by `settle`
            supervisor.write_atomically(
                directory / supervisor.LAUNCHED, {"bootId": supervisor.boot_id()}, durable=False
            )
            started = forkserver.start_supervisor(directory, lock_fd)
            self._direct.append(started)
            pid = started.pid
            if launch.wait_for:
                _note_armed_pid(directory, pid)
        finally:
            os.close(lock_fd)
        return State("running")

    def settle(self) -> None:
        """Note the pids of the armed supervisors forked since the last call in their markers
        (`_note_armed_pid`), and reap the supervisors started in a fresh interpreter that have
        ended. The agent calls it once a pass, after its launches: waiting for each fork's
        reply as it is made would cost every launch the fork's time."""
        for directory, pid in self._forker.replies():
            _note_armed_pid(directory, pid)
        self._direct = [started for started in self._direct if started.poll() is None]

    def stop(
        self, uid: str, *, warn: bool = True, reason: str | None = None, message: str | None = None
    ) -> None:
        """Ask the supervisor to stop the job: its warning signal first (if it asked for one
        and `warn`), then SIGTERM, then SIGKILL after the grace period. A `reason` given here
        is the one the attempt reports when it has exited."""
        self.settle()
        directory = self.attempts_dir / uid
        record = supervisor.read_json(directory / supervisor.PID)
        phase = self.state(uid).phase
        if phase == "armed":  # not started: its supervisor ends it before it starts
            record = _armed_record(directory)
        elif phase != "running":
            return
        elif record is None and (directory / supervisor.PID).exists():
            # Its pid record cannot be read: its launch record names the supervisor too (one
            # with no pid record yet has not started the job, and finds the stop when it does).
            record = supervisor.read_json(directory / supervisor.LAUNCHED)
        elif record is None:
            return
        # The first request says why; one that allows no warning replaces a warned one.
        if not warn or not (directory / supervisor.STOP).exists():
            supervisor.write_atomically(
                directory / supervisor.STOP,
                {"warn": warn, "reason": reason, "message": message},
            )
        _terminate(record)

    def disarm(self, uid: str) -> bool:
        """Take an armed attempt back from its supervisor before it starts the job: True if
        taken (the supervisor ends without starting it), False if it started meanwhile (or
        stopped, or was never armed): then its state says what became of it."""
        self.settle()
        directory = self.attempts_dir / uid
        try:
            os.rename(directory / supervisor.ARMED, directory / supervisor.DISARMED)
        except FileNotFoundError:
            if not (directory / supervisor.DISARMED).exists():
                return False
            # Taken back before: the supervisor may not have been told then.
        _terminate(_armed_record(directory))
        return True

    def kill_lost(self, uid: str) -> None:
        """End what is left of an attempt whose supervisor died: its whole process group."""
        record = supervisor.read_json(self.attempts_dir / uid / supervisor.PID)
        # Only in the boot that recorded it: after a reboot the pid is someone else's.
        if record is not None and record.get("bootId") == supervisor.boot_id():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(record["pid"]), signal.SIGKILL)

    def forget(self, uid: str) -> None:
        """Remove a finished attempt's directory (its log stays): moved out of `attempts` at
        once, so the attempt is absent from then on, and removed by the tidier."""
        self._tidier.remove(self.attempts_dir / uid)
        self._ended.pop(uid, None)


def _record(path: str, damaged: list[str]) -> dict[str, Any] | None:
    """A supervisor's record, None where there is none; one there that cannot be read is None
    too, and its path is added to `damaged`."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError:
        damaged.append(path)
        return None
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    if isinstance(document, dict):
        return document
    damaged.append(path)
    return None


def _note_armed_pid(directory: Path, pid: int) -> None:
    """Write an armed supervisor's pid into its `armed` marker, so that a request to stop it
    or take it back reaches it before it has written `launched.json` itself (it holds its
    lock, and so looks armed, from the moment it is forked). Never creates the marker: gone,
    the supervisor has fired already."""
    try:
        fd = os.open(directory / supervisor.ARMED, os.O_WRONLY | os.O_TRUNC)
    except FileNotFoundError:
        return
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def _armed_record(directory: Path) -> dict[str, object] | None:
    """Whom to signal about an armed attempt: the pid in its marker (armed, or disarmed once
    taken back), else its own launch record."""
    for marker in (supervisor.ARMED, supervisor.DISARMED):
        with contextlib.suppress(OSError, ValueError):
            return {"supervisor": int((directory / marker).read_text())}
    return supervisor.read_json(directory / supervisor.LAUNCHED)


def _terminate(record: dict[str, object] | None) -> None:
    """SIGTERM the supervisor a record names, if it names one. A supervisor that has not yet
    written it finds the request (or the marker) in its directory when it looks."""
    pid = record.get("supervisor") if record else None
    if isinstance(pid, int):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


class _Tidier:
    """Removes the directories of ended attempts in a thread of its own. Removing one takes a
    dozen unlinks, milliseconds on a busy disk, that the agent's pass would otherwise spend
    between one GPU's hand-off and the next: the pass only renames the directory into
    `trash` (one rename, on the same file system), and this thread removes what is there,
    including what a killed agent left."""

    def __init__(self, trash: Path) -> None:
        self.trash = trash
        self.trash.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._count = itertools.count()
        self._work = threading.Event()
        self._closing = False
        self._work.set()  # what an earlier agent left
        self._thread = threading.Thread(target=self._run, daemon=True, name="agent-tidy")
        self._thread.start()

    def remove(self, directory: Path) -> None:
        # Unique in the trash: the same attempt may be forgotten again (armed, given back,
        # launched anew and ended) before its first directory is gone.
        target = self.trash / f"{directory.name}.{os.getpid()}.{next(self._count)}"
        try:
            os.rename(directory, target)
        except FileNotFoundError:
            return
        except OSError as exc:  # not movable: removed here, as before
            log.warning("cannot move %s to %s (%s); removing it in place", directory, target, exc)
            shutil.rmtree(directory, ignore_errors=True)
            return
        self._work.set()

    def _run(self) -> None:
        while True:
            self._work.wait()
            self._work.clear()
            try:
                entries = sorted(self.trash.iterdir())
            except OSError as exc:  # the state directory went away under it
                log.warning("cannot list %s (%s)", self.trash, exc)
                entries = []
            for entry in entries:
                shutil.rmtree(entry, ignore_errors=True)
            if self._closing:
                return

    def close(self) -> None:
        self._closing = True
        self._work.set()
        self._thread.join(timeout=5)


def _seconds(value: object) -> float | None:
    """An epoch-seconds field of a record, if it holds one."""
    return float(value) if isinstance(value, int | float) else None


def _tail(path: Path, limit: int = 300) -> str:
    try:
        return path.read_text(errors="replace").strip()[-limit:]
    except OSError:
        return ""


def _supervisor_alive(directory: str | Path) -> bool:
    try:
        fd = os.open(os.path.join(directory, LOCK), os.O_RDWR)
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
