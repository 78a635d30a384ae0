"""Trace replay: a job trace through the real controller and virtual nodes, and how it went.

`python -m bench replay TRACE.csv [--nodes 8] [--gpus-per-node 8] [--time-scale 3600]
[--limit 500] [--oversize clip|skip|span] [--queue-order LongestFirst|FIFO] [--bind-ahead]
[--db URL] [--json]` starts `gctl controller run` and
`gctl agent run --simulate` (bench.sim) on a scratch database, submits each job of the trace
when its `submit_s`, divided by the time scale, has passed (as a Job whose
`gctl/simulated-duration` is its `duration_s`), waits until all have finished, and reports in
trace seconds: makespan, mean/p95 job completion time, mean/p95 queueing delay, GPU
utilization, and the lower bound on makespan (bench.trace.lower_bound) with the ratio; beside
them, the makespans of two ideal, zero-latency schedulers (bench.trace): first come, first
served with backfill (`fifo_makespan`), EASY backfilling that knows every run time
(`easy_makespan`, gctl's reservation made clairvoyant), and the same taking the longest job
first (`longest_first_makespan`). They tell the policy's share of the gap from gctl's.

The Jobs go to a GPUPool `default` whose `queueOrder` is `--queue-order` (LongestFirst unless
told otherwise) and which binds nothing ahead unless `--bind-ahead` is given (`bindAhead:
false`, as docs/scheduling.md advises for long jobs), and each declares a time limit,
activeDeadlineSeconds, of twice its scaled run time plus a second, rounded up: generous, as a
Slurm user gives `--time`, and never reached. In a LongestFirst pool the longest limit starts
first, and these limits rank the jobs exactly as their run times do, as no user's estimates
quite would; the limits also give the scheduler the end times its reservations and estimates
work from.

A job asking more GPUs than a node has asks for a whole node instead (`--oversize clip`, the
default, so the suite's figure stays comparable with its history), is left out (`skip`), or
becomes a multi-node Job (`span`, bench.trace.fit: 16 GPUs on 8-GPU nodes is 2 x 8), whose
every member "runs" for the job's duration; it counts from its first member's start to its
last member's finish, with all its members' GPUs.

Times are measured, not simulated: a job's submission is its Job's creation time, its start and
finish are its Binding's (the virtual agent writes the exact simulated finish), each converted
to trace seconds by multiplying by the time scale. So the control plane's own latency is in the
figures, magnified by the scale: at 3600, 10 ms of latency is 36 trace seconds.

The suite's `replay` entry replays the first 500 jobs of the Philly trace on 8 nodes x 8 GPUs at
a time scale of 3600 (two minutes), and its budget is a makespan within 10% of the bound. At
14400 it would take 40 s, but a millisecond of latency is then 14 trace seconds, and the 20 ms
between a job's submission and its start can decide where a 20-hour job lands and with it when
an 89-hour one gets a whole node (docs/decisions.md); at 3600 the same 20 ms is 72 trace
seconds.
"""

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import jobs as job_benchmarks
from bench import sim, trace
from bench.store import BenchError, Context, Result, progress
from gctl.api import binding, job, meta, pool, queue
from gctl.store import db, store
from nodeagent.virtual import MIN_TIME_SCALE

PHILLY = Path(__file__).parent / "traces" / "philly-2017-11-20-3000.csv"  # CC BY 4.0
SUITE_LIMIT, SUITE_TIME_SCALE = 500, 3600.0
DEFAULT_LIMIT, DEFAULT_TIME_SCALE = 500, 3600.0
RATIO_BUDGET = 1.10
TRACE_ANNOTATION = "gctl/trace-job-id"
FINISH_SLACK_S = 120.0


def time_limit(duration: float, scale: float) -> int:
    """The activeDeadlineSeconds a replayed job declares: twice its real run time plus a
    second, rounded up (the deadline must not end a job the trace lets finish)."""
    return math.ceil(2 * duration / scale + 1)


def _submit(
    database: db.Database, jobs: Sequence[tuple[str, trace.TraceJob]], scale: float
) -> None:
    made = []
    for name, j in jobs:
        limit = time_limit(j.duration, scale)
        new = sim.simulated_job(name, j.duration, j.gpus, limit, nodes=j.nodes)
        new.metadata.annotations[TRACE_ANNOTATION] = j.job_id
        made.append(new)
    with database.write() as session:
        store.Store(session).create_many(made)


