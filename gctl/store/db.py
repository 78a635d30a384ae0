"""Opening the database: how SQLite is tuned, and keeping the schema current.

Where the database is comes from `locations`; the pragmas every SQLite connection gets are
`driver`'s, shared with the path that reads and creates without SQLAlchemy.
"""

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc, inspect, make_url, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from gctl.api import errors
from gctl.store import driver, jsontext, locations, notify, schema, writers

# psycopg warns on its own logger when a lost connection leaves it a pipeline it cannot close
# ("error ignored terminating <psycopg.Pipeline [BAD]>"), beside the error gctl reports in one
# line. The gctl command configures no logging, so Python would print the warning raw: a
# handler that drops it keeps the command's stderr to that one line. The daemons log it still
# (it goes on to their root handler).
logging.getLogger("psycopg").addHandler(logging.NullHandler())
# The JSON columns' text, written and read as gctl.store.jsontext does it (and `driver` too);
# read exactly, as the kind is not known there.
JSON_TEXT = {"json_serializer": jsontext.dumps, "json_deserializer": jsontext.loads_exact}

MIGRATIONS_LOCK_KEY = 0x6763746C  # "gctl": the PostgreSQL advisory lock held while migrating
SQLITE_BUSY_TIMEOUT_MS = driver.BUSY_TIMEOUT_MS


def display_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


