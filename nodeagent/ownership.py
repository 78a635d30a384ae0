"""One agent per node, as one kubelet per node and one slurmd per host: a second agent for the
same node refuses to start, rather than act on the same Bindings and attempt directories (and
start a job twice, or stop the other's jobs).

- On one host: the agent holds an exclusive flock on `agent.lock` in its state directory while
  it runs. The kernel lets go of it when the process dies, so a crashed agent never blocks its
  restart.
- Across hosts (the same --node-name, other state directories, one database): every heartbeat
  records the agent's instance in the Node's status (`AgentInstance`: a random id, host, pid,
  start). An agent refuses a Node whose heartbeat is fresh and was written by another instance;
  a stale one (that agent died) does not block. The instance that last held this state
  directory, named in its lock file, is this agent's own predecessor, dead since its lock is
  ours: never a rival. The check and the write are one compare-and-set, so of two agents that
  start together one wins and the other refuses.

Freshness compares the Node's heartbeat time, written by the other host's clock, with this
host's: the hosts' clocks are assumed in step (NTP), as Kubernetes assumes for node leases.
"""

import contextlib
import fcntl
import os
import socket
import uuid
from datetime import datetime
from pathlib import Path

from gctl.api import errors, node

LOCK = "agent.lock"


class Taken(errors.AlreadyExists):
    """Another agent acts for this node: this one must not start, or must stop."""


class StateLock:
    """The flock on a state directory's `agent.lock`, held until `release` or the process's
    end. The file says which instance holds it (`predecessor`: the one that held it before)."""

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
        self.predecessor = next(iter(_read(self._fd).split()), None)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{instance_id} {os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # and with it the lock
            self._fd = None


def new_instance(heartbeat_seconds: float, now: datetime) -> node.AgentInstance:
    return node.AgentInstance(
        id=uuid.uuid4().hex,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        started=now,
        heartbeat_seconds=heartbeat_seconds,
    )


def rival(
    current: node.Node | None,
    ours: node.AgentInstance,
    predecessor: str | None,
    now: datetime,
) -> str | None:
    """Why this agent must not act for the Node: the one-line error naming the other agent
    whose heartbeat is fresh; None when the Node is this agent's, or its own predecessor's,
    or no one's (never heartbeated, or stale)."""
    theirs = current.status.agent_instance if current is not None else None
    beat = current.status.heartbeat_time if current is not None else None
    if current is None or theirs is None or beat is None or theirs.id in (ours.id, predecessor):
        return None
    age = (now - beat).total_seconds()
    if abs(age) > theirs.silent_after():
        return None
    return (
        f"node {current.name}: another agent is running for it, on host {theirs.hostname} "
        f"(pid {theirs.pid}), last heartbeat {max(0, round(age))}s ago; stop it first, or give "
        "this one another --node-name"
    )


def _read(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 200, 0).decode(errors="replace")
    return ""
