"""The queue a controller keeps from pass to pass: the pending Jobs, their Requests, in order.

A pass decides the head of the queue, and with every GPU busy that is all it decides; but it
read the whole queue to find the head: every pending Job, whether each may be held back, its
Request, the queue's order and what kinds of request are left (about 4.5 us a Job, 42 ms a pass
behind 10,000). `Queue` keeps all of that between passes and brings it up to date from the
change feed: a pass asks which Jobs were written since the revision it last read (the
`changes` table, `Store.changed_uids`), reads those that are still pending, and moves them in
or out of each pool's sorted list. So a pass over the head costs what changed, as Kueue's
heaps of pending workloads do. It is a cache of the database, never a second truth: a
controller that starts has an empty one; a pass that decides the whole queue reads the queue
in full (the first such pass in `REREAD_EVERY`) and keeps only what it found the same (the very
objects the Store's shared read gives an unchanged row, `shared`); so do a pass after more than
`MAX_CHANGES` Jobs were written, one whose set-aside Jobs changed, and one that finds the
database behind the revision it read last. A hand edit of a row that moves its
resource_version (as a running controller needs anyway: `shared`), which writes nothing to the
feed, is thus seen by a whole pass within a second or few (a Tail's pass, every second or few).

What a Job is read as:
- free: nothing may hold it back as stored (`queue.may_hold`: not suspended, deleted, in
  back-off, nor waiting for dependencies) and it names no GPUProfile. Its Request is built
  once per version of its spec (a Job told why it waits keeps its place and its Request) and
  kept in its pool's list, sorted by `queue_key`; the counts `depth.Ordered` needs are kept
  beside. Most of a long queue is free.
- the others: whether each is held back depends on the time and on other Jobs, so a pass
  looks at each (`hold_back`); their Requests are kept as the free ones' are, but for a Job
  that names a GPUProfile, built every pass from the profile as it is then.
Every kept Request was built with one run-time history and one set of pools' queue orders
(`reading.World`); when either is another object, every Request is given its new run time
and rank, and the lists sorted again.
"""

import bisect
from collections import ChainMap, Counter
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from controller import depth, placement, reading
from gctl.api import job, queue
from gctl.store import shared, store

Key = reading.Key
Wire = reading.Wire
Request = placement.Request

# Jobs written since the last pass's read past which a pass reads the whole queue again: as
# many changes cost about what reading it all does.
MAX_CHANGES = 2_000
# How often, at most, passes that decide the whole queue read it in full (`Queue.read`); those
# between read what changed, as a pass over the head does. Behind 10,000 Jobs a read in full
# took 20-30 ms of CPU, and while every pass started Jobs a whole pass ran every 120-200 ms
# (`scheduling.BACKLOG_SHARE`).
REREAD_EVERY = timedelta(seconds=1)
# Requests in or out of a pool's list past which it is sorted again rather than edited.
MAX_EDITS = 64


@dataclass(eq=False, slots=True)
class _Entry:
    uid: str
    wire: Wire
    key: Key
    command: str  # its command's key in the run-time history
    free: bool  # nothing may hold it back as stored, and it names no GPUProfile
    request: Request | None = None  # None: built by the next pass that needs it


