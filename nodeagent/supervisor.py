"""The per-attempt supervisor: a small process that outlives the agent.

The agent starts one supervisor per Binding in its own session. The supervisor starts the job's
command as the leader of a new process group, writes `pid.json`, waits, and writes `exit.json`
with the real exit code; so a job keeps running while the agent is down, and a restarted agent
still learns how it ended. SIGTERM to the supervisor stops the job: SIGTERM to the whole group,
then SIGKILL after the grace period, even if the agent died meanwhile.

Run as `python -I -S supervisor.py ATTEMPT_DIR LOCK_FD` (ATTEMPT_DIR holds `spec.json`; LOCK_FD
is its locked `lock`, inherited): it must import nothing but the standard library.

Starting an interpreter costs about 30 ms, which every job start would wait for; so the agent
keeps one `supervisor.py --fork-server FD` process (`serve`), started once, that forks a
supervisor for each attempt from its already-loaded interpreter in about a millisecond. The
forked supervisor leaves the server's session at once, so it is as independent of the agent as
one started directly.

An *armed* supervisor (its spec lists `waitFor`, and its directory holds the marker `armed`)
is started ahead, for an attempt bound after others on its GPUs: it waits until the jobs of
those attempts have ended (each supervisor holds its attempt's `lock` until it has recorded its
job's exit; a blocked flock wakes the moment it is released) and then starts the job at once,
without the agent. Exactly one of three renames
of `armed` succeeds, so the attempt starts at most once and every party knows what happened:
to `fired` by the supervisor as it starts the job; to `disarmed` by the agent taking the
attempt back (the scheduler moved it); to `cancelled` by the supervisor stopping before it
started (a stop request, or an agent silent for longer than the fence). It does not fire when
one it waited for ended without an exit record: that job's processes may still hold the GPU,
and the agent decides.
"""

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

SPEC = "spec.json"
LAUNCHED = "launched.json"
PID = "pid.json"
EXIT = "exit.json"
STOP = "stop.json"  # why the agent stops the attempt; written before it sends SIGTERM
FENCED = "Fenced"  # the reason of an attempt stopped because its agent went silent
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# In the attempts directory: touched after each record, to wake the agent at once (the agent
# listens with gctl.store.notify; this file imports nothing of gctl).
NOTIFY = "notify"
# The markers of an armed attempt (see the module's docstring).
ARMED, FIRED, DISARMED, CANCELLED = "armed", "fired", "disarmed", "cancelled"
NOT_STARTED = "stopped before it started"
# The fence is watched by a thread of its own once the job has run this long: most short jobs
# end first, and a thread costs a job about 0.4 ms of CPU to start and end. The agent that
# launched the job was alive a moment before (an armed job checks the lease as it starts).
FENCE_WATCH_AFTER_S = 0.2
_STOPS = {signal.SIGTERM, signal.SIGINT}  # the signals that ask a supervisor to stop the job


_BOOT: list[str] = []  # this boot's id, once read: no process outlives its boot


def boot_id() -> str:
    """This boot's id: a pid recorded before a reboot names some other process after it. Read
    once a process (the fork server reads it for every supervisor it forks); a read that failed
    (out of descriptors, say) is tried again next time, not kept."""
    if not _BOOT:
        try:
            _BOOT.append(BOOT_ID.read_text().strip())
        except OSError:
            return ""
    return _BOOT[0]


def write_atomically(path: Path, document: dict[str, Any], *, durable: bool = True) -> None:
    """Write JSON so that a reader sees the whole file or none of it, even across a crash;
    `durable`: and it survives a power cut (fsync), which costs milliseconds. Written as bytes
    with the os module's calls: a text file's layers cost a just-forked supervisor some 45
    page faults more (a fifth of a millisecond), and the exit record is on the hand-off's
    path."""
    temporary = path.with_suffix(".tmp")
    _write(temporary, os.O_TRUNC, document, durable)
    os.replace(temporary, path)


def write_new(path: Path, document: dict[str, Any], *, durable: bool = False) -> None:
    """Write JSON into a file that must not exist yet, in place: for a record no one may read
    before it is whole (`durable` as in `write_atomically`)."""
    _write(path, os.O_EXCL, document, durable)


