"""The Node lifecycle: a node whose heartbeat has not moved for the timeout becomes NotReady, and
its attempts are marked Lost once its jobs' fence has stopped them too (`outlive`), so their
Jobs are retried on other nodes.

As in Kubernetes, the timeout runs on the controller's own clock from when it last *saw* the
heartbeat change, never from the time the agent wrote: so clock skew between hosts cannot flap
a node, and a controller that restarts gives every node a full timeout before judging it.
When the agent comes back it finds those attempts Lost and stops whatever still runs of them.
"""

from datetime import datetime, timedelta

from gctl.api import binding, meta, node
from gctl.store import store

SOURCE = "controller/nodes"

# node name -> (the heartbeat last read, when this controller first read it, and how long the
# node's jobs outlive its heartbeat as the Node said then: kept for when the Node is deleted)
Seen = dict[str, tuple[datetime | None, datetime, float]]


def reconcile(
    writer: store.Store, name: str, now: datetime, timeout: timedelta, seen: Seen
) -> datetime | None:
    return _reconcile(writer, name, writer.find(node.Node, name), now, timeout=timeout, seen=seen)


def reconcile_many(
    writer: store.Store, names: list[str], now: datetime, timeout: timedelta, seen: Seen
) -> dict[str, datetime]:
    """`reconcile` for many Nodes in one transaction, read in one query: after a heartbeat of
    hundreds of nodes, one read instead of hundreds. Returns when each wants to run again
    (those that do)."""
    found = {n.name: n for n in writer.find_many(node.Node, "", names)}
    due = {}
    for name in names:
        when = _reconcile(writer, name, found.get(name), now, timeout=timeout, seen=seen)
        if when is not None:
            due[name] = when
    return due


def _reconcile(
    writer: store.Store,
    name: str,
    n: node.Node | None,
    now: datetime,
    *,
    timeout: timedelta,
    seen: Seen,
) -> datetime | None:
    if n is None:
        # Its jobs may run on (its agent alive, or not yet fenced): lost once they cannot, as
        # for a silent node, counted from the heartbeat last seen move, where this controller
        # saw one. An agent alive registers the Node again meanwhile, and they run on.
        last = seen.get(name)
        if last is not None and now < (lost := last[1] + timedelta(seconds=last[2])):
            return lost
        seen.pop(name, None)
        _lose_attempts(writer, name, "the node was deleted", now)
        return None
    heartbeat = n.status.heartbeat_time
    previous = seen.get(name)
    if previous is None or previous[0] != heartbeat:
        seen[name] = (heartbeat, now, outlive(n))
    observed = seen[name][1]
    due = observed + timeout
    if now < due:
        return due
    message = f"no heartbeat for {int((now - observed).total_seconds())}s"
    if meta.set_condition(
        n.status.conditions, "Ready", "Unknown", "NodeStatusUnknown", message, now=now
    ):
        n = writer.update_status(n)
        writer.record_event(n, "NodeNotReady", message, type_="Warning", source=SOURCE)
    lost = observed + max(timeout, timedelta(seconds=seen[name][2]))
    if now < lost:
        return lost  # NotReady, taking no new work; its jobs may still run until then
    _lose_attempts(writer, name, message, now)
    return None


def outlive(n: node.Node) -> float:
    """Seconds the node's jobs may still run after its agent's last heartbeat: until their
    fence has stopped them (`AgentInstance.jobs_outlive`; 0 where its agent has no fence, or
    is older than the record). Its attempts are retried elsewhere no sooner, so that a Job
    never runs in two places at once, whatever the agent's --fence-after and --grace-period
    against the controller's --node-timeout."""
    seconds = n.status.jobs_outlive_seconds
    if seconds is None and n.status.agent_instance is not None:
        seconds = n.status.agent_instance.jobs_outlive()
    return seconds or 0.0


def _lose_attempts(writer: store.Store, name: str, message: str, now: datetime) -> None:
    """Mark the node's attempts Lost, except those bound ahead and not taken: they never
    started, and the next scheduling pass moves them off the node (or unbinds them)."""
    for attempt in writer.active_bindings(name):
        if binding.queued(attempt.spec, attempt.status):
            continue
        attempt.status.phase = "Lost"
        attempt.status.reason = binding.REASON_NODE_LOST
        attempt.status.message = message
        attempt.status.finish_time = now
        writer.update_status(attempt)
