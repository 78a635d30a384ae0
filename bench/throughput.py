"""The benchmarks of the real `gctl up` under load, and at rest, on fake GPUs.

- throughput-1000: 1,000 `true` Jobs on 8 fake GPUs, created in one transaction: commit -> the
  last one Succeeded. Beside it, measured in the same run before `gctl up` starts, the floor: a
  bare pool of 8 threads that fork/exec the same `/bin/sh -c true` 1,000 times. The budget is
  twice the floor's time (at least half its jobs per second); every state change of gctl's run
  is committed to the database (SQLite with synchronous=FULL), the floor keeps none. Beside
  it, for information: the CPU time per job of `gctl up` (its threads and the fork server;
  /proc/PID/stat) and of the whole machine (/proc/stat: the supervisors and the jobs too).
  And, for information, the CPU the Store alone spends per job on the seven object writes and
  three Events of a job's lifecycle (bench.lifecycle), beside what the budget leaves each job;
  and the machine's user and system CPU per `true` attempt launched through the agent's
  runtime alone (bench.attempts: fork server, supervisor, job; no database, no daemons).
- packing-200: 200 `sleep 0.5` Jobs (the command itself, no shell) on 8 fake GPUs in one
  `gctl apply`: apply -> the last one Succeeded, against the ideal 12.5 s + 2%; and the mean gap
  between one attempt's end and the next one's start on the same GPU, as their supervisors
  timed them (the Bindings' finishTime and startTime), against 10 ms. Beside it, the makespan
  from the Jobs' creation, without the apply's own start.
- throughput-deep: 400 `true` Jobs on 8 fake GPUs with nothing else queued, then 400 more ahead
  of 10,000 waiting Jobs of lower priority, in one `gctl up`: the second rate against the first
  (a pass reads the whole queue, and must stay cheap behind a long one), each from the start of
  the transaction that writes the Jobs. Budget: at most twice as slow.
- idle-60s: CPU seconds (user + system, the process and all its descendants, from
  /proc/PID/stat) that an idle `gctl up --fake-gpus 8` uses over 60 s, after one job ran.
  Beside it, for information, those it used from its start to its node Ready
  (`idle-60s-start-cpu`).
"""

import json
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import attempts, lifecycle
from bench import jobs as job_benchmarks
from bench.store import BenchError, Context, Result, progress, run_gctl
from gctl.api import job, meta
from gctl.store import store

THROUGHPUT_JOBS, THROUGHPUT_GPUS = 1000, 8
THROUGHPUT_TIMEOUT_S = 600.0
# A job's durable records alone (bench.lifecycle), in transactions of one GPU round of 8 Jobs
# (as the daemons batch them) and of all 1,000 at once (the most batching could give).
RECORD_ROUNDS = (THROUGHPUT_GPUS, THROUGHPUT_JOBS)
RUNTIME_ATTEMPTS = 300  # `true` attempts through the runtime alone (bench.attempts)
PACKING_JOBS, PACKING_GPUS, PACKING_SLEEP_S = 200, 8, 0.5
PACKING_IDEAL_S = PACKING_JOBS / PACKING_GPUS * PACKING_SLEEP_S
PACKING_TIMEOUT_S = 300.0
GAP_BUDGET_MS = 10.0
IDLE_WINDOW_S, IDLE_SETTLE_S, IDLE_BUDGET_S = 60.0, 5.0, 1.0
DEEP_JOBS, DEEP_BEHIND, DEEP_SLOWER = 400, 10_000, 2.0


def floor_seconds(jobs: int, workers: int) -> float:
    """The same commands forked and exec'd by a bare pool of `workers` threads."""

    def one(_: int) -> int:
        return subprocess.run(["/bin/sh", "-c", "true"], check=False).returncode

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        codes = list(pool.map(one, range(jobs)))
    elapsed = time.perf_counter() - start
    if any(codes):
        raise BenchError("`/bin/sh -c true` failed in the floor's pool")
    return elapsed


