"""One agent per node, as one kubelet per node and one slurmd per host: a second agent for the
same node refuses to start, rather than act on the same Bindings and attempt directories (and
start a job twice, or stop the other's jobs).

- On one host: the agent holds an exclusive flock on `agent.lock` in its state directory while
  it runs. The kernel lets go of it when the process dies, so a crashed agent never blocks its
  restart.
- Across hosts (the same --node-name, other state directories, one database): every heartbeat
  records the agent's instance in the Node's status (`AgentInstance`: a random id, host, pid,
  start). An agent refuses a Node that another instance holds, and stops if it finds one at a
  heartbeat (it was taken over). The instances that held this state directory before, named
  in its lock file, are this agent's own predecessors, dead since its lock is ours: never
  rivals. The file keeps every one of them until an agent's claim of the Node commits, so
  that one killed between taking the lock and claiming does not hide the one the Node still
  names. An agent that stops cleanly lets go of the Node. The check and the write are one
  compare-and-set, so of two agents that start together one wins and the other refuses.

Whether the other agent is gone is never read from its heartbeat's time, written by another
host's clock: that is only enough to refuse at once. Otherwise this agent watches the stored
heartbeat on its own monotonic clock, as the controller times nodes out: one that moves is alive
(refused), one that stood still for the other agent's whole silence window (three of its
heartbeats, at least 10 s) and, where longer, until its jobs are sure to have been stopped by
their fence (`Held.gone_after`: its --fence-after, --grace-period and one heartbeat, or those
its jobs were launched with, which the Node records, where longer) is taken over: the attempts
it ran are then reported lost and run again, and must not still run on its host. So hosts'
clocks need not agree.
"""

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from gctl.api import errors, node

LOCK = "agent.lock"
WATCH_POLL_SECONDS = 0.5  # how often a silent agent's heartbeat is read while it is watched

log = logging.getLogger("gctl.agent")


class Taken(errors.AlreadyExists):
    """Another agent acts for this node: this one must not start, or must stop. `held`: the
    other agent's hold on the Node, where it is the Node's heartbeat that says so."""

    def __init__(self, message: str, held: "Held | None" = None) -> None:
        super().__init__(message)
        self.held = held


