"""A pool's queue, from stored Jobs alone: which Jobs wait and in what order.

Plain data, no pydantic: the scheduler orders its requests by `order_key`, and `gctl get jobs -o
wide` and `gctl describe job` number the queue with `positions` when they print, as Kueue's
visibility API does. The positions are not stored: every Job that starts moves everyone behind
it, and rewriting thousands of queued Jobs for that would cost more than the scheduling.
"""

from datetime import UTC, datetime
from typing import Any

DEFAULT_POOL = "default"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Wire = dict[str, Any]


def pool_of(wire: Wire) -> str:
    return str(wire["spec"].get("pool") or DEFAULT_POOL)


def queued(wire: Wire) -> bool:
    """A Job in its pool's queue: Pending, not suspended, not being deleted."""
    return (
        wire["status"].get("phase", "Pending") == "Pending"
        and not wire["spec"].get("suspend")
        and not wire["metadata"].get("deletionTimestamp")
    )


def order_key(
    priority: int, created: datetime | None, name: str, namespace: str
) -> tuple[int, datetime, str, str]:
    """Higher priority first, then older, then by name: the scheduler's order too."""
    return (-priority, created or EPOCH, name, namespace)


def wire_key(wire: Wire) -> tuple[int, datetime, str, str]:
    metadata = wire["metadata"]
    created = metadata.get("creationTimestamp")
    return order_key(
        int(wire["spec"].get("priority", 0)),
        datetime.fromisoformat(created) if created else None,
        metadata["name"],
        metadata.get("namespace", ""),
    )


def positions(jobs: list[Wire]) -> dict[tuple[str, str], int]:
    """(namespace, name) -> place in its pool's queue, 1 being next, for every queued Job."""
    found: dict[tuple[str, str], int] = {}
    by_pool: dict[str, list[Wire]] = {}
    for wire in jobs:
        if queued(wire):
            by_pool.setdefault(pool_of(wire), []).append(wire)
    for waiting in by_pool.values():
        for place, wire in enumerate(sorted(waiting, key=wire_key), start=1):
            found[(wire["metadata"].get("namespace", ""), wire["metadata"]["name"])] = place
    return found
