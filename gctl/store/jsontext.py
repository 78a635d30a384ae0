"""The JSON text of stored documents, written and read with orjson.

Every stored object is JSON text (spec, status, labels, the change feed's copies): `gctl get
jobs` over 10,000 Jobs spent a quarter of its time in json.loads, and the controller a tenth of
its own in json.loads and json.dumps; orjson does either in a fifth of the time or less.

What orjson would do otherwise than json, json does, so that every stored document reads and
writes as it did:
- A lone surrogate (the shell hands a command argument's undecodable bytes over as them), an
  integer beyond 64 bits, NaN or an infinity is written by json.dumps: orjson refuses the
  first two and writes the others as null. A NaN reaches no new document (numbers must be
  finite), but a Sweep an older gctl stored with one in its matrix still reads, and keeps it
  when written again; so any text orjson writes with a `null` in it is written again by json,
  which costs little: stored documents leave empty fields out, null ones too.
- Text orjson refuses (an escaped lone surrogate, that NaN) is read by json.loads.
- orjson reads an integer beyond 64 bits as a double. Apply takes none since orjson came
  (gctl.api.manifest), as Kubernetes' int64 fields take none; but a Sweep's matrix, free-form
  numbers, may hold one stored before, which read as a double would name and run other
  children. So the documents of the kinds that hold free-form numbers (`EXACT_KINDS`), and
  those read where the kind is not known (SQLAlchemy's JSON columns), are read by json.loads
  where their text has a run of 19 digits, which costs about what orjson's read does.
"""

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

EXACT_KINDS = frozenset({"Sweep"})  # matrix values are numbers as users gave them
# An integer orjson may read as a double: 2**63 has 19 digits.
_LONG_NUMBER = re.compile("[0-9]" * 19)
_LONG_NUMBER_BYTES = re.compile(b"[0-9]" * 19)
_COMPACT = (",", ":")  # as orjson writes


def loads(text: str | bytes) -> Any:
    """A document of a kind that holds no free-form numbers, from its text."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an escaped lone surrogate, NaN, an infinity
        return json.loads(text)


def loads_exact(text: str | bytes) -> Any:
    """A document from its text, every integer as written."""
    pattern = _LONG_NUMBER if isinstance(text, str) else _LONG_NUMBER_BYTES
    if pattern.search(text) is not None:  # type: ignore[arg-type]  # the pattern of its type
        return json.loads(text)
    return loads(text)


def loads_of(kind: str) -> Callable[[str | bytes], Any]:
    """How to read the documents of `kind`."""
    return loads_exact if kind in EXACT_KINDS else loads


def dumps(document: Any) -> str:
    """A document's text, as json.dumps writes it without the spaces."""
    return encode(document).decode()


def encode(document: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`dumps` as UTF-8 bytes, for a reader that takes them (pydantic's validate_json);
    `default` turns what JSON has no type for into what it has, as json.dumps's does."""
    text: bytes | None
    try:
        text = orjson.dumps(document, default=default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # a lone surrogate, an integer beyond 64 bits, an unknown type
        text = None
    if text is None or b"null" in text:  # or a None, a NaN or an infinity written as null
        return json.dumps(document, default=default, separators=_COMPACT).encode()
    return text
