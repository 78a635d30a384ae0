"""Fixtures shared by every test folder: databases on both dialects and the `gctl` command.

PostgreSQL comes from GCTL_TEST_PG (an admin URL; default: the local server CI provides). Each
run makes one migrated template database and every test gets a fresh copy, dropped afterwards;
the copies are made ahead and dropped behind the tests, in a thread (`Clones`). Set
GCTL_TEST_PG=skip to run without PostgreSQL; otherwise an unreachable server is an error.

A test's SQLite `database` is a copy of a file migrated once per run (per xdist worker), as its
PostgreSQL one is a copy of the template, unless a daemon the test started first made the file;
`db_url` alone gives a path where no file is yet.

The `gctl` commands of one test session share a command server of their own (gctl/cli/client.py)
in a directory of the session's, stopped when the session ends.
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gctl.api import kinds
from gctl.cli import client, cmdserver
from gctl.store import db, listing, locations


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start, however the run was started: a shell
    starts a background job (`make test &`) with SIGINT ignored, every child inherits that,
    and gctl, like any command under `trap '' INT`, then keeps ignoring it, so the tests that
    send SIGINT to a `gctl` would wait for nothing (their processes get SIG_DFL on exec)."""
    del config
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


PG_ADMIN = os.environ.get("GCTL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
DIALECTS = ["sqlite", "postgresql"]


def _pg_url(name: str) -> str:
    base, _, _ = PG_ADMIN.rpartition("/")
    return f"{base}/{name}"


def _admin(sql: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def command_server_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("cli-server")
    where.chmod(0o700)
    os.environ[client.DIR_ENV] = str(where)
    yield where
    cmdserver.stop_all(str(where))


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agents' default state directories (`gctl agent run` without --state-dir, its
    virtual nodes' locks) in the session's own temporary directory, never the user's."""
    where = tmp_path_factory.mktemp("state-home")
    os.environ["XDG_STATE_HOME"] = str(where)
    return where


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    if PG_ADMIN == "skip":
        pytest.skip("GCTL_TEST_PG=skip: PostgreSQL tests skipped")
    name = f"gctl_tpl_{uuid.uuid4().hex[:10]}"
    try:
        _admin(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_ADMIN} is unreachable ({exc}); set GCTL_TEST_PG")
    database = db.Database.open(_pg_url(name))
    database.close()
    yield name
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Clones:
    """Copies of the template database, made ahead of the tests that take them by one thread
    and dropped after them by another: `CREATE DATABASE ... TEMPLATE` takes 0.2 s on an idle
    2-core machine and seconds on a busy one, as `DROP DATABASE` does, and a test waits for
    none of it but its first copy, or a copy that a run of short tests left unmade.

    A copy the server refuses to make fails every test that would take one; one it refuses to
    drop fails the session's end, which names it."""

    AHEAD = 3

    def __init__(self, template: str) -> None:
        self._template = template
        self._ready: list[str] = []
        self._doomed: list[str] = []
        self._refused: psycopg.Error | None = None  # a copy the server did not make
        self._left: list[str] = []  # copies the server did not drop, and why
        self._closing = False  # no more copies are made
        self._closed = False  # no more copies are dropped
        self._changed = threading.Condition()
        self._maker = threading.Thread(target=self._make_ahead, daemon=True)
        self._dropper = threading.Thread(target=self._drop_behind, daemon=True)
        self._maker.start()
        self._dropper.start()

    # How long a test waits for its copy before it fails: a maker thread that died of
    # something other than the server's refusal, or a CREATE DATABASE that never returns,
    # fails the tests that need a copy rather than hang the run until CI's limit.
    TAKE_TIMEOUT_S = 300.0

    def take(self) -> str:
        with self._changed:
            if not self._changed.wait_for(
                lambda: self._ready or self._refused, timeout=self.TAKE_TIMEOUT_S
            ):
                pytest.fail(f"PostgreSQL at {PG_ADMIN}: no copy of the template made in time")
            if self._refused is not None:
                pytest.fail(f"PostgreSQL at {PG_ADMIN}: {self._refused}")
            name = self._ready.pop(0)
            self._changed.notify_all()
            return name

    def drop(self, name: str) -> None:
        with self._changed:
            self._doomed.append(name)
            self._changed.notify_all()

    def close(self) -> None:
        """Drop every copy, those made ahead included, and end both threads."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._maker.join()
        with self._changed:
            self._doomed += self._ready
            self._ready.clear()
            self._closed = True
            self._changed.notify_all()
        self._dropper.join()
        if self._left:
            pytest.fail(f"PostgreSQL at {PG_ADMIN} left databases behind: {self._left}")

    def _make_ahead(self) -> None:
        try:
            conn = psycopg.connect(PG_ADMIN, autocommit=True)
        except psycopg.Error as exc:
            self._refuse(exc)
            return
        with conn:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._closing or len(self._ready) < self.AHEAD)
                    if self._closing or self._refused is not None:
                        return
                name = f"gctl_t_{uuid.uuid4().hex[:10]}"
                try:
                    conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
                except psycopg.Error as exc:
                    self._refuse(exc)
                    return
                with self._changed:
                    self._ready.append(name)
                    self._changed.notify_all()

    def _drop_behind(self) -> None:
        try:
            conn = psycopg.connect(PG_ADMIN, autocommit=True)
        except psycopg.Error as exc:
            self._left.append(f"every copy ({exc})")
            return
        with conn:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._doomed or self._closed)
                    if not self._doomed:
                        return
                    name = self._doomed.pop(0)
                try:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                except psycopg.Error as exc:
                    self._left.append(f"{name} ({exc})")

    def _refuse(self, error: psycopg.Error) -> None:
        with self._changed:
            self._refused = error
            self._changed.notify_all()


@pytest.fixture(scope="session")
def pg_clones(pg_template: str) -> Iterator[Clones]:
    clones = Clones(pg_template)
    yield clones
    clones.close()


@pytest.fixture
def pg_url(pg_clones: Clones) -> Iterator[str]:
    name = pg_clones.take()
    yield _pg_url(name)
    pg_clones.drop(name)


@pytest.fixture
def empty_pg_url(pg_template: str) -> Iterator[str]:
    """A PostgreSQL database with no schema at all, for migration tests."""
    name = f"gctl_e_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}"')
    yield _pg_url(name)
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL: a SQLite file, or a PostgreSQL database cloned from the template."""
    return database_url(request, tmp_path, request.param)


def database_url(request: pytest.FixtureRequest, tmp_path: Path, dialect: str) -> str:
    if dialect == "sqlite":
        return str(tmp_path / "gctl.db")
    url: str = request.getfixturevalue("pg_url")
    return url


def sqlite_unless_asked(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """`db_url` for a module whose tests run on SQLite alone, save those marked `ON_BOTH`
    (docs/decisions.md: which end-to-end tests run on both databases)."""
    return database_url(request, tmp_path, getattr(request, "param", "sqlite"))


# A test of a SQLite-only module that runs on both databases too.
ON_BOTH = pytest.mark.parametrize("db_url", DIALECTS, indirect=True)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per run, for `database` to copy: migrating takes longer
    than most tests that use it (Alembic walks every migration)."""
    path = tmp_path_factory.mktemp("sqlite-template") / "gctl.db"
    db.Database.open(str(path)).close()  # closed: the last connection folds the WAL in
    return path


def _copy_unless_there(template: Path, path: Path) -> None:
    """The migrated template at `path`, unless a file is there already: a fixture set up before
    `database` (a `gctl up` the test starts) may have made it and hold it open, and a copy
    written over it would take what that process wrote from under it. The copy is linked into
    place whole, so such a process never opens half of one. Its mode comes along: 0600, as
    gctl creates the file."""
    staged = path.with_name(f"{path.name}.template")
    shutil.copy(template, staged)
    try:
        os.link(staged, path)
    except FileExistsError:
        pass  # made by what the test started first, migrated by it: the test uses it
    finally:
        staged.unlink()


@pytest.fixture
def database(db_url: str, request: pytest.FixtureRequest) -> Iterator[db.Database]:
    if "://" not in db_url:
        _copy_unless_there(request.getfixturevalue("sqlite_template"), Path(db_url))
    database = db.Database.open(db_url)
    yield database
    database.close()


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Gctl:
    """Runs the real `gctl` console script against one database, from one directory."""

    db_url: str
    cwd: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "GCTL_DB": self.db_url}

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 60) -> Result:
        done = subprocess.run(
            [GCTL_BIN, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.cwd,
            timeout=timeout,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self(*args, stdin=stdin)
        assert result.code == 0, f"gctl {' '.join(args)} failed: {result.err}"
        return result.out

    def read(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """A stored object as `gctl get KIND NAME -o json` prints it, read in this process
        through the same path (gctl.store.listing), or None: not there, or no database that
        path can read (none yet, not migrated yet, an error, which `gctl get` would say).
        What the tests poll: a `gctl get` costs 40-50 ms of CPU in two processes, a read here
        under a millisecond on SQLite, and it creates no database either."""
        url = self.db_url if "://" in self.db_url else str(self.cwd / self.db_url)
        snapshot = listing.read(locations.resolve_url(url), kinds.BY_KIND[kind], namespace, [name])
        return snapshot.wires[0] if snapshot is not None and snapshot.wires else None

    def object(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any]:
        """`read`, which must find it."""
        found = self.read(kind, name, namespace)
        assert found is not None, f"{kind} {namespace}/{name} not found"
        return found

    def popen(self, *args: str) -> "subprocess.Popen[str]":
        return subprocess.Popen(
            [GCTL_BIN, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(),
            cwd=self.cwd,
            bufsize=1,
        )


GCTL_BIN = str(Path(sys.executable).parent / "gctl")


@pytest.fixture
def gctl(db_url: str, tmp_path: Path) -> Gctl:
    return Gctl(db_url, tmp_path)
