"""The benchmark of the scheduler: scheduling passes over 10,000 pending Jobs and 1,000 GPUs.

125 Node objects with 8 fake GPUs each are written straight into the store with a Ready
condition (no agent, no processes), then 10,000 pending Jobs asking for 1, 2 or half a GPU at
100 priorities, a quarter of them with an activeDeadlineSeconds. Each pass is
`scheduling.schedule` in its own write transaction, timed from its start to its commit:

- scheduling-pass: the first pass (every GPU free, no Job told anything yet); it binds and
  writes up to the pass's limits and leaves the rest to the next pass;
- scheduling-fill: passes until none is due at once (every GPU taken, every waiting Job told):
  how many, and how long in all;
- scheduling-pass-steady: a pass with nothing changed, and how many objects it wrote (none);
- scheduling-pass-one-exit: one attempt exits and its Job is accounted; the next pass;
- scheduling-planner: `placement.plan` alone on the first pass's snapshot, with no limit on
  placements (the reads and writes around it excluded);
- scheduling-4k: the first pass and the planner again, over 500 nodes (4,000 GPUs);
- scheduling-ahead: 10,000 pending one-GPU Jobs instead, passes until every GPU has a job and
  the next one bound ahead (the steady state of a lab's long queue of whole-GPU jobs); then a
  pass with nothing changed, the planner alone on that state, and the pass after one exit;
  then 1,000 Jobs of priorities 1 to 100 arrive, and the pass that preempts for them.
"""

import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime

from bench import jobs as job_benchmarks
from bench.store import BenchError, Context, Result, progress
from controller import jobs, pending, placement, reading, scheduling
from gctl.api import binding, job, meta, node
from gctl.store import db, store

NODES, GPUS_PER_NODE = 125, 8
BIG_NODES = 500  # scheduling-4k: 4,000 GPUs
PENDING = 10_000
MAX_PASSES = 400
PASS_BUDGET_S = 1.0
BURST = 1000  # scheduling-ahead: Jobs of higher priority than the whole queue


def _load(
    database: db.Database,
    now: datetime,
    nodes: int = NODES,
    make: Callable[[int], job.Job] | None = None,
) -> None:
    with database.write() as session:
        writer = store.Store(session)
        created = writer.create_many(
            [node.Node(metadata=meta.ObjectMeta(name=f"node-{n:03d}")) for n in range(nodes)]
        )
        for found in created:
            found.status.gpus = [
                node.GPUInfo(
                    index=i,
                    uuid=f"{found.name}-{i}",
                    model="NVIDIA A100-SXM4-80GB",
                    memory_total=80 * 2**30,
                    fake=True,
                )
                for i in range(GPUS_PER_NODE)
            ]
            found.status.heartbeat_time = now
            meta.set_condition(found.status.conditions, "Ready", "True", "AgentReady", now=now)
            writer.update_status(found)
        writer.create_many([(make or _job)(index) for index in range(PENDING)])


def _job(index: int) -> job.Job:
    return job.Job(
        metadata=meta.ObjectMeta(name=f"job-{index:05d}", namespace="default"),
        spec=job.JobSpec(
            command=["python", "train.py", "--seed", str(index)],
            priority=(index * 37) % 100,
            resources=job.Resources(gpus=(1, 2, 0.5)[index % 3]),
            active_deadline_seconds=3600 if index % 4 == 0 else None,
        ),
    )


def _whole_gpu_job(index: int) -> job.Job:
    """scheduling-ahead: a queue of one-GPU Jobs, the commonest shape of a lab's queue."""
    return job.Job(
        metadata=meta.ObjectMeta(name=f"job-{index:05d}", namespace="default"),
        spec=job.JobSpec(command=["python", "train.py", "--seed", str(index)]),
    )


def _urgent_job(index: int) -> job.Job:
    """scheduling-ahead's burst: one-GPU Jobs of priorities 1 to 100, above the queue's."""
    return job.Job(
        metadata=meta.ObjectMeta(name=f"urgent-{index:05d}", namespace="default"),
        spec=job.JobSpec(command=["python", "eval.py"], priority=1 + index % 100),
    )