class StateLock:
    """The flock on a state directory's `agent.lock`, held until `release` or the process's
    end. The file's first line says which instance holds it (id and pid); the lines after it
    name the instances that held it before (`predecessors`), until `claimed`."""

    def __init__(self, state_dir: Path, node_name: str, instance_id: str) -> None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = state_dir / LOCK
        # Not inherited by children (PEP 446): a job that outlives the agent must not keep
        # its state directory locked.
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(self._fd).split()
            self.release()
            pid = f" (pid {holder[1]})" if len(holder) > 1 else ""
            raise Taken(
                f"node {node_name}: another agent{pid} is running with state directory "
                f"{state_dir}; stop it first (one agent per node)"
            ) from None
        # Every instance the file names is dead (or stopped): the lock is ours. The Node may
        # name any of them: one killed before its claim committed never replaced the one
        # before it there, so all are kept until this agent's claim commits.
        lines = _read(self._fd).splitlines()
        self.predecessors = frozenset(line.split()[0] for line in lines if line.split())
        self._mine = f"{instance_id} {os.getpid()}\n"
        self._write(self._mine + "".join(f"{p}\n" for p in sorted(self.predecessors)))

    def claimed(self) -> None:
        """The Node names this agent now: the instances before it need no longer be named."""
        if self._fd is not None:
            self._write(self._mine)

    def _write(self, text: str) -> None:
        """Written over, then cut to size: a kill between the two leaves every predecessor
        named (the text either covers the old one or begins with all it still needs)."""
        assert self._fd is not None
        data = text.encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        # On disk before the agent acts: a power cut could otherwise leave it empty, and the
        # next agent here would not know the Node's holder for its own dead predecessor (it
        # would wait out that one's silence, and its jobs be fenced). Once per start and claim.
        os.fsync(self._fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # and with it the lock
            self._fd = None


def new_instance(
    heartbeat_seconds: float, fence_seconds: float, grace_seconds: float, now: datetime
) -> node.AgentInstance:
    return node.AgentInstance(
        id=uuid.uuid4().hex,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        started=now,
        heartbeat_seconds=heartbeat_seconds,
        fence_seconds=fence_seconds,
        grace_seconds=grace_seconds,
    )


class Held(NamedTuple):
    """Another agent's hold on the Node, as read: its instance, its last heartbeat as written
    by its own host's clock, and how long the Node's jobs outlive that heartbeat
    (`NodeStatus.jobs_outlive_seconds`: jobs it adopted may have a longer fence than its own)."""

    instance: node.AgentInstance
    beat: datetime | None
    outlive: float | None = None

    def gone_after(self) -> float:
        """How long its heartbeat must stand still before it may be taken over: its own
        silence window and fence (`AgentInstance.gone_after`), or its jobs', where longer."""
        return max(self.instance.gone_after(), self.outlive or 0.0)

    def looks_fresh(self, now: datetime) -> bool:
        """Whether its heartbeat is recent by this host's clock: enough to refuse at once (a
        wrong clock then delays a takeover, never allows one), never to take over."""
        if self.beat is None:
            return False
        return abs((now - self.beat).total_seconds()) <= self.instance.silent_after()

    def may_be_gone(self, now: datetime) -> bool:
        """Whether to watch it rather than refuse at once: its heartbeat looks stale by this
        host's clock, or it is an agent of this host whose process is gone."""
        return not self.looks_fresh(now) or self.gone_here()

    def gone_here(self) -> bool:
        """Whether it is an agent of this host whose process is gone: its heartbeat, however
        fresh, is then no sign of life, and its hold is watched rather than refused (its
        state directory's lock file did not name it: another directory, or the file damaged).
        A pid taken since by another process looks alive: refused, as before."""
        if self.instance.hostname != socket.gethostname():
            return False
        try:
            os.kill(self.instance.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # someone else's process: alive
            return False
        return False

    def same(self, other: "Held") -> bool:
        """Whether `other` is this hold, its heartbeat unmoved."""
        return (other.instance.id, other.beat) == (self.instance.id, self.beat)


def held(
    current: node.Node | None, ours: node.AgentInstance, predecessors: frozenset[str]
) -> Held | None:
    """Another agent's hold on the Node: None when it is this agent's, one of its own
    predecessors' (dead: their lock is ours), or no one's (never heartbeated, or let go of)."""
    theirs = current.status.agent_instance if current is not None else None
    if current is None or theirs is None or theirs.id == ours.id or theirs.id in predecessors:
        return None
    return Held(theirs, current.status.heartbeat_time, current.status.jobs_outlive_seconds)


def check(
    current: node.Node | None,
    ours: node.AgentInstance,
    predecessors: frozenset[str],
    now: datetime,
    *,
    silent: Held | None = None,
) -> None:
    """Taken (naming the other agent) if another agent holds the Node, whatever its
    heartbeat's time says: only the hold `silent`, which this agent watched stand still for
    its whole silence window (`claim`), may be taken over, and only while it has not moved."""
    theirs = held(current, ours, predecessors)
    if theirs is None or (silent is not None and silent.same(theirs)):
        return
    assert current is not None
    raise Taken(refusal(current.name, theirs, now), theirs)


def refusal(name: str, theirs: Held, now: datetime, flag: str = "--node-name") -> str:
    """The one-line error naming the agent that holds the Node `name`; `flag` names the
    Node (a virtual agent's: --name-prefix)."""
    instance = theirs.instance
    return (
        f"node {name}: another agent is running for it, on host {instance.hostname} (pid "
        f"{instance.pid}), {_last_beat(theirs, now)}; stop it first, or give this one another "
        f"{flag}"
    )


def claim(
    name: str,
    take: Callable[[Held | None], None],
    read: Callable[[], Held | None],
    clock: Callable[[], datetime],
    stop: threading.Event | None,
) -> bool:
    """Make the Node `name` this agent's: `take` writes this agent's hold (ownership.Taken,
    with the other agent's hold, if there is one it may not take over); `read` reads another
    agent's hold. True once the Node is this agent's.

    A hold whose heartbeat looks fresh by this host's clock is refused at once, but one of an
    agent of this host that is gone (`Held.may_be_gone`). Any other is watched (`watch`); with
    no `stop` to watch with, or once `stop` is set, False (the caller claims again)."""
    try:
        take(None)
        return True
    except Taken as exc:
        theirs = exc.held
        if theirs is None or not theirs.may_be_gone(clock()):
            raise
    if stop is None:
        return False
    seen = watch(name, theirs, read, clock, stop)
    if seen == STOPPED:
        return False
    if seen == LET_GO:
        return claim(name, take, read, clock, stop)
    take(theirs)  # Taken if it beat since the last look
    said_taken_over(name, theirs)
    return True


STOPPED, LET_GO, SILENT = "stopped", "let go", "silent"


def watch(
    name: str,
    theirs: Held,
    read: Callable[[], Held | None],
    clock: Callable[[], datetime],
    stop: threading.Event,
    *,
    flag: str = "--node-name",
) -> str:
    """Watch another agent's hold on the Node `name`, whose heartbeat looks stale, on this
    host's monotonic clock (as the controller times a node out): Taken as soon as its
    heartbeat moves (alive); else SILENT once it stood still for its whole silence window
    (`Held.gone_after`: it may be taken over, while it has not moved), LET_GO if it
    was let go of meanwhile (a clean stop, or the Node deleted: no one's), STOPPED if `stop`
    was set. `flag`: as for `refusal`."""
    window = theirs.gone_after()
    log.warning(
        "node %s: agent on host %s pid %d last beat at %s; waiting up to %gs to see whether it "
        "is alive",
        name,
        theirs.instance.hostname,
        theirs.instance.pid,
        _at(theirs.beat),
        window,
    )
    since = time.monotonic()
    while (left := since + window - time.monotonic()) > 0:
        if stop.wait(min(WATCH_POLL_SECONDS, left)):
            return STOPPED
        seen = read()
        if seen is None:
            return LET_GO
        if not theirs.same(seen):  # it heartbeats: alive
            raise Taken(refusal(name, seen, clock(), flag), seen)
    return SILENT


def said_taken_over(name: str, theirs: Held) -> None:
    log.warning(
        "node %s: taking it over from the agent on host %s pid %d, silent for %gs",
        name,
        theirs.instance.hostname,
        theirs.instance.pid,
        theirs.gone_after(),
    )


def _last_beat(theirs: Held, now: datetime) -> str:
    if theirs.beat is None:
        return "no heartbeat yet"
    age = (now - theirs.beat).total_seconds()
    if theirs.looks_fresh(now):
        return f"last heartbeat {max(0, round(age))}s ago"
    # Stale by this host's clock, though it may be alive: the hosts' clocks may disagree.
    how = "behind" if age > 0 else "ahead of"
    return f"last heartbeat at {_at(theirs.beat)} by its clock, {abs(round(age))}s {how} ours"


def _at(when: datetime | None) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if when is not None else "never"


def _read(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
    return ""
