"""Virtual nodes: one process plays N Nodes whose jobs "run" for a simulated time, like KWOK.

`VirtualAgent` registers Nodes `PREFIX-0001` ... with fake GPUs, heartbeats all of them in one
transaction, follows the Bindings that name them through the change feed, and writes the same
observed states a real agent writes (`nodeagent.passes.Pass._report`): Running with a start
time and a pid (this process's own: nothing is executed), then Exited with an exit code and a
reason, or Exited with the stop reason when the controller asked for a stop. So the controller
cannot tell a virtual node from a real one.

A job's simulated run time is its annotation `gctl/simulated-duration` (seconds, a float, at
most a year; absent: 0, the job ends at once), divided by the agent's time scale (at most a year
of real time); its exit code is `gctl/simulated-exit-code` (0 to 255, default 0). A stopped job
dies at once as if by SIGTERM (exit code 143): stop warnings and grace periods are not
simulated. Timers live in a heap keyed on an injected monotonic clock; the loop sleeps until the
next timer, heartbeat or feed wake-up, so an idle virtual agent uses no CPU. Each wake reads
only the Bindings the feed named or whose timer fired (all of them at start, and after a failed
write) and writes every report of the wake in one transaction.
"""

import heapq
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import gctl
from gctl.api import binding, errors, failures, job, meta, node, quantity
from gctl.store import db, feed, store
from nodeagent import ownership

log = logging.getLogger("gctl.agent")

DURATION_ANNOTATION = job.ANNOTATION_SIMULATED_DURATION
EXIT_CODE_ANNOTATION = job.ANNOTATION_SIMULATED_EXIT_CODE
FAKE_LABEL = "gctl/fake-gpus"  # the same label a real agent on fake GPUs carries
VIRTUAL_LABEL = "gctl/virtual-node"
# The slowest time scale (`gctl agent run --time-scale`'s minimum, which the CLI repeats).
MIN_TIME_SCALE = 1e-9
SIGTERM_EXIT = 143  # 128 + 15, as supervisor.exit_code_of reports a death by SIGTERM
RENAME = "--name-prefix"  # how a refusal asks for other Nodes than another agent's
RETRY_S = 1.0  # after a pass or a heartbeat that failed
# Exited attempts need nothing more; Lost ones may still "run" here and must be stopped.
_SYNCED_PHASES = frozenset({"Pending", "Starting", "Running", "Lost"})

CHUNK = 500  # names in one IN list: far below SQLite's limit on a statement's parameters
Key = tuple[str, str]  # a Binding's (namespace, name)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class Simulated:
    """One attempt "running" on a virtual node: when it started, when it ends, and how."""

    key: Key
    started: datetime
    finish: datetime
    due: float  # monotonic time of `finish`
    exit_code: int = 0
    signal: str | None = None
    stop_reason: str | None = None


@dataclass
class _Pass:
    """What one wake reads and decides: the Bindings, their Jobs, and the reports."""

    bindings: list[binding.Binding]
    owners: dict[Key, job.Job]
    # The pass is one moment, on the wall clock and the monotonic one: the attempts it starts
    # start then, together, as the members of a multi-node attempt do (read one by one, a
    # loaded host had them start milliseconds, so at a time scale of 1,000 trace seconds, apart,
    # and the replay count the gap on every GPU); an attempt ends in it if its end is due by
    # then, and a stop ends one then, so that an attempt bound after it never starts before it
    # ended; one that ends without running (lost, not startable, stopped first) ends then too.
    now: datetime
    mono: float
    reports: list[binding.Binding] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # uids whose Exited report is in `reports`
    # Uids of the Bindings read that are bound and not started (Pending or Starting): worked
    # out once a pass, not once an attempt bound ahead (thousands of them at scale).
    unstarted: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.unstarted = {
            b.metadata.uid or "" for b in self.bindings if b.status.phase in ("Pending", "Starting")
        }


def node_names(count: int, prefix: str) -> list[str]:
    width = max(4, len(str(count)))
    return [f"{prefix}-{index:0{width}d}" for index in range(1, count + 1)]


