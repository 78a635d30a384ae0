"""Job traces for replay: reading the CSV, fitting jobs to the nodes, and the metrics.

A trace is a CSV with the columns `job_id`, `submit_s`, `duration_s` and `gpus` (other columns,
such as the Philly trace's `vc`, are ignored). `submit_s` and `duration_s` are seconds; `gpus`
is a GPU count (a fraction up to 1 is allowed, as gctl shares GPUs; above 1, whole GPUs). A
job's duration is at most a year, as a Job's simulated duration is, and submissions span at most
ten. The file may begin with a byte order mark, as spreadsheets write one. Everything here is
pure: no database, no processes, so unit tests give it hand-made traces.

A job may span several nodes: it then asks for `gpus` GPUs on each of `nodes` distinct nodes at
once, as a multi-node Job does, and holds all `nodes x gpus` until it ends.
"""

import csv
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gctl.api import quantity

COLUMNS = ("job_id", "submit_s", "duration_s", "gpus")
# Submissions span at most ten years of trace time (a duration at most one, as a Job's
# simulated duration): beyond, a typo, or a replay that would sleep for ever.
MAX_SUBMIT_S = 10 * quantity.MAX_DURATION_SECONDS
EPSILON = 1e-9


class TraceError(ValueError):
    """The trace file cannot be read: one line naming the file, the row and the field."""


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit: float  # seconds, as in the trace
    duration: float  # seconds of run time
    gpus: float  # on each of its nodes
    nodes: int = 1  # distinct nodes at once, all started and ended together

    @property
    def total_gpus(self) -> float:
        return self.gpus * self.nodes


@dataclass(frozen=True)
class Record:
    """What happened to one replayed job, in trace seconds (any common origin)."""

    submit: float
    start: float  # its first attempt started
    finish: float  # its last attempt ended
    gpus: float  # on all its nodes together


@dataclass(frozen=True)
class Metrics:
    jobs: int
    makespan: float  # first submission -> last finish
    lower_bound: float
    jct_mean: float  # job completion time: submission -> finish
    jct_p95: float
    queueing_mean: float  # submission -> first start
    queueing_p95: float
    utilization: float  # GPU-seconds used / (GPUs x makespan), 0..1
    fifo_makespan: float = math.nan  # an ideal FIFO scheduler's, for reference
    easy_makespan: float = math.nan  # EASY backfilling's with run times known, the same
    longest_first_makespan: float = math.nan  # the same, longest job first

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound > 0 else math.nan


def _number(path: Path, line: int, column: str, text: str | None) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise TraceError(f"{path}: line {line}: {column} {text!r} is not a number") from None
    if not 0 <= value < math.inf:
        raise TraceError(f"{path}: line {line}: {column} {text!r} must be 0 or more")
    return value


