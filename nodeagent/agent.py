"""The node agent's loop: register the Node, heartbeat, and make this host's processes match the
Bindings that name it.

Level-based: every pass reads this node's Bindings and the attempts on disk and moves each one
step: launch what is bound and not yet running, stop what the controller asked to stop, report
what exited. It wakes on the change feed and on the supervisors' records (`notify`), and on
the heartbeat timer; a pass may run any number of times.

An attempt bound ahead (it starts after others on its GPUs) is *armed* while they run: the
agent takes it (phase Armed, a compare-and-set like every report) and starts its supervisor,
which starts the job the moment they end, without the agent (docs/decisions.md). Asked for it
back (`spec.disarm`), or when its GPUs are cordoned, the agent takes it from the supervisor if
the job has not started and reports it Pending again.
"""

import logging
import os
import shlex
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gctl.api import binding, errors, failures, job, meta, node
from gctl.store import db, events, feed, notify, store
from nodeagent import gpus as gpu_backends
from nodeagent import heartbeat, launches, logserver, ownership, reports, runtime, supervisor

log = logging.getLogger("gctl.agent")
FAKE_LABEL = "gctl/fake-gpus"
# Exited attempts need nothing more; Lost ones may still run here and must be stopped.
_SYNCED_PHASES = frozenset({"Pending", "Armed", "Starting", "Running", "Lost"})
# Stops the user asked for explicitly: no stop warning, as for `kubectl delete --now`.
_UNWARNED_STOPS = frozenset({binding.STOP_DELETED, binding.STOP_RERUN})
_NOT_STARTED = supervisor.NOT_STARTED


