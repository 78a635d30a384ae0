"""`python -m bench [NAME ...] [--db URL] [--json] [--strict]`: run the benchmarks, print a table.

`python -m bench replay TRACE.csv [...]` replays a job trace instead (bench.replay).

This module parses the arguments, makes the scratch database the benchmarks run against (a
fresh SQLite file in a temporary directory, or with `--db` a randomly named PostgreSQL database
created through the given admin URL and dropped at the end), points GCTL_DB at it, runs the
chosen benchmarks in suite order and prints one row per figure (and, with `--json`, one JSON
object). Exit status: 1 when a benchmark errs or a count check fails, or with `--strict` when a
timing is over budget; 0 otherwise.
"""

import argparse
import compileall
import json
import math
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import jobs, replay, scale, scheduler, throughput
from bench import store as store_benchmarks
from bench.store import BenchError, Context, Result, progress

BENCHMARKS = {  # the suite's order
    **store_benchmarks.BENCHMARKS,
    **jobs.BENCHMARKS,
    **scheduler.BENCHMARKS,
    **scale.BENCHMARKS,
    **throughput.BENCHMARKS,
    **replay.BENCHMARKS,
}

POSTGRES_SCHEMES = ("postgresql", "postgres")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark gctl's object store, CLI and running jobs on a scratch database.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default, or `all`: every one): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="PostgreSQL admin URL, e.g. postgresql://postgres@127.0.0.1:5432/postgres: a "
        "scratch database is created through it and dropped at the end (default: a "
        "temporary SQLite file)",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a timing is over its budget"
    )
    args = parser.parse_args(argv)
    if "all" in args.names:  # `python -m bench all`: the whole suite, as with no names
        args.names = []
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}: choose from {', '.join(BENCHMARKS)}")
    if args.db is not None and urlsplit(args.db).scheme not in POSTGRES_SCHEMES:
        parser.error("--db: give a postgresql:// admin URL (SQLite needs no flag)")
    return args


# -- the scratch database ----------------------------------------------------------------------


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A new, randomly named database next to `admin_url`'s; dropped (forcibly) at the end."""
    import psycopg
    from psycopg import sql

    name = f"gctl_bench_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    progress(f"created scratch database {name}")
    try:
        yield urlsplit(admin_url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        progress(f"dropped scratch database {name}")


@contextmanager
def scratch(admin_url: str | None) -> Iterator[Context]:
    """A Context whose database is new and empty, with GCTL_DB pointing at it meanwhile."""
    with tempfile.TemporaryDirectory(prefix="gctl-bench-") as tmp:
        workdir = Path(tmp)
        with postgres_database(admin_url) if admin_url else sqlite_database(workdir) as url:
            saved = os.environ.get("GCTL_DB")
            os.environ["GCTL_DB"] = url
            try:
                yield Context(db_url=url, workdir=workdir)
            finally:
                if saved is None:
                    os.environ.pop("GCTL_DB", None)
                else:
                    os.environ["GCTL_DB"] = saved


@contextmanager
def sqlite_database(workdir: Path) -> Iterator[str]:
    """A SQLite file in a directory of its own (its watcher follows that directory)."""
    directory = workdir / "db"
    directory.mkdir()
    yield str(directory / "gctl.db")


# -- running and reporting ---------------------------------------------------------------------


def run(names: Sequence[str], ctx: Context) -> list[Result]:
    """The chosen benchmarks in suite order; one that fails becomes an ERROR row."""
    results: list[Result] = []
    ctx.whole_suite = not names or set(names) == set(BENCHMARKS)
    for name, benchmark in BENCHMARKS.items():
        if names and name not in names:
            continue
        start = time.perf_counter()
        try:
            results.extend(benchmark(ctx))
            progress(f"{name}: {time.perf_counter() - start:.0f} s")
        except BenchError as error:
            print(f"bench: {name}: ERROR: {error}", file=sys.stderr, flush=True)
            results.append(Result(name, float("nan"), "", None, kind="error", note=str(error)))
    return results


def figure(value: float, unit: str) -> str:
    if math.isnan(value):  # an error row has no figure
        return "-"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:g} {unit}".strip()


def budget_text(result: Result) -> str:
    if result.budget is None:
        return "-"
    if result.kind == "check":
        return f"= {result.budget:g}"
    return f"{result.budget:g} {result.unit}".strip()


def print_table(results: Sequence[Result], backend: str) -> None:
    rows = [("BENCHMARK", "MEASURED", "BUDGET", "RESULT")]
    for r in results:
        status = r.status
        if r.note and r.kind != "error":
            status += f" ({r.note})"
        rows.append((r.name, figure(r.value, r.unit), budget_text(r), status))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print(f"gctl benchmarks on {backend}")
    for name, measured, budget, status in rows:
        print(f"{name:<{widths[0]}}   {measured:>{widths[1]}}   {budget:>{widths[2]}}   {status}")


def as_json(results: Sequence[Result], backend: str, seconds: float) -> dict[str, Any]:
    return {
        "backend": backend,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "seconds": round(seconds, 2),
        "results": {
            r.name: {
                "value": None if math.isnan(r.value) else round(r.value, 4),
                "unit": r.unit,
                "budget": r.budget,
                "status": r.status,
                "note": r.note,
            }
            for r in results
        },
    }


def exit_code(results: Sequence[Result], strict: bool) -> int:
    broken = any(r.status == "ERROR" or (r.kind == "check" and r.status == "FAIL") for r in results)
    slow = any(r.kind == "timing" and r.status == "FAIL" for r in results)
    return 1 if broken or (strict and slow) else 0


def compile_bytecode() -> None:
    """Compile gctl's modules to bytecode, as `pip install` of a wheel does: an editable
    install run with PYTHONDONTWRITEBYTECODE=1 would otherwise compile about 30 modules from
    source at every `gctl` command the benchmarks time (40 ms of a 200 ms `gctl apply`)."""
    root = Path(__file__).resolve().parent.parent
    for package in ("gctl", "controller", "nodeagent", "migrations"):
        compileall.compile_dir(root / package, quiet=2)


HELP = ("-h", "--help")  # `replay --help` is the replay's, not the suite's


def is_replay(argv: Sequence[str]) -> bool:
    """`replay TRACE.csv ...` (or `replay --help`): a replay of one's own trace, not the suite's
    `replay` entry. Any word after `replay` that names no benchmark, is no suite flag and no
    flag's value is taken for the trace, whatever it names (a missing file, a directory), so
    that the replay says what is wrong with it."""
    if argv[:1] != ["replay"]:
        return False
    words = iter(argv[1:])
    for arg in words:
        if arg in HELP:
            return True
        if arg == "--db":
            next(words, None)  # its value
        elif not arg.startswith("-") and arg not in BENCHMARKS and arg != "all":
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if is_replay(argv):
        return replay.main(argv[1:])
    args = parse_args(argv)
    backend = "postgresql" if args.db else "sqlite"
    compile_bytecode()
    start = time.perf_counter()
    with scratch(args.db) as ctx, store_benchmarks.command_server(ctx.workdir):
        results = run(args.names, ctx)
    seconds = time.perf_counter() - start
    progress(f"done in {seconds:.1f} s")
    print_table(results, backend)
    if args.json:
        print(json.dumps(as_json(results, backend, seconds)))
    return exit_code(results, args.strict)


if __name__ == "__main__":
    sys.exit(main())