def read_trace(path: Path, limit: int | None = None) -> list[TraceJob]:
    """The first `limit` jobs of the trace in submission order (a stable sort by submit_s)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            header = [name.strip() for name in reader.fieldnames or []]
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise TraceError(
                    f"{path}: missing column {missing[0]!r} (has: {', '.join(header) or 'none'}); "
                    f"a trace needs {', '.join(COLUMNS)}"
                )
            reader.fieldnames = header
            jobs = [_row(path, number, row) for number, row in enumerate(reader, start=2)]
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a CSV file ({exc})") from None
    jobs.sort(key=lambda j: j.submit)
    return jobs if limit is None else jobs[:limit]


def _row(path: Path, line: int, row: dict[str, str | None]) -> TraceJob:
    gpus = _number(path, line, "gpus", row["gpus"])
    if gpus == 0:
        raise TraceError(f"{path}: line {line}: gpus must be above 0")
    if gpus > 1 and not gpus.is_integer():
        raise TraceError(
            f"{path}: line {line}: gpus {row['gpus']!r} is neither a fraction of one GPU "
            "(at most 1) nor a whole number of GPUs"
        )
    seconds = {}
    for column, limit, words in (
        ("submit_s", MAX_SUBMIT_S, "ten years"),
        ("duration_s", quantity.MAX_DURATION_SECONDS, "a year"),
    ):
        seconds[column] = _number(path, line, column, row[column])
        if seconds[column] > limit:  # a typo, or a replay that never ends
            raise TraceError(
                f"{path}: line {line}: {column} {row[column]!r} is more than {words} "
                f"({limit} seconds)"
            )
    return TraceJob(
        job_id=(row["job_id"] or "").strip(),
        submit=seconds["submit_s"],
        duration=seconds["duration_s"],
        gpus=gpus,
    )


def fit(
    jobs: Sequence[TraceJob], gpus_per_node: int, oversize: str = "clip", nodes: int | None = None
) -> tuple[list[TraceJob], int, int]:
    """Jobs asking more GPUs than one node has: with "clip" they ask for a whole node instead,
    with "skip" they are left out, with "span" they become multi-node jobs of n =
    ceil(G / gpus_per_node) nodes with ceil(G / n) GPUs on each (16 on 8-GPU nodes: 2 x 8; 12:
    2 x 6), left out if n is more than the cluster's `nodes`. Returns (jobs, how many asked
    for more than a node, how many of those were left out)."""
    fitted, oversized, left_out = [], 0, 0
    for j in jobs:
        if j.gpus <= gpus_per_node:
            fitted.append(j)
            continue
        oversized += 1
        if oversize == "clip":
            fitted.append(TraceJob(j.job_id, j.submit, j.duration, float(gpus_per_node)))
            continue
        spread = math.ceil(j.gpus / gpus_per_node)
        if oversize == "span" and (nodes is None or spread <= nodes):
            each = float(math.ceil(j.gpus / spread))  # whole GPUs, as a multi-node Job takes
            fitted.append(TraceJob(j.job_id, j.submit, j.duration, each, spread))
            continue
        left_out += 1
    return fitted, oversized, left_out


def lower_bound(jobs: Sequence[TraceJob], total_gpus: int) -> float:
    """A makespan no schedule can beat, measured from the first submission.

    Two facts bound it from below. A job cannot finish before it was submitted plus its
    duration: max_i(s_i + d_i). And the jobs submitted at or after a time s cannot start before
    s, and their GPU-seconds W(s) take at least W(s)/G on G GPUs: max over submission times of
    (s + W(s)/G); at s = the first submission that is the whole trace's work over all GPUs.
    A multi-node job's work is all its GPUs' (nodes x gpus) for its duration: it holds them
    all, so both facts still hold. Times are relative to the first submission. (It ignores that
    a job cannot be split over nodes or time, so real schedules can be well above it when a
    few jobs dominate.)
    """
    if not jobs:
        return 0.0
    first = min(j.submit for j in jobs)
    bound = max(j.submit - first + j.duration for j in jobs)
    later_work = 0.0
    for j in sorted(jobs, key=lambda j: j.submit, reverse=True):
        later_work += j.total_gpus * j.duration
        bound = max(bound, j.submit - first + later_work / total_gpus)
    return bound


def fifo_makespan(jobs: Sequence[TraceJob], nodes: int, gpus_per_node: int) -> float:
    """The makespan of an ideal first-come-first-served list scheduler, for reference: no
    latency at all, each job on the fullest node it fits on (a multi-node job of n nodes on
    the n fullest nodes with its GPUs free on each, held until it ends), later jobs may start
    ahead of one that does not fit yet (backfill). GPUs are counted per node as a float, so
    fractions pack perfectly. The gap between this and the lower bound is the policy's, not
    gctl's."""
    return _list_schedule(jobs, nodes, gpus_per_node, reserve=False)


def easy_makespan(jobs: Sequence[TraceJob], nodes: int, gpus_per_node: int) -> float:
    """The makespan of EASY backfilling (Lifka, 1995; Slurm's backfill with exact time
    limits) that knows every job's run time, for reference: as `fifo_makespan`, but the first
    waiting job that does not fit reserves the node where it could start soonest (a multi-node
    job of n nodes: the n nodes where it could, from when the last of them could), and a later
    job may use a reserved node only if it ends by then. gctl reserves the same way, but
    without run times it cannot backfill a reserved node; so this is a clairvoyant version of
    its policy. A later job may also use a reserved node's GPUs that the reserved job will not
    need when it starts, however long it runs (EASY's "extra" resources, node by node)."""
    return _list_schedule(jobs, nodes, gpus_per_node, reserve=True)


def longest_first_makespan(jobs: Sequence[TraceJob], nodes: int, gpus_per_node: int) -> float:
    """The makespan of `easy_makespan`'s scheduler taking the longest waiting job first (the
    LPT rule), for reference: a GPUPool with `queueOrder: LongestFirst` whose Jobs declare
    their exact run times as time limits, with no latency."""
    return _list_schedule(jobs, nodes, gpus_per_node, reserve=True, longest_first=True)


