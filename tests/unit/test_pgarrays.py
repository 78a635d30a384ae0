"""The one-statement writes of many rows on PostgreSQL: when they apply, and what they send.
(Their effect on a real PostgreSQL: tests/integration/test_store.py.)"""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy.dialects import postgresql

from gctl.store import pgarrays, tables

DIALECT = postgresql.dialect()
JOBS = tables.table_of("Job")
REQUESTS = tables.Base.metadata.tables["log_requests"]


def test_rows_of_other_columns_are_left_to_executemany() -> None:
    rows = [{"uid": "a", "name": "a"}, {"uid": "b", "namespace": "x"}]
    assert pgarrays.insert(DIALECT, JOBS, rows) is None


def test_two_writes_of_one_object_are_left_to_executemany() -> None:
    """PostgreSQL would join both to the row and apply one; executemany applies both."""
    params = [
        {"b_uid": "a", "b_version": 1, "b_phase": "Scheduled"},
        {"b_uid": "a", "b_version": 7, "b_phase": "Running"},
    ]
    assert pgarrays.update(DIALECT, JOBS, params, 8) is None


def test_each_column_travels_as_one_array_of_what_sqlalchemy_would_bind() -> None:
    east = timezone(timedelta(hours=2))
    rows = [
        {"uid": "a", "created_at": datetime(2026, 1, 1, 2, tzinfo=east), "spec": {"x": 1}},
        {"uid": "b", "created_at": datetime(2026, 1, 1), "spec": None},
    ]
    made = pgarrays.insert(DIALECT, JOBS, rows)
    assert made is not None
    sql, arrays = made
    assert sql == (
        'INSERT INTO "jobs" ("uid", "created_at", "spec") SELECT v."uid", v."created_at", '
        'CAST(v."spec" AS jsonb) FROM unnest(%b::text[], %b::timestamptz[], %b::text[]) '
        'WITH ORDINALITY AS v("uid", "created_at", "spec", gctl_row) ORDER BY gctl_row'
    )
    midnight = datetime(2026, 1, 1, tzinfo=UTC)  # in UTC, naive ones taken as UTC
    assert arrays == [["a", "b"], [midnight, midnight], ['{"x":1}', "null"]]


def test_a_guarded_update_sets_the_new_revision_where_uid_and_version_match() -> None:
    params = [
        {"b_uid": "a", "b_version": 3, "b_phase": "Running", "b_status": {"phase": "Running"}},
        {"b_uid": "b", "b_version": 4, "b_phase": "Failed", "b_status": {}},
    ]
    made = pgarrays.update(DIALECT, JOBS, params, 9)
    assert made is not None
    sql, arrays = made
    assert sql == (
        'UPDATE "jobs" AS t SET "phase" = v."phase", "status" = CAST(v."status" AS jsonb), '
        "resource_version = %s FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[]) "
        'AS v(b_uid, b_version, "phase", "status") '
        "WHERE t.uid = v.b_uid AND t.resource_version = v.b_version"
    )
    assert arrays == [9, ["a", "b"], [3, 4], ["Running", "Failed"], ['{"phase":"Running"}', "{}"]]


def test_numbers_of_a_float_column_are_all_floats() -> None:
    """psycopg dumps no list that mixes ints and floats."""
    made = pgarrays.insert(DIALECT, REQUESTS, [{"lease_seconds": 5}, {"lease_seconds": 2.5}])
    assert made is not None
    assert made[1] == [[5.0, 2.5]]
    assert "%b::double precision[]" in made[0]


def test_a_guarded_delete_names_rows_by_uid_and_version() -> None:
    sql, arrays = pgarrays.delete(
        JOBS, [{"b_uid": "a", "b_version": 3}, {"b_uid": "b", "b_version": 5}]
    )
    assert sql == (
        'DELETE FROM "jobs" AS t USING unnest(%b::text[], %b::bigint[]) AS v(b_uid, b_version) '
        "WHERE t.uid = v.b_uid AND t.resource_version = v.b_version"
    )
    assert arrays == [["a", "b"], [3, 5]]


def test_a_column_named_as_the_rows_own_columns_is_refused() -> None:
    """The unnested rows carry the guard and their position beside the table's columns."""
    with pytest.raises(ValueError, match="gctl_row"):
        pgarrays.insert(DIALECT, JOBS, [{"gctl_row": 1}, {"gctl_row": 2}])
