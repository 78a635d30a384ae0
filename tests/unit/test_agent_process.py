"""`gctl up`'s watch of its agent's process (gctl/cli/daemons.py `_AgentProcess`), on real
child processes."""

import errno
import logging
import os
import signal
import subprocess
import sys

import pytest

from gctl.cli import daemons
from gctl.store import notify


def _watched(command: list[str]) -> "daemons._AgentProcess":
    """A child running `command` (spawned bare: the watch reaps it, as `gctl up` reaps its
    agent), watched as `gctl up` watches its agent. Its `said` pipe's write end is what it
    holds as `stop` (the child writes nothing; a test may, in its place)."""
    pid = os.posix_spawnp(command[0], command, os.environ)
    said, said_w = os.pipe()
    return daemons._AgentProcess(pid, said, said_w)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_the_agents_end_is_seen_with_or_without_a_pidfd(
    monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """Where pidfd_open is refused (Linux before 5.3, a seccomp profile older than it), the
    wait looks every STOP_CHECK_S instead (review: it raised, and `gctl up` could not run)."""
    if not pidfd:

        def refused(_pid: int) -> int:
            raise OSError(errno.ENOSYS, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", refused)
    watched = _watched(["sleep", "0.3"])
    stop = notify.Stop()
    assert watched._wait(stop, timeout=0.05) is None  # still running
    assert watched._wait(stop, timeout=10) == 0
    stop.set()
    assert watched._wait(stop) == 0  # reaped once, remembered
    watched.stop()  # closes its end of `stop`
    os.close(watched._said)


def test_a_stop_ends_the_wait_and_the_agents_own_error_is_its_end() -> None:
    watched = _watched(["sh", "-c", "exit 3"])
    stop = notify.Stop()
    stop.set()
    assert watched._wait(stop) is None
    assert watched._wait(notify.Stop(), timeout=10) is not None
    ended = watched._ended(watched._wait())
    assert str(ended) == f"the node agent's process (pid {watched.pid}) ended (exit 3)"
    watched.stop()
    os.close(watched._said)


def test_the_error_an_agent_ended_with_is_said_whole() -> None:
    """Its first byte read apart from the rest (to tell READY from an error) is not lost, nor
    a message's own first letter taken for the mark that an error follows."""
    watched = _watched(["true"])
    assert watched._stop is not None
    os.write(watched._stop, daemons.ERROR + b"Exited: the node's agent was refused")
    head = os.read(watched._said, len(daemons.READY))
    ended = watched._ended(watched._wait(), "before it started", head)
    assert str(ended) == "Exited: the node's agent was refused"
    watched.stop()
    os.close(watched._said)


@pytest.mark.parametrize("agent_process", [True, False], ids=["agent-process", "own"])
def test_a_second_signal_leaves_at_once_said_by_whoever_says_the_first(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, agent_process: bool
) -> None:
    """A second signal leaves at once. A daemon of its own says so and exits 0; `gctl up`'s
    agent process says nothing (`gctl up` says its signals) and exits SIGNALLED plus the
    signal's number, which `gctl up` names (review: it said "received SIGTERM again" alone
    and exited 0, which `gctl up` called "ended (exit 0)")."""
    exits: list[int] = []

    def exit_now(code: int) -> None:
        exits.append(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    monkeypatch.setattr(logging, "shutdown", lambda: None)  # pytest's own handlers stay
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop, received = daemons._stop_on_signals(agent_process=agent_process)
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        assert (signal.getsignal(signal.SIGINT) == signal.SIG_IGN) is agent_process
        handler(signal.SIGTERM, None)
        assert stop.is_set()
        assert received == ["SIGTERM"]
        assert exits == []
        handler(signal.SIGTERM, None)
    finally:
        for sig, was in saved.items():
            signal.signal(sig, was)
    said = "received SIGTERM again: leaving at once" in caplog.text
    if agent_process:
        assert exits == [daemons.SIGNALLED + signal.SIGTERM]
        assert daemons._signal_of(exits[0]) == "SIGTERM"
        assert not said
    else:
        assert exits == [0]
        assert said


def test_importing_the_agents_modules_opens_nothing_and_starts_no_thread() -> None:
    """`gctl up` imports the agent's modules before it forks the agent: a thread that an
    import started would be missing in the child (and a lock it held, held there for ever), a
    descriptor or a signal handler it opened or set would be the agent's too. In a fresh
    interpreter, as `gctl up` starts."""
    code = """
import os, signal, sys, threading
def state():
    handlers = {s.name: signal.getsignal(s) for s in signal.Signals if s.name[-4:] != "KILL"}
    fds = sorted(os.listdir("/proc/self/fd"))
    return {"descriptors": fds, "threads": threading.active_count(), **handlers}
import gctl.cli.daemons
before = state()
import nodeagent.agent
after = state()
changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
sys.exit(f"importing nodeagent.agent changed: {changed}" if changed else 0)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_daemons_modules_import_no_postgresql_dialect() -> None:
    """SQLAlchemy's PostgreSQL package imports the dialects of its five drivers: 45-75 ms of
    every start on SQLite when the models imported JSONB (docs/decisions.md). The dialect is
    imported where a database on PostgreSQL is opened, not before."""
    code = """
import sys
import controller.manager, gctl.cli.daemons, gctl.store.store, nodeagent.agent
found = sorted(name for name in sys.modules if name.startswith("sqlalchemy.dialects.postgresql"))
sys.exit(f"imported: {found}" if found else 0)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
