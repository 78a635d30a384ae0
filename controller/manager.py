"""The controller's loop: wake on the change feed or a due timer, reconcile what changed.

A change to a Job or to one of its Bindings reconciles that Job; a change to a Node reconciles
the Node; any change that can free or need GPUs runs a scheduling pass. Reconcilers return when
they want to run again (deadlines, back-offs, heartbeat timeouts); the loop keeps those in a
heap. Each reconcile is its own transaction, retried from a fresh read on a conflict.
"""

import heapq
import logging
import queue
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from controller import jobs, nodes, scheduling
from gctl.api import job, meta, node
from gctl.store import db, feed, store

log = logging.getLogger("gctl.controller")
SCHEDULE = ("schedule", "", "")
Key = tuple[str, str, str]  # kind, namespace, name


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
        self._changes: queue.Queue[list[store.Change]] = queue.Queue()
        self._timers: list[tuple[datetime, Key]] = []

    def reconcile(self, key: Key) -> None:
        kind, namespace, name = key
        now = self.clock()

        def work(writer: store.Store) -> datetime | None:
            if kind == "Job":
                return jobs.reconcile(writer, namespace, name, now, self.backoff_base)
            if kind == "Node":
                return nodes.reconcile(writer, name, now, self.node_timeout)
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
                keys.add(("Job", change.namespace, change.name))
                finished |= change.object["status"].get("phase") in job.FINISHED_PHASES
            elif change.kind == "Binding":
                keys.add(("Job", change.namespace, change.object["spec"]["jobName"]))
            elif change.kind == "Node":
                keys.add(("Node", "", change.name))
            if change.kind != "Event":
                keys.add(SCHEDULE)
        if finished:  # dependents of a finished Job may now run or fail
            with self.db.read() as session:
                keys |= {
                    ("Job", j.namespace, j.name)
                    for j in store.Store(session).pending_jobs()
                    if j.spec.depends_on
                }
        return keys

    def run(self, stop: threading.Event) -> None:
        with self.db.read() as session:
            since = store.Store(session).current_revision()
        follower = threading.Thread(
            target=self._follow, args=(since, stop), daemon=True, name="controller-feed"
        )
        follower.start()
        dirty = self.resync()
        while not stop.is_set():
            for key in sorted(dirty, key=lambda k: k == SCHEDULE):  # the scheduler last
                try:
                    self.reconcile(key)
                except Exception:  # the loop never dies: log, and retry on the next change
                    log.exception("reconciling %s failed", "/".join(p for p in key if p))
                    heapq.heappush(self._timers, (self.clock() + timedelta(seconds=1), key))
            dirty = self._wait(stop)
        follower.join(timeout=5)

    def _wait(self, stop: threading.Event) -> set[Key]:
        dirty: set[Key] = set()
        while not dirty and not stop.is_set():
            timeout = None
            if self._timers:
                timeout = max(0.0, (self._timers[0][0] - self.clock()).total_seconds())
            try:
                # At most a second, so that a stop is noticed; a due timer sooner.
                batch = self._changes.get(timeout=1.0 if timeout is None else min(timeout, 1.0))
                dirty |= self._keys_of(batch)
                while not self._changes.empty():
                    dirty |= self._keys_of(self._changes.get_nowait())
            except queue.Empty:
                pass
            now = self.clock()
            while self._timers and self._timers[0][0] <= now:
                dirty.add(heapq.heappop(self._timers)[1])
        return dirty

    def _follow(self, since: int, stop: threading.Event) -> None:
        with feed.Watch(self.db, since=since, stop=stop) as changes:
            for batch in changes:
                self._changes.put(batch)
