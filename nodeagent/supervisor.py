"""The per-attempt supervisor: a small process that outlives the agent.

The agent starts one supervisor per Binding in its own session. The supervisor starts the job's
command as the leader of a new process group, writes `pid.json`, waits, and writes `exit.json`
with the real exit code; so a job keeps running while the agent is down, and a restarted agent
still learns how it ended. SIGTERM to the supervisor stops the job: SIGTERM to the whole group,
then SIGKILL after the grace period, even if the agent died meanwhile.

Run as `python -I -S supervisor.py ATTEMPT_DIR` (ATTEMPT_DIR holds `spec.json`): it must
import nothing but the standard library.
"""

import contextlib
import json
import os
import signal
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
FENCED = "Fenced"  # the reason of an attempt stopped because its agent went silent
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's id: a pid recorded before a reboot names some other process after it."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    """Write JSON so that a reader sees the whole file or none of it, even across a crash."""
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


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


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, sig)


class _Stopper:
    """Turns SIGTERM into a stop of the job's process group, escalated by a timer signal."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.requested = False
        self.pgid: int | None = None

    def on_term(self, _signum: int, _frame: object) -> None:
        if self.requested:
            return
        self.requested = True
        if self.pgid is not None:
            self._begin()

    def on_alarm(self, _signum: int, _frame: object) -> None:
        if self.pgid is not None:
            _kill_group(self.pgid, signal.SIGKILL)

    def started(self, pgid: int) -> None:
        self.pgid = pgid
        if self.requested:  # the stop arrived while the job was being started
            self._begin()

    def _begin(self) -> None:
        assert self.pgid is not None
        _kill_group(self.pgid, signal.SIGTERM)
        signal.setitimer(signal.ITIMER_REAL, max(self.grace, 0.001))


def _fence(lease: Path, fence_seconds: float, log: BinaryIO, fenced: threading.Event) -> None:
    """Stop the job once the agent has not renewed its lease for fence_seconds.

    The controller retries the Jobs of a node that stopped heartbeating elsewhere; the agent's
    timeout for that (--fence-after) is shorter than the controller's (--node-timeout), so a
    job on a node whose agent is gone ends before it can run a second time elsewhere."""
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
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(min(5.0, max(0.2, fence_seconds - silent)))


def supervise(attempt_dir: Path) -> int:
    spec = json.loads((attempt_dir / SPEC).read_text(encoding="utf-8"))
    stopper = _Stopper(float(spec.get("gracePeriodSeconds", 30)))
    fenced = threading.Event()
    signal.signal(signal.SIGTERM, stopper.on_term)
    signal.signal(signal.SIGINT, stopper.on_term)
    signal.signal(signal.SIGALRM, stopper.on_alarm)
    try:
        log = open(spec["logPath"], "ab", buffering=0)  # noqa: SIM115 - closed below
    except OSError as exc:
        write_atomically(
            attempt_dir / EXIT,
            {
                "exitCode": 127,
                "reason": "StartError",
                "finished": time.time(),
                "message": f"cannot open the log {spec['logPath']}: {exc.strerror}",
            },
        )
        return 0
    with log:
        try:
            child = subprocess.Popen(
                spec["argv"],
                cwd=spec.get("cwd") or None,
                env=spec["env"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # The job must not inherit the supervisor's handlers' effects on its mask.
                restore_signals=True,
            )
        except OSError as exc:
            log.write(f"gctl: cannot start {spec['argv'][0]!r}: {exc.strerror}\n".encode())
            write_atomically(
                attempt_dir / EXIT,
                {
                    "exitCode": 127,
                    "reason": "StartError",
                    "message": str(exc),
                    "finished": time.time(),
                },
            )
            return 0
        stopper.started(child.pid)
        write_atomically(
            attempt_dir / PID,
            {
                "supervisor": os.getpid(),
                "pid": child.pid,
                "started": time.time(),
                "bootId": boot_id(),
            },
        )
        if spec.get("leasePath") and spec.get("fenceSeconds"):
            threading.Thread(
                target=_fence,
                args=(Path(spec["leasePath"]), float(spec["fenceSeconds"]), log, fenced),
                daemon=True,
            ).start()
        returncode = child.wait()
        # Processes the job left behind in its group are part of the job: end them too.
        _kill_group(child.pid, signal.SIGKILL)
    code, signal_name = exit_code_of(returncode)
    write_atomically(
        attempt_dir / EXIT,
        {
            "exitCode": code,
            "signal": signal_name,
            "stopped": stopper.requested,
            "reason": FENCED if fenced.is_set() else None,
            "finished": time.time(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
