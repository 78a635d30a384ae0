"""One pass of the node agent over this node's Bindings: each attempt moved one step on this
host (started, stopped, taken, armed or given back) and what became of it reported.

A `Pass` holds what one pass reads and decides, and lives for that pass only: the Bindings as
read, the attempts' states on this host, the Jobs of those it may start, and the statuses and
Events it writes together, in one transaction (and one more for the attempts it took). What
outlasts a pass (the Node, the runtime, the attempts on disk whose Binding is gone, the loop)
is the agent's (agent.py).

An attempt bound ahead (it starts after others on its GPUs) is *armed* while they run: the
agent takes it (phase Armed, a compare-and-set like every report) and starts its supervisor,
which starts the job the moment they end, without the agent (docs/decisions.md). Asked for it
back (`spec.disarm`), or when its GPUs are cordoned, the agent takes it from the supervisor if
the job has not started and reports it Pending again.
"""

import logging
import shlex
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from gctl.api import binding, errors, job
from gctl.store import db, events, store
from nodeagent import launches, reports, runtime, supervisor

log = logging.getLogger("gctl.agent")
# Stops the user asked for explicitly: no stop warning, as for `kubectl delete --now`; nor for
# the members of a multi-node attempt one of which ended badly (they cannot go on without it).
_UNWARNED_STOPS = frozenset({binding.STOP_DELETED, binding.STOP_RERUN, binding.STOP_MEMBER_ENDED})
_NOT_STARTED = supervisor.NOT_STARTED
# An attempt in these states on this host may use its GPUs now, or at any moment.
_HOLDING = frozenset({"running", "armed", "disarming", "lost"})