def bench_throughput(ctx: Context) -> list[Result]:
    """1,000 `true` Jobs through `gctl up` on 8 fake GPUs, against the bare fork/exec floor."""
    progress(f"throughput-1000: the floor, {THROUGHPUT_JOBS} forks in a pool of 8...")
    floor = floor_seconds(THROUGHPUT_JOBS, THROUGHPUT_GPUS)
    names = [f"true-{index:04d}" for index in range(THROUGHPUT_JOBS)]
    with job_benchmarks.daemons(ctx, "throughput-1000", THROUGHPUT_GPUS) as rig:
        progress(f"throughput-1000: {THROUGHPUT_JOBS} jobs of `true`...")
        daemons, machine = job_benchmarks.cpu_seconds(rig.proc.pid), machine_cpu_seconds()
        start = time.perf_counter()
        job_benchmarks.create_jobs(rig.database, dict.fromkeys(names, "true"))
        job_benchmarks.wait_finished(rig, names, THROUGHPUT_TIMEOUT_S)
        daemons = job_benchmarks.cpu_seconds(rig.proc.pid) - daemons
        machine = machine_cpu_seconds() - machine
        elapsed = max(rig.watcher.finished_at[n] for n in names) - start
    rate, floor_rate = THROUGHPUT_JOBS / elapsed, THROUGHPUT_JOBS / floor
    per_job = 1000 / THROUGHPUT_JOBS
    progress("throughput-1000: the records alone, through the Store...")
    with job_benchmarks.fresh_database(ctx, "throughput-1000-records") as url:
        records = {n: lifecycle.cpu_ms_per_job(url, THROUGHPUT_JOBS, n) for n in RECORD_ROUNDS}
    progress(f"throughput-1000: {RUNTIME_ATTEMPTS} attempts through the runtime alone...")
    user, system = attempts.cpu_ms_per_attempt(ctx.workdir / "runtime-alone", RUNTIME_ATTEMPTS)
    # The CPU the budget leaves each job, for everything: the two-fold floor's time, all cores.
    allowed = floor * 2 * (os.cpu_count() or 1) * per_job
    return [
        Result(
            "throughput-1000",
            elapsed,
            "s",
            round(floor * 2, 2),
            note=f"{rate:.0f} jobs/s; floor {floor_rate:.0f} jobs/s, budget {floor_rate / 2:.0f}",
        ),
        Result("throughput-1000-floor", floor, "s", None, kind="info"),
        Result(
            "throughput-1000-cpu-gctl-up",
            daemons * per_job,
            "ms",
            None,
            kind="info",
            note="CPU per job: controller, agent, fork server",
        ),
        Result(
            "throughput-1000-cpu-machine",
            machine * per_job,
            "ms",
            None,
            kind="info",
            note="CPU per job, every process (supervisors, jobs ...)",
        ),
        *(
            Result(
                f"throughput-1000-records-{n}",
                ms,
                "ms",
                None,
                kind="info",
                note=f"CPU per job, the Store alone, rounds of {n}; budget leaves {allowed:.1f}",
            )
            for n, ms in records.items()
        ),
        Result(
            "throughput-1000-attempt-cpu",
            user + system,
            "ms",
            None,
            kind="info",
            note=f"machine CPU per attempt, runtime alone: {user:.1f} user, {system:.1f} system",
        ),
    ]


def bench_deep(ctx: Context) -> list[Result]:
    """`true` Jobs through `gctl up` with an empty queue behind them, then with a long one."""
    with job_benchmarks.daemons(ctx, "throughput-deep", THROUGHPUT_GPUS) as rig:
        rates = []
        for label, behind in (("alone", 0), ("deep", DEEP_BEHIND)):
            names = [f"{label}-{index:03d}" for index in range(DEEP_JOBS)]
            waiting = [f"behind-{index:05d}" for index in range(behind)]
            progress(f"throughput-deep: {DEEP_JOBS} jobs of `true`, {behind} queued behind...")
            ranked = _ranked(names, waiting)
            start = time.perf_counter()
            with rig.database.write() as session:
                store.Store(session).create_many(ranked)
            job_benchmarks.wait_finished(rig, names, THROUGHPUT_TIMEOUT_S)
            elapsed = max(rig.watcher.finished_at[n] for n in names) - start
            rates.append(DEEP_JOBS / elapsed)
    alone, deep = rates
    return [
        Result(
            "throughput-deep",
            round(alone / deep, 2),
            "x",
            DEEP_SLOWER,
            note=f"slower: {deep:.0f} jobs/s ahead of {DEEP_BEHIND:,} waiting, {alone:.0f} alone",
        )
    ]


