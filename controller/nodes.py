"""The Node lifecycle: a node whose heartbeat is older than the timeout becomes NotReady and its
attempts are marked Lost, so their Jobs are retried on other nodes.

When the agent comes back it finds those attempts Lost and stops whatever still runs of them.
"""

from datetime import datetime, timedelta

from gctl.api import meta, node
from gctl.store import store

SOURCE = "controller/nodes"


def reconcile(writer: store.Store, name: str, now: datetime, timeout: timedelta) -> datetime | None:
    n = writer.find(node.Node, name)
    if n is None or n.status.heartbeat_time is None:
        return None
    due = n.status.heartbeat_time + timeout
    if now < due:
        return due
    message = f"no heartbeat for {int((now - n.status.heartbeat_time).total_seconds())}s"
    if meta.set_condition(
        n.status.conditions, "Ready", "Unknown", "NodeStatusUnknown", message, now=now
    ):
        n = writer.update_status(n)
        writer.record_event(n, "NodeNotReady", message, type_="Warning", source=SOURCE)
    for attempt in writer.active_bindings(name):
        attempt.status.phase = "Lost"
        attempt.status.reason = "NodeLost"
        attempt.status.message = f"node {name}: {message}"
        attempt.status.finish_time = now
        writer.update_status(attempt)
    return None