class Database:
    """One engine; `write()` and `read()` hand out sessions whose transaction they own."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        """`create`: make the SQLite file (and its directories) where it is missing. Without
        it, for the commands that only read or act on what is stored, a missing directory is
        errors.NotFound (a mistyped --db), and a missing file in a directory that exists reads
        as an empty database: `absent`, an in-memory stand-in with the current schema and
        nothing in it, so that `gctl get nodes` before `gctl up` says "No resources found"
        and leaves no stray file behind. Nothing is written to a stand-in (`write`), and it
        has no change feed to follow (`must_exist`)."""
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self.absent = False
        self.sqlite_path: Path | None = None
        # Rung after every committed write on SQLite: the change feed's wake-up (`notify`).
        self.notify_path: Path | None = None
        # Writers of a SQLite file take turns (`writers`), threads and processes alike, and go
        # in the moment the previous one commits. PostgreSQL needs no such thing.
        self._turns: writers.Turns | None = None
        if self.dialect == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                raise errors.Invalid(
                    "--db: use a file for SQLite; an in-memory database is "
                    "invisible to the controller and agents"
                )
            self.sqlite_path = Path(parsed.database)
            self.notify_path = locations.notify_path(self.sqlite_path)
            if not create and not self.sqlite_path.parent.is_dir():
                raise errors.NotFound(
                    f"--db: no database at {self.sqlite_path}: no directory "
                    f"{self.sqlite_path.parent} (gctl up, apply and run create them)"
                )
            if not create and not self.sqlite_path.exists():
                self.absent = True
                self._stand_in()
                return
            try:
                _prepare_sqlite_file(self.sqlite_path)
            except OSError as exc:  # not a path a file can be made at: no retry helps
                raise errors.Invalid(
                    f"--db: cannot create {self.sqlite_path}: {exc.strerror or exc}"
                ) from None
            self._turns = writers.Turns(locations.writers_path(self.sqlite_path))
            self.engine: Engine = create_engine(url, **JSON_TEXT)
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
        elif self.dialect == "postgresql":
            # No server-side prepared statements: PostgreSQL plans a prepared one generically
            # after a few runs, and a generic plan of `name IN (500 parameters)` compares every
            # row with every parameter (0.2 s over 10,000 Jobs, against 3 ms planned for the
            # values), as it mis-plans `phase = 'Pending'` for a skewed table.
            self.engine = create_engine(
                url, pool_pre_ping=True, connect_args={"prepare_threshold": None}, **JSON_TEXT
            )
        else:
            raise errors.Invalid(
                f"--db: {parsed.drivername} is not supported: use a SQLite "
                "file path or postgresql://user@host/db"
            )

    def _stand_in(self) -> None:
        """An empty database in memory in place of the absent file: migrated as a new file is
        (the same schema, the revision counter at 0), so that every read finds what an empty
        database holds, through the same code."""
        self.engine = create_engine(
            "sqlite://",
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
            **JSON_TEXT,
        )
        event.listen(self.engine, "connect", _sqlite_on_connect)
        event.listen(self.engine, "begin", _sqlite_on_begin)
        self.upgrade()

    def must_exist(self, doing: str) -> None:
        """Refuse `doing` where the SQLite file is absent: a watch or a write would create it."""
        if self.absent:
            raise errors.NotFound(
                f"--db: no database at {self.sqlite_path} to {doing} (gctl up, apply and run "
                "create it)"
            )

    @classmethod
    def open(
        cls, flag: str | None = None, *, migrate: bool = True, create: bool = True
    ) -> "Database":
        db = cls(locations.resolve_url(flag), create=create)
        if migrate:
            try:
                db.ensure_schema()
            except BaseException:
                db.close()
                raise
        return db

    def close(self) -> None:
        self.engine.dispose()
        if self._turns is not None:
            self._turns.close()

    @contextmanager
    def write(self, *, bell: Path | None = None) -> Iterator[Session]:
        """One read-write transaction, committed when the block ends without an error. On
        SQLite, `bell` is rung after the commit instead of the change feed's (`notify_path`):
        for writes that the feed does not carry.

        On an absent file's stand-in, a transaction that only reads (as a delete of what is
        not there: not found) runs as on an empty database; one that would change a row is
        rolled back and refused, since what it wrote would vanish with the stand-in."""
        if self.absent:
            with self._write_nothing() as session:
                yield session
            return
        with (
            self._turns.turn() if self._turns is not None else contextlib.nullcontext(),
            translate_errors(self.url),
            Session(self.engine) as session,
            session.begin(),
        ):
            yield session
        rung = bell or self.notify_path
        if rung is not None and self.sqlite_path is not None:  # committed: wake the watchers
            notify.ring(rung)

    @contextmanager
    def _write_nothing(self) -> Iterator[Session]:
        with translate_errors(self.url), Session(self.engine) as session, session.begin():
            before = _changes(session)
            yield session
            if _changes(session) != before:  # raised inside the transaction: rolled back
                self.must_exist("write to")

    @contextmanager
    def read(self) -> Iterator[Session]:
        """One read-only transaction: a consistent snapshot that takes no write lock."""
        engine = self.engine.execution_options(gctl_sqlite_begin="DEFERRED")
        with translate_errors(self.url), Session(engine) as session, session.begin():
            yield session

    def schema_version(self) -> str | None:
        engine = self.engine.execution_options(gctl_sqlite_begin="DEFERRED")
        with translate_errors(self.url), engine.connect() as conn:
            try:
                return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            except exc.DBAPIError:
                return None

    def ensure_schema(self) -> None:
        """Upgrade the schema on first use; refuse a database made by a newer gctl."""
        current = self.schema_version()
        if current == schema.HEAD:
            return
        self.upgrade()

    def upgrade(self) -> tuple[str | None, str]:
        """Run the migrations to head under a lock, so that racing first uses migrate once. A
        database with no tables at all is made at head from the models instead, as Alembic
        advises ("create_all", then stamp): what every first use does, without importing
        Alembic or walking the migrations (about a second of CPU on a slow day; every test of
        `gctl` starts from no file). tests/migrations checks that both make the same schema."""
        with translate_errors(self.url), self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATIONS_LOCK_KEY}
                )
            before = _version_in(conn)
            if before is None and not inspect(conn).get_table_names():
                _create_at_head(conn)
            else:
                _migrate(conn, before, self.url)
        return before, schema.HEAD


def _create_at_head(conn: Connection) -> None:
    """The schema at head in an empty database, from the models: the rows the migrations
    seed (the global revision) and Alembic's version table as Alembic makes it."""
    from gctl.store import tables

    tables.Base.metadata.create_all(conn)
    conn.execute(text("INSERT INTO revision (id, revision) VALUES (1, 0)"))
    conn.execute(
        text(
            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    version = text("INSERT INTO alembic_version (version_num) VALUES (:head)")
    conn.execute(version, {"head": schema.HEAD})


def _migrate(conn: Connection, before: str | None, url: str) -> None:
    """Alembic's migrations from `before` to head; a version this gctl does not know is
    refused."""
    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    known = {rev.revision for rev in ScriptDirectory.from_config(config).walk_revisions()}
    if before is not None and before not in known:
        raise errors.Incompatible(
            f"{display_url(url)} has schema {before}, newer than this gctl "
            f"knows ({schema.HEAD}): upgrade gctl"
        )
    config.attributes["connection"] = conn
    command.upgrade(config, "head")


def _changes(session: Session) -> int:
    """The rows SQLite's connection has inserted, updated or deleted since it was opened."""
    return int(session.execute(text("SELECT total_changes()")).scalar_one())


def _version_in(conn: Any) -> str | None:
    savepoint = conn.begin_nested()
    try:
        version: str | None = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except exc.DBAPIError:
        savepoint.rollback()
        return None
    savepoint.commit()
    return version


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Driver errors become the project's own, once, here at the store boundary."""
    try:
        yield
    except exc.OperationalError as error:
        raise errors.Unavailable(f"database {display_url(url)}: {_first_line(error)}") from None
    except exc.DataError as error:
        raise errors.Invalid(f"the database refused a value: {_first_line(error)}") from None


def _first_line(error: exc.DBAPIError) -> str:
    return str(error.orig or error).strip().splitlines()[0]


def _prepare_sqlite_file(path: Path) -> None:
    """Create the file readable by its owner only, before SQLite creates it world-readable."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own handling defers it).
    dbapi_connection.isolation_level = None
    driver.tune(dbapi_connection)


def _sqlite_on_begin(conn: Any) -> None:
    # IMMEDIATE takes the write lock up front: a writer waits (busy_timeout) instead of failing
    # when it upgrades a read lock; read-only sessions ask for DEFERRED.
    mode = conn.get_execution_options().get("gctl_sqlite_begin", "IMMEDIATE")
    conn.exec_driver_sql(f"BEGIN {mode}")
