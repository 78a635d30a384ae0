"""`gctl get jobs` prints a long table page by page, from one snapshot, as kubectl prints chunks.

The pages are read from one SELECT in (namespace, name) order (a server-side cursor on
PostgreSQL); these tests check that what is printed is the whole table, in order, once, whatever
page boundaries it crossed, and that changes made while the pages are read do not show.
"""

import pytest

from gctl.api import job
from gctl.store import db, listing, locations, store
from tests.builders import make_job
from tests.conftest import Gctl

COUNT = listing.PAGE * 2 + 7  # three pages, the last one short


def _fill(url: str) -> list[str]:
    """COUNT Jobs over two namespaces, names of growing width; returns them in table order."""
    database = db.Database.open(url)
    jobs = [
        make_job(f"j{i}")
        .label("half", "yes" if i % 2 else "no")
        .in_namespace("alpha" if i < COUNT // 3 else "default")
        .build()
        for i in range(COUNT)
    ]
    with database.write() as session:
        store.Store(session).create_many(jobs)
    database.close()
    return [
        f"{j.metadata.namespace or 'default'}/{j.name}"
        for j in sorted(jobs, key=lambda j: (j.metadata.namespace or "default", j.name))
    ]


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()]


@pytest.mark.slow
def test_a_long_table_is_printed_whole_in_order_with_one_header(gctl: Gctl) -> None:
    expected = _fill(gctl.db_url)
    rows = _rows(gctl.ok("get", "jobs", "-A"))
    assert rows[0][:2] == ["NAMESPACE", "NAME"]
    assert [f"{r[0]}/{r[1]}" for r in rows[1:]] == expected
    assert sum(r[0] == "NAMESPACE" for r in rows) == 1

    only_default = _rows(gctl.ok("get", "jobs"))
    assert [r[0] for r in only_default[1:]] == [
        e.split("/")[1] for e in expected if e.startswith("default/")
    ]


@pytest.mark.slow
def test_a_selector_filters_every_page(gctl: Gctl) -> None:
    expected = _fill(gctl.db_url)
    rows = _rows(gctl.ok("get", "jobs", "-A", "-l", "half=yes"))
    odd = [e for e in expected if int(e.split("/j")[1]) % 2]
    assert [f"{r[0]}/{r[1]}" for r in rows[1:]] == odd
    nothing = gctl("get", "jobs", "-A", "-l", "half=maybe")
    assert nothing.code == 0
    assert nothing.out == ""
    assert "No resources found" in nothing.err


@pytest.mark.slow
def test_the_pages_come_from_one_snapshot(db_url: str) -> None:
    expected = _fill(db_url)
    pages = listing.read_pages(locations.resolve_url(db_url), job.Job.INFO, None)
    assert pages is not None
    first = next(pages)
    database = db.Database.open(db_url)  # meanwhile: one Job more, one fewer
    with database.write() as session:
        writer = store.Store(session)
        writer.create(make_job("zz-late").build())
        writer.delete(job.Job, "j400", "default")
    database.close()
    read = [*first, *(w for page in pages for w in page)]
    assert len(first) == listing.PAGE
    assert [f"{w['metadata']['namespace']}/{w['metadata']['name']}" for w in read] == expected
