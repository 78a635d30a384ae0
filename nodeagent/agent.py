"""The node agent's loop: register the Node, heartbeat, and make this host's processes match the
Bindings that name it.

Level-based: every pass reads this node's Bindings and the attempts on disk and moves each one
step: launch what is bound and not yet running, stop what the controller asked to stop, report
what exited. It wakes on the change feed and on the supervisors' records (`notify`), and on
the heartbeat timer; a pass may run any number of times.

Here lives what outlasts a pass: the Node (its ownership, heartbeat and closed GPUs), the
attempts on disk whose Binding is gone, and the loop with its watchers. What one pass does
with each Binding, attempts bound ahead and armed included, is passes.py.
"""

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gctl.api import binding, errors, failures, meta, node
from gctl.store import db, feed, notify, shared, store
from nodeagent import gpus as gpu_backends
from nodeagent import heartbeat, launches, logserver, ownership, passes, runtime, supervisor

log = logging.getLogger("gctl.agent")
FAKE_LABEL = "gctl/fake-gpus"
# Exited attempts need nothing more; Lost ones may still run here and must be stopped.
_SYNCED_PHASES = frozenset({"Pending", "Armed", "Starting", "Running", "Lost"})
BEAT_RETRY_SECONDS = 1.0  # after a failed heartbeat (or the heartbeat period, if shorter)
_ALIVE = ("running", "armed")  # an attempt's phases on the host that a new agent adopts
PASS_RETRY_SECONDS = 1.0  # after a pass that failed, or failed for some attempt


def default_state_dir(node_name: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return Path(base) / "gctl" / node_name


def default_virtual_state_dir(name_prefix: str, database_url: str) -> Path:
    """Where a virtual agent (`gctl agent run --simulate`) holds its lock: beside the real
    agents' state directories, under a name no node can have (`_` is no part of a DNS name),
    one for each database, whose Nodes they are (a replay's scratch database has its own)."""
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:12]
    return default_state_dir("_virtual") / f"{name_prefix}-{digest}"


