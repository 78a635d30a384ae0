"""The benchmarks of the object store and the CLI, and the helpers they share.

Each benchmark takes a `Context` (the database GCTL_DB points at, a scratch directory) and
returns `Result` rows; `BENCHMARKS` lists them in the order the suite runs them. The CLI always
runs as a real subprocess, so every figure includes interpreter start-up; a short command is
served by the suite's own command server (gctl/cli/client.py, warm before the first figure), as
it is for a user from their second command on, and the rows named `-in-process` run it in its
own process, as on a first command or with GCTL_CLI_SERVER=0.
"""

import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from gctl.api import job, meta
from gctl.cli import client, cmdserver
from gctl.store import db, store

JOBS = 10_000
VERSION_RUNS, VERSION_WARMUPS = 15, 2
SERVER_START_TIMEOUT_S = 30.0
GET_RUNS = 5
WATCH_JOBS = 50
WATCH_INTERVAL_S = 0.020
WATCH_READY_TIMEOUT_S = 30.0
WATCH_DRAIN_TIMEOUT_S = 10.0

Kind = Literal["timing", "info", "check", "error"]


@dataclass(frozen=True)
class Result:
    """One row of the table: a figure against its budget (`None`: nothing to compare with)."""

    name: str
    value: float
    unit: str  # "ms", "s", or "" for a count
    budget: float | None
    kind: Kind = "timing"  # info: reported only; check: a count that must match; error: none
    note: str = ""

    @property
    def status(self) -> str:
        """ERROR (nothing measured), INFO (no budget), else PASS or FAIL."""
        if self.kind == "error":
            return "ERROR"
        if self.budget is None:
            return "INFO"
        ok = self.value == self.budget if self.kind == "check" else self.value <= self.budget
        return "PASS" if ok else "FAIL"


class BenchError(Exception):
    """A benchmark could not measure what it claims: a command failed or printed wrong output."""


@dataclass
class Context:
    """What the benchmarks share within one run of the suite."""

    db_url: str  # what GCTL_DB holds: a SQLite file path or a postgresql:// URL
    workdir: Path  # scratch space for manifests and logs
    manifests: Path | None = None  # the 10,000 Job manifests, once written
    loaded: bool = False  # whether those Jobs are in the database
    whole_suite: bool = False  # every benchmark runs: the longest ones run at a smaller scale


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def gctl_command() -> list[str]:
    """The console script next to this interpreter; without one, what it runs: `python -m
    gctl.cli.client` (which hands commands to the command server, as the script does)."""
    script = Path(sys.executable).parent / "gctl"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "gctl.cli.client"]


def run_gctl(args: Sequence[str], served: bool = True) -> tuple[float, str]:
    """Run `gctl ARGS` with stdout to a pipe; return (seconds, stdout). Failing is an error.
    `served=False`: in its own process only, never by the command server."""
    command = [*gctl_command(), *args]
    env = None if served else {**os.environ, client.SWITCH_ENV: "0"}
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise BenchError(f"gctl {' '.join(args)} exited {proc.returncode}: {' | '.join(tail)}")
    return elapsed, proc.stdout


@contextmanager
def command_server(workdir: Path) -> Iterator[None]:
    """A command server of the suite's own (gctl/cli/client.py), in `workdir`: it serves the
    code being measured, is warm before the first figure, and is stopped after the last."""
    where = workdir / "cli"
    where.mkdir(mode=0o700)
    saved = os.environ.get(client.DIR_ENV)
    os.environ[client.DIR_ENV] = str(where)
    try:
        run_gctl(["version"])
        path = client.socket_path()
        deadline = time.perf_counter() + SERVER_START_TIMEOUT_S
        while path is not None and not os.path.exists(path):
            if time.perf_counter() > deadline:
                raise BenchError("gctl's command server did not start")
            time.sleep(0.05)
        yield
    finally:
        cmdserver.stop_all(str(where))
        if saved is None:
            os.environ.pop(client.DIR_ENV, None)
        else:
            os.environ[client.DIR_ENV] = saved