def default_state_dir(node_name: str) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    return Path(base) / "gctl" / node_name


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
        clock: Callable[[], datetime] = meta.utcnow,
    ) -> None:
        self.db = database
        self.name = node_name
        self.backend = backend
        self.instance = ownership.new_instance(heartbeat_seconds, clock())
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
        self._reports: list[binding.Binding] = []  # statuses a sync pass will write
        self._events: list[events.Occurrence] = []  # and the Events that go with them
        self._taking: list[binding.Binding] = []  # attempts bound ahead this pass takes or arms
        self._arming: dict[str, runtime.Launch] = {}  # launches of those it arms, by uid
        self._bindings: list[binding.Binding] = []  # this node's, as this pass read them
        self._started = 0  # attempts this pass started
        self._seen: dict[str, runtime.State] = {}  # attempts' states as this pass found them
        # The Jobs of the attempts this pass may start, read together when first needed
        self._owners: dict[tuple[str, str], job.Job | None] | None = None
        # This node's cordoned or draining GPUs, read when a pass first wants to take an attempt
        # and kept while the feed shows no change to the Node (`_node_changes` counts them).
        self._closed: tuple[int, set[int]] | None = None
        self._node_changes = 0
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

    def claim(self) -> None:
        """Make the Node this agent's: ownership.Taken (one line naming the other agent) if
        another agent's heartbeat for it is fresh."""
        predecessor = self._state_lock.predecessor
        heartbeat.claim(self.db, self.name, self.instance, predecessor, self.clock())

    def heartbeat(self) -> None:
        """Register or refresh this Node: GPUs as discovered now, heartbeat, Ready."""
        discovered = heartbeat.attribute(self.db, self.name, self.runtime, self.backend.discover())
        heartbeat.beat(
            self.db,
            self.name,
            self.labels,
            discovered,
            self.clock(),
            instance=self.instance,
            predecessor=self._state_lock.predecessor,
        )
        self.lease.touch()  # only after the heartbeat is in the database

    def close(self) -> None:
        """Stop the runtime's helpers and let go of the Node and the state directory, so that
        another agent may start for them at once; jobs keep running."""
        self.runtime.close()
        try:
            heartbeat.release(self.db, self.name, self.instance)
        except errors.GctlError as exc:  # the database is away: the heartbeat goes stale
            log.warning("letting go of node %s: %s", self.name, exc)
        self._state_lock.release()

    # -- the attempts --------------------------------------------------------------------------

    def sync(self) -> None:
        """One level-based pass over this node's Bindings and the attempts on disk.

        Attempts bound ahead come last: one whose predecessors have ended here is taken (its
        phase Starting), one whose predecessors still run is armed (Armed); either is written
        with the pass's reports, so a move by the scheduler and the take cannot both succeed,
        and started, or its supervisor started, as soon as that write commits."""
        skipped: list[errors.StoredInvalid] = []
        with self.db.read() as session:
            reader = store.Store(session)
            bindings = reader.active_bindings(self.name, _SYNCED_PHASES, skipped=skipped)
        for invalid in skipped:  # left alone, its attempt too: said once a minute
            self._failures.failed(f"binding {invalid.key[2]}", invalid)
        bindings.sort(key=lambda b: (binding.queued(b.spec, b.status), _created(b)))
        bound_uids = {b.metadata.uid for b in bindings} | {i.uid for i in skipped}
        self._bindings = bindings
        self._reports = []
        self._events = []
        self._taking = []
        self._arming = {}
        self._seen = {}
        self._owners = None
        self._started = 0
        for bound in bindings:
            try:
                if binding.queued(bound.spec, bound.status) and not bound.spec.stop_reason:
                    self._take_if_free(bound, bindings)
                elif binding.armed(bound.status):
                    self._sync_armed(bound)
                else:
                    self._sync_one(bound)
            except errors.GctlError as exc:  # deleted meanwhile, database away: next pass
                log.warning("%s: %s", bound.name, exc)
                self.wake.set()
        arming, self._arming = self._arming, {}
        taken = self._flush_reports()
        for bound in taken:
            try:
                uid = bound.metadata.uid or ""
                if uid in arming:
                    self._launch_armed(bound, arming[uid])
                else:
                    self._start(bound)
            except errors.GctlError as exc:
                log.warning("%s: %s", bound.name, exc)
                self.wake.set()
        if taken:
            self._flush_reports()
        self.runtime.settle()
        known = self.runtime.known()
        self._untidy.intersection_update(known)
        for uid in known:
            if uid in bound_uids or (self._started and uid in self._untidy):
                continue
            # Removing an ended attempt's directory takes milliseconds: a pass that started
            # jobs leaves it to a quieter one, so that other GPUs' hand-offs wait less.
            self._orphan(uid, tidy=not self._started)

    def _take_if_free(self, bound: binding.Binding, bindings: list[binding.Binding]) -> None:
        """Take an attempt bound ahead once the attempts it waits for have ended here and no
        other attempt holds its GPUs (nor one taken in this pass); arm it while the attempts
        on its GPUs run and none other waits for them first."""
        if bound.spec.disarm or self._state(bound.metadata.uid or "").phase == "disarming":
            return  # asked back (the controller moves it), or its last supervisor lingers
        gpus = set(bound.spec.gpus)
        if any(gpus & set(t.spec.gpus) for t in self._taking):
            return
        after = set(bound.spec.after)
        running = []
        for other in bindings:
            uid = other.metadata.uid or ""
            if other is bound or (uid not in after and not gpus & set(other.spec.gpus)):
                continue
            here = self._state(uid).phase
            if here == "running":
                running.append(uid)
            elif here in ("armed", "disarming"):
                return  # armed for these GPUs before it: it waits for that one to start
            elif here == "absent" and other.status.phase in ("Armed", "Starting"):
                return  # taken before it and not launched here yet
            elif here == "absent" and uid in after and other.status.phase == "Pending":
                return  # bound before it, not started yet
        if gpus & self._closed_gpus():
            return  # cordoned or draining since it was bound: the scheduler moves it
        if running:
            self._arm(bound, running)
            return
        status = bound.status.model_copy(update={"phase": "Starting"})
        self._reports.append(bound.model_copy(update={"status": status}))
        self._taking.append(bound)

    def _arm(self, bound: binding.Binding, running: list[str]) -> None:
        """Take an attempt bound ahead while the attempts on its GPUs run: report it Armed,
        with the generation of the Job its launch is made from; its supervisor is started
        once that write commits. One whose Job cannot start waits for the take, which says
        why."""
        uid = bound.metadata.uid or ""
        owner = self._owner(bound)
        if owner is None:
            return
        wait_for = tuple(self.runtime.lock_path(before) for before in running)
        try:
            self._arming[uid] = self._launch_of(bound, owner, wait_for=wait_for)
        except errors.Invalid:
            return
        update = {"phase": "Armed", "observed_generation": owner.metadata.generation}
        status = bound.status.model_copy(update=update)
        self._reports.append(bound.model_copy(update={"status": status}))
        self._taking.append(bound)

    def _launch_armed(self, bound: binding.Binding, launch: runtime.Launch) -> None:
        uid = bound.metadata.uid or ""
        log.info(
            "armed %s/%s attempt %d on GPUs [%s]: starts when %d attempt(s) before it end",
            bound.namespace,
            bound.spec.job_name,
            bound.spec.attempt,
            ",".join(str(g) for g in bound.spec.gpus),
            len(launch.wait_for),
        )
        self._seen[uid] = self.runtime.launch(launch)

    def _sync_armed(self, bound: binding.Binding) -> None:
        """An attempt this agent armed: report it once its job started or ended; end it
        before it starts when asked to stop; give it back (Pending) when the controller asks
        for it or its GPUs closed, if the job has not started."""
        uid = bound.metadata.uid or ""
        state = self._state(uid)
        if state.phase in ("running", "exited", "lost"):
            self._sync_one(bound)
            return
        if bound.spec.stop_reason:
            if state.phase == "armed":
                self.runtime.stop(uid, warn=False)  # its supervisor records the end
            elif state.phase != "disarming":
                ended = runtime.State("exited", reason=bound.spec.stop_reason, message=_NOT_STARTED)
                self._report(bound, ended)
            return
        wanted_back = bound.spec.disarm or bool(set(bound.spec.gpus) & self._closed_gpus())
        if state.phase == "armed":
            if wanted_back and self.runtime.disarm(uid):
                self._untake(bound)
            return
        # Taken back (its supervisor may linger: told again), or armed in the database only
        # (the agent died before launching it, or the host restarted): pending again, to be
        # taken or armed anew.
        if state.phase == "disarming":
            self.runtime.disarm(uid)
        self._untake(bound)

    def _untake(self, bound: binding.Binding) -> None:
        status = bound.status.model_copy(update={"phase": "Pending", "observed_generation": None})
        self._reports.append(bound.model_copy(update={"status": status}))
        self.wake.set()  # to take or arm it anew; the feed skips this agent's own writes

    def _gpus_held_here(self, bound: binding.Binding) -> bool:
        """Whether another attempt holds one of this one's GPUs on this host: one armed for it
        (its supervisor may start it at any moment), or a whole-GPU job running here (a Lost
        one being stopped). The scheduler places nothing there; this is the backstop for a
        race with it, so that two jobs never share a whole GPU: it starts when they are gone."""
        gpus = set(bound.spec.gpus)
        for other in self._bindings:
            if other is bound or not gpus & set(other.spec.gpus):
                continue
            here = self._state(other.metadata.uid or "").phase
            whole = bound.spec.gpu_share >= 1 and other.spec.gpu_share >= 1
            if here in ("armed", "disarming") or (here == "running" and whole):
                log.info("%s waits: GPUs [%s] are still held here", bound.name, span(gpus))
                return True
        return False

    def _closed_gpus(self) -> set[int]:
        """This node's GPUs that take no new attempt (cordoned or draining)."""
        changes = self._node_changes
        if self._closed is None or self._closed[0] != changes:
            with self.db.read() as session:
                current = store.Store(session).find(node.Node, self.name)
            gpus = current.status.gpus if current is not None else []
            closed = {g.index for g in gpus if current and current.spec.gpu_state(g.index)}
            self._closed = (changes, closed)  # stale at once if the Node changed meanwhile
        return self._closed[1]

    def _sync_one(self, bound: binding.Binding) -> None:
        uid = bound.metadata.uid or ""
        phase = bound.status.phase
        if phase == "Exited":
            return
        state = self._state(uid)
        if phase == "Lost":
            # The controller gave up on this attempt and retried its Job: whatever still
            # runs here must end, so that the Job never runs twice.
            if state.phase in ("running", "armed"):
                log.warning("stopping %s: its attempt was declared lost", bound.name)
                self.runtime.stop(uid, warn=False)
            elif (learnt := reports.lost_and_ended(bound, state)) is not None:
                self._tell_lost_end(bound, *learnt)
            return
        if bound.spec.stop_reason and state.phase == "running":
            # A job asked for a warning before preemption, eviction, its deadline or a
            # suspend, so that it can checkpoint; a deleted or re-run job is stopped at once.
            self.runtime.stop(uid, warn=bound.spec.stop_reason not in _UNWARNED_STOPS)
            return
        if state.phase == "absent":
            if phase == "Running":
                self._report(bound, runtime.State("lost", message="the attempt vanished"))
            elif bound.spec.stop_reason:
                self._report(
                    bound,
                    runtime.State("exited", reason=bound.spec.stop_reason, message=_NOT_STARTED),
                )
            elif not self._gpus_held_here(bound):
                self._start(bound)
            return
        if state.phase == "lost":
            self.runtime.kill_lost(uid)
        self._report(bound, state)

    def _owner(self, bound: binding.Binding) -> job.Job | None:
        """The Job an attempt of this pass runs, None if it was deleted (or replaced by one of
        the same name). The Jobs of every attempt not yet started are read together, once a
        pass, when the first of them is needed."""
        key = (bound.namespace, bound.spec.job_name)
        if self._owners is None:
            wanted: dict[str, list[str]] = {}
            for b in self._bindings:
                if b.status.phase in ("Pending", "Starting"):
                    wanted.setdefault(b.namespace, []).append(b.spec.job_name)
            self._owners = {(ns, name): None for ns, names in wanted.items() for name in names}
            with self.db.read() as session:
                reader = store.Store(session)
                for namespace, names in wanted.items():
                    for found in reader.find_many(job.Job, namespace, names):
                        self._owners[(found.namespace, found.name)] = found
        if key in self._owners:
            owner = self._owners[key]
        else:  # not one this pass read
            with self.db.read() as session:
                owner = store.Store(session).find(job.Job, bound.spec.job_name, bound.namespace)
        if owner is None or owner.metadata.uid != bound.spec.job_uid:
            return None
        return owner

    def _start(self, bound: binding.Binding) -> None:
        owner = self._owner(bound)
        if owner is None:
            self._report(
                bound,
                runtime.State(
                    "exited", reason="JobDeleted", message="the Job was deleted before it started"
                ),
            )
            return
        try:
            launch = self._launch_of(bound, owner)
        except errors.Invalid as exc:
            self._report(
                bound, runtime.State("exited", exit_code=127, reason="StartError", message=str(exc))
            )
            return
        self._launch(bound, launch)

    def _launch_of(
        self, bound: binding.Binding, owner: job.Job, *, wait_for: tuple[Path, ...] = ()
    ) -> runtime.Launch:
        """What to run for an attempt of `owner`; errors.Invalid if it cannot start here."""
        return launches.launch_for(self.runtime, self._settings, bound, owner, wait_for=wait_for)

    def _launch(self, bound: binding.Binding, launch: runtime.Launch) -> None:
        log.info(
            "starting %s/%s attempt %d on GPUs [%s]: %s",
            bound.namespace,
            bound.spec.job_name,
            bound.spec.attempt,
            ",".join(str(g) for g in bound.spec.gpus),
            shlex.join(launch.argv),
        )
        self._started += 1
        state = self.runtime.launch(launch)
        self._seen[launch.uid] = state
        self._report(bound, state)

    def _state(self, uid: str) -> runtime.State:
        """The attempt's state on this host, read once a pass (a launch updates it)."""
        state = self._seen.get(uid)
        if state is None:
            state = self._seen[uid] = self.runtime.state(uid)
        return state

    def _report(self, bound: binding.Binding, state: runtime.State) -> None:
        """Write what the host knows about an attempt into the Binding's status, if it moved
        (`reports.status_after`)."""
        uid = bound.metadata.uid or ""
        status = reports.status_after(
            bound, state, self.clock(), lambda: self.runtime.launched_log(uid)
        )
        if status is not None and status != bound.status:
            self._reports.append(bound.model_copy(update={"status": status}))

    def _tell_lost_end(
        self, bound: binding.Binding, status: binding.BindingStatus, message: str
    ) -> None:
        """Keep how a lost attempt ended, learnt on coming back: in its Binding (still Lost:
        its Job was requeued on it and stays so) and in an Event on its Job, written with the
        pass's reports in one transaction, so the Event is told once, with the exit it tells."""
        self._reports.append(bound.model_copy(update={"status": status}))
        owner = events.standin(
            job.Job.KIND, bound.spec.job_name, bound.namespace, bound.spec.job_uid
        )
        self._events.append(
            events.Occurrence(
                owner, reports.REASON_LOST_ENDED, message, source=f"agent/{self.name}"
            )
        )

    def _flush_reports(self) -> list[binding.Binding]:
        """Write the pass's reports in one transaction: one commit, one wake-up of the
        controller, however many attempts ended together. Returns the attempts this pass took,
        as written, once the write committed (none if it failed)."""
        reports, self._reports = self._reports, []
        occurrences, self._events = self._events, []
        taking, self._taking = {b.metadata.uid for b in self._taking}, []
        if not reports:
            return []
        taken = []
        try:
            with self.db.write() as session:
                writer = store.Store(session)
                with writer.batched():
                    for report in reports:
                        written = writer.update_status(report)
                        if written.metadata.uid in taking:
                            taken.append(written)
                    for o in occurrences:
                        writer.record_event(o.involved, o.reason, o.message, source=o.source)
            if writer.written_revision is not None:
                with self._written_lock:
                    self._written.add(writer.written_revision)
        except (errors.Conflict, errors.NotFound):
            self.wake.set()  # someone wrote one meanwhile (the scheduler moved it): look again
            return []
        except errors.GctlError as exc:  # deleted meanwhile, database away: next pass
            log.warning("reporting %d attempt(s): %s", len(reports), exc)
            self.wake.set()
            return []
        return taken

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
        self.claim()
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
            if now >= next_beat and self._guarded("heartbeat", self.heartbeat):
                next_beat = now + self.heartbeat_seconds
            if not synced:
                stop.wait(1.0)  # try again shortly
                continue
            self.wake.wait(max(0.0, next_beat - _monotonic()))
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
        while not stop.is_set():
            try:
                with feed.Watch(
                    self.db, since=since, kinds=[binding.Binding.KIND, node.Node.KIND], stop=stop
                ) as changes:
                    for batch in changes:
                        since = batch[-1].revision
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
                log.warning("change feed interrupted (%s); reconnecting", exc)
                self.wake.set()
                stop.wait(2.0)

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


def span(gpus: set[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))


def _created(b: binding.Binding) -> datetime:
    return b.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)


def _monotonic() -> float:
    import time

    return time.monotonic()
