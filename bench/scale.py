"""The benchmarks of scale: a big cluster of virtual nodes, and a deep queue.

- control-plane-10k: `gctl controller run` and `gctl agent run --simulate --virtual-nodes 500
  --gpus-per-node 8` (4,000 GPUs); 10,000 pending 1-GPU Jobs (that would run for a day) are
  created in one transaction; the figure is the time from that commit until every GPU is bound,
  i.e. 4,000 Jobs left Pending (the other 6,000 wait: they cannot all be Bound at once). The
  time until those 4,000 report Running is printed beside it. (In the whole suite: a quarter.)
- queue-depth-100k: 100,000 pending Jobs written straight into the store (untimed); then
  `gctl get jobs` until its first screenful (50 lines) arrived, and to its end (information);
  `gctl apply` of one more Job (median of 3; served by the command server, and in a process
  of its own for information); and the peak resident memory (VmHWM) of a
  `gctl controller run` over that queue after 30 s of work (no nodes: it tells Jobs why they
  wait, 256 per pass). The CLI is timed before the controller starts, so that on two cores it
  is not measured against a busy controller; and `gctl apply` (served) again 10 s into the
  controller's window, while it works through the queue: an apply must not wait for its
  passes (on SQLite one writer goes in at a time).
"""

import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench import jobs as job_benchmarks
from bench import sim
from bench.store import BenchError, Context, Result, gctl_command, progress, run_gctl
from gctl.api import job, meta
from gctl.store import db, store

NODES, GPUS_PER_NODE, PENDING = 500, 8, 10_000
BOUND_BUDGET_S = 10.0
SUITE_PART = 4  # the whole suite runs a quarter of control-plane-10k
BOUND_TIMEOUT_S = 300.0
DAY_S = 86_400.0
QUEUE = 100_000
QUEUE_CHUNK = 10_000
FIRST_PAGE_LINES = 50
GET_BUDGET_MS, APPLY_BUDGET_MS, RSS_BUDGET_MB = 300.0, 150.0, 500.0
APPLY_RUNS = 3
CONTROLLER_WINDOW_S = 30.0
APPLY_AFTER_S = 10.0  # into the controller's window: past its start, in its passes
ONE_JOB = """\
apiVersion: gctl/v1
kind: Job
metadata:
  name: one-more
spec:
  command: "python train.py"
"""


def _left_pending(phases: dict[str, str], wanted: str | None = None) -> int:
    return sum(1 for p in phases.values() if (p != "Pending" if wanted is None else p == wanted))


def bench_control_plane(ctx: Context) -> list[Result]:
    """10,000 pending Jobs onto 500 virtual nodes x 8 GPUs: commit -> every GPU bound.

    In the whole suite, a quarter of it (2,500 Jobs, 125 nodes) against a quarter of the
    budget, so that the suite fits in 10 minutes; run by name it has the issue's scale."""
    part = SUITE_PART if ctx.whole_suite else 1
    nodes, pending = NODES // part, PENDING // part
    gpus, budget = nodes * GPUS_PER_NODE, BOUND_BUDGET_S / part
    note = f"{gpus} GPUs" + (f", suite scale: {pending:,} jobs" if part > 1 else "")
    with job_benchmarks.fresh_database(ctx, "control-plane-10k") as url:
        root = ctx.workdir / "control-plane-10k" / "logs"
        with sim.cluster(url, root, nodes, GPUS_PER_NODE) as rig:
            progress(f"control-plane-10k: creating {pending:,} pending jobs...")
            with rig.database.write() as session:
                store.Store(session).create_many(
                    [sim.simulated_job(f"cp-{i:05d}", DAY_S) for i in range(pending)]
                )
            committed = time.perf_counter()
            if not rig.watcher.wait(lambda p: _left_pending(p) >= gpus, BOUND_TIMEOUT_S):
                bound = _left_pending(rig.watcher.phases)
                raise rig.fail(f"{bound} of {gpus} GPUs bound after {BOUND_TIMEOUT_S:g} s")
            bound_s = time.perf_counter() - committed
            if not rig.watcher.wait(lambda p: _left_pending(p, "Running") >= gpus, 120):
                raise rig.fail(f"the {gpus} bound jobs did not all report Running")
            running_s = time.perf_counter() - committed
    return [
        Result("control-plane-10k-bound", bound_s, "s", budget, note=note),
        Result("control-plane-10k-running", running_s, "s", None, kind="info"),
    ]


# -- queue depth -------------------------------------------------------------------------------


