"""The agent's Node: registered and heartbeated with its GPUs as discovered, each GPU's
processes told apart (gctl's jobs' from the others), and a job that uses more GPU memory than
it declared stopped where its pool enforces that.

The spec is the user's (cordons, drains), the status the agent's: a stored spec that does not
validate (an older gctl, a hand edit) stops none of the agent's writes, which touch the status
only, or the node would fall silent and its running jobs be fenced (docs/decisions.md)."""

import logging
import os
import socket
from datetime import datetime
from typing import Any, NamedTuple

import gctl
from gctl.api import binding, errors, meta, node, quantity
from gctl.store import db, store, stored
from nodeagent import ownership, runtime

log = logging.getLogger("gctl.agent")


class SpecUnread(NamedTuple):
    """A Node whose stored spec does not validate: why, and the spec as stored."""

    error: errors.StoredInvalid
    spec: Any


def _current(writer: store.Store, name: str) -> tuple[node.Node | None, SpecUnread | None]:
    """The Node as stored; where its spec does not validate, a stand-in with a default spec,
    to write the status with (`Store.update_status` keeps the stored spec), and why.
    StoredInvalid if more than the spec fails."""
    try:
        return writer.find(node.Node, name), None
    except errors.StoredInvalid as exc:
        rows = writer.list_wire(node.Node, names=[name])
        if not rows:  # deleted since (PostgreSQL): as if it had not been found
            return None, None
        stand_in = stored.validated(node.Node, {**rows[0], "spec": {}})
        return stand_in, SpecUnread(exc, rows[0].get("spec", {}))


def _spec_of(unread: SpecUnread | None) -> Any:
    return unread.spec if unread is not None else None


def claim(
    database: db.Database,
    name: str,
    instance: node.AgentInstance,
    predecessors: frozenset[str],
    now: datetime,
    *,
    silent: ownership.Held | None = None,
) -> None:
    """Make the Node this agent's before it acts for it (`ownership`): ownership.Taken if
    another agent holds it (but `silent`, watched silent, unmoved), else its instance and
    heartbeat written (not Ready: that waits for the first `beat`)."""

    def work(writer: store.Store) -> None:
        current, unread = _current(writer, name)
        ownership.check(current, instance, predecessors, now, silent=silent)
        if current is not None:
            # Its jobs_outlive_seconds stays the agent's before it until the first heartbeat,
            # which knows the fences of the jobs it adopted (`Agent._jobs_outlive`).
            current.status.agent_instance = instance
            current.status.heartbeat_time = now
            writer.update_status(current, stored_spec=_spec_of(unread))

    store.transact(database, work)


def held(
    database: db.Database, name: str, instance: node.AgentInstance, predecessors: frozenset[str]
) -> ownership.Held | None:
    """Another agent's hold on the Node, as stored now (`ownership.held`)."""
    with database.read() as session:
        current, _ = _current(store.Store(session), name)
    return ownership.held(current, instance, predecessors)


def release(database: db.Database, name: str, instance: node.AgentInstance) -> None:
    """An agent that stops lets go of its Node, so that another may start for it at once
    (its heartbeat stays: the controller still judges the node by it)."""

    def work(writer: store.Store) -> None:
        current, unread = _current(writer, name)
        theirs = current.status.agent_instance if current is not None else None
        if current is not None and theirs is not None and theirs.id == instance.id:
            current.status.agent_instance = None
            writer.update_status(current, stored_spec=_spec_of(unread))

    store.transact(database, work)


