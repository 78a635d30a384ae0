"""Stored JSON text: orjson's speed, and every document as the standard library's json read
and wrote it."""

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gctl.store import jsontext


def documents(integers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none()
        | st.booleans()
        | integers
        | st.floats(allow_nan=False)  # NaN is not equal to itself: tested below
        | st.text(),  # lone surrogates too: Python's argv holds undecodable bytes as them
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    )


@given(documents(st.integers(-(2**63), 2**63 - 1)))  # what apply takes (gctl.api.manifest)
def test_a_document_reads_back_as_written(document: Any) -> None:
    for text in (jsontext.dumps(document), json.dumps(document)):  # json: rows of before
        assert jsontext.loads(text) == document
        assert jsontext.loads(text.encode()) == document  # bytes, as psycopg hands them
        assert jsontext.loads_exact(text) == document


@given(documents(st.integers(-(2**90), 2**90)))
def test_a_document_of_any_integers_reads_back_exactly(document: Any) -> None:
    """What an older gctl stored in a Sweep's matrix (`EXACT_KINDS`)."""
    for text in (jsontext.dumps(document), json.dumps(document)):
        assert jsontext.loads_exact(text) == document
        assert jsontext.loads_exact(text.encode()) == document


def test_only_the_kinds_with_free_numbers_are_read_exactly() -> None:
    text = json.dumps({"seed": [10**30]})
    assert jsontext.loads_of("Sweep")(text) == {"seed": [10**30]}
    assert jsontext.loads_of("Job")(text) == {"seed": [float(10**30)]}  # as Go's JSON reads it


@pytest.mark.parametrize(
    "document",
    [
        2**63,  # one past int64: orjson refuses it
        -(2**63) - 1,
        {"gpus": [12345678901234567890123]},
        "\udcff",  # a lone surrogate: orjson refuses it, json escapes it
        ["echo", "caf\udce9"],
        {"lr": [0.1, math.nan, math.inf]},  # orjson writes them as null
        {"a": None},
    ],
)
def test_what_orjson_would_write_otherwise_json_writes(document: Any) -> None:
    assert jsontext.dumps(document) == json.dumps(document, separators=(",", ":"))


def test_nan_and_infinities_read_as_json_reads_them() -> None:
    read = jsontext.loads('{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e400}')
    assert math.isnan(read["a"])
    assert (read["b"], read["c"], read["d"]) == (math.inf, -math.inf, math.inf)


def test_integer_keys_are_written_as_json_writes_them() -> None:
    assert jsontext.loads(jsontext.dumps({1: "a"})) == {"1": "a"}


def test_encode_turns_unknown_types_with_default() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd"

    assert jsontext.encode({"a": Odd()}, default=str) == b'{"a":"odd"}'
    with pytest.raises(TypeError):
        jsontext.encode({"a": Odd()})