def _stopping(database: db.Database) -> int:
    with database.read() as session:
        attempts = store.Store(session).active_bindings()
    return sum(1 for a in attempts if a.spec.stop_reason)


# The queue each database's controller would keep from pass to pass (`pending.Queue`).
_KEPT: dict[str, pending.Queue] = {}


def _timed_pass(database: db.Database, now: datetime) -> tuple[float, datetime | None]:
    kept = _KEPT.setdefault(database.url, pending.Queue())
    start = time.perf_counter()
    due = store.transact(database, lambda w: scheduling.schedule(w, now, kept=kept))
    return time.perf_counter() - start, due


def _revision(database: db.Database) -> int:
    with database.read() as session:
        return store.Store(session).current_revision()


def _time_planner(database: db.Database, now: datetime, *, places: bool = True) -> float:
    """`placement.plan` alone over the pending Jobs and the Jobs bound ahead, as a pass reads
    them; `places`: it must place some (the GPUs are free)."""
    with database.read() as session:
        reader = store.Store(session)
        world = reading.read_world(reader)
        requests = [reading.request_of(w, world) for w in reader.pending_wires()]
        requests += [request for request, _ in reading.queued_requests(world)]
    start = time.perf_counter()
    result = placement.plan(world.snapshot, requests, now)
    elapsed = time.perf_counter() - start
    placed = sum(1 for d in result.decisions if d.placement is not None)
    if places and placed == 0:
        raise BenchError("the planner placed nothing on 1,000 free GPUs")
    return elapsed


def _gpus_taken(database: db.Database) -> float:
    taken: dict[tuple[str, int], float] = defaultdict(float)
    with database.read() as session:
        for attempt in store.Store(session).active_bindings():
            if binding.movable(attempt.spec, attempt.status):
                continue  # bound ahead: the next job of its GPUs, holding none of them yet
            for index in attempt.spec.gpus:
                taken[(attempt.spec.node, index)] += attempt.spec.gpu_share
    if any(share > 1 + 1e-9 for share in taken.values()):
        raise BenchError("a GPU was bound more than once over")
    return round(sum(taken.values()), 6)


def _fill(database: db.Database, now: datetime, first_due: datetime | None) -> tuple[int, float]:
    """Passes until none is due at once (or after `scheduling.FOLLOW_UP`, as the controller
    runs the one after a pass that started Jobs); returns (passes, seconds), the first one
    included."""
    passes, seconds, due = 1, 0.0, first_due
    while due is not None and (due <= now or due == now + scheduling.FOLLOW_UP):
        if passes >= MAX_PASSES:
            raise BenchError(f"the queue did not settle in {MAX_PASSES} passes")
        elapsed, due = _timed_pass(database, now)
        passes, seconds = passes + 1, seconds + elapsed
    return passes, seconds


def _one_exit(database: db.Database, now: datetime) -> None:
    """The agent reports one attempt exited; the controller accounts for its Job."""
    with database.write() as session:
        writer = store.Store(session)
        attempt = next(
            b
            for b in writer.active_bindings()
            if b.spec.gpu_share == 1.0 and not binding.movable(b.spec, b.status)
        )
        attempt.status.phase = "Exited"
        attempt.status.exit_code = 0
        attempt.status.start_time = now
        attempt.status.finish_time = now
        attempt.status.reason = "Completed"
        writer.update_status(attempt)
        name, namespace = attempt.spec.job_name, attempt.namespace
    store.transact(database, lambda w: jobs.reconcile(w, namespace, name, now))


def bench_scheduling(ctx: Context) -> list[Result]:
    with job_benchmarks.fresh_database(ctx, "scheduling") as url:
        database = db.Database.open(url)
        try:
            return _measure(database)
        finally:
            database.close()