def median_run(
    args: Sequence[str], runs: int, check: Callable[[str], None], served: bool = True
) -> float:
    """The median seconds of `runs` runs of `gctl ARGS`, each run's output checked."""
    times = []
    for _ in range(runs):
        elapsed, out = run_gctl(args, served)
        check(out)
        times.append(elapsed)
    return statistics.median(times)


def bench_version(ctx: Context) -> list[Result]:
    """`gctl version`: median of 15 runs after 2 warm-ups, served by the command server, and
    in a process of its own (GCTL_CLI_SERVER=0: Python, typer and gctl's CLI module)."""

    def check(out: str) -> None:
        if not out.startswith("gctl "):
            raise BenchError(f"gctl version printed {out!r}")

    rows = []
    for served, name, budget in ((True, "version", 150.0), (False, "version-in-process", None)):
        for _ in range(VERSION_WARMUPS):
            run_gctl(["version"], served)
        median = median_run(["version"], VERSION_RUNS, check, served)
        kind: Kind = "timing" if budget else "info"
        rows.append(Result(name, median * 1000, "ms", budget, kind=kind))
    return rows


MANIFEST = """\
apiVersion: gctl/v1
kind: Job
metadata:
  name: job-{index:05d}
  labels:
    bench: "yes"
spec:
  command: ["python", "train.py", "--seed", "{index}"]
  priority: {priority}
  resources:
    gpus: {gpus}
"""
GPU_CHOICES = ("1", "2", "0.5")


def write_manifests(ctx: Context) -> Path:
    """10,000 Job manifests, one small file each (written once per suite run)."""
    if ctx.manifests is not None:
        return ctx.manifests
    progress(f"generating {JOBS:,} manifests...")
    directory = ctx.workdir / "manifests"
    directory.mkdir()
    for index in range(JOBS):
        text = MANIFEST.format(
            index=index, priority=(index * 37) % 100, gpus=GPU_CHOICES[index % len(GPU_CHOICES)]
        )
        (directory / f"job-{index:05d}.yaml").write_text(text)
    ctx.manifests = directory
    return directory


def apply_all(ctx: Context, verb: str) -> float:
    """`gctl apply -f DIR` once; it must report `verb` for every one of the 10,000 Jobs."""
    elapsed, out = run_gctl(["apply", "-f", str(write_manifests(ctx))])
    lines = out.splitlines()
    matching = sum(1 for line in lines if line.endswith(f" {verb}"))
    if matching != JOBS or len(lines) != JOBS:
        raise BenchError(
            f"gctl apply printed {len(lines):,} lines, {matching:,} of them {verb!r}; "
            f"expected {JOBS:,} {verb!r} lines"
        )
    ctx.loaded = True
    return elapsed


def bench_apply(ctx: Context) -> list[Result]:
    """`gctl apply -f DIR` of 10,000 Jobs into an empty database, then again, all unchanged."""
    write_manifests(ctx)
    progress(f"applying {JOBS:,} manifests into an empty database...")
    first = apply_all(ctx, "created")
    progress(f"applying the same {JOBS:,} manifests again (all unchanged)...")
    second = apply_all(ctx, "unchanged")
    return [
        Result("apply-10k", first, "s", 5),
        Result("apply-10k-unchanged", second, "s", 5),
    ]


def _check_table(out: str) -> None:
    rows = out.count("\n")
    if rows != JOBS + 1 or not out.startswith("NAME"):
        raise BenchError(f"gctl get jobs printed {rows:,} lines; expected a header + {JOBS:,}")


def _check_yaml(out: str) -> None:
    items = sum(1 for line in out.splitlines() if line == "  kind: Job")
    if items != JOBS:
        raise BenchError(f"gctl get jobs -o yaml printed {items:,} Jobs; expected {JOBS:,}")


def bench_get(ctx: Context) -> list[Result]:
    """`gctl get jobs` over 10,000 Jobs, as a table and as YAML: median of 5 runs each."""
    if not ctx.loaded:  # apply-10k did not run: load the Jobs, untimed
        write_manifests(ctx)
        progress(f"loading {JOBS:,} jobs (untimed)...")
        apply_all(ctx, "created")
    progress(f"gctl get jobs, {GET_RUNS} runs...")
    table = median_run(["get", "jobs"], GET_RUNS, _check_table)
    progress(f"gctl get jobs -o yaml, {GET_RUNS} runs...")
    yaml = median_run(["get", "jobs", "-o", "yaml"], GET_RUNS, _check_yaml)
    return [
        Result("get-10k", table * 1000, "ms", 300),
        Result("get-10k-yaml", yaml, "s", 2, kind="info", note="informational"),
    ]