def _ranked(names: list[str], behind: list[str]) -> list[job.Job]:
    """`true` Jobs of priority 1 (`names`), then of priority 0 (`behind`): built before the
    clock starts, which counts from their write (Python's building of the benchmark's own
    10,400 objects is no part of what a user's submission costs)."""
    return [
        job.Job(
            metadata=meta.ObjectMeta(name=name),
            spec=job.JobSpec(command="true", priority=priority),
        )
        for priority, group in ((1, names), (0, behind))
        for name in group
    ]


def _packing_manifest(rig: job_benchmarks.Rig, names: list[str]) -> Path:
    items = [
        {
            "apiVersion": "gctl/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"command": ["sleep", f"{PACKING_SLEEP_S:g}"]},
        }
        for name in names
    ]
    path = rig.root / "jobs.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def bench_packing(ctx: Context) -> list[Result]:
    """200 `sleep 0.5` Jobs on 8 fake GPUs in one apply: makespan and the GPU gaps."""
    names = [f"pack-{index:03d}" for index in range(PACKING_JOBS)]
    with job_benchmarks.daemons(ctx, "packing-200", PACKING_GPUS) as rig:
        manifest = _packing_manifest(rig, names)
        progress(f"packing-200: {PACKING_JOBS} jobs of sleep 0.5 (ideal {PACKING_IDEAL_S:g} s)...")
        start, wall = time.perf_counter(), time.time()
        run_gctl(["apply", "-f", str(manifest), "--db", rig.url])
        job_benchmarks.wait_finished(rig, names, PACKING_TIMEOUT_S)
        makespan = max(rig.watcher.finished_at[n] for n in names) - start
        runs = job_benchmarks.attempt_runs(rig, names).values()
        gap = job_benchmarks.mean_gpu_gap_ms(runs)
        submitted = min(created(rig, names))
    overhead = (makespan / PACKING_IDEAL_S - 1) * 100
    from_submission = wall + makespan - submitted
    return [
        Result(
            "packing-200",
            makespan,
            "s",
            round(PACKING_IDEAL_S * 1.02, 2),
            note=f"{overhead:+.1f}% over the ideal {PACKING_IDEAL_S:g} s",
        ),
        Result("packing-200-gpu-gap-mean", gap, "ms", GAP_BUDGET_MS),
        Result(
            "packing-200-from-submission",
            from_submission,
            "s",
            None,
            kind="info",
            note="the Jobs' creation -> the last Succeeded: without gctl apply's own start",
        ),
        *job_benchmarks.makespan_parts("packing-200", runs, wall, makespan),
    ]


def created(rig: job_benchmarks.Rig, names: list[str]) -> list[float]:
    """The Jobs' creation times (epoch seconds): when the apply wrote them."""
    wanted = set(names)
    with rig.database.read() as session:
        jobs = store.Store(session).list_objects(job.Job)
    return [
        j.metadata.creation_timestamp.timestamp()
        for j in jobs
        if j.metadata.name in wanted and j.metadata.creation_timestamp is not None
    ]


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has used since boot (`attempts.machine_cpu`)."""
    return sum(attempts.machine_cpu())


def bench_idle(ctx: Context) -> list[Result]:
    """CPU seconds of an idle `gctl up --fake-gpus 8` (controller + agent) over 60 s."""
    with job_benchmarks.daemons(ctx, "idle-60s", 8) as rig:
        time.sleep(IDLE_SETTLE_S)  # the warm-up job's aftermath
        progress(f"idle-60s: measuring an idle gctl up for {IDLE_WINDOW_S:g} s...")
        before = job_benchmarks.cpu_seconds(rig.proc.pid)
        time.sleep(IDLE_WINDOW_S)
        used = job_benchmarks.cpu_seconds(rig.proc.pid) - before
        if rig.proc.poll() is not None:
            raise rig.fail("gctl up exited while idle")
    return [
        Result("idle-60s", used, "s", IDLE_BUDGET_S, note="CPU seconds"),
        Result(
            "idle-60s-start-cpu",
            rig.ready_cpu,
            "s",
            None,
            kind="info",
            note="CPU seconds from gctl up's start to its node Ready (both its processes)",
        ),
    ]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "throughput-1000": bench_throughput,
    "throughput-deep": bench_deep,
    "packing-200": bench_packing,
    "idle-60s": bench_idle,
}