def beat(
    database: db.Database,
    name: str,
    labels: dict[str, str],
    discovered: list[node.GPUInfo],
    now: datetime,
    *,
    instance: node.AgentInstance | None = None,
    predecessors: frozenset[str] = frozenset(),
    address: str | None = None,
    outlive: float | None = None,
) -> SpecUnread | None:
    """Register or refresh the Node: GPUs as discovered now, heartbeat, Ready, the address
    other nodes reach it at (None: its hostname). With the
    agent's `instance`: ownership.Taken if another agent has taken the Node meanwhile; and
    `outlive`, how long its jobs may run on after this heartbeat (`Agent._jobs_outlive`).
    Returns why the stored spec does not validate, if it does not (the status is written all
    the same)."""

    def work(writer: store.Store) -> SpecUnread | None:
        current, unread = _current(writer, name)
        if instance is not None:
            ownership.check(current, instance, predecessors, now)
        if current is None:
            current = writer.create(node.Node(metadata=meta.ObjectMeta(name=name, labels=labels)))
            writer.record_event(
                current, "Registered", f"{len(discovered)} GPU(s)", source=f"agent/{name}"
            )
        elif unread is None and any(current.metadata.labels.get(k) != v for k, v in labels.items()):
            # Not while the spec does not validate: this write would replace it with the default.
            current.metadata.labels = {**current.metadata.labels, **labels}
            current = writer.update(current)
        status = current.status
        status.gpus = discovered
        status.heartbeat_time = now
        status.hostname = socket.gethostname()
        status.address = address
        status.agent_version = gctl.__version__
        status.agent_instance = instance or status.agent_instance
        if instance is not None:
            status.jobs_outlive_seconds = outlive
        meta.set_condition(
            status.conditions, "Ready", "True", "AgentReady", "the agent is heartbeating", now=now
        )
        writer.update_status(current, stored_spec=_spec_of(unread))
        return unread

    return store.transact(database, work)


def attribute(
    database: db.Database, name: str, attempts: runtime.Runtime, discovered: list[node.GPUInfo]
) -> list[node.GPUInfo]:
    """Tell this node's jobs' processes from the others on each GPU (a job runs in a session
    of its own, led by the pid its supervisor recorded): the Node lists only the others, and
    a job that uses more GPU memory than it declared is stopped where its pool asks for that."""
    skipped: list[errors.StoredInvalid] = []  # not read, but gctl's: not someone else's
    with database.read() as session:
        reader = store.Store(session)
        running = reader.active_bindings(name, frozenset({"Running"}), skipped=skipped)
    by_session: dict[int | None, binding.Binding] = {}
    for bound in running:
        pid = attempts.state(bound.metadata.uid or "").pid
        if pid is not None:
            by_session[pid] = bound
    unread = {attempts.state(invalid.uid).pid for invalid in skipped} - {None}
    used: dict[str, dict[int, int]] = {}
    for gpu in discovered:
        others = []
        for process in gpu.processes:
            leader = _session_of(process.pid)
            owner = by_session.get(leader)
            if owner is not None:
                per_gpu = used.setdefault(owner.metadata.uid or "", {})
                per_gpu[gpu.index] = per_gpu.get(gpu.index, 0) + (process.used_memory or 0)
            elif leader not in unread:
                others.append(process)
        gpu.processes = others
    for bound in running:
        _enforce_memory(attempts, bound, used.get(bound.metadata.uid or "", {}))
    return discovered


def _enforce_memory(
    attempts: runtime.Runtime, bound: binding.Binding, used: dict[int, int]
) -> None:
    limit = bound.spec.gpu_memory
    if not bound.spec.enforce_gpu_memory or limit is None:
        return
    over = {index: amount for index, amount in used.items() if amount > limit}
    if not over:
        return
    index, amount = max(over.items(), key=lambda item: item[1])
    message = (
        f"used {quantity.format_bytes(amount)} of GPU {index}'s memory, more than its "
        f"gpuMemory {quantity.format_bytes(limit)}; its pool enforces declared memory"
    )
    log.warning("stopping %s: %s", bound.name, message)
    attempts.stop(
        bound.metadata.uid or "", warn=False, reason=binding.STOP_GPU_MEMORY, message=message
    )


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone, or in another PID namespace (a container): not one of ours
        return None
