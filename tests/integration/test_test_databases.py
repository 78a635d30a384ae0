"""The `database` fixture (tests/conftest.py): a SQLite file that something the test started
before it made, such as a `gctl up` from a fixture listed first, is the test's database, not
replaced by a copy of the migrated template under that process's feet."""

from pathlib import Path

import pytest

from gctl.api import job
from gctl.store import db, store
from tests.builders import make_job, stored


@pytest.fixture
def written_first(db_url: str) -> str:
    """As `gctl up` started by a fixture before `database`: the file is there, with a Job."""
    first = db.Database.open(db_url)
    with first.write() as session:
        store.Store(session).create(make_job("made-first").build())
    first.close()  # the last connection: what it wrote is in the file itself, not its WAL
    return db_url


def test_a_database_made_before_the_fixture_is_kept(
    written_first: str, database: db.Database
) -> None:
    assert stored(database, job.Job, "made-first").name == "made-first"
    if "://" not in written_first:
        assert not list(Path(written_first).parent.glob("*.template"))