def simulated_run(owner: job.Job) -> tuple[float, int]:
    """(seconds, exit code) from the Job's annotations; errors.Invalid names a bad one (a Job
    stored before gctl checked them when applied, or written other than by `gctl apply`)."""
    try:
        return job.simulated_run(owner.metadata.annotations)
    except meta.FieldError as exc:
        raise errors.Invalid(str(exc)) from None


class VirtualAgent:
    def __init__(
        self,
        database: db.Database,
        *,
        nodes: int,
        gpus_per_node: int,
        name_prefix: str = "vnode",
        gpu_model: str = "Fake GPU",
        gpu_memory: str = "80Gi",
        labels: dict[str, str] | None = None,
        heartbeat_seconds: float = 10.0,
        time_scale: float = 1.0,
        clock: Callable[[], datetime] = meta.utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        state_dir: Path | None = None,
    ) -> None:
        """`state_dir`: where this agent holds its lock (`ownership.StateLock`), so that a second
        virtual agent for these Nodes on this host refuses to start and the next one after this
        one, dead, takes them at once; None: no lock (the Nodes' holds alone say who acts)."""
        if not MIN_TIME_SCALE <= time_scale < math.inf:  # NaN fails this too
            raise errors.Invalid(
                f"time scale {time_scale:g}: must be a finite number of at least {MIN_TIME_SCALE:g}"
            )
        self.db = database
        self.names = node_names(nodes, name_prefix)
        self._name_set = frozenset(self.names)
        self.gpus_per_node = gpus_per_node
        self.gpu_model = gpu_model
        self.gpu_memory = quantity.parse_bytes(gpu_memory)
        self.labels = dict(labels or {}) | {FAKE_LABEL: "true", VIRTUAL_LABEL: "true"}
        self.heartbeat_seconds = heartbeat_seconds
        self.time_scale = time_scale
        self.clock = clock
        self._failures = failures.FailureLog(log)
        self.monotonic = monotonic
        self.pid = os.getpid()
        self.wake = threading.Event()
        self.sims: dict[str, Simulated] = {}  # uid -> attempt "running" here
        self._timers: list[tuple[float, str]] = []  # (due, uid), a heap
        self._lock = threading.Lock()  # guards the three below, shared with the feed thread
        self._dirty: set[Key] = set()
        self._resync = True  # read every Binding of these nodes on the next wake
        self._written: set[int] = set()  # revisions of our own reports: no wake-up for them
        # uid of an attempt "running" here -> the attempts bound ahead that wait for it
        self._waiting: dict[str, set[Key]] = {}
        # One agent for these Nodes, as for a real one (nodeagent/ownership.py): this one's
        # hold, written into each Node; nothing runs on this host that must outlive it, so it
        # has no fence, and is gone once its heartbeat stood still for its silence window.
        self.instance = ownership.new_instance(heartbeat_seconds, 0.0, 0.0, clock())
        self._state_lock = (
            None
            if state_dir is None
            else ownership.StateLock(
                state_dir, f"{self.names[0]}..{self.names[-1]}", self.instance.id
            )
        )
        self._refused = ""  # the Node whose hold the last claim refused

    # -- the Nodes -----------------------------------------------------------------------------

    def _gpus(self, name: str) -> list[node.GPUInfo]:
        return [
            node.GPUInfo(
                index=i,
                uuid=f"GPU-virtual-{name}-{i}",
                model=self.gpu_model,
                memory_total=self.gpu_memory,
                memory_used=0,
                utilization=0,
                fake=True,
            )
            for i in range(self.gpus_per_node)
        ]

    def _nodes(self, writer: store.Store) -> list[node.Node]:
        """These Nodes as stored, after creating the missing ones (a deleted Node comes back
        on the next heartbeat, as with a real agent)."""
        found = self._stored(writer)
        known = {n.name for n in found}
        created = writer.create_many(
            [
                node.Node(metadata=meta.ObjectMeta(name=name, labels=self.labels))
                for name in self.names
                if name not in known
            ]
        )
        for new in created:
            writer.record_event(
                new, "Registered", f"{self.gpus_per_node} virtual GPU(s)", source="agent/virtual"
            )
        return found + created

    def _predecessors(self) -> frozenset[str]:
        return self._state_lock.predecessors if self._state_lock is not None else frozenset()

    def claim(self, stop: threading.Event | None = None) -> bool:
        """Make every one of these Nodes this agent's before it acts for them, as a real agent
        claims its Node (`Agent.claim`): ownership.Taken (one line naming the other agent) if
        another agent holds one of them and is alive. A hold whose heartbeat looks stale is
        watched (`ownership.watch`) and taken over once it stood still for its whole silence
        window, one holder after another. True once all are this agent's; False where that
        means watching and there is no `stop` to watch with, or `stop` was set meanwhile."""
        silent: list[tuple[str, ownership.Held]] = []  # (a Node, its hold) watched silent
        while True:
            try:
                store.transact(self.db, lambda writer: self._claim(writer, silent))
                break
            except ownership.Taken as exc:
                theirs, name = exc.held, self._refused
                if theirs is None or not theirs.may_be_gone(self.clock()):
                    raise
            if stop is None:
                return False
            read = partial(self._held, name)
            seen = ownership.watch(name, theirs, read, self.clock, stop, flag=RENAME)
            if seen == ownership.STOPPED:
                return False
            if seen == ownership.SILENT:
                silent.append((name, theirs))
        for name, theirs in silent:
            ownership.said_taken_over(name, theirs)
        if self._state_lock is not None:
            self._state_lock.claimed()
        return True

    def _claim(self, writer: store.Store, silent: list[tuple[str, ownership.Held]]) -> None:
        """This agent's hold and heartbeat written into each of these Nodes that exists (the
        others are made, held, at the first heartbeat); ownership.Taken for the first held by
        another agent, but with a hold in `silent`, unmoved."""
        now = self.clock()
        for stored in self._stored(writer):
            theirs = ownership.held(stored, self.instance, self._predecessors())
            if theirs is not None and not any(theirs.same(held) for _, held in silent):
                self._refused = stored.name
                raise ownership.Taken(ownership.refusal(stored.name, theirs, now, RENAME), theirs)
            stored.status.agent_instance = self.instance
            stored.status.heartbeat_time = now
            writer.update_status(stored)

    def _held(self, name: str) -> ownership.Held | None:
        """Another agent's hold on the Node `name`, as stored now."""
        with self.db.read() as session:
            found = store.Store(session).find(node.Node, name)
        return ownership.held(found, self.instance, self._predecessors())

    def release(self) -> None:
        """Let go of these Nodes, where this agent holds them, so that another agent may start
        for them at once (their heartbeats stay: the controller still judges them by those)."""

        def work(writer: store.Store) -> None:
            for stored in self._stored(writer):
                held = stored.status.agent_instance
                if held is not None and held.id == self.instance.id:
                    stored.status.agent_instance = None
                    writer.update_status(stored)

        try:
            store.transact(self.db, work)
        except errors.GctlError as exc:  # the database is away: the heartbeats go stale
            log.warning("letting go of the virtual nodes: %s", exc)

    def abandon(self) -> None:
        """After a claim that failed, or once stopped: let go of the state directory, so that
        an agent built again in this process (`gctl agent run` waiting for its database) can
        take it."""
        if self._state_lock is not None:
            self._state_lock.release()

    def _stored(self, writer: store.Store) -> list[node.Node]:
        """These Nodes as stored (those that exist)."""
        wires = [
            wire
            for start in range(0, len(self.names), CHUNK)
            for wire in writer.list_wire(node.Node, names=self.names[start : start + CHUNK])
        ]
        return [node.Node.model_validate(w) for w in wires]

    def heartbeat(self) -> None:
        """Register or refresh every Node: GPUs, heartbeat, Ready, this agent's hold; all in
        one transaction. ownership.Taken if another agent has taken one of them meanwhile."""
        now = self.clock()
        hostname = socket.gethostname()

        def work(writer: store.Store) -> None:
            for stored in self._nodes(writer):
                theirs = ownership.held(stored, self.instance, self._predecessors())
                if theirs is not None:
                    raise ownership.Taken(
                        ownership.refusal(stored.name, theirs, now, RENAME), theirs
                    )
                current = stored
                if any(stored.metadata.labels.get(k) != v for k, v in self.labels.items()):
                    stored.metadata.labels = {**stored.metadata.labels, **self.labels}
                    current = writer.update(stored)
                status = current.status
                status.gpus = self._gpus(current.name)
                status.heartbeat_time = now
                status.hostname = hostname
                status.agent_version = gctl.__version__
                status.agent_instance = self.instance
                status.jobs_outlive_seconds = None  # nothing runs: none outlives a heartbeat
                meta.set_condition(
                    status.conditions,
                    "Ready",
                    "True",
                    "AgentReady",
                    "the agent is heartbeating",
                    now=now,
                )
                writer.update_status(current)
            self._note_written(writer)

        store.transact(self.db, work)

    # -- the attempts --------------------------------------------------------------------------

    def sync(self) -> None:
        """One pass: read the Bindings that may have moved, step each, write the reports."""
        now = self.monotonic()
        with self._lock:
            keys, full = self._dirty, self._resync
            self._dirty, self._resync = set(), False
        while self._timers and self._timers[0][0] <= now:
            _, uid = heapq.heappop(self._timers)
            if uid in self.sims:
                keys.add(self.sims[uid].key)
                keys |= self._waiting.get(uid, set())  # read with it: they may start now
        if not keys and not full:
            return
        work = self._read(None if full else keys)
        # Those bound ahead last, oldest first: one may wait for another bound before it.
        work.bindings.sort(
            key=lambda b: (binding.queued(b.spec, b.status), b.metadata.creation_timestamp or EPOCH)
        )
        seen = set()
        for bound in work.bindings:
            seen.add(bound.metadata.uid or "")
            self._sync_one(bound, work)
        for uid, sim in list(self.sims.items()):
            if uid not in seen and (full or sim.key in keys):
                self._end(uid)  # its Binding is gone: the "process" ends with it
        self._flush(work)

    def _read(self, keys: set[Key] | None) -> _Pass:
        """The Bindings named (all of these nodes' when None), and the Jobs of new ones."""
        with self.db.read() as session:
            reader = store.Store(session)
            if keys is None:
                found = reader.active_bindings(None, _SYNCED_PHASES, skipped=[])  # left alone
            else:
                found = [
                    binding.Binding.model_validate(w)
                    for namespace, names in _by_namespace(keys)
                    for w in reader.list_wire(binding.Binding, namespace, names=names)
                ]
            mine = [b for b in found if b.spec.node in self._name_set]
            starting = {
                (b.namespace, b.spec.job_name)
                for b in mine
                if (b.metadata.uid or "") not in self.sims and b.status.phase != "Exited"
            }
            owners = {
                (namespace, w["metadata"]["name"]): job.Job.model_validate(w)
                for namespace, names in _by_namespace(starting)
                for w in reader.list_wire(job.Job, namespace, names=names)
            }
        return _Pass(mine, owners, self.clock(), self.monotonic())

    def _sync_one(self, bound: binding.Binding, work: _Pass) -> None:
        uid = bound.metadata.uid or ""
        phase = bound.status.phase
        sim = self.sims.get(uid)
        if phase in ("Exited", "Lost"):
            # Lost: the controller retried the Job elsewhere; it must not "run" twice.
            self._end(uid)
            return
        if sim is None:
            queued = binding.queued(bound.spec, bound.status) and not bound.spec.stop_reason
            if queued and self._waits(bound, work):
                return
            for uid_before in bound.spec.after if queued else ():
                self._waiting.get(uid_before, set()).discard((bound.namespace, bound.name))
            sim = self._adopt_or_start(bound, work)
            if sim is None:
                return
        if bound.spec.stop_reason and sim.stop_reason is None and sim.due > work.mono:
            self._stop(sim, bound.spec.stop_reason, work)
        if sim.due <= work.mono:
            self._report_exit(bound, sim, work)
            work.ended.append(uid)
        elif phase != "Running":
            self._report(bound, work, phase="Running", start_time=sim.started, pid=self.pid)

    def _adopt_or_start(self, bound: binding.Binding, work: _Pass) -> Simulated | None:
        """A Running attempt this process does not know (it restarted): adopt it from its
        start time; a Pending one: start it, unless it was stopped or its Job is gone."""
        owner = work.owners.get((bound.namespace, bound.spec.job_name))
        if owner is None or owner.metadata.uid != bound.spec.job_uid:
            if bound.status.phase == "Running":
                self._report(
                    bound,
                    work,
                    phase="Lost",
                    reason="Lost",
                    message="the attempt vanished",
                    finish_time=work.now,
                )
            else:
                self._report_ended(
                    bound, work, "JobDeleted", "the Job was deleted before it started"
                )
            return None
        if bound.status.phase == "Pending" and bound.spec.stop_reason:
            self._report_ended(bound, work, bound.spec.stop_reason, "stopped before it started")
            return None
        try:
            seconds, code = simulated_run(owner)
        except errors.Invalid as exc:  # as a real agent reports a command it cannot run
            self._report(
                bound,
                work,
                phase="Exited",
                exit_code=127,
                reason="StartError",
                message=str(exc),
                finish_time=work.now,
            )
            return None
        started = bound.status.start_time or work.now
        return self._schedule(bound, started, seconds, code, work)

    def _waits(self, bound: binding.Binding, work: _Pass) -> bool:
        """Whether an attempt bound ahead must wait: one it starts after still "runs" here (it
        is then read again when that one ends), or is bound and not started yet. Otherwise its
        Running report, written with a compare-and-set, is how this agent takes it."""
        for uid in bound.spec.after:
            running = uid in self.sims and uid not in work.ended
            if running or (uid in work.unstarted and uid not in self.sims):
                # Read again when it ends (one bound ahead itself may start later this pass).
                self._waiting.setdefault(uid, set()).add((bound.namespace, bound.name))
                return True
        return False

    def _end(self, uid: str) -> None:
        """Forget an attempt that ended here, and read the attempts waiting for it again."""
        self.sims.pop(uid, None)
        waiting = self._waiting.pop(uid, None)
        if waiting:
            self._mark_dirty(waiting)

    def _schedule(
        self, bound: binding.Binding, started: datetime, seconds: float, code: int, work: _Pass
    ) -> Simulated:
        # At most a year of real time, however slow the time scale: an end in the calendar.
        wall = min(seconds / self.time_scale, quantity.MAX_DURATION_SECONDS)
        finish = started + timedelta(seconds=wall)
        due = work.mono + (finish - work.now).total_seconds()
        sim = Simulated((bound.namespace, bound.name), started, finish, due, exit_code=code)
        self.sims[bound.metadata.uid or ""] = sim
        heapq.heappush(self._timers, (due, bound.metadata.uid or ""))
        return sim

    def _stop(self, sim: Simulated, reason: str, work: _Pass) -> None:
        """The controller asked for a stop: the job dies now, as a process does on SIGTERM."""
        sim.finish, sim.due = work.now, work.mono
        sim.exit_code, sim.signal, sim.stop_reason = SIGTERM_EXIT, "SIGTERM", reason

    def _report_exit(self, bound: binding.Binding, sim: Simulated, work: _Pass) -> None:
        reason = sim.stop_reason or ("Completed" if sim.exit_code == 0 else "Error")
        self._report(
            bound,
            work,
            phase="Exited",
            start_time=bound.status.start_time or sim.started,
            pid=self.pid,
            exit_code=sim.exit_code,
            signal=sim.signal,
            finish_time=sim.finish,
            reason=reason,
        )

    def _report_ended(self, bound: binding.Binding, work: _Pass, reason: str, message: str) -> None:
        self._report(
            bound, work, phase="Exited", reason=reason, message=message, finish_time=work.now
        )

    def _report(self, bound: binding.Binding, work: _Pass, **changes: Any) -> None:
        status = bound.status.model_copy(update=changes)
        if status != bound.status:
            work.reports.append(bound.model_copy(update={"status": status}))

    def _flush(self, work: _Pass) -> None:
        """Write the wake's reports in one transaction; on a conflict, read them all again."""
        if not work.reports:
            return
        try:
            with self.db.write() as session:
                writer = store.Store(session)
                with writer.batched():  # one statement for thousands of reports
                    for report in work.reports:
                        writer.update_status(report)
            self._note_written(writer)
        except errors.GctlError as exc:  # a Conflict, a deleted Binding, the database away
            log.debug("reporting %d attempt(s): %s; reading them again", len(work.reports), exc)
            self._mark_dirty((r.namespace, r.name) for r in work.reports)
            return
        for uid in work.ended:
            self._end(uid)

    # -- the loop ------------------------------------------------------------------------------

    def _note_written(self, writer: store.Store) -> None:
        if writer.written_revision is not None:
            with self._lock:
                self._written.add(writer.written_revision)

    def _mark_dirty(self, keys: Iterable[Key], *, full: bool = False) -> None:
        with self._lock:
            self._dirty.update(keys)
            self._resync = self._resync or full
        self.wake.set()

    def resync(self) -> None:
        """Read every Binding of these nodes on the next pass (as after a failed write)."""
        self._mark_dirty((), full=True)

    def next_wake(self, next_beat: float) -> float:
        """Seconds until the next timer or heartbeat."""
        due = min(next_beat, self._timers[0][0]) if self._timers else next_beat
        return max(0.0, due - self.monotonic())

    def run(self, stop: threading.Event) -> None:
        """Heartbeat and simulate until `stop` is set; wakes on the feed, timers, heartbeats.
        Ends with ownership.Taken if another agent takes one of the Nodes meanwhile; lets go
        of them when it ends."""
        try:
            if self.claim(stop):
                self._run(stop)
        finally:
            self.release()
            self.abandon()

    def _run(self, stop: threading.Event) -> None:
        log.info("%d virtual node(s) %s..%s", len(self.names), self.names[0], self.names[-1])
        with self.db.read() as session:
            since = store.Store(session).current_revision()
        watcher = threading.Thread(
            target=self._follow_feed, args=(since, stop), daemon=True, name="virtual-feed"
        )
        watcher.start()
        next_beat = self.monotonic()  # the first heartbeat in the first turn, after its pass
        while not stop.is_set():
            self.wake.clear()
            synced = self._guarded("virtual agent pass", self.sync)
            # Beats even when a pass fails, as a real agent does: the nodes are fine.
            if self.monotonic() >= next_beat:
                beat = self._guarded("virtual agent heartbeat", self.heartbeat)
                next_beat = self.monotonic() + (self.heartbeat_seconds if beat else RETRY_S)
            if not synced:  # read everything again shortly
                self.resync()
                stop.wait(RETRY_S)
                continue
            self.wake.wait(self.next_wake(next_beat))
        watcher.join(timeout=5)

    def _guarded(self, what: str, step: Callable[[], object]) -> bool:
        """One step of the loop, which never dies: a failure is logged (once a minute for a
        repeat) and False returned; another agent taking one of the Nodes ends the loop."""
        try:
            step()
        except ownership.Taken:
            raise
        except Exception as exc:
            self._failures.failed(what, exc)
            return False
        return True

    def _follow_feed(self, since: int, stop: threading.Event) -> None:
        """Mark the Bindings of these nodes that others wrote; reconnect if the database goes.
        When `stop` is set it wakes the loop on its way out, so that the agent ends at once."""
        try:
            self._watch(since, stop)
        finally:
            self.wake.set()

    def _watch(self, since: int, stop: threading.Event) -> None:
        said = failures.FailureLog(log)  # this thread's own
        while not stop.is_set():
            try:
                with feed.Watch(
                    self.db, since=since, kinds=[binding.Binding.KIND], stop=stop
                ) as changes:
                    for batch in changes:
                        since = batch[-1].revision
                        with self._lock:
                            written = self._written
                            self._written = {r for r in written if r > since}
                        keys = [
                            (c.namespace, c.name)
                            for c in batch
                            if c.object["spec"].get("node") in self._name_set
                            and c.revision not in written
                        ]
                        if keys:
                            self._mark_dirty(keys)
            except Exception as exc:  # a full pass catches up on whatever was missed
                said.failed("change feed", exc)  # once a minute, while the database is away
                self.resync()
                stop.wait(2.0)


def _by_namespace(keys: Iterable[Key]) -> list[tuple[str, list[str]]]:
    """Names grouped by namespace, at most CHUNK in a group (one IN list of a query each)."""
    grouped: dict[str, list[str]] = {}
    for namespace, name in keys:
        grouped.setdefault(namespace, []).append(name)
    return [
        (namespace, names[start : start + CHUNK])
        for namespace, names in grouped.items()
        for start in range(0, len(names), CHUNK)
    ]
