"""The benchmarks of running jobs: the real `gctl up` (controller and node agent) on fake GPUs.

- start-latency: a 1-GPU Job's commit -> its process started, 8 idle GPUs, 30 times one by one.
- handoff-latency: one GPU, 30 queued Jobs: one job's exit -> the next one's start.
- makespan-500: 500 `sleep 1` Jobs on 8 GPUs in one `gctl apply`: apply -> the last Succeeded
  (ideal 62.5 s), and the mean exit-to-next-start gap on each GPU.

Each benchmark gets a database of its own (a new SQLite file, or a new PostgreSQL database next
to the suite's scratch one), so that the 10,000 Pending Jobs of apply-10k are never scheduled,
and starts `gctl up --fake-gpus N` as a real subprocess against it; one untimed warm-up Job
runs first. Process start and exit times come from the jobs themselves (`date +%s.%N` written
to a file; in makespan-500 that adds two `date` runs, about 2 ms, to each 1 s job), or, where a
benchmark runs its command bare (packing-200), from its Binding, as its supervisor timed it;
either is compared with wall-clock `time.time()` taken in the benchmark right after a commit.
The Jobs' phases are followed through the change feed, in a thread of the benchmark.

With GCTL_BENCH_PROFILE=DIR, `gctl up` runs with each of its threads under cProfile and writes
DIR/BENCHMARK/NN-THREAD.prof when it stops (`python -m pstats FILE` reads them). The times are
wall-clock times, waits for the GIL included; with GCTL_BENCH_PROFILE_CLOCK=cpu too they are
each thread's CPU time, which is what a CPU-bound benchmark is short of.
"""

import itertools
import json
import math
import os
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from bench.store import BenchError, Context, Result, gctl_command, progress, run_gctl
from bench.trace import percentile
from gctl.api import binding, errors, job, meta, node
from gctl.store import db, feed, store

START_RUNS = 30
START_GPUS = 8
HANDOFF_JOBS = 30
HANDOFF_TIMEOUT_S = 120.0
MAKESPAN_JOBS = 500
MAKESPAN_GPUS = 8
MAKESPAN_SECONDS = 1.0  # each job's `sleep`
MAKESPAN_IDEAL_S = MAKESPAN_JOBS / MAKESPAN_GPUS * MAKESPAN_SECONDS
MAKESPAN_BUDGET_S = MAKESPAN_IDEAL_S * 1.05
MAKESPAN_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 10.0
READY_TIMEOUT_S = 60.0
JOB_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
NODE = "bench-node"
STAMP = "date +%s.%N > {path}"
TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc/PID/stat's times
# cProfile follows only the thread that enables it, and the daemons are threads: hence our own.
PROFILE_ENV = "GCTL_BENCH_PROFILE"
PROFILE_CLOCK_ENV = "GCTL_BENCH_PROFILE_CLOCK"  # "cpu": time.thread_time instead of wall time


# -- a database and the daemons of one benchmark -------------------------------------------------


