"""A pool's queue, from stored Jobs alone: which Jobs wait in it and in what order.

Plain data, no pydantic: the scheduling pass leaves the Jobs `held` out of its queue and orders
its requests by `order_key` (with `length_key` for the pool's `queueOrder`), and `gctl get jobs
-o wide` and `gctl describe job` number the same queue with `positions` when they print, as
Kueue's visibility API does. The positions are not stored: every Job that starts moves everyone
behind it, and rewriting thousands of queued Jobs for that would cost more than the scheduling.
"""

import math
from collections.abc import Callable, Container, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gctl.api import dependencies, kinds, quantity

DEFAULT_POOL = "default"
FIFO, LONGEST_FIRST = "FIFO", "LongestFirst"  # a GPUPool's spec.queueOrder
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Wire = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
# Stored objects of a kind in one namespace, by name: (kind, namespace, names) -> wires. The
# scheduling pass reads through its Store, the CLI through the driver.
ReadNamed = Callable[[kinds.KindInfo, str, list[str]], list[Wire]]
CHUNK = 500  # names in one read


def key(wire: Wire) -> Key:
    return wire["metadata"].get("namespace", ""), wire["metadata"]["name"]


def pool_of(wire: Wire) -> str:
    return str(wire["spec"].get("pool") or DEFAULT_POOL)


def pending(wire: Wire) -> bool:
    return bool(wire["status"].get("phase", "Pending") == "Pending")


def held(wire: Wire, now: datetime, succeeded: Container[Key] | None = None) -> bool:
    """Whether a pending Job is kept out of its pool's queue: suspended, being deleted,
    waiting out a back-off (`status.retryAfter` still ahead), or waiting for a name in
    `dependsOn` that is not in `succeeded` (what has succeeded is looked up, not trusted from
    the Job's status). The scheduling pass places none of these, nor numbers them.
    `succeeded` None: dependencies are not looked at (what the Job alone says)."""
    retry = wire["status"].get("retryAfter")
    namespace = key(wire)[0]
    return bool(
        wire["spec"].get("suspend")
        or wire["metadata"].get("deletionTimestamp")
        or (retry is not None and datetime.fromisoformat(retry) > now)
        or (
            succeeded is not None
            and any((namespace, d) not in succeeded for d in wire["spec"].get("dependsOn", []))
        )
    )


def queued(wire: Wire, now: datetime, succeeded: Container[Key]) -> bool:
    """A Job in its pool's queue: Pending and not `held`."""
    return pending(wire) and not held(wire, now, succeeded)


def needed(jobs: Iterable[Wire]) -> set[Key]:
    """What the pending Jobs among `jobs` name in `dependsOn`: the names `succeeded` must be
    told of to say which of them are queued."""
    return {
        (key(wire)[0], name)
        for wire in jobs
        if pending(wire)
        for name in wire["spec"].get("dependsOn", [])
    }


def succeeded(found: Iterable[Wire]) -> set[Key]:
    """Of stored Jobs and Sweeps (those named in `dependsOn`), the ones that count as
    succeeded (`dependencies.succeeded`). A name is a Job first: a Sweep counts only where no
    Job of its name is among `found`."""
    found = list(found)
    jobs = {key(w) for w in found if w.get("kind", dependencies.JOB) == dependencies.JOB}
    return {
        key(w)
        for w in found
        if dependencies.succeeded(w) and (w.get("kind") != dependencies.SWEEP or key(w) not in jobs)
    }


def succeeded_among(wanted: Iterable[Key], read: ReadNamed) -> set[Key]:
    """Of the names Jobs wait for (`needed`), those that have succeeded (`succeeded`): read as
    Jobs, then the names no Job holds as Sweeps, a few hundred names a read."""
    wanted = set(wanted)
    found = _read_named(read, kinds.JOB, wanted)
    found += _read_named(read, kinds.SWEEP, wanted - {key(w) for w in found})
    return succeeded(found)


def _read_named(read: ReadNamed, info: kinds.KindInfo, keys: set[Key]) -> list[Wire]:
    names: dict[str, list[str]] = {}
    for namespace, name in sorted(keys):
        names.setdefault(namespace, []).append(name)
    return [
        wire
        for namespace, its in names.items()
        for start in range(0, len(its), CHUNK)
        for wire in read(info, namespace, its[start : start + CHUNK])
    ]


def time_limit(spec: Wire) -> int | None:
    """A stored Job's activeDeadlineSeconds, where the scheduler can use it. One past the
    limit of what apply accepts (stored by an older gctl, or written by hand) counts as none:
    the plan adds deadlines to times, and up on its timeline, where such a one would pass the
    last moment a datetime holds and fail every pass."""
    value = spec.get("activeDeadlineSeconds")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value <= quantity.MAX_DURATION_SECONDS else None


def length_key(order: str, deadline: int | None) -> float:
    """A Job's place among Jobs of equal priority by its pool's `queueOrder`, before the age:
    the same for all in a FIFO pool; in a LongestFirst pool, the longest time limit
    (`activeDeadlineSeconds`) first, a Job without one before every Job with one. Longest
    first (the LPT rule) finishes a batch soonest: the long Jobs start early, and the short
    ones fill the gaps they leave at the end."""
    if order != LONGEST_FIRST:
        return 0.0
    return -math.inf if deadline is None else -float(deadline)


def order_key(
    priority: int, created: datetime | None, name: str, namespace: str, length: float = 0.0
) -> tuple[int, float, datetime, str, str]:
    """Higher priority first, then `length_key`, then older, then by name: the scheduler's
    order too."""
    return (-priority, length, created or EPOCH, name, namespace)


def wire_key(wire: Wire, order: str = FIFO) -> tuple[int, float, datetime, str, str]:
    """`order_key` of a stored Job in a pool whose `queueOrder` is `order`."""
    metadata, spec = wire["metadata"], wire["spec"]
    created = metadata.get("creationTimestamp")
    return order_key(
        int(spec.get("priority", 0)),
        datetime.fromisoformat(created) if created else None,
        metadata["name"],
        metadata.get("namespace", ""),
        length_key(order, time_limit(spec)),
    )


def orders(pools: Iterable[Wire]) -> dict[str, str]:
    """Pool name -> its `queueOrder`, from stored GPUPools (a pool not among them is FIFO)."""
    return {w["metadata"]["name"]: str(w["spec"].get("queueOrder", FIFO)) for w in pools}


def positions(
    jobs: Iterable[Wire],
    now: datetime,
    succeeded: Container[Key],
    pool_orders: Mapping[str, str] | None = None,
) -> dict[Key, int]:
    """(namespace, name) -> place in its pool's queue, 1 being next, for every queued Job
    (`queued`; `succeeded`: the dependencies that have, as `succeeded` finds them;
    `pool_orders`: each pool's `queueOrder`, as `orders` reads them; FIFO where none)."""
    pool_orders = pool_orders or {}
    found: dict[Key, int] = {}
    by_pool: dict[str, list[Wire]] = {}
    for wire in jobs:
        if queued(wire, now, succeeded):
            by_pool.setdefault(pool_of(wire), []).append(wire)
    for pool, waiting in by_pool.items():
        order = pool_orders.get(pool, FIFO)
        ranked = sorted(waiting, key=lambda wire: wire_key(wire, order))
        for place, wire in enumerate(ranked, start=1):
            found[key(wire)] = place
    return found