class Agent:
    def __init__(
        self,
        database: db.Database,
        node_name: str,
        backend: gpu_backends.Backend,
        state_dir: Path,
        *,
        labels: dict[str, str] | None = None,
        heartbeat_seconds: float = 10.0,
        grace_seconds: float = 10.0,
        fence_seconds: float = 30.0,
        address: str | None = None,
        clock: Callable[[], datetime] = meta.utcnow,
    ) -> None:
        self.db = database
        self.address = address  # where other nodes reach this one; None: its hostname
        self.name = node_name
        self.backend = backend
        self.instance = ownership.new_instance(
            heartbeat_seconds, fence_seconds, grace_seconds, clock()
        )
        # Before anything touches the state directory: a second agent for it stops here.
        self._state_lock = ownership.StateLock(state_dir, node_name, self.instance.id)
        self.runtime = runtime.Runtime(state_dir)
        self.labels = dict(labels or {})
        if backend.kind == "fake":
            self.labels[FAKE_LABEL] = "true"
        self.heartbeat_seconds = heartbeat_seconds
        self.grace_seconds = grace_seconds
        self.fence_seconds = fence_seconds
        self.lease = state_dir / "lease"  # touched on every heartbeat; supervisors watch its age
        self._settings = launches.Settings(
            node_name, grace_seconds, self.lease if fence_seconds else None, fence_seconds
        )
        self.clock = clock
        self._failures = failures.FailureLog(log)
        self.wake = threading.Event()
        self._retry = False  # the last pass failed for some attempt (`passes.Pass.retry`)
        # This node's cordoned or draining GPUs, read when a pass first wants to take an attempt
        # and kept while the feed shows no change to the Node (`_node_changes` counts them);
        # None for all of them, while the Node's spec does not validate.
        self._closed: tuple[int, set[int] | None] | None = None
        self._spec_unread: str | None = None  # the Node's spec that does not validate, as said
        self._node_changes = 0
        self._read_uids: set[str] = set()  # the Bindings the last pass read (`sync`)
        self._untidy: set[str] = set()  # ended attempts, unbound, whose directories remain
        # Revisions of this agent's own reports: the feed need not wake the loop for them.
        self._written: set[int] = set()
        self._written_lock = threading.Lock()
        # Sends this node's logs to `gctl logs` on other hosts, in a thread of its own.
        self.logs = logserver.LogServer(
            database,
            node_name,
            self.runtime.logs_dir,
            exits_bell=self.runtime.attempts_dir / supervisor.NOTIFY,
            ended=self._ended,
        )

    # -- the Node ------------------------------------------------------------------------------

    def claim(self, stop: threading.Event | None = None) -> bool:
        """Make the Node this agent's: ownership.Taken (one line naming the other agent) if
        another agent holds it and is alive. True once it is this agent's; False where that
        means watching the other one's heartbeat and there is no `stop` to watch with, or
        `stop` was set meanwhile (`ownership.claim`)."""
        predecessors = self._state_lock.predecessors

        def take(silent: ownership.Held | None) -> None:
            now = self.clock()
            heartbeat.claim(self.db, self.name, self.instance, predecessors, now, silent=silent)

        def read() -> ownership.Held | None:
            return heartbeat.held(self.db, self.name, self.instance, predecessors)

        if not ownership.claim(self.name, take, read, self.clock, stop):
            return False
        self._state_lock.claimed()
        # The claim wrote this agent's heartbeat: the attempts its first pass starts, before
        # its first `heartbeat`, must not find the lease a dead predecessor left and fence.
        self.lease.touch()
        return True

    def heartbeat(self) -> None:
        """Register or refresh this Node: GPUs as discovered now, heartbeat, Ready; said once
        for each spec as stored that does not validate (its GPUs take no new attempt)."""
        discovered = heartbeat.attribute(self.db, self.name, self.runtime, self.backend.discover())
        unread = heartbeat.beat(
            self.db,
            self.name,
            self.labels,
            discovered,
            self.clock(),
            instance=self.instance,
            predecessors=self._state_lock.predecessors,
            address=self.address,
            outlive=self._jobs_outlive(),
        )
        self.lease.touch()  # only after the heartbeat is in the database
        said = json.dumps(unread.spec, sort_keys=True) if unread is not None else None
        if unread is not None and said != self._spec_unread:
            log.warning(
                "%s; its GPUs take no new attempt until it is fixed (running jobs go on)",
                unread.error,
            )
        self._spec_unread = said

    def _jobs_outlive(self) -> float | None:
        """How long this node's jobs may run on after its last heartbeat, for the controller
        to wait before it retries them elsewhere (controller/nodes.py): this agent's fence, or
        the longest of the fences its jobs were launched with, by an agent before it whose
        flags differed (each plus one heartbeat: the lease is renewed after each). None where
        this agent or one of its jobs has no fence: they may run on for as long as they run."""
        own = self.instance.jobs_outlive()
        fences = self.runtime.fences()
        if own is None or None in fences:
            return None
        return max([own, *(f + self.heartbeat_seconds for f in fences if f is not None)])

    def abandon(self) -> None:
        """After a claim that failed: stop the runtime's helpers and let go of the state
        directory, so that the agent built again in this process (`gctl agent run` waiting
        for its database) can take it. The Node is left as it is: this instance and those
        before it, named in the state directory's lock file, are the next one's predecessors."""
        self.runtime.close()
        self._state_lock.release()

    def close(self) -> None:
        """Stop the runtime's helpers and let go of the Node and the state directory, so that
        another agent may start for them at once; jobs keep running."""
        self.runtime.close()
        try:
            heartbeat.release(self.db, self.name, self.instance)
        except errors.GctlError as exc:  # the database is away: the heartbeat goes stale
            log.warning("letting go of node %s: %s", self.name, exc)
        self._state_lock.release()

    def _closed_gpus(self) -> set[int] | None:
        """This node's GPUs that take no new attempt (cordoned or draining); None for every
        one while the Node's spec, which says which, does not validate: it fails closed."""
        changes = self._node_changes
        if self._closed is None or self._closed[0] != changes:
            closed: set[int] | None
            try:
                with self.db.read() as session:
                    current = store.Store(session).find(node.Node, self.name)
            except errors.StoredInvalid:  # said by the heartbeat
                closed = None
            else:
                gpus = current.status.gpus if current is not None else []
                closed = {g.index for g in gpus if current and current.spec.gpu_state(g.index)}
            self._closed = (changes, closed)  # stale at once if the Node changed meanwhile
        return self._closed[1]

    # -- the attempts --------------------------------------------------------------------------

    def sync(self) -> None:
        """One level-based pass over this node's Bindings (`passes.Pass`, attempts bound
        ahead last) and the attempts on disk whose Binding is gone."""
        skipped: list[errors.StoredInvalid] = []
        with self.db.read() as session:
            reader = store.Store(session)
            # Validated once per version: most of them are as the last pass read them. Shared
            # objects, never changed here: a pass writes copies.
            bindings = reader.shared_bindings_on(self.name, _SYNCED_PHASES, skipped=skipped)
            # What their attempts hold, for the pass to fail closed on while they run here
            unread = {i.uid: _gpus_as_stored(reader, i) for i in skipped}
        # Those that left the read (ended, deleted) are not read again: not kept either, as
        # no change feed tells this process's cache to drop them.
        read = {b.metadata.uid or "" for b in bindings}
        shared.forget(self._read_uids - read)
        self._read_uids = read
        for invalid in skipped:  # left alone, its attempt too: said once a minute
            self._failures.failed(f"binding {invalid.key[2]}", invalid)
        bindings.sort(key=lambda b: (binding.queued(b.spec, b.status), _created(b)))
        bound_uids = {b.metadata.uid for b in bindings} | {i.uid for i in skipped}
        the_pass = passes.Pass(
            self.db,
            self.name,
            self.runtime,
            self._settings,
            bindings,
            clock=self.clock,
            wake=self.wake,
            closed_gpus=self._closed_gpus,
            wrote=self._note_written,
            failed=self._failures.failed,
            unread=unread,
        )
        started = the_pass.run()
        self._retry = the_pass.retry
        self.runtime.settle()
        known = self.runtime.known()
        self._untidy.intersection_update(known)
        for uid in known:
            if uid in bound_uids or (started and uid in self._untidy):
                continue
            # Removing an ended attempt's directory takes milliseconds: a pass that started
            # jobs leaves it to a quieter one, so that other GPUs' hand-offs wait less.
            self._orphan(uid, tidy=not started)

    def _orphan(self, uid: str, *, tidy: bool = True) -> None:
        """An attempt on disk whose Binding is gone: stop it, and forget it once it ended
        (when `tidy`)."""
        state = self.runtime.state(uid)
        if state.phase == "running":
            log.warning("stopping attempt %s: its Binding was deleted", uid)
            self.runtime.stop(uid, warn=False)
        elif state.phase == "armed":
            self.runtime.disarm(uid)  # its job never starts; tidied once its supervisor ended
        elif state.phase == "disarming":
            self.runtime.disarm(uid)  # told again: it may have missed it
        elif tidy:
            if state.phase == "lost":
                self.runtime.kill_lost(uid)
            self.runtime.forget(uid)
            self._untidy.discard(uid)
        elif state.phase in ("exited", "absent"):
            self._untidy.add(uid)  # nothing left to stop: a busy pass need not look again

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Heartbeat and sync until `stop` is set; wakes on writes to Bindings and on exits.
        Ends with ownership.Taken if another agent takes the Node meanwhile."""
        try:
            self._run(stop)
        finally:
            self.close()

    def _run(self, stop: threading.Event) -> None:
        if not self.claim(stop):
            return
        self._settle_lost()
        self.heartbeat()
        with self.db.read() as session:
            since = store.Store(session).current_revision()
        watchers = [
            threading.Thread(
                target=self._follow_feed, args=(since, stop), daemon=True, name="agent-feed"
            ),
            threading.Thread(
                target=self._follow_attempts, args=(stop,), daemon=True, name="agent-files"
            ),
            threading.Thread(target=self.logs.run, args=(stop,), daemon=True, name="agent-logs"),
        ]
        for thread in watchers:
            thread.start()
        next_beat = 0.0
        while not stop.is_set():
            self.wake.clear()
            synced = self._guarded("agent pass", self.sync)
            # Beats even when a pass fails (a Binding that no longer validates, say): the node
            # and its running jobs are fine, and a silent node would have them declared lost.
            now = _monotonic()
            if now >= next_beat:
                beat = self._guarded("heartbeat", self.heartbeat)
                # A failed one is tried again shortly, not at once: the wait would not wait.
                retry = min(BEAT_RETRY_SECONDS, self.heartbeat_seconds)
                next_beat = now + (self.heartbeat_seconds if beat else retry)
            if not synced:
                stop.wait(PASS_RETRY_SECONDS)  # try again shortly
                continue
            due = next_beat - _monotonic()
            if self._retry:  # part of the pass failed: shortly, or on a write to look at
                due = min(due, PASS_RETRY_SECONDS)
            self.wake.wait(max(0.0, due))
        for thread in watchers:
            thread.join(timeout=5)

    def _guarded(self, what: str, step: Callable[[], object]) -> bool:
        """Run one step of the loop, which never dies: a failure is logged (once a minute for
        a repeat) and False returned; another agent taking the Node ends the loop."""
        try:
            step()
        except ownership.Taken:  # another agent acts for this node now: this one stops
            raise
        except Exception as exc:
            self._failures.failed(what, exc)
            return False
        return True

    def _settle_lost(self) -> None:
        """Before offering its GPUs again, stop what still runs of attempts declared lost while
        this agent was away, and wait for them to end, so no GPU is used twice."""
        alive = [u for u in self.runtime.known() if self.runtime.state(u).phase in _ALIVE]
        if alive:
            log.info("node %s: %d attempt(s) still running here: adopted", self.name, len(alive))
        self.sync()
        skipped: list[errors.StoredInvalid] = []  # waited for too: their GPUs are as held
        with self.db.read() as session:
            reader = store.Store(session)
            lost = reader.active_bindings(self.name, frozenset({"Lost"}), skipped=skipped)
        deadline = _monotonic() + self.grace_seconds + 5
        for uid in [a.metadata.uid or "" for a in lost] + [i.uid for i in skipped]:
            while self.runtime.state(uid).phase == "running" and _monotonic() < deadline:
                self.wake.wait(0.1)

    def _follow_feed(self, since: int, stop: threading.Event) -> None:
        """Wake the loop on writes to this node's Bindings; reconnect if the database goes.
        When `stop` is set it wakes the loop on its way out, so that the agent ends at once
        rather than at its next heartbeat."""
        try:
            self._watch_feed(since, stop)
        finally:
            self.wake.set()

    def _watch_feed(self, since: int, stop: threading.Event) -> None:
        said = failures.FailureLog(log)  # this thread's own
        while not stop.is_set():
            try:
                with feed.Watch(
                    self.db, since=since, kinds=[binding.Binding.KIND, node.Node.KIND], stop=stop
                ) as changes:
                    for batch in changes:
                        since = feed.resume_after(batch)
                        with self._written_lock:
                            written = self._written
                            self._written = {r for r in written if r > since}
                        if any(c.kind == node.Node.KIND and c.name == self.name for c in batch):
                            self._node_changes += 1  # cordoned or uncordoned, maybe
                            self.wake.set()
                        if any(
                            c.kind == binding.Binding.KIND
                            and c.object["spec"].get("node") == self.name
                            and c.revision not in written
                            for c in batch
                        ):
                            self.wake.set()
            except Exception as exc:  # a level-based pass catches up on whatever was missed
                said.failed("change feed", exc)  # once a minute, while the database is away
                self.wake.set()
                stop.wait(2.0)

    def _note_written(self, revision: int) -> None:
        """A revision of this agent's own reports: the feed need not wake the loop for it."""
        with self._written_lock:
            self._written.add(revision)

    def _ended(self, uid: str) -> bool:
        """Whether an attempt has ended on this host (or was never here, or was forgotten
        once its end was reported), for the log server."""
        return self.runtime.state(uid).phase in ("exited", "lost", "absent")

    def _follow_attempts(self, stop: threading.Event) -> None:
        """Wake the loop when a supervisor records a start or an exit."""
        bell = notify.bell(self.runtime.attempts_dir / supervisor.NOTIFY, stop)
        try:
            while not stop.is_set():
                if bell.wait(feed.RESYNC_SECONDS):
                    self.wake.set()
        finally:
            bell.close()
            self.wake.set()  # stopping: the loop too


def _gpus_as_stored(reader: store.Store, invalid: errors.StoredInvalid) -> frozenset[int] | None:
    """The GPUs the row of a Binding that does not validate names, read without validating
    it; None where they cannot be read (then its attempt is taken to hold every GPU)."""
    _, namespace, name = invalid.key
    rows = reader.list_wire(binding.Binding, namespace, names=[name])
    spec = rows[0].get("spec") if rows else None
    gpus = spec.get("gpus") if isinstance(spec, dict) else None
    if isinstance(gpus, list) and gpus and all(type(g) is int for g in gpus):
        return frozenset(gpus)
    return None


def _created(b: binding.Binding) -> datetime:
    return b.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)


def _monotonic() -> float:
    import time

    return time.monotonic()