class Pass:
    """One pass over `bindings` (this node's, in the order they are synced), `run` once.
    `closed_gpus` says which of the node's GPUs take no new attempt (None: every one); `wrote`
    is told the revision of each write of the pass's reports; `wake` is set when the loop must
    look again at once (someone wrote meanwhile); `failed` is told what failed (a Job that
    does not validate, the database away) and `retry` set: the loop looks again shortly, not
    at once, which would spin while the fault lasts. `unread`: this node's attempts whose
    Binding does not validate, by uid, with the GPUs their rows name (None where those cannot
    be read)."""

    def __init__(
        self,
        database: db.Database,
        node_name: str,
        attempts: runtime.Runtime,
        settings: launches.Settings,
        bindings: list[binding.Binding],
        *,
        clock: Callable[[], datetime],
        wake: threading.Event,
        closed_gpus: Callable[[], set[int] | None],
        wrote: Callable[[int], None],
        failed: Callable[[str, BaseException], None],
        unread: dict[str, frozenset[int] | None] | None = None,
    ) -> None:
        self.db = database
        self.name = node_name
        self.runtime = attempts
        self._settings = settings
        self.clock = clock
        self.wake = wake
        self._closed_gpus = closed_gpus
        self._wrote = wrote
        self._failed = failed
        self.retry = False  # something failed: the loop runs the next pass shortly
        self._bindings = bindings
        self._unread = unread or {}
        self._reports: list[binding.Binding] = []  # statuses the pass will write
        self._events: list[events.Occurrence] = []  # and the Events that go with them
        self._taking: list[binding.Binding] = []  # attempts bound ahead the pass takes or arms
        self._arming: dict[str, runtime.Launch] = {}  # launches of those it arms, by uid
        self._started = 0  # attempts the pass started
        self._seen: dict[str, runtime.State] = {}  # attempts' states as the pass found them
        # The Jobs of the attempts the pass may start, read together when first needed; one
        # that does not validate, as the error it raised
        self._owners: dict[tuple[str, str], job.Job | errors.StoredInvalid | None] | None = None

    def run(self) -> int:
        """Move every attempt one step and write the reports; returns how many attempts the
        pass started.

        Attempts bound ahead come last: one whose predecessors have ended here is taken (its
        phase Starting), one whose predecessors still run is armed (Armed); either is written
        with the pass's reports, so a move by the scheduler and the take cannot both succeed,
        and started, or its supervisor started, as soon as that write commits."""
        bindings = self._bindings
        for bound in bindings:
            try:
                if binding.queued(bound.spec, bound.status) and not bound.spec.stop_reason:
                    self._take_if_free(bound, bindings)
                elif binding.armed(bound.status):
                    self._sync_armed(bound)
                else:
                    self._sync_one(bound)
            except errors.GctlError as exc:  # its Job does not validate, database away
                self._retry_soon(f"attempt {bound.name}", exc)
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
                self._retry_soon(f"attempt {bound.name}", exc)
        if taken:
            self._flush_reports()
        return self._started

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
        if self._held_unaccounted(gpus, after):
            return  # not known to have ended: it waits, neither taken nor armed
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
        if self._closed(gpus):
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
            if state.pid is not None:  # its supervisor started it: said here, once
                log.info(
                    "%s/%s attempt %d started on GPUs [%s] as the attempt before it ended "
                    "(armed; pid %d)",
                    bound.namespace,
                    bound.spec.job_name,
                    bound.spec.attempt,
                    span(set(bound.spec.gpus)),
                    state.pid,
                )
            self._sync_one(bound)
            return
        if bound.spec.stop_reason:
            if state.phase == "armed":
                self.runtime.stop(uid, warn=False)  # its supervisor records the end
            elif state.phase != "disarming":
                ended = runtime.State("exited", reason=bound.spec.stop_reason, message=_NOT_STARTED)
                self._report(bound, ended)
            return
        wanted_back = bound.spec.disarm or self._closed(set(bound.spec.gpus))
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
        if self._held_unaccounted(gpus):
            log.info("%s waits: GPUs [%s] may still be held here", bound.name, span(gpus))
            return True
        for other in self._bindings:
            if other is bound or not gpus & set(other.spec.gpus):
                continue
            here = self._state(other.metadata.uid or "").phase
            whole = bound.spec.gpu_share >= 1 and other.spec.gpu_share >= 1
            if here in ("armed", "disarming") or (here == "running" and whole):
                log.info("%s waits: GPUs [%s] are still held here", bound.name, span(gpus))
                return True
        return False

    def _closed(self, gpus: set[int]) -> bool:
        """Whether one of these GPUs takes no new attempt (cordoned or draining, or every GPU
        while the Node's spec does not validate)."""
        closed = self._closed_gpus()
        return closed is None or bool(gpus & closed)

    def _held_unaccounted(self, gpus: set[int], after: set[str] | None = None) -> bool:
        """Whether an attempt alive here that the pass cannot account for may hold one of
        these GPUs: one whose Binding does not validate (on the GPUs its row names, or on every
        GPU where those cannot be read), or one named in `after` that has no Binding among
        those read. What it holds is not known: a new attempt fails closed, as the scheduler
        does, rather than share a whole GPU with it (docs/decisions.md)."""
        valid = {b.metadata.uid for b in self._bindings}
        for uid in (after or set()) - valid:
            if self._state(uid).phase in _HOLDING:
                return True
        return any(
            (held is None or gpus & held) and self._state(uid).phase in _HOLDING
            for uid, held in self._unread.items()
        )

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
        the same name); errors.StoredInvalid if it does not validate (the attempt waits, and
        the others are read all the same). The Jobs of every attempt not yet started are read
        together, once a pass, when the first of them is needed."""
        key = (bound.namespace, bound.spec.job_name)
        if self._owners is None:
            wanted: dict[str, list[str]] = {}
            for b in self._bindings:
                if b.status.phase in ("Pending", "Starting"):
                    wanted.setdefault(b.namespace, []).append(b.spec.job_name)
            self._owners = self._read_owners(wanted)
        if key in self._owners:
            owner = self._owners[key]
        else:  # not one this pass read
            with self.db.read() as session:
                owner = store.Store(session).find(job.Job, bound.spec.job_name, bound.namespace)
        if isinstance(owner, errors.StoredInvalid):
            raise owner
        if owner is None or owner.metadata.uid != bound.spec.job_uid:
            return None
        return owner

    def _read_owners(
        self, wanted: dict[str, list[str]]
    ) -> dict[tuple[str, str], job.Job | errors.StoredInvalid | None]:
        """The Jobs named, by namespace: each found, None where there is none, or the error of
        one that does not validate (its namespace's Jobs are then read one by one)."""
        owners: dict[tuple[str, str], job.Job | errors.StoredInvalid | None] = {
            (namespace, name): None for namespace, names in wanted.items() for name in names
        }
        with self.db.read() as session:
            reader = store.Store(session)
            for namespace, names in wanted.items():
                try:
                    found = reader.find_many(job.Job, namespace, names)
                except errors.StoredInvalid:
                    found = []
                    for name in names:
                        try:
                            one = reader.find(job.Job, name, namespace)
                        except errors.StoredInvalid as exc:
                            owners[(namespace, name)] = exc
                            continue
                        found.extend([one] if one is not None else [])
                for one in found:
                    owners[(one.namespace, one.name)] = one
        return owners

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
        rank = bound.spec.rank
        log.info(
            "starting %s/%s attempt %d%s on GPUs [%s]: %s",
            bound.namespace,
            bound.spec.job_name,
            bound.spec.attempt,
            "" if rank is None else f" (rank {rank} of {len(bound.spec.members)})",
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
                self._wrote(writer.written_revision)
        except (errors.Conflict, errors.NotFound):
            self.wake.set()  # someone wrote one meanwhile (the scheduler moved it): look again
            return []
        except errors.GctlError as exc:  # database away: a pass shortly
            self._retry_soon(f"reporting {len(reports)} attempt(s)", exc)
            return []
        return taken

    def _retry_soon(self, what: str, exc: errors.GctlError) -> None:
        self._failed(what, exc)
        self.retry = True


def span(gpus: set[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))
