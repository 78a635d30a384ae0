"""The controller's loop: wake on the change feed or a due timer, reconcile what changed.

A change to a Job or to one of its Bindings reconciles that Job; a change to a Node reconciles
the Node; a change that can free or need GPUs runs a scheduling pass (a heartbeat alone does
not). Reconcilers return when they want to run again (deadlines, back-offs, heartbeat
timeouts); the loop keeps those in a heap. Each reconcile is its own transaction, retried from
a fresh read on a conflict; an error in one is logged and retried, and never stops the loop.
"""

import functools
import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from controller import jobs, nodes, scheduling
from gctl.api import job, meta, node
from gctl.store import db, feed, store

log = logging.getLogger("gctl.controller")
SCHEDULE = ("schedule", "", "")
RESYNC = ("resync", "", "")
Key = tuple[str, str, str]  # kind, namespace, name


def _node_shape(wire: dict[str, Any]) -> tuple[Any, ...]:
    """What of a Node matters to scheduling: not its heartbeat or GPU utilization."""
    ready = [c.get("status") for c in wire["status"].get("conditions", []) if c["type"] == "Ready"]
    gpus = [(g["index"], g["model"], g.get("memoryTotal")) for g in wire["status"].get("gpus", [])]
    return (wire["metadata"].get("deletionTimestamp"), str(wire["spec"]), ready, gpus)


class Controller:
    def __init__(
        self,
        database: db.Database,
        *,
        node_timeout: timedelta = timedelta(seconds=40),
        backoff_base: timedelta = jobs.BACKOFF_BASE,
        clock: Callable[[], datetime] = meta.utcnow,
    ) -> None:
        self.db = database
        self.node_timeout = node_timeout
        self.backoff_base = backoff_base
        self.clock = clock
        self._changes: queue.Queue[list[store.Change] | None] = queue.Queue()
        self._timers: list[tuple[datetime, Key]] = []
        self._seen: nodes.Seen = {}
        self._node_shapes: dict[str, tuple[Any, ...]] = {}

    def reconcile(self, key: Key) -> None:
        kind, namespace, name = key
        now = self.clock()

        def work(writer: store.Store) -> datetime | None:
            if kind == "Job":
                return jobs.reconcile(writer, namespace, name, now, self.backoff_base)
            if kind == "Node":
                return nodes.reconcile(writer, name, now, self.node_timeout, self._seen)
            return scheduling.schedule(writer, now)

        due = store.transact(self.db, work)
        if due is not None:
            heapq.heappush(self._timers, (due, key))

    def resync(self) -> set[Key]:
        """Every object, as on start: level-based, so nothing that happened while down is lost."""
        with self.db.read() as session:
            reader = store.Store(session)
            keys: set[Key] = {("Job", j.namespace, j.name) for j in reader.list_objects(job.Job)}
            keys |= {("Node", "", n.name) for n in reader.list_objects(node.Node)}
        return keys | {SCHEDULE}

    def _keys_of(self, changes: list[store.Change]) -> set[Key]:
        keys: set[Key] = set()
        finished = False
        for change in changes:
            if change.kind == "Job":
                keys |= {("Job", change.namespace, change.name), SCHEDULE}
                finished |= change.object["status"].get("phase") in job.FINISHED_PHASES
            elif change.kind == "Binding":
                keys |= {("Job", change.namespace, change.object["spec"]["jobName"]), SCHEDULE}
            elif change.kind == "Node":
                keys.add(("Node", "", change.name))
                shape = None if change.type == "DELETED" else _node_shape(change.object)
                if self._node_shapes.get(change.name) != shape:
                    self._node_shapes[change.name] = shape  # type: ignore[assignment]
                    keys.add(SCHEDULE)
            elif change.kind == "GPUPool":
                keys.add(SCHEDULE)
        if finished:  # dependents of a finished Job may now run or fail
            with self.db.read() as session:
                keys |= {
                    ("Job", w["metadata"]["namespace"], w["metadata"]["name"])
                    for w in store.Store(session).pending_wires()
                    if w["spec"].get("dependsOn")
                }
        return keys

    def run(self, stop: threading.Event) -> None:
        with self.db.read() as session:
            since = store.Store(session).current_revision()
        follower = threading.Thread(
            target=self._follow, args=(since, stop), daemon=True, name="controller-feed"
        )
        follower.start()
        dirty: set[Key] = {RESYNC}
        while not stop.is_set():
            if RESYNC in dirty:
                dirty.discard(RESYNC)
                dirty |= self._guarded(self.resync, RESYNC) or {RESYNC}
            for key in sorted(dirty - {RESYNC}, key=lambda k: k == SCHEDULE):  # schedule last
                if self._guarded(functools.partial(self.reconcile, key), key) is None:
                    heapq.heappush(self._timers, (self.clock() + timedelta(seconds=1), key))
            dirty = self._wait(stop) | (dirty & {RESYNC})
        self._changes.put(None)
        follower.join(timeout=5)

    def _guarded(self, step: Callable[[], Any], key: Key) -> Any:
        """Run one step; an error is logged and reported as None, never raised."""
        try:
            result = step()
        except Exception:
            log.exception("%s failed; retrying", "/".join(p for p in key if p))
            return None
        return True if result is None else result

    def _wait(self, stop: threading.Event) -> set[Key]:
        dirty: set[Key] = set()
        while not dirty and not stop.is_set():
            timeout = None
            if self._timers:
                timeout = max(0.0, (self._timers[0][0] - self.clock()).total_seconds())
            try:
                # At most a second, so that a stop is noticed; a due timer sooner.
                batch = self._changes.get(timeout=1.0 if timeout is None else min(timeout, 1.0))
                batches = [batch]
                while not self._changes.empty():
                    batches.append(self._changes.get_nowait())
                for item in batches:
                    if item is None:  # the follower reconnected: changes may have been missed
                        dirty.add(RESYNC)
                    else:
                        keys = self._guarded(functools.partial(self._keys_of, item), RESYNC)
                        dirty |= keys or {RESYNC}
            except queue.Empty:
                pass
            now = self.clock()
            while self._timers and self._timers[0][0] <= now:
                dirty.add(heapq.heappop(self._timers)[1])
        return dirty

    def _follow(self, since: int, stop: threading.Event) -> None:
        """Feed changes to the loop; on a lost connection, reconnect and ask for a resync."""
        delay = 0.5
        while not stop.is_set():
            try:
                with feed.Watch(self.db, since=since, stop=stop) as changes:
                    for batch in changes:
                        self._changes.put(batch)
                        since = batch[-1].revision
                        delay = 0.5
            except Exception as exc:  # the database went away: keep trying, then resync
                log.warning("change feed interrupted (%s); reconnecting in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                self._changes.put(None)