def _measure(database: db.Database) -> list[Result]:
    now = meta.utcnow()
    progress(f"writing {NODES} nodes x {GPUS_PER_NODE} GPUs and {PENDING:,} pending jobs...")
    _load(database, now)
    planner = _time_planner(database, now)
    progress("first scheduling pass...")
    first, due = _timed_pass(database, now)
    progress("passes until the queue settles...")
    passes, fill = _fill(database, now, due)
    taken = _gpus_taken(database)
    before = _revision(database)
    steady, _ = _timed_pass(database, now)
    writes = _revision(database) - before
    _one_exit(database, now)
    after_exit, _ = _timed_pass(database, now)
    return [
        Result("scheduling-pass", first, "s", PASS_BUDGET_S),
        Result("scheduling-fill", fill + first, "s", None, kind="info", note=f"{passes} passes"),
        Result("scheduling-gpus-taken", taken, "", float(NODES * GPUS_PER_NODE), kind="check"),
        Result("scheduling-pass-steady", steady, "s", PASS_BUDGET_S),
        Result("scheduling-pass-steady-writes", writes, "", 0, kind="check"),
        Result("scheduling-pass-one-exit", after_exit, "s", PASS_BUDGET_S),
        Result("scheduling-planner", planner * 1000, "ms", None, kind="info"),
    ]


def _bound_ahead(database: db.Database) -> int:
    with database.read() as session:
        attempts = store.Store(session).active_bindings()
    return sum(1 for a in attempts if binding.movable(a.spec, a.status))


def bench_scheduling_ahead(ctx: Context) -> list[Result]:
    """10,000 pending one-GPU Jobs onto 1,000 GPUs: once every GPU runs one and has the next
    bound ahead, a pass with nothing changed, and the one after an exit."""
    with job_benchmarks.fresh_database(ctx, "scheduling-ahead") as url:
        database = db.Database.open(url)
        try:
            now = meta.utcnow()
            progress(f"writing {NODES} nodes x {GPUS_PER_NODE} GPUs, {PENDING:,} one-GPU jobs")
            _load(database, now, make=_whole_gpu_job)
            first, due = _timed_pass(database, now)
            progress("passes until every GPU has a job and the next bound ahead...")
            passes, fill = _fill(database, now, due)
            ahead = _bound_ahead(database)
            planner = _time_planner(database, now, places=False)
            steady, _ = _timed_pass(database, now)
            _one_exit(database, now)
            after_exit, _ = _timed_pass(database, now)
            progress(f"{BURST:,} jobs of higher priorities arrive...")
            with database.write() as session:
                store.Store(session).create_many([_urgent_job(i) for i in range(BURST)])
            burst, _ = _timed_pass(database, now)
            stopping = _stopping(database)
        finally:
            database.close()
    gpus = NODES * GPUS_PER_NODE
    return [
        Result(
            "scheduling-ahead-fill", fill + first, "s", None, kind="info", note=f"{passes} passes"
        ),
        Result("scheduling-ahead-bound", ahead, "", float(gpus), kind="check"),
        Result("scheduling-ahead-steady", steady, "s", PASS_BUDGET_S),
        Result("scheduling-ahead-one-exit", after_exit, "s", PASS_BUDGET_S),
        Result("scheduling-ahead-planner", planner * 1000, "ms", None, kind="info"),
        Result(
            "scheduling-ahead-preempt",
            burst,
            "s",
            PASS_BUDGET_S,
            note=f"{stopping} attempts asked to stop",
        ),
    ]


def bench_scheduling_4k(ctx: Context) -> list[Result]:
    """The first pass only, over 10,000 pending Jobs and 4,000 GPUs (500 nodes x 8)."""
    with job_benchmarks.fresh_database(ctx, "scheduling-4k") as url:
        database = db.Database.open(url)
        try:
            now = meta.utcnow()
            progress(f"writing {BIG_NODES} nodes x {GPUS_PER_NODE} GPUs, {PENDING:,} pending jobs")
            _load(database, now, BIG_NODES)
            planner = _time_planner(database, now)
            first, _ = _timed_pass(database, now)
        finally:
            database.close()
    return [
        Result("scheduling-4k-pass", first, "s", PASS_BUDGET_S),
        Result("scheduling-4k-planner", planner * 1000, "ms", None, kind="info"),
    ]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "scheduling": bench_scheduling,
    "scheduling-4k": bench_scheduling_4k,
    "scheduling-ahead": bench_scheduling_ahead,
}