class LineReader:
    """Reads a stream in a thread, stamping each line with perf_counter() as it arrives."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put((time.perf_counter(), line.strip()))

    def wait_for(self, names: set[str], timeout: float) -> dict[str, float]:
        """When each of `names` (as `job.gctl/NAME`) was read; stops early at the timeout."""
        deadline = time.perf_counter() + timeout
        seen: dict[str, float] = {}
        while names - seen.keys():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            try:
                stamp, line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            name = line.rpartition("/")[2]
            if name in names:
                seen.setdefault(name, stamp)
        return seen


def create_job(database: db.Database, name: str) -> float:
    """Create one Job in its own transaction; return perf_counter() right after the commit."""
    with database.write() as session:
        store.Store(session).create(
            job.Job(metadata=meta.ObjectMeta(name=name), spec=job.JobSpec(command="true"))
        )
    return time.perf_counter()


def wait_ready(
    database: db.Database, reader: LineReader, proc: subprocess.Popen[str], stderr: Path
) -> None:
    """Write probe Jobs until the watcher prints one: it then follows the feed.

    A probe committed before the watcher read its starting revision is never printed, hence
    a fresh probe each second rather than one long wait.
    """
    deadline = time.perf_counter() + WATCH_READY_TIMEOUT_S
    attempt = 0
    while time.perf_counter() < deadline and proc.poll() is None:
        attempt += 1
        probe = f"watch-probe-{attempt}"
        create_job(database, probe)
        if reader.wait_for({probe}, timeout=1.0):
            return
    state = "is silent" if proc.poll() is None else f"exited {proc.returncode}"
    raise BenchError(f"gctl get --watch-only {state}: {stderr.read_text().strip()[-300:]}")


def measure_watch(database: db.Database, reader: LineReader) -> list[float]:
    """Create the Jobs 20 ms apart; return each one's latency in ms, for those that arrived."""
    names = [f"watch-{index:03d}" for index in range(WATCH_JOBS)]
    committed: dict[str, float] = {}
    start = time.perf_counter()
    for index, name in enumerate(names):
        delay = start + index * WATCH_INTERVAL_S - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        committed[name] = create_job(database, name)
    seen = reader.wait_for(set(names), timeout=WATCH_DRAIN_TIMEOUT_S)
    return [(seen[name] - committed[name]) * 1000 for name in names if name in seen]


def bench_watch(ctx: Context) -> list[Result]:
    """Commit-to-line latency of `gctl get jobs --watch-only -o name` for 50 Jobs."""
    database = db.Database.open(ctx.db_url)  # migrates before the watcher starts
    stderr_path = ctx.workdir / "watch.stderr"
    command = [*gctl_command(), "get", "jobs", "--watch-only", "-o", "name"]
    progress(f"watching while creating {WATCH_JOBS} jobs, 20 ms apart...")
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1
        )
    try:
        assert proc.stdout is not None
        reader = LineReader(proc.stdout)
        wait_ready(database, reader, proc, stderr_path)
        latencies = measure_watch(database, reader)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        database.close()
    if not latencies:
        raise BenchError(f"gctl get --watch-only printed none of the {WATCH_JOBS} jobs")
    p99 = sorted(latencies)[math.ceil(0.99 * len(latencies)) - 1]  # nearest rank
    return [
        Result("watch-latency-p50", statistics.median(latencies), "ms", 100),
        Result("watch-latency-p99", p99, "ms", None, kind="info"),
        Result("watch-latency-received", len(latencies), "", WATCH_JOBS, kind="check"),
    ]


Benchmark = Callable[[Context], list[Result]]
BENCHMARKS: dict[str, Benchmark] = {
    "version": bench_version,
    "apply-10k": bench_apply,
    "get-10k": bench_get,
    "watch-latency": bench_watch,
}
