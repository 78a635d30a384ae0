"""Alembic environment: runs on the connection gctl hands in, or on `GCTL_DB` from the command line.

SQLite needs batch mode to alter tables, so every migration is written with it.
"""

from alembic import context
from sqlalchemy import create_engine

from gctl.store import locations, tables

config = context.config


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=tables.Base.metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or locations.resolve_url(None))
    with engine.begin() as conn:
        _run(conn)