def _submit_on_time(rig: sim.Cluster, jobs: Sequence[trace.TraceJob], scale: float) -> None:
    """Create each job once its (scaled) submission time has come; late ones together."""
    first = jobs[0].submit
    started = time.perf_counter()
    index = 0
    while index < len(jobs):
        wait = (jobs[index].submit - first) / scale - (time.perf_counter() - started)
        if wait > 0:
            time.sleep(wait)
        elapsed = time.perf_counter() - started
        batch = []
        while index < len(jobs) and (jobs[index].submit - first) / scale <= elapsed:
            batch.append((f"t{index:05d}", jobs[index]))
            index += 1
        _submit(rig.database, batch, scale)


def _records(database: db.Database, origin: datetime, scale: float) -> list[trace.Record]:
    """Each replayed Job's submission, first start and last finish, in trace seconds. A
    multi-node attempt is one Binding per node: it started when its first member did, ended
    when its last member did, and held all its nodes' GPUs."""

    def at(moment: datetime | None) -> float:
        if moment is None:
            raise BenchError("a finished attempt has no start or finish time")
        return (moment - origin).total_seconds() * scale

    with database.read() as session:
        reader = store.Store(session)
        owners = {j.name: j for j in reader.list_objects(job.Job)}
        attempts: dict[str, list[binding.Binding]] = {}
        for b in reader.list_objects(binding.Binding):
            attempts.setdefault(b.spec.job_name, []).append(b)
    records = []
    for name, owner in owners.items():
        tried = attempts.get(name, [])
        if owner.status.phase != "Succeeded" or not tried:
            raise BenchError(f"job {name} ended {owner.status.phase}: {owner.status.message}")
        first = min(b.spec.attempt for b in tried)
        last = max(b.spec.attempt for b in tried)
        resources = owner.spec.resources
        records.append(
            trace.Record(
                submit=at(owner.metadata.creation_timestamp),
                start=min(at(b.status.start_time) for b in tried if b.spec.attempt == first),
                finish=max(at(b.status.finish_time) for b in tried if b.spec.attempt == last),
                gpus=resources.gpu_count() * resources.node_count(),
            )
        )
    return records


def replay(
    url: str,
    root: Path,
    jobs: Sequence[trace.TraceJob],
    *,
    nodes: int,
    gpus_per_node: int,
    scale: float,
    queue_order: str = queue.LONGEST_FIRST,
    bind_ahead: bool = False,
) -> trace.Metrics:
    """Run the jobs through the controller and virtual nodes, in a GPUPool `default` of
    `queue_order` and `bind_ahead`; the metrics in trace seconds."""
    total = nodes * gpus_per_node
    bound = trace.lower_bound(jobs, total)
    names = [f"t{index:05d}" for index in range(len(jobs))]
    with sim.cluster(url, root, nodes, gpus_per_node, scale) as rig:
        # Binding ahead only when asked: with long jobs a GPU that frees should go to the
        # queue's first Job, not to one bound ahead to it (docs/scheduling.md).
        spec = pool.GPUPoolSpec(queue_order=queue_order, bind_ahead=bind_ahead)
        with rig.database.write() as session:
            store.Store(session).create(
                pool.GPUPool(metadata=meta.ObjectMeta(name=queue.DEFAULT_POOL), spec=spec)
            )
        progress(
            f"replay: {len(jobs)} jobs ({queue_order}), ideal {bound / scale:.1f} s at time "
            f"scale {scale:g}"
        )
        origin = meta.utcnow()
        _submit_on_time(rig, jobs, scale)
        timeout = bound / scale * 3 + FINISH_SLACK_S

        def finished(phases: dict[str, str]) -> bool:
            return all(phases.get(n) in job.FINISHED_PHASES for n in names)

        if not rig.watcher.wait(finished, timeout):
            done = sum(1 for n in names if rig.watcher.phases.get(n) in job.FINISHED_PHASES)
            raise rig.fail(f"replay: {done} of {len(jobs)} jobs finished after {timeout:.0f} s")
        records = _records(rig.database, origin, scale)
    return dataclasses.replace(
        trace.metrics(records, total, bound, start=0.0),  # `origin`: the submissions began
        fifo_makespan=trace.fifo_makespan(jobs, nodes, gpus_per_node),
        easy_makespan=trace.easy_makespan(jobs, nodes, gpus_per_node),
        longest_first_makespan=trace.longest_first_makespan(jobs, nodes, gpus_per_node),
    )