class Queue:
    """The pending Jobs as of `revision`, for a controller's passes (the module says how)."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Keep nothing: the next pass reads the whole queue."""
        self.revision: int | None = None  # the revision read last; None: read it all
        self._read_at: datetime | None = None  # the pass's time of the last read in full
        self._aside: dict[tuple[str, str, str], str] = {}  # the set-aside Jobs it read with
        self._entries: dict[str, _Entry] = {}  # uid -> every pending Job not set aside
        self._others: dict[str, _Entry] = {}  # uid -> those not free
        self._unbuilt: dict[str, _Entry] = {}  # uid -> free Jobs whose Request is to be built
        self.by_key: dict[Key, Wire] = {}  # the free Jobs
        self._sorted: dict[str, list[Request]] = {}  # pool -> its free Jobs' Requests, in order
        # Requests to go into `_sorted` (by identity) and to come out of it, by the next pass
        # that orders the queue: a pass may read and fail before it does
        self._added: dict[int, Request] = {}
        self._removed: list[Request] = []
        self._shapes: Counter[depth.Shape] = Counter()  # of the free Jobs' Requests
        self._examples: dict[depth.Shape, Request] = {}
        self._must = 0  # free Jobs' Requests that `depth.must_decide`
        self._run_times: object = None  # what the kept Requests were built with
        self._orders: object = None

    def __len__(self) -> int:
        return len(self._entries)

    # -- reading -------------------------------------------------------------------------------

    def read(
        self,
        reader: store.Store,
        aside: reading.SetAside,
        *,
        whole: bool,
        now: datetime | None = None,
    ) -> None:
        """Bring the queue up to date with the database: from the change feed, or reading
        every pending Job for a pass that decides them all (`whole`; with `now`, only if the
        last such read is `REREAD_EVERY` old), the first, one after too many changes, one whose
        set-aside Jobs changed, or one that finds the database behind the revision it read
        last. A failure keeps nothing."""
        try:
            revision = reader.current_revision()
            changed = None
            last = self.revision
            # behind the last read: another database, or one restored from a backup
            current = last is not None and last <= revision and _jobs_of(aside) == self._aside
            if not self._in_full(whole, now) and last is not None and current:
                changed = reader.changed_uids(job.Job.KIND, last, MAX_CHANGES)
            if changed is None:
                if len(self._entries) > shared.MAX_KEPT:  # new objects all: hold one copy
                    self.forget()
                self._read_all(reader.pending_wires(), aside)
                self._read_at = now
            else:
                found = {w["metadata"]["uid"]: w for w in reader.pending_wires_of(changed)}
                for uid in changed:
                    w = found.get(uid)
                    self._put(uid, None if w is None or aside.holds(w) else w)
            self.revision, self._aside = revision, _jobs_of(aside)
        except BaseException:
            self.forget()
            raise

    def _in_full(self, whole: bool, now: datetime | None) -> bool:
        if not whole:
            return False
        last = self._read_at
        return now is None or last is None or not last <= now < last + REREAD_EVERY

    def _read_all(self, pending: list[Wire], aside: reading.SetAside) -> None:
        seen = set()
        entries = self._entries
        for w in pending:
            if aside.holds(w):
                continue
            uid = w["metadata"]["uid"]
            seen.add(uid)
            entry = entries.get(uid)
            if entry is None or entry.wire is not w:
                self._put(uid, w)
        for uid in [uid for uid in entries if uid not in seen]:
            self._put(uid, None)

    def _put(self, uid: str, w: Wire | None) -> None:
        """The Job `uid` is now `w` as stored, or None: not pending (or set aside)."""
        old = self._entries.get(uid)
        if old is not None and old.wire is w:
            return
        if old is not None:
            if w is not None and self._moved_in_place(old, w):
                return
            self._drop(old)
        if w is None:
            return
        entry = _Entry(uid, w, reading.key(w), _command(w), _free(w))
        if old is not None and old.request is not None and not _profiled(w):
            # its spec unchanged (a status written), the same Request
            entry.request = old.request if old.wire["spec"] == w["spec"] else None
        self._entries[uid] = entry
        if not entry.free:
            self._others[uid] = entry
            return
        self.by_key[entry.key] = w
        if entry.request is None:
            self._unbuilt[uid] = entry
        else:
            self._add(entry.request)

    def _moved_in_place(self, old: _Entry, w: Wire) -> bool:
        """A free Job whose status alone changed, still free: its place and Request stay."""
        if not old.free or old.request is None or old.wire["spec"] != w["spec"] or not _free(w):
            return False
        old.wire = self.by_key[old.key] = w
        return True

    def _drop(self, entry: _Entry) -> None:
        del self._entries[entry.uid]
        if not entry.free:
            del self._others[entry.uid]
            return
        if self.by_key.get(entry.key) is entry.wire:  # not the Job made anew under its name
            del self.by_key[entry.key]
        if entry.request is None:
            del self._unbuilt[entry.uid]
        else:
            self._remove(entry.request)

    def _add(self, request: Request) -> None:
        self._added[id(request)] = request
        shape = depth.shape_of(request)
        self._shapes[shape] += 1
        self._examples.setdefault(shape, request)
        self._must += depth.must_decide(request)

    def _remove(self, request: Request) -> None:
        if self._added.pop(id(request), None) is None:  # in `_sorted` already
            self._removed.append(request)
        shape = depth.shape_of(request)
        self._shapes[shape] -= 1
        if not self._shapes[shape]:
            del self._shapes[shape], self._examples[shape]
        self._must -= depth.must_decide(request)

    # -- a pass's queue ------------------------------------------------------------------------

    def hold_back(self, reader: store.Store, now: datetime) -> tuple[dict[Key, Wire], list[Wire]]:
        """The Jobs that are not free: those in the queue now, by key, and those held back
        (`queue.held`). One that does not validate raises StoredInvalid, to be set aside:
        `strict`, as the CLI's reading (which leaves it out of the queue) is not."""
        others = [entry.wire for entry in self._others.values()]
        eligible: dict[Key, Wire] = {}
        held: list[Wire] = []
        try:
            succeeded = reading.succeeded_dependencies(reader, others)
            for w in others:
                if queue.held(w, now, succeeded, strict=True):
                    held.append(w)
                else:
                    eligible[reading.key(w)] = w
        except Exception:
            reading.raise_invalid(others)
            raise
        return eligible, held

    def ordered(
        self,
        world: reading.World,
        others: dict[Key, Wire],
        queued: list[tuple[Request, Wire]],
    ) -> tuple[depth.Ordered, MutableMapping[Key, Wire]]:
        """The pass's requests in queue order: the free Jobs', the `others` (`hold_back`) and
        the Jobs bound ahead it decides again (`reading.queued_requests`); and every one of
        those Jobs as stored, by key."""
        try:
            if world.run_times is not self._run_times or world.orders is not self._orders:
                self._rerank(world)
            for entry in self._unbuilt.values():
                entry.request = reading.request_or_invalid(entry.wire, world)
                self._add(entry.request)
            self._unbuilt.clear()
            self._edit()
        except BaseException:
            self.forget()
            raise
        extras = [self._request_of_other(w, world) for w in others.values()]
        found = dict(others)  # the pass's writes may note a Job's new version here
        for request, w in queued:
            extras.append(request)
            found[reading.key(w)] = w
        runs: dict[str, list[Sequence[Request]]] = {
            pool: [waiting] for pool, waiting in self._sorted.items()
        }
        if not extras:
            ordered = depth.Ordered(runs, self._shapes, self._examples, self._must)
            return ordered, ChainMap(found, self.by_key)
        more = depth.Ordered.of(extras)
        for pool, pool_runs in more.runs.items():
            runs.setdefault(pool, []).extend(pool_runs)
        examples = ChainMap(dict(more.examples), self._examples)
        ordered = depth.Ordered(
            runs, self._shapes + more.shapes, examples, self._must + more.must, more.bound
        )
        return ordered, ChainMap(found, self.by_key)

    def _request_of_other(self, w: Wire, world: reading.World) -> Request:
        entry = self._others[w["metadata"]["uid"]]
        if entry.request is not None:
            return entry.request
        request = reading.request_or_invalid(w, world)
        if not _profiled(w):  # one that names a GPUProfile is read with it as it is now
            entry.request = request
        return request

    def _rerank(self, world: reading.World) -> None:
        """Every kept Request with the run time and rank the world gives it now, in order."""
        self._sorted, self._added, self._removed = {}, {}, []
        self._shapes, self._examples, self._must = Counter(), {}, 0
        for entry in self._entries.values():
            if entry.request is None:
                continue
            request = reading.with_run_time(entry.request, entry.command, world)
            entry.request = request = reading.ranked(request, world)
            if entry.free:
                self._add(request)
        self._run_times, self._orders = world.run_times, world.orders

    def _edit(self) -> None:
        """The Requests added and removed since the last pass, into and out of `_sorted`: one
        by one where few, else each pool's list filtered and sorted again."""
        added, removed = list(self._added.values()), self._removed
        if not added and not removed:
            return
        self._added, self._removed = {}, []
        if len(added) + len(removed) > MAX_EDITS:
            gone = {id(r) for r in removed}
            pools = {r.pool for r in added} | {r.pool for r in removed}
            for pool in pools:
                waiting = [r for r in self._sorted.get(pool, ()) if id(r) not in gone]
                waiting.extend(r for r in added if r.pool == pool)
                waiting.sort(key=depth.ORDER)
                self._sorted[pool] = waiting
        else:
            for request in removed:
                waiting = self._sorted[request.pool]
                at = bisect.bisect_left(waiting, request.order, key=depth.ORDER)
                if at >= len(waiting) or waiting[at] is not request:
                    at = next(i for i, r in enumerate(waiting) if r is request)
                del waiting[at]
            for request in added:
                bisect.insort(self._sorted.setdefault(request.pool, []), request, key=depth.ORDER)
        for pool in [pool for pool, waiting in self._sorted.items() if not waiting]:
            del self._sorted[pool]


def _jobs_of(aside: reading.SetAside) -> dict[tuple[str, str, str], str]:
    """The set-aside Jobs (a Node set aside is written again by every heartbeat: that must
    not make every pass read the whole queue)."""
    return {key: version for key, version in aside.versions.items() if key[0] == job.Job.KIND}


def _command(w: Wire) -> str:
    try:
        return reading.command_key(w["spec"].get("command"))
    except (AttributeError, KeyError, TypeError):
        return ""  # it does not validate: it fails as such where it is read (`hold_back`)


def _free(w: Wire) -> bool:
    return not queue.may_hold(w) and not _profiled(w)


def _profiled(w: Wire) -> bool:
    """Whether the Job names a GPUProfile; one that cannot be read is taken as one (it is read
    again every pass, and fails there as a Job that does not validate)."""
    try:
        return bool(w["spec"].get("resources", {}).get("profile"))
    except (AttributeError, KeyError, TypeError):
        return True
