"""The migrations and the models agree, and upgrade and downgrade both run, on both databases."""

import multiprocessing
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

import migrations
from gctl.api import errors
from gctl.store import db, schema, tables


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return config


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "m.db")
    url: str = request.getfixturevalue("empty_pg_url")
    return url


def test_schema_head_constant_is_the_newest_migration() -> None:
    assert ScriptDirectory.from_config(_config()).get_current_head() == schema.HEAD


def _schema(database: db.Database) -> dict[str, object]:
    """Every table's columns (name, type, nullable; in any order), indexes and primary key,
    and the rows of the tables the migrations seed."""
    found: dict[str, object] = {}
    with database.engine.connect() as conn:
        seen = inspect(conn)
        for table in sorted(seen.get_table_names()):
            columns = sorted(
                (c["name"], str(c["type"]), c["nullable"]) for c in seen.get_columns(table)
            )
            indexes = sorted(
                (i["name"] or "", tuple(i["column_names"]), bool(i["unique"]))
                for i in seen.get_indexes(table)
            )
            found[table] = (columns, indexes, seen.get_pk_constraint(table)["constrained_columns"])
        for table in ("revision", "alembic_version"):
            found[f"{table} rows"] = conn.execute(text(f"SELECT * FROM {table}")).all()
    return found


def test_models_and_migrations_agree(fresh_url: str) -> None:
    """The migrations make what the models declare; and a first use, which makes the schema
    from the models (`Database.upgrade` on an empty database), makes what the migrations do,
    rows they seed included."""
    migrated = db.Database.open(fresh_url, migrate=False)
    with migrated.engine.begin() as conn:
        config = _config()
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    with migrated.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, tables.Base.metadata) == []
    by_migrations = _schema(migrated)
    with migrated.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
        conn.execute(text("DROP TABLE alembic_version"))
    migrated.close()

    made = db.Database.open(fresh_url)
    assert _schema(made) == by_migrations
    made.close()


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    database = db.Database.open(fresh_url, migrate=False)
    assert database.upgrade() == (None, schema.HEAD)
    assert database.upgrade() == (schema.HEAD, schema.HEAD)
    config = _config()
    with database.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    assert database.schema_version() is None
    database.ensure_schema()
    assert database.schema_version() == schema.HEAD
    database.close()


def _open(url: str) -> None:
    db.Database.open(url).close()


def test_racing_first_uses_migrate_once(fresh_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    racers = [context.Process(target=_open, args=(fresh_url,)) for _ in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
        assert racer.exitcode == 0
    database = db.Database.open(fresh_url)
    with database.engine.connect() as conn:
        versions = conn.execute(text("SELECT count(*) FROM alembic_version")).scalar()
        revisions = conn.execute(text("SELECT count(*) FROM revision")).scalar()
    assert (versions, revisions) == (1, 1)
    database.close()


def test_newer_schema_is_refused(fresh_url: str) -> None:
    database = db.Database.open(fresh_url)
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(errors.Incompatible, match="newer than this gctl"):
        db.Database.open(fresh_url)
    database.close()
