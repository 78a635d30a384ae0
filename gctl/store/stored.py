"""Stored documents back into objects: a row that no longer validates is one error that names
it (`errors.StoredInvalid`), never pydantic's, so that a daemon can set that object aside and
go on with the others, and the CLI can say it in one line."""

from typing import Any, TypeVar

import pydantic

from gctl.api import errors, meta
from gctl.store import jsontext

T = TypeVar("T", bound=meta.Resource)


def validated(cls: type[T], wire: dict[str, Any], *, strict: bool = False) -> T:
    """`strict`: checked as the JSON it is stored as, without pydantic's conversions (a time
    stored as a number fails): for a reader of plain stored data that failed on it, to tell
    a malformed row from its own bug (gctl writes none that fails)."""
    try:
        if strict:
            return cls.model_validate_json(jsontext.encode(wire, default=str), strict=True)
        return cls.model_validate(wire)
    except pydantic.ValidationError as exc:
        from gctl.api import manifest  # only on this path: YAML and the rest are not needed

        metadata = wire["metadata"]
        raise errors.StoredInvalid(
            (cls.KIND, metadata.get("namespace", ""), metadata["name"]),
            metadata.get("uid", ""),
            str(metadata.get("resourceVersion", "")),
            manifest.first_error(exc, ""),
            generation=metadata.get("generation"),
        ) from None


def validated_or_skipped(
    cls: type[T], wire: dict[str, Any], skipped: list[errors.StoredInvalid] | None
) -> T | None:
    """`validated`, for a reader that goes on past what does not validate: with `skipped`, the
    error goes there and None comes back; without, it raises."""
    try:
        return validated(cls, wire)
    except errors.StoredInvalid as exc:
        if skipped is None:
            raise
        skipped.append(exc)
        return None
