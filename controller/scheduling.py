"""The scheduling pass: read a snapshot, let `placement` decide, then apply it with compare-and-set.

A pass runs in three steps (on SQLite the first two in a read transaction and the third in a
write transaction, so that its reads hold no writer back: `run`; elsewhere all three in one):

1. read (`reading`): the pending Jobs as stored (unvalidated: a pass pays only for those it
   writes; the controller keeps them from pass to pass, with their Requests in queue order,
   and reads only the Jobs written since its last pass: `pending`), Nodes, GPUPools,
   GPUProfiles, the active Bindings and their Jobs, and the run times of recent successful
   Jobs;
2. plan: `placement.plan`, a pure function of that snapshot, walking the queue in order
   (`depth.Ordered`) only as far as it must;
3. apply (`writing`): each placement creates the attempt's Binding (named `<job>-<attempt>`,
   unique, so a second controller racing on the same attempt fails) and moves the Job to
   Scheduled with the CAS of the Job it read; each preemption sets `stopReason: Preempted` on
   its victims' Bindings; each Job left waiting gets its Scheduled=False condition and
   estimated start, written only when they changed (`telling`; its place in the queue is not
   stored: gctl.api.queue).

A pass binds at most `Limits.binds` Jobs, writes at most `Limits.writes` waiting Jobs and starts
no write after `Limits.seconds` of writing (as Slurm's scheduler stops after so many starts or
so much time per cycle); it then returns `now`, so the controller runs the next pass at once
and no single transaction holds the database for long. A pass that binds a Job that starts now
leaves binding ahead and telling waiting Jobs to the next pass too (`writing._starting`), which
it makes due `FOLLOW_UP` after its own start rather than at once. And the controller's passes
decide the queue behind its head only when they may change something there besides what those
Jobs are told, or once a second (`Tail`): with every GPU busy, a pass over a long queue costs
what reading it costs, not what deciding and telling it does.

What lives here is the pass itself: its `Limits`, the two ways of running it (`schedule` in one
transaction; `run`, with SQLite's optimistic read), the read and plan (`_plan`) and when the
next pass is due (`_write`).
"""

import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from controller import pending, placement, reading, telling, writing
from gctl.api import errors, job
from gctl.store import bulk, db, store

Wire = reading.Wire
Key = reading.Key

# A pass that binds Jobs to start now writes only those (`writing._starting`); the pass that
# binds ahead and tells the waiting Jobs why is due this long after its start, not at once:
# meanwhile the agent starts those Jobs, which would otherwise share the CPU with it. An exit
# or a new Job runs a pass sooner, as always.
FOLLOW_UP = timedelta(milliseconds=50)
# A Job that waits on what the GPUs report (memory held by processes outside gctl, a pool's
# utilization or memory-used limit) is decided again this often: those readings change with
# every heartbeat, which does not wake the controller (it would run a pass per heartbeat).
METRICS_RECHECK = timedelta(seconds=5)


@dataclass(frozen=True)
class Limits:
    """How much one pass may do before it leaves the rest to the next one."""

    binds: int = 512  # Jobs bound
    writes: int = 256  # waiting Jobs whose status is written
    # Seconds of writing after which a pass starts no more writes (it binds at least one Job):
    # a pass holds the write lock, and SQLite has only one.
    seconds: float | None = 0.4
    clock: Callable[[], float] = time.perf_counter


LIMITS = Limits()

# How often, at least, a controller's passes decide the whole queue: between such passes, one
# that can change nothing behind the head of the queue but what those Jobs are told leaves
# them untold (`Tail`).
TAIL_EVERY = timedelta(seconds=1)
TAIL_SHARE = 0.05  # the most of its time a controller spends deciding the queue behind the head
# ... and while some of that queue is still to be told why it waits (a pass writes at most
# `Limits.writes` of them): 10,000 Jobs applied at once are all told within about a minute.
BACKLOG_SHARE = 0.25


