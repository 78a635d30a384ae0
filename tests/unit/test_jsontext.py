"""Stored JSON text: orjson's speed, and what the standard library's json reads and writes."""

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gctl.store import jsontext

documents = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # what apply takes (gctl.api.manifest)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # lone surrogates too: Python's argv holds undecodable bytes as them
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(documents)
def test_what_is_written_reads_back_the_same(document: Any) -> None:
    assert jsontext.loads(jsontext.dumps(document)) == document
    assert jsontext.loads(json.dumps(document)) == document  # rows written before orjson
    assert jsontext.loads(json.dumps(document).encode()) == document  # bytes, from psycopg


@pytest.mark.parametrize(
    "document",
    [
        2**63,  # one past int64: orjson refuses it, json writes it
        -(2**63) - 1,
        {"gpus": [12345678901234567890123]},
        "\udcff",  # a lone surrogate: orjson refuses it, json escapes it
        ["echo", "caf\udce9"],
    ],
)
def test_what_orjson_cannot_write_json_writes(document: Any) -> None:
    assert jsontext.dumps(document) == json.dumps(document)


def test_a_lone_surrogate_reads_back() -> None:
    assert jsontext.loads(jsontext.dumps(["caf\udce9"])) == ["caf\udce9"]


def test_an_integer_beyond_64_bits_reads_as_a_double() -> None:
    """As Go's JSON reads one into no int64: apply takes none (test_manifest)."""
    assert jsontext.loads(jsontext.dumps(10**30)) == float(10**30)
    assert jsontext.loads(jsontext.dumps(2**63 - 1)) == 2**63 - 1


def test_integer_keys_are_written_as_json_writes_them() -> None:
    assert jsontext.loads(jsontext.dumps({1: "a"})) == {"1": "a"}


def test_nan_and_infinities_read_as_json_reads_them() -> None:
    read = jsontext.loads('{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e400}')
    assert math.isnan(read["a"])
    assert (read["b"], read["c"], read["d"]) == (math.inf, -math.inf, math.inf)


def test_nan_is_written_as_null() -> None:
    # JSON has no NaN: PostgreSQL refused the `NaN` json.dumps wrote.
    assert jsontext.dumps({"a": math.nan}) == '{"a":null}'


def test_encode_turns_unknown_types_with_default() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd"

    assert jsontext.encode({"a": Odd()}, default=str) == b'{"a":"odd"}'
    with pytest.raises(TypeError):
        jsontext.encode({"a": Odd()})