@contextmanager
def fresh_database(ctx: Context, label: str) -> Iterator[str]:
    """A new, empty database for one benchmark; a PostgreSQL one is dropped at the end."""
    if not ctx.db_url.startswith(("postgresql:", "postgres:", "postgresql+")):
        directory = ctx.workdir / label / "db"
        directory.mkdir(parents=True)
        yield str(directory / "gctl.db")
        return
    import psycopg
    from psycopg import sql
    from sqlalchemy import make_url

    scratch = make_url(ctx.db_url).set(drivername="postgresql")
    name = f"{scratch.database}_{label.replace('-', '_')}_{secrets.token_hex(3)}"
    admin = scratch.render_as_string(hide_password=False)
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise BenchError(f"cannot create the database {name}: {exc}") from exc
    try:
        yield scratch.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class JobWatcher:
    """Follows the Jobs' phases through the change feed in a thread; waiters block on them."""

    def __init__(self, database: db.Database) -> None:
        with database.read() as session:
            since = store.Store(session).current_revision()
        self.phases: dict[str, str] = {}
        self.messages: dict[str, str] = {}
        self.finished_at: dict[str, float] = {}  # perf_counter() when first seen finished
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._follow, args=(database, since), daemon=True, name="bench-feed"
        )
        self._thread.start()

    def _follow(self, database: db.Database, since: int) -> None:
        try:
            with feed.Watch(database, since=since, kinds=[job.Job.KIND], stop=self._stop) as w:
                for batch in w:
                    now = time.perf_counter()
                    with self._changed:
                        for change in batch:
                            status = change.object.get("status", {})
                            phase = status.get("phase", "Pending")
                            self.phases[change.name] = phase
                            self.messages[change.name] = status.get("message", "")
                            if phase in job.FINISHED_PHASES:
                                self.finished_at.setdefault(change.name, now)
                        self._changed.notify_all()
        except BaseException as exc:  # surfaces in the next wait
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def wait(self, done: Callable[[dict[str, str]], bool], timeout: float) -> bool:
        """Block until `done(phases)` holds (True) or the timeout passes (False)."""
        with self._changed:
            met = self._changed.wait_for(
                lambda: self._error is not None or done(self.phases), timeout
            )
            if self._error is not None:
                raise BenchError(f"following the change feed failed: {self._error}")
            return met

    def count(self, phase: str, prefix: str = "") -> int:
        """How many Jobs named `prefix...` are in `phase`."""
        with self._changed:
            return sum(1 for n, p in self.phases.items() if p == phase and n.startswith(prefix))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class Rig:
    """One benchmark's database, daemons, feed watcher and scratch directories."""

    url: str
    database: db.Database
    watcher: JobWatcher
    root: Path
    stamps: Path
    state: Path
    log: Path
    proc: subprocess.Popen[bytes]
    ready_cpu: float = 0.0  # CPU seconds `gctl up` used from its start to its node Ready

    def fail(self, what: str) -> BenchError:
        """An error naming what went wrong, with the tail of the daemons' log."""
        alive = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        lines = self.log.read_text(errors="replace").strip().splitlines()
        tail = " | ".join([line for line in lines if "watchfiles" not in line][-3:])
        return BenchError(f"{what} (gctl up {alive}; log {self.log}: {tail})")


def daemon_command(root: Path, gpus: int) -> list[str]:
    """`gctl up` on fake GPUs; with $GCTL_BENCH_PROFILE set, under `profile_threads`."""
    args = [
        "up",
        "--fake-gpus",
        str(gpus),
        "--node-name",
        NODE,
        "--state-dir",
        str(root / "state"),
        "--heartbeat",
        "5",
        "--backoff",
        "1",
    ]
    profile_dir = os.environ.get(PROFILE_ENV)
    if profile_dir:
        return [sys.executable, "-m", "bench.jobs", str(Path(profile_dir) / root.name), *args]
    return [*gctl_command(), *args]