@dataclass
class Tail:
    """When a controller's passes last set out to decide the whole queue, for those between.

    With every GPU busy and its next Job bound ahead, a pass after each exit decided every Job
    of the queue to tell them they still wait, and with 8,000 Jobs behind 8 GPUs of short jobs
    that was 0.6 s a pass and 12 jobs/s. So a pass decides the head of the queue
    (`placement.QUEUE_HEAD` Jobs) and goes on only while a later Job could change something
    more than what it is told (`placement.plan`'s `head`); what the others are told waits for
    the next pass that decides the whole queue: the controller's first, then one due
    `TAIL_EVERY` after the last that did, or later where that one took longer than
    `TAIL_SHARE` of the time between (10,000 queued: every 5-8 s). One that set out to and
    did not (it started Jobs and left the rest to the next, or ran out of writes) is taken up
    again sooner, in `BACKLOG_SHARE` of the time. Meanwhile a Job behind the head keeps what it
    was told last, as a Pod keeps its PodScheduled condition between kube-scheduler's
    attempts."""

    clock: Callable[[], datetime]  # the controller's
    last: datetime | None = None  # when the last pass that set out to decide it all began
    took: timedelta = timedelta(0)  # how long it took
    done: bool = False  # it decided (and told) the whole queue
    began: datetime | None = None  # of the pass now running
    whole: bool = True  # the pass now running sets out to decide the whole queue

    def head(self) -> int | None:
        """A pass begins: how many Jobs it decides whatever happens, or None for all."""
        self.began = self.clock()
        self.whole = self.last is None or self.due() <= self.began
        return None if self.whole else placement.QUEUE_HEAD

    def ended(self, whole: bool) -> datetime:
        """The pass's writes are committed, having decided (and told) the whole queue or not:
        when the next pass that must is due."""
        if self.whole and self.began is not None:
            self.last, self.took, self.done = self.began, self.clock() - self.began, whole
        return self.due()

    def due(self) -> datetime:
        """When the next pass that decides the whole queue is due: now, if none has yet (or
        the clock went back past the last one)."""
        now = self.clock()
        if self.last is None or self.last > now:
            return now
        if not self.done:
            return self.last + self.took / BACKLOG_SHARE
        return self.last + max(TAIL_EVERY, self.took / TAIL_SHARE)


def schedule(
    writer: store.Store,
    now: datetime,
    limits: Limits = LIMITS,
    aside: reading.SetAside | None = None,
    tail: Tail | None = None,
    *,
    kept: pending.Queue | None = None,
) -> datetime | None:
    """One pass in one transaction; returns when the next one is due: `now` when work was
    left for it (`now + FOLLOW_UP` when the pass started Jobs and left the rest), else when
    the next back-off ends, or the queue behind the head is to be decided (`tail`: without
    one, every pass decides the whole queue), if any. The stored objects that do not validate
    are left out (`reading.SetAside`): a Job that fails as the pass writes it raises
    StoredInvalid, and the next pass, given it in `aside.versions`, leaves it out too."""
    aside = aside if aside is not None else reading.SetAside()
    return _told(tail, *_locked_pass(writer, now, limits, aside, tail, kept=kept))


def _locked_pass(
    writer: store.Store,
    now: datetime,
    limits: Limits,
    aside: reading.SetAside,
    tail: Tail | None,
    *,
    kept: pending.Queue | None,
) -> tuple["_Planned", "Written"]:
    """A pass that reads, plans and writes under the scheduling lock."""
    with bulk.collector_paused():  # some hundred thousand objects over 10,000 pending Jobs
        writer.lock_scheduling()
        planned = _plan(writer, now, limits, aside, tail, kept=kept)
        return planned, _write(writer, planned, now, limits)


def run(
    database: db.Database,
    now: datetime,
    limits: Limits = LIMITS,
    aside: reading.SetAside | None = None,
    tail: Tail | None = None,
    *,
    kept: pending.Queue | None = None,
) -> tuple[datetime | None, int | None]:
    """The controller's pass: as `schedule`, and the revision it wrote at, if it wrote.

    SQLite has one writer at a time, and a pass that read and planned under the write lock
    held every other writer (an apply, an agent's report) for all of it: seconds over a queue
    of 100,000 Jobs. There the pass reads and plans in a read transaction, and only its writes
    take the lock. They are guarded as every write is (the CAS of each Job and Binding it
    read), and what no CAS sees, a Binding another pass made meanwhile (a second controller on
    the same file) or a Node deleted, makes it plan again from a fresh read (`RACES`). After
    `OPTIMISTIC_TRIES` such tries it reads under the lock, as on PostgreSQL, where reads never
    hold writers back and a pass is one transaction under its advisory lock."""
    aside = aside if aside is not None else reading.SetAside()
    if database.dialect == "sqlite":
        for _ in range(OPTIMISTIC_TRIES):
            aside.found.clear()  # of the last try
            with bulk.collector_paused():
                with database.read() as session:
                    reader = store.Store(session)
                    since = reader.current_revision()
                    planned = _plan(reader, now, limits, aside, tail, kept=kept)
                try:
                    with database.write() as session:
                        writer = store.Store(session)
                        if writer.changed_since(since, RACES):
                            raise PassRaced
                        outcome = _write(writer, planned, now, limits)
                        revision = writer.written_revision
                except (errors.Conflict, PassRaced):
                    continue
                return _told(tail, planned, outcome), revision
    written: list[int | None] = [None]

    def locked(writer: store.Store) -> tuple[_Planned, Written]:
        aside.found.clear()  # of an earlier try
        found = _locked_pass(writer, now, limits, aside, tail, kept=kept)
        written[0] = writer.written_revision
        return found

    return _told(tail, *store.transact(database, locked)), written[0]


class PassRaced(Exception):
    """A pass's plan may no longer hold (`RACES`) though no CAS of its writes would fail."""


