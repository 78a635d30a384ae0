"""Many rows in one PostgreSQL statement: each column sent as one array, and unnested.

psycopg's executemany sends one INSERT or UPDATE per row (pipelined, but one statement each),
which PostgreSQL parses, plans and runs one by one: a scheduling pass that binds 500 Jobs wrote
about 3,000 such statements (Bindings, Jobs, Events, the change feed), and of the server's CPU
in `control-plane-10k` most went to statements of one row. Sent as arrays, each batch is one
statement: 500 Events took the server 15 ms of CPU rather than 58. The arrays go in binary
(`%b`): psycopg writes an array of JSON documents as text in Python, escaping every quote (44
ms for 500 of them), in binary in half a millisecond. SQLite's executemany runs inside the
process, in C, and stays as it is.

`insert` writes rows in the order given (the change feed's ids are taken in that order);
`update` is the Store's guarded status write (uid and resourceVersion as read), for rows of
distinct uids: PostgreSQL would apply only one of two rows of one uid, where executemany
applies both in turn; `delete` the Store's guarded removal.
"""

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Dialect, Float, Integer, String, Table
from sqlalchemy.types import TypeDecorator

from gctl.store import jsontext

UID, VERSION = "b_uid", "b_version"  # the guard's parameters, as the Store names them
# The unnested rows' own columns, beside the table's: the guard's, and an inserted row's
# position. No table has a column of these names (`_columns` makes sure).
_GUARD, _ROW = f"{UID}, {VERSION}", "gctl_row"


def insert(
    dialect: Dialect, table: Table, rows: Sequence[Mapping[str, Any]]
) -> tuple[str, list[Any]] | None:
    """The INSERT of `rows` (dicts of one set of columns) and its parameters; None where they
    do not share their columns (executemany then)."""
    columns = tuple(rows[0])
    if any(row.keys() != rows[0].keys() for row in rows):
        return None
    return _insert_sql(table, columns), _arrays(dialect, table, columns, rows, "")


def update(
    dialect: Dialect, table: Table, params: Sequence[Mapping[str, Any]], revision: int
) -> tuple[str, list[Any]] | None:
    """The guarded UPDATE of the Store's status writes: each of `params` names a row by
    `b_uid` and `b_version` and gives its new columns as `b_<column>`; every row's
    resource_version becomes `revision`. None where two name one uid, or they differ in
    columns (executemany then)."""
    keys = tuple(params[0])
    uids = {p[UID] for p in params}
    if len(uids) != len(params) or any(p.keys() != params[0].keys() for p in params):
        return None
    columns = tuple(k.removeprefix("b_") for k in keys if k not in (UID, VERSION))
    sql = _update_sql(table, columns)
    arrays = [[p[UID] for p in params], [p[VERSION] for p in params]]
    arrays += _arrays(dialect, table, columns, params, "b_")
    return sql, [revision, *arrays]


def delete(table: Table, params: Sequence[Mapping[str, Any]]) -> tuple[str, list[Any]]:
    """The guarded DELETE of rows named by `b_uid` and `b_version` (a row named twice is
    removed once, as executemany's second statement would remove none)."""
    sql = (
        f"DELETE FROM {_quoted(table.name)} AS t USING unnest(%b::text[], %b::bigint[]) "
        f"AS v({_GUARD}) WHERE t.uid = v.{UID} AND t.resource_version = v.{VERSION}"
    )
    return sql, [[p[UID] for p in params], [p[VERSION] for p in params]]


@cache
def _insert_sql(table: Table, columns: tuple[str, ...]) -> str:
    names = _columns(table, columns)
    values = ", ".join(_value(table, c) for c in columns)
    return (
        f"INSERT INTO {_quoted(table.name)} ({names}) SELECT {values} FROM "
        f"unnest({_array_params(table, columns)}) WITH ORDINALITY AS v({names}, {_ROW}) "
        f"ORDER BY {_ROW}"
    )


@cache
def _update_sql(table: Table, columns: tuple[str, ...]) -> str:
    sets = ", ".join(f"{_quoted(c)} = {_value(table, c)}" for c in columns)
    names = _columns(table, columns)
    arrays = _array_params(table, columns)
    return (
        f"UPDATE {_quoted(table.name)} AS t SET {sets}, resource_version = %s FROM "
        f"unnest(%b::text[], %b::bigint[], {arrays}) AS v({_GUARD}, {names}) "
        f"WHERE t.uid = v.{UID} AND t.resource_version = v.{VERSION}"
    )


def _columns(table: Table, columns: tuple[str, ...]) -> str:
    if clash := {UID, VERSION, _ROW} & set(columns):
        raise ValueError(f"{table.name}: a column named {clash.pop()} clashes with pgarrays'")
    return ", ".join(_quoted(c) for c in columns)


def _array_params(table: Table, columns: tuple[str, ...]) -> str:
    return ", ".join(f"%b::{_element(table, c)}[]" for c in columns)


def _value(table: Table, column: str) -> str:
    """The column's value from its array element: JSON documents travel as text."""
    value = f"v.{_quoted(column)}"
    return f"CAST({value} AS jsonb)" if isinstance(_base(table, column), JSON) else value


def _base(table: Table, column: str) -> Any:
    """The column's type, or the type a TypeDecorator of it stores (tables.JSONDocument's JSON,
    UTCDateTime's DateTime)."""
    kind = table.c[column].type
    return kind.impl_instance if isinstance(kind, TypeDecorator) else kind


def _quoted(name: str) -> str:
    """A table's or column's name as PostgreSQL reads it whatever it is (`order`, `user`)."""
    return '"' + name.replace('"', '""') + '"'


def _element(table: Table, column: str) -> str:
    """The SQL type of the column's array elements."""
    kind = _base(table, column)
    for python, sql in _ELEMENTS:
        if isinstance(kind, python):
            return sql
    raise TypeError(f"{table.name}.{column}: no array type for {kind!r}")


# In order: JSON before String (no overlap today, but a JSON type is the more specific).
_ELEMENTS: tuple[tuple[type[Any], str], ...] = (
    (JSON, "text"),
    (DateTime, "timestamptz"),
    (Boolean, "boolean"),
    (Integer, "bigint"),  # BigInteger is an Integer; the column casts it to its own width
    (Float, "double precision"),
    (String, "text"),  # Text is a String
)


def _arrays(
    dialect: Dialect,
    table: Table,
    columns: tuple[str, ...],
    rows: Sequence[Mapping[str, Any]],
    prefix: str,
) -> list[list[Any]]:
    """Each column's values, as SQLAlchemy would have bound them."""
    arrays: list[list[Any]] = []
    for column in columns:
        key, kind = prefix + column, table.c[column].type
        if isinstance(_base(table, column), JSON):  # as SQLAlchemy writes them: None is null
            arrays.append([jsontext.dumps(row[key]) for row in rows])
        elif isinstance(kind, TypeDecorator):
            arrays.append([kind.process_bind_param(row[key], dialect) for row in rows])
        elif isinstance(kind, Float):  # psycopg dumps no list that mixes ints and floats
            arrays.append([None if row[key] is None else float(row[key]) for row in rows])
        else:
            arrays.append([row[key] for row in rows])
    return arrays