def start_daemons(url: str, root: Path, gpus: int) -> tuple[subprocess.Popen[bytes], Path]:
    """`gctl up` on `gpus` fake GPUs, its output in a log file; returns (process, log)."""
    log = root / "gctl-up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            daemon_command(root, gpus),
            env=os.environ | {"GCTL_DB": url},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def stop_daemons(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        progress(f"gctl up (pid {proc.pid}) ignored SIGTERM for {STOP_TIMEOUT_S:g} s: killing it")
        proc.kill()
        proc.wait()


def node_ready(database: db.Database) -> bool:
    with database.read() as session:
        found = store.Store(session).find(node.Node, NODE)
    return found is not None and any(
        c.type == "Ready" and c.status == "True" for c in found.status.conditions
    )


def wait_ready(rig: Rig) -> None:
    """Until the agent registered a Ready Node, then one untimed warm-up Job to the end."""
    deadline = time.perf_counter() + READY_TIMEOUT_S
    while not node_ready(rig.database):
        if rig.proc.poll() is not None or time.perf_counter() > deadline:
            raise rig.fail(f"node {NODE} did not become Ready within {READY_TIMEOUT_S:g} s")
        time.sleep(0.1)
    rig.ready_cpu = cpu_seconds(rig.proc.pid)
    create_jobs(rig.database, {"warm-up": "true"})
    wait_finished(rig, ["warm-up"], READY_TIMEOUT_S)


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of a process and its live descendants (/proc/PID/stat)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier.extend(children)
    return sum(times.get(pid, 0.0) for pid in tree)


@contextmanager
def daemons(ctx: Context, label: str, gpus: int) -> Iterator[Rig]:
    """A fresh database with `gctl up --fake-gpus GPUS` running against it, warmed up."""
    root = ctx.workdir / label
    stamps = root / "stamps"
    stamps.mkdir(parents=True)
    with fresh_database(ctx, label) as url:
        database = db.Database.open(url)  # migrated before the daemons start
        watcher = JobWatcher(database)
        proc, log = start_daemons(url, root, gpus)
        rig = Rig(url, database, watcher, root, stamps, root / "state", log, proc)
        try:
            progress(f"{label}: gctl up --fake-gpus {gpus} started (pid {proc.pid}, log {log})")
            wait_ready(rig)
            yield rig
        except errors.GctlError as exc:  # the benchmark's own reads and writes
            raise rig.fail(str(exc)) from exc
        finally:
            stop_daemons(proc)
            watcher.close()
            database.close()


# -- jobs, stamps and figures --------------------------------------------------------------------


def create_jobs(database: db.Database, commands: dict[str, str]) -> float:
    """Create 1-GPU Jobs (name: shell command) in one transaction; time.time() after commit."""
    with database.write() as session:
        store.Store(session).create_many(
            [
                job.Job(metadata=meta.ObjectMeta(name=name), spec=job.JobSpec(command=command))
                for name, command in commands.items()
            ]
        )
    return time.time()


def stamp(path: Path) -> str:
    """A shell command that writes the wall-clock time to `path`."""
    return STAMP.format(path=shlex.quote(str(path)))


def read_stamp(path: Path) -> float | None:
    """The time a job wrote to `path`, or None while it is absent or half written."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return float(text) if text.endswith("\n") else None


def wait_stamp(rig: Rig, path: Path, timeout: float) -> float:
    """Watch for a job's stamp file (checked every 5 ms) and return the time in it."""
    deadline = time.perf_counter() + timeout
    while (value := read_stamp(path)) is None:
        if time.perf_counter() > deadline:
            raise rig.fail(f"no stamp in {path} after {timeout:g} s")
        time.sleep(0.005)
    return value


def wait_finished(rig: Rig, names: Sequence[str], timeout: float) -> None:
    """Until every Job named has finished; a Failed one or the timeout is an error."""
    wanted = set(names)

    def finished(phases: dict[str, str]) -> bool:
        return all(phases.get(n) in job.FINISHED_PHASES for n in wanted)

    if not rig.watcher.wait(finished, timeout):
        left = sorted(n for n in wanted if rig.watcher.phases.get(n) not in job.FINISHED_PHASES)
        raise rig.fail(f"{len(left)} job(s) unfinished after {timeout:g} s, e.g. {left[0]}")
    failed = sorted(n for n in wanted if rig.watcher.phases.get(n) == "Failed")
    if failed:
        raise rig.fail(f"job {failed[0]} failed: {rig.watcher.messages.get(failed[0])}")


def latency_rows(name: str, latencies_ms: Sequence[float], budget_ms: float) -> list[Result]:
    return [
        Result(f"{name}-p50", statistics.median(latencies_ms), "ms", budget_ms),
        Result(f"{name}-p99", percentile(latencies_ms, 0.99), "ms", None, kind="info"),
    ]


# -- the benchmarks ------------------------------------------------------------------------------


def bench_start_latency(ctx: Context) -> list[Result]:
    """Commit of a 1-GPU Job -> its process started, 8 idle fake GPUs, one Job at a time."""
    latencies: list[float] = []
    with daemons(ctx, "start-latency", START_GPUS) as rig:
        progress(f"start-latency: {START_RUNS} jobs, one at a time...")
        for index in range(START_RUNS):
            name = f"start-{index:02d}"
            path = rig.stamps / name
            committed = create_jobs(rig.database, {name: stamp(path)})
            started = wait_stamp(rig, path, JOB_TIMEOUT_S)
            wait_finished(rig, [name], JOB_TIMEOUT_S)
            latencies.append((started - committed) * 1000)
    return latency_rows("start-latency", latencies, 100)


def run_command(rig: Rig, name: str, body: str = "") -> str:
    """Stamp the start to STAMPS/NAME.start, run `body`, stamp the end to STAMPS/NAME.end."""
    middle = f"{body}; " if body else ""
    start, end = rig.stamps / f"{name}.start", rig.stamps / f"{name}.end"
    return f"{stamp(start)}; {middle}{stamp(end)}"


def read_runs(rig: Rig, names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Each Job's own (start, end) stamps, written by `run_command`."""
    runs = {}
    for name in names:
        start = read_stamp(rig.stamps / f"{name}.start")
        end = read_stamp(rig.stamps / f"{name}.end")
        if start is None or end is None:
            raise rig.fail(f"job {name} succeeded without writing both of its stamps")
        runs[name] = (start, end)
    return runs


def gaps_ms(runs: Sequence[tuple[float, float]]) -> list[float]:
    """Between each run's end and the next run's start, in start order."""
    ordered = sorted(runs)
    return [(later[0] - earlier[1]) * 1000 for earlier, later in itertools.pairwise(ordered)]


def bench_handoff_latency(ctx: Context) -> list[Result]:
    """One fake GPU, 30 queued Jobs: job k's own exit stamp -> job k+1's own start stamp."""
    names = [f"handoff-{index:02d}" for index in range(HANDOFF_JOBS)]
    with daemons(ctx, "handoff-latency", 1) as rig:
        progress(f"handoff-latency: {HANDOFF_JOBS} jobs queued on one GPU...")
        create_jobs(rig.database, {name: run_command(rig, name) for name in names})
        wait_finished(rig, names, HANDOFF_TIMEOUT_S)
        runs = read_runs(rig, names)
    return latency_rows("handoff-latency", gaps_ms(list(runs.values())), 100)


def makespan_names() -> list[str]:
    return [f"sleep-{index:03d}" for index in range(MAKESPAN_JOBS)]


def list_manifest(rig: Rig) -> Path:
    """One `kind: List` of the 500 `sleep 1` Jobs (each also stamps its start and end)."""
    items = [
        {
            "apiVersion": "gctl/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {
                "command": run_command(rig, name, f"sleep {MAKESPAN_SECONDS:g}"),
                "resources": {"gpus": 1},
            },
        }
        for name in makespan_names()
    ]
    path = rig.root / "jobs.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def follow_makespan(rig: Rig, started: float) -> float:
    """Until all 500 Jobs finished, with progress every 10 s; perf_counter() of the last."""
    names = makespan_names()
    deadline = started + MAKESPAN_TIMEOUT_S

    def finished(phases: dict[str, str]) -> bool:
        return all(phases.get(n) in job.FINISHED_PHASES for n in names)

    while not rig.watcher.wait(finished, min(PROGRESS_EVERY_S, deadline - time.perf_counter())):
        elapsed = time.perf_counter() - started
        progress(
            f"makespan-500: {rig.watcher.count('Succeeded', 'sleep-')}/{MAKESPAN_JOBS} "
            f"succeeded, {rig.watcher.count('Running', 'sleep-')} running after {elapsed:.0f} s"
        )
        if time.perf_counter() >= deadline:
            raise rig.fail(f"makespan-500: not done after {MAKESPAN_TIMEOUT_S:g} s")
    wait_finished(rig, names, 0)  # none may have failed
    return max(rig.watcher.finished_at[n] for n in names)


Run = tuple[tuple[int, ...], float, float]  # an attempt's GPUs, its start and its end (epoch s)


def _bindings(rig: Rig, names: Sequence[str]) -> dict[str, binding.Binding]:
    """Each Job's one attempt."""
    wanted = set(names)
    with rig.database.read() as session:
        bound = store.Store(session).list_objects(binding.Binding)
    return {b.spec.job_name: b for b in bound if b.spec.job_name in wanted}


def attempt_runs(rig: Rig, names: Sequence[str]) -> dict[str, Run]:
    """Each Job's attempt as its supervisor timed it: the start once the process existed, the
    end once it saw the process end (the Binding's startTime and finishTime)."""
    runs = {}
    for name, b in _bindings(rig, names).items():
        start, end = b.status.start_time, b.status.finish_time
        if start is None or end is None:
            raise rig.fail(f"job {name}'s attempt has no start or finish time")
        runs[name] = (tuple(b.spec.gpus), start.timestamp(), end.timestamp())
    return runs


def stamped_runs(rig: Rig, names: Sequence[str]) -> dict[str, Run]:
    """Each Job's attempt as the job stamped it (`run_command`), on its Binding's GPUs."""
    bound = _bindings(rig, names)
    return {
        name: (tuple(bound[name].spec.gpus), start, end)
        for name, (start, end) in read_runs(rig, names).items()
    }


def mean_gpu_gap_ms(runs: Iterable[Run]) -> float:
    """The mean time between one job's end and the next one's start on the same GPUs."""
    by_gpu: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    for gpus, start, end in runs:
        by_gpu.setdefault(gpus, []).append((start, end))
    gaps = [gap for per_gpu in by_gpu.values() for gap in gaps_ms(per_gpu)]
    return statistics.fmean(gaps) if gaps else math.nan


def bench_makespan(ctx: Context) -> list[Result]:
    """500 `sleep 1` Jobs on 8 fake GPUs in one apply: apply -> the last one Succeeded."""
    with daemons(ctx, "makespan-500", MAKESPAN_GPUS) as rig:
        manifest = list_manifest(rig)
        progress(f"makespan-500: applying {MAKESPAN_JOBS} jobs of sleep 1 (ideal 62.5 s)...")
        started, wall = time.perf_counter(), time.time()
        _, out = run_gctl(["apply", "-f", str(manifest), "--db", rig.url])
        created = sum(1 for line in out.splitlines() if line.endswith(" created"))
        if created != MAKESPAN_JOBS:
            raise rig.fail(f"gctl apply created {created} jobs; expected {MAKESPAN_JOBS}")
        makespan = follow_makespan(rig, started) - started
        runs = stamped_runs(rig, makespan_names()).values()
        gap = mean_gpu_gap_ms(runs)
    overhead = (makespan / MAKESPAN_IDEAL_S - 1) * 100
    return [
        Result(
            "makespan-500",
            makespan,
            "s",
            round(MAKESPAN_BUDGET_S, 1),
            note=f"{overhead:+.1f}% over the ideal {MAKESPAN_IDEAL_S:g} s",
        ),
        Result("makespan-500-gpu-gap-mean", gap, "ms", None, kind="info"),
        *makespan_parts("makespan-500", runs, wall, makespan),
    ]


def makespan_parts(label: str, runs: Iterable[Run], wall: float, makespan: float) -> list[Result]:
    """Where a makespan went besides the GPU gaps, for information: from the apply (at epoch
    `wall`) to the first job's start, from the last end to its Succeeded seen, and each job's
    own run (its command beyond the `sleep`)."""
    runs = list(runs)
    first = min(start for _, start, _ in runs) - wall
    last = wall + makespan - max(end for _, _, end in runs)
    ran = statistics.fmean(end - start for _, start, end in runs)
    return [
        Result(f"{label}-first-start", first * 1000, "ms", None, kind="info"),
        Result(f"{label}-last-seen", last * 1000, "ms", None, kind="info"),
        Result(f"{label}-job-run-mean", ran * 1000, "ms", None, kind="info"),
    ]


BENCHMARKS: dict[str, Callable[[Context], list[Result]]] = {
    "start-latency": bench_start_latency,
    "handoff-latency": bench_handoff_latency,
    "makespan-500": bench_makespan,
}


def profile_threads(argv: Sequence[str]) -> None:
    """`python -m bench.jobs OUT_DIR ARGS...`: `gctl ARGS`, each thread under its own cProfile,
    written to OUT_DIR/THREAD.prof when the command ends (`gctl up`: on SIGTERM or SIGINT); the
    threads of `gctl up`'s agent process (forked, and ended by os._exit) to
    OUT_DIR/agent-THREAD.prof when it ends."""
    import cProfile

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    profiles: list[tuple[int, str, cProfile.Profile]] = []
    original = threading.Thread.run
    parent = os.getpid()

    clock = time.thread_time if os.environ.get(PROFILE_CLOCK_ENV) == "cpu" else time.perf_counter

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile(clock)
        profiles.append((os.getpid(), self.name, profile))
        profile.runcall(original, self)

    def dump() -> None:
        me = os.getpid()
        prefix = "" if me == parent else "agent-"
        for index, (pid, name, profile) in enumerate(profiles):
            if pid == me:  # a forked child holds a copy of its parent's list
                profile.dump_stats(out / f"{prefix}{index:02d}-{name}.prof")

    exit_now = os._exit

    def dumped_exit(status: int) -> NoReturn:
        try:
            dump()
        finally:
            exit_now(status)

    threading.Thread.run = run  # type: ignore[method-assign]
    os._exit = dumped_exit
    from gctl.cli import main as cli

    sys.argv = ["gctl", *argv[1:]]
    try:
        cli.main()
    finally:
        dump()


if __name__ == "__main__":
    profile_threads(sys.argv[1:])