def _fill_queue(database: db.Database) -> None:
    for start in range(0, QUEUE, QUEUE_CHUNK):
        with database.write() as session:
            store.Store(session).create_many(
                [
                    job.Job(
                        metadata=meta.ObjectMeta(name=f"q-{i:06d}"),
                        spec=job.JobSpec(command=["python", "train.py", "--seed", str(i)]),
                    )
                    for i in range(start, min(QUEUE, start + QUEUE_CHUNK))
                ]
            )


def _time_first_page(url: str) -> tuple[float, float]:
    """`gctl get jobs`: (seconds until its first 50 lines arrived, seconds until it ended)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*gctl_command(), "get", "jobs", "--db", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    lines, first_page = 0, float("nan")
    for _ in proc.stdout:
        lines += 1
        if lines == FIRST_PAGE_LINES:
            first_page = time.perf_counter() - start
    if proc.wait() != 0 or lines != QUEUE + 1:
        raise BenchError(f"gctl get jobs exited {proc.returncode} after {lines} lines")
    return first_page, time.perf_counter() - start


def _time_apply(url: str, root: Path, served: bool, label: str = "") -> float:
    manifest = root / "one.yaml"
    manifest.write_text(ONE_JOB)
    times = []
    for index in range(APPLY_RUNS):
        text = ONE_JOB.replace("one-more", f"one-more-{index}-{served:d}{label}")
        manifest.write_text(text)
        elapsed, out = run_gctl(["apply", "-f", str(manifest), "--db", url], served)
        if not out.strip().endswith("created"):
            raise BenchError(f"gctl apply printed {out!r}")
        times.append(elapsed)
    return statistics.median(times)


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a live process, in MB (2**20 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmHWM in /proc/{pid}/status")


def _controller_at_work(url: str, root: Path) -> tuple[float, float]:
    """A `gctl controller run` over the queue: (its peak RSS in MB after the window, the
    median seconds of `gctl apply` of one more Job, served, while it works)."""
    log = root / "controller.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*gctl_command(), "controller", "run", "--db", url], stdout=out, stderr=out
        )
    try:
        time.sleep(APPLY_AFTER_S)
        apply_s = _time_apply(url, root, served=True, label="busy")
        time.sleep(max(0.0, CONTROLLER_WINDOW_S - APPLY_AFTER_S - 3 * apply_s))
        if proc.poll() is not None:
            raise BenchError(f"the controller exited {proc.returncode} (log {log})")
        return peak_rss_mb(proc.pid), apply_s
    finally:
        job_benchmarks.stop_daemons(proc)


def bench_queue_depth(ctx: Context) -> list[Result]:
    """100,000 pending Jobs: get's first page, apply one more, the controller's peak RSS."""
    root = ctx.workdir / "queue-depth-100k"
    root.mkdir(parents=True)
    with job_benchmarks.fresh_database(ctx, "queue-depth-100k") as url:
        database = db.Database.open(url)
        try:
            progress(f"queue-depth-100k: writing {QUEUE:,} pending jobs...")
            _fill_queue(database)
        finally:
            database.close()
        progress("queue-depth-100k: gctl get jobs, gctl apply...")
        first_page, whole = _time_first_page(url)
        apply_s = _time_apply(url, root, served=True)
        apply_alone_s = _time_apply(url, root, served=False)
        progress(f"queue-depth-100k: the controller for {CONTROLLER_WINDOW_S:g} s...")
        rss, busy_apply_s = _controller_at_work(url, root)
    return [
        Result("queue-depth-100k-get-first-page", first_page * 1000, "ms", GET_BUDGET_MS),
        Result("queue-depth-100k-get-all", whole * 1000, "ms", None, kind="info"),
        Result("queue-depth-100k-apply-one", apply_s * 1000, "ms", APPLY_BUDGET_MS),
        Result(
            "queue-depth-100k-apply-one-in-process", apply_alone_s * 1000, "ms", None, kind="info"
        ),
        Result(
            "queue-depth-100k-apply-one-busy",
            busy_apply_s * 1000,
            "ms",
            APPLY_BUDGET_MS,
            note=f"while the controller works through the queue ({APPLY_AFTER_S:g} s in)",
        ),
        Result(
            "queue-depth-100k-controller-rss",
            rss,
            "MB",
            RSS_BUDGET_MB,
            note=f"peak after {CONTROLLER_WINDOW_S:g} s",
        ),
    ]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "control-plane-10k": bench_control_plane,
    "queue-depth-100k": bench_queue_depth,
}
