"""Quantities of memory (`24Gi`, `24GB`, `500Mi`, bytes), GPU counts (`0.5`, `2`) and durations
(a deadline or TTL in seconds)."""

import math
import re
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "KB": 10**3,
    "kB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "Ki": 2**10,
    "KiB": 2**10,
    "Mi": 2**20,
    "MiB": 2**20,
    "Gi": 2**30,
    "GiB": 2**30,
    "Ti": 2**40,
    "TiB": 2**40,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

# No GPU made or announced holds more than this; a larger figure is a typo (GB for MB, say).
MAX_GPU_MEMORY = 2**40
MAX_GPUS_PER_JOB = 1024
# A deadline or TTL longer than a year is a typo, or means none (leave the field out). The
# scheduler adds up the deadlines of the Jobs queued on one GPU on its timeline (a hundred and
# more): at a year each, that stays far inside the last moment a datetime holds (year 9999).
MAX_DURATION_SECONDS = 365 * 86_400


def parse_bytes(value: object) -> int:
    """Return the number of bytes in a memory quantity, or raise ValueError saying why not."""
    if isinstance(value, bool):
        raise ValueError("must be a memory quantity such as 24Gi, 24GB or 500Mi")
    if isinstance(value, int):
        amount = Decimal(value)
        multiplier = 1
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if match is None or match.group(2) not in _SUFFIXES:
            raise ValueError(
                f"{value!r} is not a memory quantity: use a number with a unit such as "
                "24Gi, 24GB or 500Mi"
            )
        try:
            amount = Decimal(match.group(1))
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
            raise ValueError(f"{value!r} is not a number") from exc
        multiplier = _SUFFIXES[match.group(2)]
    else:
        raise ValueError("must be a memory quantity such as 24Gi, 24GB or 500Mi")
    total = amount * multiplier
    if total <= 0:
        raise ValueError("must be greater than zero")
    if total != total.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    if total > MAX_GPU_MEMORY:
        raise ValueError(f"{value!r} is more memory than any GPU has (at most 1Ti)")
    return int(total)


def format_bytes(count: int) -> str:
    """Render bytes compactly, binary units: 25769803776 -> '24Gi'."""
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if count >= size:
            value = count / size
            return f"{value:.0f}{suffix}" if value == int(value) else f"{value:.1f}{suffix}"
    return str(count)


def check_gpus(value: float) -> float:
    """A GPU request is a fraction in (0, 1] or a whole number (0 for a job that needs none)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if value < 0:
        raise ValueError("must not be negative")
    if value > 1 and value != int(value):
        raise ValueError(f"{value} is neither a fraction in (0,1] nor a whole number of GPUs")
    if value > MAX_GPUS_PER_JOB:
        raise ValueError(
            f"{format_gpus(value)} GPUs is more than one node has (at most {MAX_GPUS_PER_JOB})"
        )
    return value


def format_gpus(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def after(moment: datetime, span: timedelta | float) -> datetime | None:
    """`moment` plus `span` (or that many seconds); None when that is past the last moment a
    datetime holds: a deadline or TTL so far ahead (stored before durations were limited)
    never comes."""
    try:
        return moment + (span if isinstance(span, timedelta) else timedelta(seconds=span))
    except OverflowError:
        return None