def report(metrics: trace.Metrics) -> dict[str, float | int | None]:
    """The figures by name, in trace seconds (as printed with --json); one that is not a
    number (the ratio to a lower bound of 0: every job took no time) is null, as JSON has no
    NaN."""

    def figure(value: float, digits: int) -> float | None:
        return round(value, digits) if math.isfinite(value) else None

    return {
        "jobs": metrics.jobs,
        "makespan_s": figure(metrics.makespan, 1),
        "lower_bound_s": figure(metrics.lower_bound, 1),
        "makespan_over_bound": figure(metrics.ratio, 4),
        "jct_mean_s": figure(metrics.jct_mean, 1),
        "jct_p95_s": figure(metrics.jct_p95, 1),
        "queueing_delay_mean_s": figure(metrics.queueing_mean, 1),
        "queueing_delay_p95_s": figure(metrics.queueing_p95, 1),
        "gpu_utilization": figure(metrics.utilization, 4),
        "fifo_reference_makespan_s": figure(metrics.fifo_makespan, 1),
        "easy_reference_makespan_s": figure(metrics.easy_makespan, 1),
        "longest_first_reference_makespan_s": figure(metrics.longest_first_makespan, 1),
    }


def print_table(metrics: trace.Metrics) -> None:
    hours = 3600.0
    rows = [
        ("makespan", metrics.makespan),
        ("lower bound on makespan", metrics.lower_bound),
        ("ideal FIFO's makespan", metrics.fifo_makespan),
        ("ideal EASY's makespan", metrics.easy_makespan),
        ("ideal LongestFirst's makespan", metrics.longest_first_makespan),
        ("mean JCT", metrics.jct_mean),
        ("p95 JCT", metrics.jct_p95),
        ("mean queueing delay", metrics.queueing_mean),
        ("p95 queueing delay", metrics.queueing_p95),
    ]
    print(f"{'METRIC':<30}{'TRACE SECONDS':>15}{'HOURS':>10}")
    for name, seconds in rows:
        print(f"{name:<30}{seconds:>15,.0f}{seconds / hours:>10.2f}")
    print(f"{'makespan / lower bound':<30}{metrics.ratio:>15.3f}")
    print(f"{'GPU utilization':<30}{metrics.utilization * 100:>14.1f}%")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench replay",
        description="Replay a job trace (CSV: job_id, submit_s, duration_s, gpus) through the "
        "real controller and virtual nodes.",
    )
    parser.add_argument("trace", type=Path, metavar="TRACE.csv")
    parser.add_argument("--nodes", type=int, default=8, help="virtual nodes (default 8)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs each (default 8)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help=f"trace seconds per real second (default {DEFAULT_TIME_SCALE:g})",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"replay the first N jobs (default {DEFAULT_LIMIT}; 0: all)",
    )
    parser.add_argument(
        "--oversize",
        choices=("clip", "skip", "span"),
        default="clip",
        help="jobs asking more GPUs than a node has: ask for a whole node (clip, the "
        "default), leave them out (skip), or run on as many nodes as they need (span)",
    )
    parser.add_argument(
        "--queue-order",
        choices=(queue.LONGEST_FIRST, queue.FIFO),
        default=queue.LONGEST_FIRST,
        help="the pool's queueOrder: the longest time limit first (the default), or the oldest",
    )
    parser.add_argument(
        "--bind-ahead",
        action="store_true",
        help="let the pool bind Jobs ahead to busy GPUs (bindAhead: true; default off)",
    )
    parser.add_argument("--db", metavar="URL", help="PostgreSQL admin URL (default: SQLite)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)
    for flag, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
        if value < 1:
            parser.error(f"{flag}: give a whole number of 1 or more")
    # As `gctl agent run --simulate --time-scale` takes it: NaN fails this too.
    if not MIN_TIME_SCALE <= args.time_scale < math.inf:
        parser.error(f"--time-scale: give a finite number of at least {MIN_TIME_SCALE:g}")
    if args.limit < 0:
        parser.error("--limit: give 0 (all) or more")
    return args


def load(
    path: Path, limit: int, nodes: int, gpus_per_node: int, oversize: str
) -> list[trace.TraceJob]:
    jobs = trace.read_trace(path, limit or None)
    fitted, oversized, left_out = trace.fit(jobs, gpus_per_node, oversize, nodes)
    if oversize == "span" and oversized:
        spanned = f"{oversized - left_out} run on several nodes at once"
        if left_out:
            spanned += f", {left_out} left out: they need more than {nodes} nodes"
        progress(f"{oversized} job(s) asked for more than {gpus_per_node} GPUs: {spanned}")
    elif oversized:
        verb = "asked for a whole node instead" if oversize == "clip" else "were left out"
        progress(f"{oversized} job(s) asked for more than {gpus_per_node} GPUs and {verb}")
    if not fitted:
        raise trace.TraceError(f"{path}: no job to replay")
    return fitted


def main(argv: Sequence[str]) -> int:
    """`python -m bench replay ...`; a bad trace or flag is one line and exit status 2."""
    args = parse_args(argv)
    try:
        jobs = load(args.trace, args.limit, args.nodes, args.gpus_per_node, args.oversize)
    except trace.TraceError as exc:
        print(f"bench replay: {exc}", file=sys.stderr)
        return 2
    from bench import __main__ as suite

    with suite.scratch(args.db) as ctx:
        try:
            metrics = replay(
                ctx.db_url,
                ctx.workdir / "replay",
                jobs,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                scale=args.time_scale,
                queue_order=args.queue_order,
                bind_ahead=args.bind_ahead,
            )
        except BenchError as exc:
            print(f"bench replay: {exc}", file=sys.stderr)
            return 1
    print(
        f"replay of {args.trace.name}: {metrics.jobs} jobs on {args.nodes} nodes x "
        f"{args.gpus_per_node} GPUs, time scale {args.time_scale:g}, {args.queue_order}"
        + (", binding ahead" if args.bind_ahead else "")
    )
    print_table(metrics)
    if args.json:
        summary: dict[str, Any] = report(metrics)
        summary |= {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node}
        summary |= {"time_scale": args.time_scale, "trace": str(args.trace)}
        summary |= {"queue_order": args.queue_order, "bind_ahead": args.bind_ahead}
        print(json.dumps(summary, allow_nan=False))
    return 0


def bench_replay(ctx: Context) -> list[Result]:
    """The suite's entry: the Philly slice's first 500 jobs, 8 x 8 GPUs, time scale 3600."""
    if not PHILLY.exists():
        raise BenchError(f"no trace at {PHILLY}")
    jobs = load(PHILLY, SUITE_LIMIT, 8, 8, "clip")
    with job_benchmarks.fresh_database(ctx, "replay") as url:
        metrics = replay(
            url, ctx.workdir / "replay", jobs, nodes=8, gpus_per_node=8, scale=SUITE_TIME_SCALE
        )

    def hours(seconds: float) -> float:
        return round(seconds / 3600, 2)

    return [
        Result(
            "replay-makespan",
            hours(metrics.makespan),
            "h",
            hours(metrics.lower_bound * RATIO_BUDGET),
            note=f"{metrics.ratio:.3f} x the lower bound {hours(metrics.lower_bound)} h",
        ),
        Result("replay-fifo-reference", hours(metrics.fifo_makespan), "h", None, kind="info"),
        Result(
            "replay-easy-reference",
            hours(metrics.easy_makespan),
            "h",
            None,
            kind="info",
            note="EASY backfilling, every run time known",
        ),
        Result(
            "replay-longest-first-reference",
            hours(metrics.longest_first_makespan),
            "h",
            None,
            kind="info",
            note="the same, longest first",
        ),
        Result("replay-jct-mean", hours(metrics.jct_mean), "h", None, kind="info"),
        Result("replay-jct-p95", hours(metrics.jct_p95), "h", None, kind="info"),
        Result("replay-queueing-mean", hours(metrics.queueing_mean), "h", None, kind="info"),
        Result("replay-queueing-p95", hours(metrics.queueing_p95), "h", None, kind="info"),
        Result(
            "replay-gpu-utilization", round(metrics.utilization * 100, 1), "%", None, kind="info"
        ),
    ]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {"replay": bench_replay}
