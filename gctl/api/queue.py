"""A pool's queue, from stored Jobs alone: which Jobs wait in it and in what order.

Plain data, no pydantic: the scheduling pass leaves the Jobs `held` out of its queue and orders
its requests by `order_key` (with `length_key` for the pool's `queueOrder`), and `gctl get jobs
-o wide` and `gctl describe job` number the same queue with `positions` when they print, as
Kueue's visibility API does. The positions are not stored: every Job that starts moves everyone
behind it, and rewriting thousands of queued Jobs for that would cost more than the scheduling.

A stored Job that does not validate (written by an older gctl, or by hand in the database) may
hold anything where a field should be: what cannot be read of it makes it out of the queue
here, held and unnumbered, so that `get` lists it. The scheduling pass reads `strict`ly
instead: the error names that Job, which the pass then sets aside (controller.reading).
"""

import math
from collections.abc import Callable, Container, Iterable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from gctl.api import dependencies, kinds, quantity

DEFAULT_POOL = "default"
FIFO, LONGEST_FIRST = "FIFO", "LongestFirst"  # a GPUPool's spec.queueOrder
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Wire = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
Rank = tuple[int, float, datetime, str, str]  # a Job's place in its queue: `order_key`
# Stored objects of a kind in one namespace, by name: (kind, namespace, names) -> wires. The
# scheduling pass reads through its Store, the CLI through the driver.
ReadNamed = Callable[[kinds.KindInfo, str, list[str]], list[Wire]]
CHUNK = 500  # names in one read
# What reading a stored Job that does not validate raises: a spec that is no mapping, a time
# that is no ISO text, a priority that is no number.
UNREADABLE = (AttributeError, KeyError, TypeError, ValueError)
T = TypeVar("T")


def _unless_malformed(
    read: Callable[[], T], info: kinds.KindInfo, wire: Wire, instead: T, strict: bool = False
) -> T:
    """`read()` of a stored object; where it cannot read one that does not validate, `instead`.
    `strict`, or where the object validates (a bug here), the error is raised."""
    try:
        return read()
    except UNREADABLE:
        if strict or not kinds.malformed(info.kind, wire):
            raise
        return instead


def key(wire: Wire) -> Key:
    return wire["metadata"].get("namespace", ""), wire["metadata"]["name"]


def pool_of(wire: Wire) -> str:
    spec = wire["spec"]
    return str((spec.get("pool") if isinstance(spec, dict) else None) or DEFAULT_POOL)


def pending(wire: Wire) -> bool:
    return bool(wire["status"].get("phase", "Pending") == "Pending")


def held(
    wire: Wire, now: datetime, succeeded: Container[Key] | None = None, *, strict: bool = False
) -> bool:
    """Whether a pending Job is kept out of its pool's queue: suspended, being deleted,
    waiting out a back-off (`status.retryAfter` still ahead), or waiting for a name in
    `dependsOn` that is not in `succeeded` (what has succeeded is looked up, not trusted from
    the Job's status). The scheduling pass places none of these, nor numbers them.
    `succeeded` None: dependencies are not looked at (what the Job alone says). A Job that
    does not validate, where this cannot read it, is held too; `strict`: it raises instead."""
    try:  # not through `_unless_malformed`: the pass asks this of every pending Job
        return _held(wire, now, succeeded)
    except UNREADABLE:
        if strict or not kinds.malformed(kinds.JOB.kind, wire):
            raise
        return True


def may_hold(wire: Wire) -> bool:
    """Whether anything could hold a pending Job as stored back (`held`), whatever the time
    and whichever Jobs have succeeded: it is suspended, deleted, in back-off or depends on
    others. One that does not validate, where this cannot read it, may."""
    try:
        spec, status = wire["spec"], wire["status"]
        return bool(
            spec.get("suspend")
            or spec.get("dependsOn")
            or status.get("retryAfter") is not None
            or wire["metadata"].get("deletionTimestamp")
        )
    except UNREADABLE:
        return True


def _held(wire: Wire, now: datetime, succeeded: Container[Key] | None) -> bool:
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
    """A Job in its pool's queue: Pending, not `held`, and with its place (`wire_key`); a
    Job that does not validate, where this cannot read it, is not."""
    return _queue_key(wire, now, succeeded, FIFO) is not None


def _queue_key(wire: Wire, now: datetime, succeeded: Container[Key], order: str) -> Rank | None:
    """`wire_key` of a `queued` Job; None for one that is not."""

    def read() -> Rank | None:
        if not pending(wire) or _held(wire, now, succeeded):
            return None
        return wire_key(wire, order)

    return _unless_malformed(read, kinds.JOB, wire, None)


def needed(jobs: Iterable[Wire], *, strict: bool = False) -> set[Key]:
    """What the pending Jobs among `jobs` name in `dependsOn`: the names `succeeded` must be
    told of to say which of them are queued. A Job that does not validate, where this cannot
    read it, names none (it is `held`); `strict`: it raises instead."""
    found: set[Key] = set()
    for wire in jobs:  # as `held`, for speed
        try:
            if pending(wire) and (names := wire["spec"].get("dependsOn")):
                found.update((key(wire)[0], name) for name in names)
        except UNREADABLE:
            if strict or not kinds.malformed(kinds.JOB.kind, wire):
                raise
    return found


def succeeded(found: Iterable[Wire]) -> set[Key]:
    """Of stored Jobs and Sweeps (those named in `dependsOn`), the ones that count as
    succeeded (`dependencies.succeeded`). A name is a Job first: a Sweep counts only where no
    Job of its name is among `found`."""
    found = list(found)
    jobs = {key(w) for w in found if w.get("kind", dependencies.JOB) == dependencies.JOB}
    return {
        key(w)
        for w in found
        if _succeeded(w) and (w.get("kind") != dependencies.SWEEP or key(w) not in jobs)
    }


def _succeeded(wire: Wire) -> bool:
    """`dependencies.succeeded`; one that does not validate, where that cannot read it, has
    not: what waits for it waits on."""
    info = kinds.BY_KIND[str(wire.get("kind", dependencies.JOB))]
    return _unless_malformed(partial(dependencies.succeeded, wire), info, wire, False)


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
) -> Rank:
    """Higher priority first, then `length_key`, then older, then by name: the scheduler's
    order too."""
    return (-priority, length, created or EPOCH, name, namespace)


def wire_key(wire: Wire, order: str = FIFO) -> Rank:
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
    """Pool name -> its `queueOrder`, from stored GPUPools (a pool not among them is FIFO, as
    is one that does not validate, where this cannot read it: the pass leaves it out)."""
    found = {
        w["metadata"]["name"]: _unless_malformed(partial(_order, w), kinds.GPUPOOL, w, None)
        for w in pools
    }
    return {name: order for name, order in found.items() if order is not None}


def _order(pool: Wire) -> str | None:
    return str(pool["spec"].get("queueOrder", FIFO))


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
    by_pool: dict[str, list[tuple[Rank, Wire]]] = {}
    for wire in jobs:
        pool = pool_of(wire)
        if (rank := _queue_key(wire, now, succeeded, pool_orders.get(pool, FIFO))) is not None:
            by_pool.setdefault(pool, []).append((rank, wire))
    found: dict[Key, int] = {}
    for waiting in by_pool.values():
        waiting.sort(key=lambda keyed: keyed[0])
        for place, (_, wire) in enumerate(waiting, start=1):
            found[key(wire)] = place
    return found
