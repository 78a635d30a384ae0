"""The JSON text of stored documents, written and read with orjson.

Every stored object is JSON text (spec, status, labels, the change feed's copies): `gctl get
jobs` over 10,000 Jobs spent a quarter of its time in json.loads, and the controller a tenth of
its own in json.loads and json.dumps; orjson does either in a fifth of the time or less.

Its numbers are those of Kubernetes' JSON: integers of 64 bits and doubles, and what apply
takes is held to them (`gctl.api.manifest` refuses a larger integer, NaN and the infinities,
which JSON has no text for). Where orjson cannot do what json did, json does it: a document
holding a lone surrogate (the shell gives a command argument's undecodable bytes as them) or
an integer beyond 64 bits (only from code or a hand edit) is written by json.dumps, and text
orjson refuses (an escaped lone surrogate; NaN, as an older gctl wrote it) is read by
json.loads. An integer beyond 64 bits is read as a double, as Go's JSON reads one, and a NaN or
infinity in a document is written as null.
"""

import json
from collections.abc import Callable
from typing import Any

import orjson


def loads(text: str | bytes) -> Any:
    """A document from its text."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an escaped lone surrogate, NaN, an infinity
        return json.loads(text)


def dumps(document: Any) -> str:
    """A document's text, as json.dumps writes it without the spaces."""
    return encode(document).decode()


def encode(document: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`dumps` as UTF-8 bytes, for a reader that takes them (pydantic's validate_json);
    `default` turns what JSON has no type for into what it has, as json.dumps's does."""
    try:
        return orjson.dumps(document, default=default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # a lone surrogate, an integer beyond 64 bits, an unknown type
        return json.dumps(document, default=default).encode()