def _list_schedule(
    jobs: Sequence[TraceJob],
    nodes: int,
    gpus_per_node: int,
    *,
    reserve: bool,
    longest_first: bool = False,
) -> float:
    if not jobs:
        return 0.0
    ordered = sorted(jobs, key=lambda j: j.submit)
    free = [float(gpus_per_node)] * nodes
    running: list[tuple[float, int, float]] = []  # (finish, node, gpus), a heap; one per node
    waiting: list[TraceJob] = []
    index, now, last = 0, ordered[0].submit, ordered[0].submit
    while index < len(ordered) or waiting or running:
        arrival = ordered[index].submit if index < len(ordered) else math.inf
        now = min(arrival, running[0][0]) if running else arrival
        if now == math.inf:  # what waits can never fit (fit() prevents it)
            break
        while running and running[0][0] <= now:
            finish, where, gpus = heapq.heappop(running)
            free[where] += gpus
            last = max(last, finish)
        while index < len(ordered) and ordered[index].submit <= now:
            waiting.append(ordered[index])
            index += 1
        if longest_first:
            waiting.sort(key=lambda j: -j.duration)  # stable: the oldest first among equals
        left = []
        held: Reservation | None = None
        for j in waiting:
            fits = [
                n
                for n in range(nodes)
                if free[n] >= j.gpus - EPSILON and (held is None or held.allows(n, j, now))
            ]
            if len(fits) < j.nodes:
                left.append(j)
                if reserve and held is None:
                    held = _soonest_start(j.gpus, free, running, now, j.nodes)
                continue
            for where in sorted(fits, key=lambda n: free[n])[: j.nodes]:  # the fullest first
                free[where] -= j.gpus
                if held is not None:
                    held.take(where, j, now)
                heapq.heappush(running, (now + j.duration, where, j.gpus))
        waiting = left
    return last - ordered[0].submit


@dataclass
class Reservation:
    """EASY's reservation for the first waiting job that does not fit: from `start` it takes
    its GPUs on each node of `spare`, which maps each to the GPUs it will leave free then."""

    start: float
    spare: dict[int, float]

    def allows(self, node: int, job: TraceJob, now: float) -> bool:
        """A job may use a reserved node if it ends by the start or fits in what is spare."""
        return (
            node not in self.spare
            or now + job.duration <= self.start
            or job.gpus <= self.spare[node] + EPSILON
        )

    def take(self, node: int, job: TraceJob, now: float) -> None:
        if node in self.spare and now + job.duration > self.start:
            self.spare[node] -= job.gpus  # it outlasts the start: on the GPUs to spare


def _soonest_start(
    gpus: float,
    free: list[float],
    running: list[tuple[float, int, float]],
    now: float,
    nodes: int = 1,
) -> Reservation:
    """When and where a job of `gpus` GPUs on each of `nodes` nodes could start soonest as the
    running jobs end: the `nodes` nodes that have its GPUs free soonest (then those with the
    most GPUs free now, then the first), from when the last of them does; and how many GPUs
    each will have to spare then: jobs that outlast the start may use those (EASY's "extra"
    resources)."""
    soonest = []  # (when the node has `gpus` free, -free now, node)
    for node, free_now in enumerate(free):
        available, start = free_now, now
        for finish, _, used in sorted(r for r in running if r[1] == node):
            if available >= gpus - EPSILON:
                break
            available, start = available + used, finish
        soonest.append((start, -free_now, node))
    chosen = sorted(soonest)[:nodes]
    assert len(chosen) == nodes  # fit() keeps every job within the cluster
    start = chosen[-1][0]
    spare = {}
    for _, minus_free, node in chosen:  # what is free there at the start, less the job's
        ended = sum(used for finish, where, used in running if where == node and finish <= start)
        spare[node] = -minus_free + ended - gpus
    return Reservation(start, spare)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest rank, as the other benchmarks report p99."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def metrics(
    records: Sequence[Record], total_gpus: int, bound: float, start: float | None = None
) -> Metrics:
    """Makespan, completion times, queueing delays and GPU utilization of a replay. The
    makespan counts from `start`, when the submissions began (by default the first one): the
    bound counts from the first submission as the trace schedules it, and a replay creates
    its first Job a moment after it began."""
    if not records:
        raise TraceError("no job was replayed")
    first = min(r.submit for r in records) if start is None else start
    makespan = max(r.finish for r in records) - first
    jct = [r.finish - r.submit for r in records]
    waits = [r.start - r.submit for r in records]
    used = sum(r.gpus * (r.finish - r.start) for r in records)
    return Metrics(
        jobs=len(records),
        makespan=makespan,
        lower_bound=bound,
        jct_mean=sum(jct) / len(jct),
        jct_p95=percentile(jct, 0.95),
        queueing_mean=sum(waits) / len(waits),
        queueing_p95=percentile(waits, 0.95),
        utilization=used / (total_gpus * makespan) if makespan > 0 else math.nan,
    )