def _write(path: Path, flag: int, document: dict[str, Any], durable: bool) -> None:
    data = memoryview(json.dumps(document).encode())  # json.dump: a pure-Python encoder
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag | os.O_CLOEXEC, 0o666)
    try:
        while data:
            data = data[os.write(fd, data) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def record(attempt_dir: Path, name: str, document: dict[str, Any]) -> None:
    """Write one of the attempt's records and wake the agent."""
    write_atomically(attempt_dir / name, document)
    ring(attempt_dir)


def ring(attempt_dir: Path) -> None:
    """Wake the agent: something about this attempt changed."""
    bell = attempt_dir.parent / NOTIFY
    try:
        os.utime(bell)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            os.close(os.open(bell, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError:
        pass


def exit_code_of(returncode: int) -> tuple[int, str | None]:
    """Popen's return code as a shell reports it: 128+N for a death by signal N."""
    if returncode >= 0:
        return returncode, None
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return 128 + number, name


def file_clock_now(path: Path) -> int:
    """Now, as the kernel stamps files (ns), by touching `path` (which exists): the kernel uses
    a coarse clock that may lag time.time() by a few ms, so a marker written right after the
    job starts could look older than a time.time() taken before it. Comparing file times with
    file times avoids that."""
    os.utime(path)
    return os.stat(path).st_mtime_ns


def make_ahead(path: Path) -> None:
    """Create the temporary file of a record `write_atomically` writes later, which then reuses
    it: on some file systems a new file costs a third of a millisecond, and the exit record is
    on the path from one job's end to the start of the job armed behind it."""
    os.close(os.open(path.with_suffix(".tmp"), os.O_CREAT | os.O_WRONLY, 0o600))


def success_file_record(path: str | None, cwd: str | None, since_ns: int) -> dict[str, Any]:
    """What became of the job's success file: Found if it exists and was created or modified
    (mtime or ctime) at or after `since_ns`, else Missing; relative paths resolve as the job's
    own working directory does. Empty when the Job names no success file."""
    if not path:
        return {}
    full = os.path.abspath(os.path.join(cwd or "", path))
    try:
        stat = os.stat(full)
    except OSError:
        written = False
    else:
        written = max(stat.st_mtime_ns, stat.st_ctime_ns) >= since_ns
    return {"successFile": "Found" if written else "Missing", "successFilePath": full}


def start_error(exc: OSError | ValueError, program: str, cwd: str | None) -> str:
    """Why the job could not start, for its log: Popen's error names the working directory
    when it was the chdir that failed, else the program."""
    if not isinstance(exc, OSError):
        return f"cannot start {program!r}: {exc}"
    if cwd and exc.filename == cwd:
        return f"cannot start in working directory {cwd!r}: {exc.strerror}"
    return f"cannot start {program!r}: {exc.strerror}"


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, sig)


class _Stopper:
    """Turns SIGTERM into a stop of the job's process group: first the job's warning signal
    (when it asked for one and the stop allows it), then SIGTERM, then SIGKILL after the grace
    period (a fence's stop: after `fence_grace` at most); each step is started by a timer
    signal."""

    def __init__(
        self,
        attempt_dir: Path,
        grace: float,
        warning: dict[str, Any] | None,
        fence_grace: float | None = None,
    ) -> None:
        self.attempt_dir = attempt_dir
        self.grace = grace
        self.fence_grace = fence_grace
        self.warning = warning
        self.requested = False
        self.pgid: int | None = None
        self._next = signal.SIGTERM
        self.warned = False  # the warning signal went out and SIGTERM has not yet

    def on_term(self, _signum: int, _frame: object) -> None:
        if self.requested:
            request = self._request()
            # A stop that allows no warning (a delete, a fence) cuts a warning short.
            if self.warned and self.pgid is not None and not request.get("warn", True):
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._send()
            # A fence that comes while the job has its grace period after SIGTERM cuts that
            # short to the fence's.
            elif self._next == signal.SIGKILL and (cut := self._fence_grace(request)) is not None:
                left, _ = signal.getitimer(signal.ITIMER_REAL)
                if left > cut:
                    signal.setitimer(signal.ITIMER_REAL, max(cut, 0.001))
            return
        self.requested = True
        if self.pgid is not None:
            self._begin()

    def on_alarm(self, _signum: int, _frame: object) -> None:
        if self.pgid is not None:
            self._send()

    def started(self, pgid: int) -> None:
        self.pgid = pgid
        if self.requested:  # the stop arrived while the job was being started
            self._begin()

    def _begin(self) -> None:
        assert self.pgid is not None
        if self.warning and self._request().get("warn", True):
            self.warned = True
            _kill_group(self.pgid, signal.Signals[self.warning["signal"]])
            signal.setitimer(signal.ITIMER_REAL, float(self.warning["seconds"]))
        else:
            self._send()

    def _request(self) -> dict[str, Any]:
        return read_json(self.attempt_dir / STOP) or {}

    def _fence_grace(self, request: dict[str, Any]) -> float | None:
        """The grace period a stop by the fence allows, where `request` is one."""
        return self.fence_grace if request.get("reason") == FENCED else None

    def _send(self) -> None:
        """SIGTERM with the grace timer armed, or, after the grace period, SIGKILL."""
        assert self.pgid is not None
        self.warned = False
        _kill_group(self.pgid, self._next)
        if self._next == signal.SIGTERM:
            self._next = signal.SIGKILL
            cut = self._fence_grace(self._request())
            grace = self.grace if cut is None else min(self.grace, cut)
            signal.setitimer(signal.ITIMER_REAL, max(grace, 0.001))


def read_json(path: str | Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as file:
            document: dict[str, Any] = json.loads(file.read())
    except (OSError, ValueError):
        return None
    return document


def _fence(
    attempt_dir: Path, lease: Path, fence_seconds: float, log: BinaryIO, fenced: threading.Event
) -> None:
    """Stop the job once the agent has not renewed its lease for fence_seconds.

    The controller retries the Jobs of a node that stopped heartbeating elsewhere only once
    this fence and its grace period are over (the agent records them on its Node), so a job
    on a node whose agent is gone ends before it can run a second time elsewhere."""
    while True:
        try:
            silent = time.time() - lease.stat().st_mtime
        except OSError:
            silent = fence_seconds + 1  # no lease at all: the agent is gone
        if silent > fence_seconds:
            message = (
                f"gctl: the node agent has been silent for {int(silent)}s; stopping "
                "this job so that it cannot run twice\n"
            )
            log.write(message.encode())
            fenced.set()
            # No warning period: the job must be gone before the controller retries it.
            write_atomically(attempt_dir / STOP, {"warn": False, "reason": FENCED})
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(min(5.0, max(0.2, fence_seconds - silent)))


def _runs_on(child: subprocess.Popen[bytes]) -> bool:
    """Whether the job is still running FENCE_WATCH_AFTER_S after it started (without a pidfd,
    as on Linux before 5.3: taken to be)."""
    try:
        fd = os.pidfd_open(child.pid)
    except OSError:
        return True
    try:
        # Readable once the job has exited; a signal's handler runs and the wait goes on.
        return not select.select([fd], [], [], FENCE_WATCH_AFTER_S)[0]
    finally:
        os.close(fd)


class _Interrupted(Exception):
    """A signal came while an armed supervisor waited: look at why before waiting on."""


class _Turn:
    """An armed supervisor's wait for the attempts before it to end. Until `decided`, SIGTERM
    interrupts a blocked wait (the agent took the attempt back, or asks it to stop: the markers
    say which, and are looked at before each wait); after, it is a stop of the job like any
    other, handed to the stopper."""

    def __init__(self, attempt_dir: Path, spec: dict[str, Any], stopper: _Stopper) -> None:
        self.attempt_dir = attempt_dir
        self.spec = spec
        self.stopper = stopper
        self.decided = False
        self.blocked = False  # in the flock call: a signal must get it out

    def on_term(self, signum: int, frame: object) -> None:
        if self.decided:
            self.stopper.on_term(signum, frame)
        elif self.blocked:
            raise _Interrupted

    def wait(self) -> bool:
        """Wait until every attempt before this one has ended; True when the job may start
        now (`armed` renamed to `fired`), False when it must not (taken back, stopped or
        fenced: the records say which)."""
        pending = [Path(path) for path in self.spec["waitFor"]]
        while pending and self._still_armed():
            try:
                self._released(pending[0])
            except _Interrupted:
                continue
            pending.pop(0)
        self.decided = True  # from here on a SIGTERM is a stop request like any other
        if not self._still_armed():
            return self._cancel(stopped=True) if (self.attempt_dir / STOP).exists() else False
        if self.spec.get("leasePath") and self.spec.get("fenceSeconds"):
            silent = _silence(Path(self.spec["leasePath"]))
            if silent > float(self.spec["fenceSeconds"]):
                message = f"the node agent has been silent for {int(silent)}s: not started"
                return self._cancel(stopped=False, reason=FENCED, message=message)
        before = [Path(path).parent for path in self.spec["waitFor"]]
        if any(d.exists() and not (d / EXIT).exists() for d in before):
            # One before it ended without an exit record: its processes may still be on the
            # GPU. Not started; the agent, which kills what is left, decides again.
            self._rename(CANCELLED)
            return False
        return self._rename(FIRED)

    def _released(self, lock: Path) -> None:
        """Block until no supervisor holds `lock` (its attempt ended), or a signal comes."""
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:  # its directory was tidied away: it ended long ago
            return
        try:
            self.blocked = True
            # A request that came before `blocked` was set raised nothing: seen here instead
            # (the agent changes the markers before it signals).
            if self._still_armed():
                fcntl.flock(fd, fcntl.LOCK_SH)  # granted once the holder's exclusive lock goes
        finally:
            self.blocked = False
            os.close(fd)

    def _still_armed(self) -> bool:
        return (self.attempt_dir / ARMED).exists() and not (self.attempt_dir / STOP).exists()

    def _rename(self, to: str) -> bool:
        try:
            os.rename(self.attempt_dir / ARMED, self.attempt_dir / to)
        except FileNotFoundError:  # the agent took it back first
            return False
        return True

    def _cancel(
        self, *, stopped: bool, reason: str | None = None, message: str = NOT_STARTED
    ) -> bool:
        """Stop before the job started, with an exit record saying so (no exit code)."""
        if self._rename(CANCELLED):
            record(
                self.attempt_dir,
                EXIT,
                {
                    "exitCode": None,
                    "stopped": stopped,
                    "notStarted": True,
                    "reason": reason,
                    "message": message,
                    "finished": time.time(),
                },
            )
        return False


def _silence(lease: Path) -> float:
    """Seconds since the agent last renewed its lease (a missing lease: forever)."""
    try:
        return time.time() - lease.stat().st_mtime
    except OSError:
        return float("inf")


def _inherit_no_ignored_signals() -> None:
    """Take back to their default the signals this process inherited ignored (`nohup gctl up`
    ignores SIGHUP), so that the job does not inherit them: Popen's restore_signals resets only
    those Python itself ignores (SIGPIPE, SIGXFSZ), which this process keeps ignoring.

    glibc's two signals of its own, 32 and 33, count too: a process started by glibc's
    posix_spawn has them ignored (GNU make starts its recipes so: `make demo` ran every job
    with signal 32 ignored), and neither Python nor glibc's sigaction may change them."""
    kept = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP}
    valid = signal.valid_signals()
    for number in ignored_signals() - kept:
        if number in valid:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(number, signal.SIG_DFL)
        else:
            set_disposition(number, ignore=False)


def ignored_signals() -> set[int]:
    """The signals this process ignores, as the kernel sees them (SigIgn in /proc)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            line = next(line for line in status if line.startswith("SigIgn:"))
        mask = int(line.split()[1], 16)
        return {bit + 1 for bit in range(mask.bit_length()) if mask >> bit & 1}
    return set()


# rt_sigaction(2) by number, for the signals that glibc's sigaction refuses to touch.
_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}


def set_disposition(number: int, *, ignore: bool) -> bool:
    """Set signal `number` to SIG_IGN or SIG_DFL with the system call itself; whether it could
    (not on a machine whose system call number is unknown here, nor without ctypes or a C
    library to call: the fork server calls this before it serves, and must not die of it)."""
    call = _RT_SIGACTION.get(os.uname().machine)
    if call is None:
        return False
    try:
        import ctypes  # only here: most processes never need it

        libc = ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return False
    # struct sigaction as the kernel reads it: handler, flags, restorer, mask (all zero but
    # the handler: 1 is SIG_IGN, 0 is SIG_DFL).
    action = (ctypes.c_ulong * 4)(int(ignore), 0, 0, 0)
    size = 8  # the kernel's sigset_t: 64 signals
    return bool(libc.syscall(call, number, ctypes.byref(action), None, size) == 0)


def _popen(spec: dict[str, Any], argv: list[str], log: BinaryIO) -> subprocess.Popen[bytes]:
    """Start `argv` as the attempt's job: in its working directory, with its environment, its
    output into the log, in a session of its own."""
    return subprocess.Popen(
        argv,
        cwd=spec.get("cwd") or None,
        env=spec["env"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # The job must not inherit the supervisor's handlers' effects on its mask.
        restore_signals=True,
    )


def _rehearse(spec: dict[str, Any], log: BinaryIO) -> None:
    """Go through Popen's Python code once, for an armed job while the job before it runs,
    without starting anything: a command with a NUL byte is refused before any fork.

    A supervisor forked from the fork server shares the server's memory until it writes to
    it, and the first Popen call touches some 150 pages of it that are then copied: about a
    millisecond, more on a busy machine, which would be the hand-off's. Rehearsed, the call
    at the hand-off takes what a later call takes."""
    with contextlib.suppress(Exception):  # a rehearsal that fails changes nothing
        _popen(spec, ["\0"], log)


def open_log(path: str) -> BinaryIO:
    """The job's log, to append to, its directories made if need be (the last one, the Job
    uid's, 0o700 as the logs directory is; those above it as the umask says): here rather
    than in the agent, whose launches follow one another while supervisors start side by
    side."""
    try:
        return open(path, "ab", buffering=0)
    except FileNotFoundError:
        Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return open(path, "ab", buffering=0)


def supervise(attempt_dir: Path, lock_fd: int | None = None) -> int:
    """Run the attempt in `attempt_dir`; `lock_fd`: its locked `lock`, let go as soon as the
    exit is recorded (a job armed behind this one waits for it), not when this process ends.
    The signals the job must not inherit ignored are taken back by the caller
    (`_inherit_no_ignored_signals`): the fork server does it once for every supervisor it
    forks, which saves each of them a millisecond."""
    # Launched, before anything can fail: a supervisor found dead without a pid record but
    # with this one died before starting the job, and the attempt is not launched again.
    write_atomically(
        attempt_dir / LAUNCHED, {"supervisor": os.getpid(), "bootId": boot_id()}, durable=False
    )
    spec = json.loads((attempt_dir / SPEC).read_bytes())
    fence_grace = spec.get("fenceGraceSeconds")
    stopper = _Stopper(
        attempt_dir,
        float(spec.get("gracePeriodSeconds", 30)),
        spec.get("stopWarning"),
        None if fence_grace is None else float(fence_grace),
    )
    fenced = threading.Event()
    signal.signal(signal.SIGALRM, stopper.on_alarm)
    log = None
    if spec.get("waitFor"):
        # The log is opened while the job before this one still runs, off the hand-off's path;
        # on failure it is opened again after the wait, where the failure is recorded.
        with contextlib.suppress(OSError):
            log = open_log(spec["logPath"])
        if log is not None:
            _rehearse(spec, log)
        turn = _Turn(attempt_dir, spec, stopper)
        signal.signal(signal.SIGTERM, turn.on_term)
        signal.signal(signal.SIGINT, turn.on_term)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # blocked by the fork server
        if not turn.wait():
            ring(attempt_dir)  # it ended without starting the job: the agent looks again
            return 0
    else:
        signal.signal(signal.SIGTERM, stopper.on_term)
        signal.signal(signal.SIGINT, stopper.on_term)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    try:
        log = log or open_log(spec["logPath"])
    except OSError as exc:
        record(
            attempt_dir,
            EXIT,
            {
                "exitCode": 127,
                "reason": "StartError",
                "finished": time.time(),
                "message": f"cannot open the log {spec['logPath']}: {exc.strerror}",
            },
        )
        return 0
    with log:
        # Only a success file is compared with it; the touch is an inode write otherwise wasted
        since_ns = file_clock_now(attempt_dir / LAUNCHED) if spec.get("successFile") else 0
        try:
            child = _popen(spec, spec["argv"], log)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the command
            log.write(f"gctl: {start_error(exc, spec['argv'][0], spec.get('cwd'))}\n".encode())
            record(
                attempt_dir,
                EXIT,
                {
                    "exitCode": 127,
                    "reason": "StartError",
                    "message": str(exc),
                    "finished": time.time(),
                },
            )
            return 0
        stopper.started(child.pid)
        record(
            attempt_dir,
            PID,
            {
                "supervisor": os.getpid(),
                "pid": child.pid,
                "started": time.time(),
                "bootId": boot_id(),
            },
        )
        with contextlib.suppress(OSError):  # only a head start: the record makes it anyway
            make_ahead(attempt_dir / EXIT)  # while the job runs
        if spec.get("leasePath") and spec.get("fenceSeconds") and _runs_on(child):
            threading.Thread(
                target=_fence,
                args=(
                    attempt_dir,
                    Path(spec["leasePath"]),
                    float(spec["fenceSeconds"]),
                    log,
                    fenced,
                ),
                daemon=True,
            ).start()
        returncode = child.wait()
        # Processes the job left behind in its group are part of the job: end them too.
        _kill_group(child.pid, signal.SIGKILL)
    code, signal_name = exit_code_of(returncode)
    # The job has ended: no stop or timer may signal its process group from here on, as the
    # GPU goes to the next job with the exit record, before this process ends.
    signal.setitimer(signal.ITIMER_REAL, 0)
    for stop in _STOPS:
        signal.signal(stop, signal.SIG_IGN)
    # Checked here, as the job exits, not when the agent learns of it: the agent may be down,
    # and by the time it is back the file may have been removed or rewritten by someone else.
    marker = success_file_record(spec.get("successFile"), spec.get("cwd"), since_ns)
    record_exit(
        attempt_dir,
        {
            "exitCode": code,
            "signal": signal_name,
            "stopped": stopper.requested,
            "reason": FENCED if fenced.is_set() else None,
            "finished": time.time(),
            **marker,
        },
        lock_fd,
    )
    return 0


def record_exit(attempt_dir: Path, document: dict[str, Any], lock_fd: int | None) -> None:
    """Write the job's exit record, let the attempt armed behind this one start (by letting go
    of `lock_fd`, the attempt's locked `lock`), then make the record durable and wake the agent.

    The hand-off waits for the record to be there, not on disk: an fsync takes milliseconds
    while the agent and the database write too. A power cut between the two leaves the record
    empty or absent, which reads as an attempt that ended without one: it is reported lost.
    The agent is woken last, as its pass would compete for the CPU with the job starting."""
    path = attempt_dir / EXIT
    write_atomically(path, document, durable=False)
    if lock_fd is not None:
        os.close(lock_fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    ring(attempt_dir)


class _ErrorFile:
    """A forked supervisor's `sys.stderr`: `supervisor.err` in its attempt's directory, made at
    its first write. Nearly every supervisor writes nothing, and a file made for each was one
    of the ten an attempt made (on an ext4 without a journal, the file system of the machine
    the benchmarks run on, making a file took a millisecond of the kernel's time beside files
    recently removed). What only the interpreter's C code writes (a fatal error) is lost."""

    def __init__(self, directory: int) -> None:
        # The attempt's directory, held open: the file is made in it even once the agent has
        # moved it into the trash (a write at the very end), never in a new attempt's made
        # under the same name.
        self._directory = directory
        # Two threads' first writes make one file; reentrant, for a signal's handler's write.
        self._lock = threading.RLock()
        self._file: Any = None

    def write(self, text: str) -> int:
        with self._lock:
            if self._file is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                fd = os.open("supervisor.err", flags, 0o600, dir_fd=self._directory)
                # Kept open for the rest of this short life; os._exit ends it.
                self._file = open(fd, "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
            written: int = self._file.write(text)
            self._file.flush()
        return written

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()


def _forked(attempt_dir: Path, server: socket.socket, lock_fd: int | None) -> int:
    """In the child of the fork server: become an independent supervisor of `attempt_dir`."""
    server.close()
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it; waiting needs it
    directory = os.open(attempt_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    sys.stderr = _ErrorFile(directory)
    return supervise(attempt_dir, lock_fd)


def serve(server: socket.socket) -> int:
    """The fork server: each message is an attempt directory with the locked `lock` descriptor
    attached (SCM_RIGHTS); the reply is the new supervisor's pid. Ends when the agent closes
    its end (or dies)."""
    _inherit_no_ignored_signals()  # before its own, which its supervisors take back
    boot_id()  # read once, for all of them
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(server, 4096, 1)
        except OSError:
            return 0
        if not message:
            return 0
        # A stop may come the moment the supervisor exists: held until its handlers are in.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        pid = os.fork()
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        if pid == 0:
            code = 1
            try:
                code = _forked(Path(os.fsdecode(message)), server, fds[0] if fds else None)
            except BaseException:
                # Into `supervisor.err`, whose tail the agent reports; os._exit prints nothing.
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        for fd in fds:  # the supervisor holds the lock now
            os.close(fd)
        try:
            server.send(str(pid).encode())
        except OSError:
            return 0


if __name__ == "__main__":
    if sys.argv[1] == "--fork-server":
        sys.exit(serve(socket.socket(fileno=int(sys.argv[2]))))
    _inherit_no_ignored_signals()
    sys.exit(supervise(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None))
