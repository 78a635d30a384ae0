"""The controller's loop: wake on the change feed or a due timer, reconcile what changed.

A change to a Job or to one of its Bindings reconciles that Job, and a change to a Sweep or
to one of its Jobs reconciles that Sweep; a change to a Node reconciles the Node; a change
that can free or need GPUs runs a scheduling pass (a heartbeat, a Job that started, an
attempt reported Running do not). Reconcilers return when they want to run again
(deadlines, back-offs, heartbeat timeouts); the loop keeps those in a heap. Each reconcile is
its own transaction, retried from a fresh read on a conflict; an error in one is logged and
retried, and never stops the loop. A stored object that no longer validates
(`errors.StoredInvalid`) is set aside: a Warning Event on it and one log line, once per version
of it, and no retry until it changes (or, when another object's reconcile read it, a minute).
"""

import functools
import heapq
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controller import jobs, nodes, outcomes, pending, reading, scheduling, sweeps
from gctl.api import binding, errors, failures, job, kinds, meta, node, sweep
from gctl.store import db, events, feed, shared, store

log = logging.getLogger("gctl.controller")
SOURCE = "controller"


@dataclass(frozen=True)
class _Outage:
    """The change feed could not read the database from `since` until it connected again."""

    since: datetime


SCHEDULE = ("schedule", "", "")
RESYNC = ("resync", "", "")
Key = tuple[str, str, str]  # kind, namespace, name
# Jobs reconciled in one transaction; small enough that agents are never held up for long.
BATCH = 32
# Jobs reconciled in one round of the loop (one batch after the pass when it runs one), the
# rest left for the next, so that thousands of attempts reported Running at once do not hold
# back the passes that bind the queue.
JOBS_PER_ROUND = 8 * BATCH
# Nodes reconciled in one transaction: most only restart their heartbeat timer, a read.
NODE_BATCH = 500
# When an object whose reconcile read another that does not validate tries again; one whose
# own stored document does not validate waits for a change to it instead.
INVALID_RECHECK = timedelta(minutes=1)
REASON_INVALID = "StoredObjectInvalid"
# The kinds whose changes the loop acts on (`_keys_of`); not Events, a third of what a busy
# cluster writes, nor ApplySets (controller.sync follows those).
WATCHED = [
    info.kind
    for info in (kinds.JOB, kinds.SWEEP, kinds.BINDING, kinds.NODE, kinds.GPUPOOL, kinds.GPUPROFILE)
]


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
        backoff_base: timedelta = outcomes.BACKOFF_BASE,
        clock: Callable[[], datetime] = meta.utcnow,
    ) -> None:
        self.db = database
        self.node_timeout = node_timeout
        self.backoff_base = backoff_base
        self.clock = clock
        self._failures = failures.FailureLog(log)
        self._changes: queue.Queue[list[store.Change] | _Outage | None] = queue.Queue()
        self._timers: list[tuple[datetime, Key]] = []
        self._seen: nodes.Seen = {}
        self._node_shapes: dict[str, tuple[Any, ...]] = {}
        # (namespace, name) of a Job -> the pending Jobs that depend on it
        self._dependents: dict[tuple[str, str], set[Key]] = {}
        self._passes: set[int] = set()  # revisions written by this controller's passes
        # revision -> the Jobs this controller's reconciles wrote at it and left at rest
        self._settled: dict[int, set[Key]] = {}
        self._tail = scheduling.Tail(clock)  # when its passes last decided the whole queue
        self._queue = pending.Queue()  # the pending Jobs, kept from pass to pass
        self._invalid: dict[Key, str] = {}  # objects set aside -> the version reported
        # and -> the generation and fault said: an agent's heartbeats write a Node that does
        # not validate (its status), each a new version, with nothing new to say
        self._said: dict[Key, tuple[int | None, str]] = {}

    def _step(
        self, writer: store.Store, key: Key, now: datetime, settled: set[tuple[str, str]]
    ) -> datetime | None:
        kind, namespace, name = key
        if kind == "Job":
            return jobs.reconcile(writer, namespace, name, now, self.backoff_base, settled=settled)
        if kind == "Node":
            return nodes.reconcile(writer, name, now, self.node_timeout, self._seen)
        if kind == "Sweep":
            return sweeps.reconcile(writer, namespace, name, now)
        raise ValueError(f"no reconciler for {kind}")

    def reconcile(self, key: Key) -> None:
        now = self.clock()
        written: list[int | None] = []
        settled: set[tuple[str, str]] = set()

        def work(writer: store.Store) -> datetime | None:
            settled.clear()  # of a try that failed
            due = self._step(writer, key, now, settled)
            written[:] = [writer.written_revision]
            return due

        aside = reading.SetAside(self._invalid)
        try:
            if key == SCHEDULE:  # its reads hold no writer back (scheduling.run)
                due, revision = scheduling.run(
                    self.db, now, aside=aside, tail=self._tail, kept=self._queue
                )
                written[:] = [revision]
            else:
                due = store.transact(self.db, work)
        except errors.StoredInvalid as exc:
            due = self._invalid_met(key, exc)
            written.clear()
        for invalid in aside.found:  # left out by the pass
            self._set_aside(invalid)
        if aside.found:  # a row fixed by hand wakes nothing: look again in a minute
            recheck = self.clock() + INVALID_RECHECK
            due = recheck if due is None else min(due, recheck)
        if key == SCHEDULE and written and written[0] is not None:
            self._passes.add(written[0])
        self._note_settled(written[0] if written else None, settled)
        if key == SCHEDULE:  # a pass sees everything: when the one after it is due replaces
            self._timers = [t for t in self._timers if t[1] != SCHEDULE]  # what earlier said
            heapq.heapify(self._timers)
        if due is not None:
            heapq.heappush(self._timers, (due, key))

    def _note_settled(self, revision: int | None, settled: set[tuple[str, str]]) -> None:
        """The Jobs a reconcile wrote at `revision` and left at rest: their change wakes no
        reconcile (`_keys_of`)."""
        if revision is not None and settled:
            self._settled[revision] = {("Job", namespace, name) for namespace, name in settled}

    def _invalid_met(self, key: Key, exc: errors.StoredInvalid) -> datetime | None:
        """When to try `key` again after it met an object that does not validate: never for
        that object itself (until it changes); at once for a scheduling pass that met a Job
        for the first time (the next pass leaves it out); else in a minute."""
        new = self._invalid.get(exc.key) != exc.resource_version
        self._set_aside(exc)
        if exc.key == key:
            return None
        if key == SCHEDULE and new and exc.key[0] == job.Job.KIND:
            return self.clock()
        return self.clock() + INVALID_RECHECK

    def _set_aside(self, exc: errors.StoredInvalid) -> None:
        """Say once per version that a stored object does not validate: a log line, and a
        Warning Event on the object, where `gctl get events` and `describe` show it. A version
        that differs only by its status (the same generation, the same fault) is not said."""
        if self._invalid.get(exc.key) == exc.resource_version:
            return
        self._invalid[exc.key] = exc.resource_version
        said = (exc.generation, exc.detail)
        if self._said.get(exc.key) == said:
            return
        self._said[exc.key] = said
        log.warning("%s; set aside until it changes", exc)
        kind, namespace, name = exc.key
        involved = events.standin(kind, name, namespace, exc.uid)  # it does not validate
        message = f"stored {kind} does not validate ({exc.detail}); left alone until it changes"
        try:
            store.transact(
                self.db,
                lambda w: w.record_event(
                    involved, REASON_INVALID, message, type_="Warning", source=SOURCE
                ),
            )
        except Exception:  # the log line said it: the Event is a convenience
            log.exception("could not record an Event on %s", "/".join(p for p in exc.key if p))

    def reconcile_together(self, keys: list[Key]) -> bool:
        """Reconcile several Jobs, or several Nodes, in one transaction (`jobs.reconcile_many`,
        `nodes.reconcile_many`): one commit for the eight attempts that ended together, not
        eight, and one read for the hundreds of Nodes that heartbeat together. False (nothing
        written) if any of them failed; the caller then reconciles them one by one, so one
        bad object cannot hold the others back."""
        now = self.clock()

        def work(writer: store.Store) -> list[tuple[datetime, Key]]:
            if keys[0][0] == "Node":
                names = [name for _, _, name in keys]
                due = nodes.reconcile_many(writer, names, now, self.node_timeout, self._seen)
                return [(when, ("Node", "", name)) for name, when in due.items()]
            named = [(namespace, name) for _, namespace, name in keys]
            settled.clear()  # of a try that failed
            due_jobs = jobs.reconcile_many(writer, named, now, self.backoff_base, settled=settled)
            written[:] = [writer.written_revision]
            return [(when, ("Job", ns, name)) for (ns, name), when in due_jobs.items()]

        settled: set[tuple[str, str]] = set()
        written: list[int | None] = [None]
        try:
            timers = store.transact(self.db, work, attempts=1)
        except Exception:
            return False
        self._note_settled(written[0], settled)
        for timer in timers:
            heapq.heappush(self._timers, timer)
        return True

    def resync(self) -> set[Key]:
        """Every object, as on start: level-based, so nothing that happened while down is lost."""
        with self.db.read() as session:
            reader = store.Store(session)
            jobs_now = reader.job_waits()
            # Names alone, unvalidated: one object that no longer validates is set aside by
            # its own reconcile, and must not keep every other from being resynced.
            keys: set[Key] = {
                ("Node", "", w["metadata"]["name"]) for w in reader.list_wire(node.Node)
            }
            keys |= {
                ("Sweep", w["metadata"]["namespace"], w["metadata"]["name"])
                for w in reader.list_wire(sweep.Sweep)
            }
        self._dependents.clear()
        for namespace, name, phase, depends in jobs_now:
            self._track(("Job", namespace, name), phase == "Pending", depends)
            keys.add(("Job", namespace, name))
        return keys | {SCHEDULE}

    def _track_dependencies(self, change_type: str, wire: dict[str, Any]) -> None:
        """Keep `_dependents` current: pending Jobs by the Jobs they wait for."""
        namespace, name = wire["metadata"].get("namespace", ""), wire["metadata"]["name"]
        waits = change_type != "DELETED" and wire["status"].get("phase", "Pending") == "Pending"
        self._track(("Job", namespace, name), waits, wire["spec"].get("dependsOn", []))

    def _track(self, key: Key, waits: bool, depends_on: Any) -> None:
        """`key` waits (pending) or not for the names in `depends_on`; what is no name there
        (a hand edit in the database) the Job's own reconcile reports."""
        namespace = key[1]
        names = depends_on if isinstance(depends_on, list) else []
        for dependency in (name for name in names if isinstance(name, str)):
            waiting = self._dependents.setdefault((namespace, dependency), set())
            if waits:
                waiting.add(key)
            else:
                waiting.discard(key)
                if not waiting:
                    del self._dependents[(namespace, dependency)]

    def _woken_dependents(self, change: store.Change) -> set[Key]:
        """The Jobs waiting on a Job or Sweep that finished or went: they may now run, or
        fail; and a scheduling pass for them."""
        phase = change.object["status"].get("phase", "Pending")
        if phase not in job.FINISHED_PHASES and change.type != "DELETED":
            return set()
        waiting = self._dependents.get((change.namespace, change.name), set())
        return waiting | {SCHEDULE} if waiting else set()

    def _keys_of(self, changes: list[store.Change]) -> set[Key]:
        """What to reconcile after these changes. A scheduling pass runs only for changes that
        can free GPUs or add work: new or requeued Jobs, ended attempts, Nodes, pools and
        profiles; not for a Job that started or an attempt reported Running."""
        keys: set[Key] = set()
        for change in changes:
            if change.revision in self._passes:
                # What a scheduling pass wrote (bindings, Jobs bound or told why they wait)
                # needs no reconcile and no further pass: it is the pass's own conclusion.
                continue
            if change.kind == "Job":
                key = ("Job", change.namespace, change.name)
                # Not a Job just created that only waits for the scheduler, nor one that this
                # controller's reconcile wrote and left at rest: reconciling either does nothing.
                if (
                    change.type != "ADDED" or not jobs.untouched_when_created(change.object)
                ) and key not in self._settled.get(change.revision, ()):
                    keys.add(key)
                self._track_dependencies(change.type, change.object)
                phase = change.object["status"].get("phase", "Pending")
                if change.type != "MODIFIED" or phase == "Pending":
                    keys.add(SCHEDULE)
                keys |= self._woken_dependents(change)
                if (owner := sweep.owner(change.object)) is not None:  # its Sweep's progress
                    keys.add(("Sweep", change.namespace, owner[0]))
            elif change.kind == "Sweep":
                keys.add(("Sweep", change.namespace, change.name))
                keys |= self._woken_dependents(change)  # a dependsOn name may be a Sweep's
            elif change.kind == "Binding":
                keys.add(("Job", change.namespace, change.object["spec"]["jobName"]))
                phase = change.object["status"].get("phase", "Pending")
                given_back = phase == "Pending" and change.object["spec"].get("disarm")
                if change.type == "DELETED" or phase not in binding.ACTIVE_PHASES or given_back:
                    keys.add(SCHEDULE)  # GPUs freed, or an attempt to move or arm again
            elif change.kind == "Node":
                keys.add(("Node", "", change.name))
                shape = None if change.type == "DELETED" else _node_shape(change.object)
                if self._node_shapes.get(change.name) != shape:
                    self._node_shapes[change.name] = shape  # type: ignore[assignment]
                    keys.add(SCHEDULE)
            elif change.kind in ("GPUPool", "GPUProfile"):
                keys.add(SCHEDULE)
        if changes:  # the feed is in revision order: older passes are behind us
            last = feed.resume_after(changes)  # (not the last, if the next page goes on with it)
            self._passes = {r for r in self._passes if r > last}
            self._settled = {r: k for r, k in self._settled.items() if r > last}
        return keys

    def run(self, stop: threading.Event) -> None:
        with self.db.read() as session:
            since = store.Store(session).current_revision()
        follower = threading.Thread(
            target=self._follow, args=(since, stop), daemon=True, name="controller-feed"
        )
        follower.start()
        dirty: set[Key] = {RESYNC}
        backlog: dict[Key, None] = {}  # Jobs left for the next round, oldest first
        while not stop.is_set():
            if RESYNC in dirty:
                dirty.discard(RESYNC)
                dirty |= self._guarded(self.resync, RESYNC) or {RESYNC}
            keys = sorted(dirty - {RESYNC, SCHEDULE})
            backlog |= dict.fromkeys(k for k in keys if k[0] == "Job")
            # The pass first, then one batch of Jobs: most Jobs in a big backlog only follow
            # their attempts' reports (Running, Exited), which bind nothing, while the pass
            # binds GPUs (it reads the Bindings themselves, not the Jobs).
            scheduling_pass = functools.partial(self.reconcile, SCHEDULE)
            if SCHEDULE in dirty and self._guarded(scheduling_pass, SCHEDULE) is None:
                heapq.heappush(self._timers, (self.clock() + timedelta(seconds=1), SCHEDULE))
            per_round = BATCH if SCHEDULE in dirty else JOBS_PER_ROUND
            job_keys = list(backlog)[:per_round]
            backlog = dict.fromkeys(list(backlog)[per_round:])
            node_keys = [k for k in keys if k[0] == "Node"]
            keys = [k for k in keys if k[0] not in ("Job", "Node")]
            for batch, size in ((job_keys, BATCH), (node_keys, NODE_BATCH)):
                for start in range(0, len(batch), size):
                    chunk = batch[start : start + size]
                    if len(chunk) == 1 or not self.reconcile_together(chunk):
                        keys[:0] = chunk  # one by one, before the others
            for key in keys:
                if self._guarded(functools.partial(self.reconcile, key), key) is None:
                    heapq.heappush(self._timers, (self.clock() + timedelta(seconds=1), key))
            dirty = self._wait(stop, block=not backlog) | (dirty & {RESYNC})
        self._changes.put(None)
        follower.join(timeout=5)

    def _guarded(self, step: Callable[[], Any], key: Key) -> Any:
        """Run one step; an error is logged and reported as None, never raised."""
        try:
            result = step()
        except Exception as exc:
            self._failures.failed("/".join(p for p in key if p), exc)
            return None
        return True if result is None else result

    def _database_back(self, since: datetime) -> None:
        """The change feed could not read the database from `since` until now: no agent could
        write its heartbeat meanwhile either. That time is left out of every node's silence
        (`nodes`): a database restarting is not every node failing (QA: a 50 s outage had
        every node's attempts declared lost, and Jobs that had succeeded meanwhile ran again).
        A node silent before the outage is judged once its silence outside it reaches the
        timeout. The feed is the probe: a step that fails (a statement timeout, say) says
        nothing of the agents, and must not keep a dead node from being judged."""
        now = self.clock()
        gap = now - since
        for name, (heartbeat, observed, outlive) in self._seen.items():
            self._seen[name] = (heartbeat, min(now, observed + gap), outlive)

    def _wait(self, stop: threading.Event, *, block: bool = True) -> set[Key]:
        """What changed, or is due: waits for something unless `block` is false."""
        dirty: set[Key] = set()
        while not stop.is_set():
            timeout = None
            if self._timers:
                timeout = max(0.0, (self._timers[0][0] - self.clock()).total_seconds())
            try:
                # At most a second, a due timer sooner; a stop wakes it through the follower.
                wait_s = 1.0 if timeout is None else min(timeout, 1.0)
                batch = self._changes.get(timeout=wait_s if block else 0.0)
                batches = [batch]
                while not self._changes.empty() or (block and _goes_on(batches[-1])):
                    try:  # the rest of a transaction that a page of the feed ended in, first
                        batches.append(self._changes.get(timeout=PAGE_WAIT_S))
                    except queue.Empty:
                        break
                _note(batches)
                for item in batches:
                    if item is None:  # the follower reconnects: changes may have been missed
                        dirty.add(RESYNC)
                    elif isinstance(item, _Outage):
                        self._database_back(item.since)
                    else:
                        keys = self._guarded(functools.partial(self._keys_of, item), RESYNC)
                        # None: working out the keys failed; an empty set: nothing to do.
                        dirty |= {RESYNC} if keys is None else keys
            except queue.Empty:
                pass
            now = self.clock()
            while self._timers and self._timers[0][0] <= now:
                dirty.add(heapq.heappop(self._timers)[1])
            if dirty or not block:
                return dirty
        return dirty

    def _follow(self, since: int, stop: threading.Event) -> None:
        """Feed changes to the loop; on a lost connection, reconnect and ask for a resync."""
        said = failures.FailureLog(log)  # this thread's own
        delay = 0.5
        down_since: datetime | None = None  # when the feed last lost the database
        while not stop.is_set():
            try:
                with feed.Watch(self.db, since=since, kinds=WATCHED, stop=stop) as changes:
                    if down_since is not None:  # connected again
                        self._changes.put(_Outage(down_since))
                        down_since = None
                    for batch in changes:
                        self._changes.put(batch)
                        since = feed.resume_after(batch)
                        delay = 0.5
            except Exception as exc:  # the database went away: keep trying, then resync
                said.failed("change feed", exc)  # once a minute, while the database is away
                down_since = down_since or self.clock()
                stop.wait(delay)
                delay = min(delay * 2, 10.0)
                self._changes.put(None)
        self._changes.put(None)  # stopping: wake the loop, which then sees the stop


# How long the loop waits for the next page of the feed when one ended within a transaction's
# changes, so that a pass never works from half of them (the feed thread reads it at once:
# tens of milliseconds for 10,000 changes); a page at a time.
PAGE_WAIT_S = 1.0


def _goes_on(item: object) -> bool:
    """Whether a batch of the feed ends within a revision that the next page goes on with."""
    return isinstance(item, feed.Page) and item.continues


def _note(items: list[Any]) -> None:
    """Tell the shared reads' cache what the feed's changes carry (`shared.note`), in order:
    the next pass need not decode again what the feed thread did. Where a page ended within a
    revision and nothing followed it (the feed reconnected, or the wait for the rest ran out),
    that revision's ADDED changes are left out, in every page: a later change of them, in the
    same transaction, may be in what was not read."""
    unsure = {
        item[-1].revision
        for position, item in enumerate(items)
        if _goes_on(item)
        and not (position + 1 < len(items) and isinstance(items[position + 1], list))
    }
    for item in items:
        if not isinstance(item, list):
            continue
        for change in item:
            if change.type == "ADDED" and change.revision in unsure:
                continue
            shared.note(change.type, change.uid, change.revision, change.object)