OPTIMISTIC_TRIES = 3
# Writes between a pass's read and its own that its plan cannot survive and no CAS of its
# writes sees: a Binding made by another pass (its GPUs are taken) and a Node deleted (bind
# nothing to a Node that is gone).
RACES = (("Binding", "ADDED"), ("Node", "DELETED"))


@dataclass
class _Planned:
    """What a pass read and decided, for its writes."""

    held: list[Wire]
    decisions: list[placement.Decision]
    by_key: MutableMapping[Key, Wire]
    world: reading.World | None
    complete: bool = True
    on_metrics: bool = False  # a Job waits on what the GPUs report (`METRICS_RECHECK`)
    undecided: int = 0  # requests the plan left to the next pass (placement.Plan)
    untold: int = 0  # requests behind the head left to a pass that decides them all


def _plan(
    reader: store.Store,
    now: datetime,
    limits: Limits,
    aside: reading.SetAside,
    tail: Tail | None = None,
    *,
    kept: pending.Queue | None = None,
) -> _Planned:
    head = tail.head() if tail is not None else None
    waiting = kept if kept is not None else pending.Queue()
    waiting.read(reader, aside, whole=head is None, now=now)
    telling.TOLD.begin(len(waiting), whole=head is None)
    try:
        others, held = waiting.hold_back(reader, now)
        if not waiting.by_key and not others and not reader.any_queued_bindings():
            return _Planned(held, [], {}, None)
        world = reading.read_world(reader, aside)
        ordered, by_key = waiting.ordered(world, others, reading.queued_requests(world, aside))
    except BaseException:  # what it read but did not order is not kept half-done
        waiting.forget()
        raise
    result = placement.plan(
        world.snapshot, ordered, now, max_placements=limits.binds, starts_only=True, head=head
    )
    if result.undecided and not writing.starts(result.decisions, world):
        # Its one start is held back (an armed attempt asked back is still on its GPUs): the
        # pass writes as one that starts nothing.
        result = placement.plan(
            world.snapshot, ordered, now, max_placements=limits.binds, head=head
        )
    foreign = any(g.foreign_memory for g in world.snapshot.gpus)
    pools = world.snapshot.pools
    on_metrics = any(_waits_on_metrics(d, pools, foreign) for d in result.decisions)
    return _Planned(
        held,
        result.decisions,
        by_key,
        world,
        result.complete,
        on_metrics,
        result.undecided,
        result.untold,
    )


# What a pass's writes left: when the next pass is due, and whether it decided and told the
# whole queue (nothing left undecided, untold, or to the next pass's budget).
Written = tuple[datetime | None, bool]


def _told(tail: Tail | None, planned: _Planned, written: Written) -> datetime | None:
    """When the next pass is due, once the pass's writes are committed: also when the Jobs it
    left untold are to be decided, if it left any (`Tail`)."""
    due, whole = written
    if tail is None:
        return due
    told = tail.ended(whole)
    if not planned.untold:
        return due
    return told if due is None else min(due, told)


def _write(writer: store.Store, planned: _Planned, now: datetime, limits: Limits) -> Written:
    # The time limit counts from the first write.
    budget = writing.Budget.of(limits.writes, limits.seconds, limits.clock)
    due = _due(writer, planned, now, budget)
    whole = planned.complete and not planned.undecided and not planned.untold and not budget.short
    return due, whole


def _due(
    writer: store.Store, planned: _Planned, now: datetime, budget: writing.Budget
) -> datetime | None:
    if planned.world is not None:
        writing.apply(
            writer,
            planned.decisions,
            planned.by_key,
            planned.world,
            now,
            budget=budget,
            undecided=planned.undecided,
        )
    telling.forget_queue(writer, planned.held, budget.take)
    if planned.complete and budget.follow_up:
        return now + FOLLOW_UP
    if not planned.complete or budget.short:
        return now  # out of time or binds: what it left, at once
    if planned.undecided:
        return now + FOLLOW_UP
    due = _next_retry(planned.held, now)
    if planned.on_metrics:
        due = min(due or now + METRICS_RECHECK, now + METRICS_RECHECK)
    return due


def _waits_on_metrics(
    d: placement.Decision, pools: dict[str, placement.Pool], foreign: bool
) -> bool:
    """Whether a waiting Job may fit once a GPU reports less load: it asks for GPU memory while
    processes outside gctl hold some (`foreign`), or its pool has utilization or memory-used
    limits."""
    if d.placement is not None or d.reason != job.REASON_UNSCHEDULABLE:
        return False
    if d.request.gpu_memory is not None and foreign:
        return True
    rules = pools.get(d.request.pool)
    return rules is not None and (
        rules.max_utilization_percent is not None or rules.max_memory_used_percent is not None
    )


def _next_retry(pending: list[Wire], now: datetime) -> datetime | None:
    times = [t for t in map(reading.retry_after, pending) if t is not None and t > now]
    return min(times) + timedelta(milliseconds=1) if times else None
