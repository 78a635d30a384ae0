"""Where the database is: the `--db` flag, then `GCTL_DB`, then a per-user SQLite file.

A plain path means SQLite; `postgresql://` and `postgres://` mean PostgreSQL through psycopg 3.
"""

import os
from pathlib import Path

ENV_VAR = "GCTL_DB"


def default_sqlite_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return Path(base) / "gctl" / "gctl.db"


def resolve_url(flag: str | None) -> str:
    """The SQLAlchemy URL for `--db`, else `GCTL_DB`, else the per-user SQLite file."""
    raw = flag or os.environ.get(ENV_VAR) or str(default_sqlite_path())
    if "://" not in raw:
        return f"sqlite:///{Path(raw).expanduser().resolve()}"
    for prefix in ("postgresql://", "postgres://"):
        if raw.startswith(prefix):
            return "postgresql+psycopg://" + raw.removeprefix(prefix)
    return raw


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///` URL, or None for any other database."""
    prefix = "sqlite:///"
    return Path("/" + url.removeprefix(prefix).lstrip("/")) if url.startswith(prefix) else None


def notify_path(sqlite_file: Path) -> Path:
    """The doorbell rung after every committed write to a SQLite file (gctl.store.notify)."""
    return sqlite_file.with_name(sqlite_file.name + "-notify")


def logs_notify_path(sqlite_file: Path) -> Path:
    """The doorbell rung after every committed write of logs through the database
    (gctl.store.logstreams): apart from the change feed's, so that a log on its way wakes
    neither the controller nor the agents' loops."""
    return sqlite_file.with_name(sqlite_file.name + "-logs")


def writers_path(sqlite_file: Path) -> Path:
    """The file whose flock SQLite writers take turns on (gctl.store.writers)."""
    return sqlite_file.with_name(sqlite_file.name + "-writers")


def libpq_url(url: str) -> str | None:
    """A `postgresql+psycopg://` URL as libpq takes it, or None for any other database."""
    for prefix in ("postgresql+psycopg://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql://" + url.removeprefix(prefix)
    return None
