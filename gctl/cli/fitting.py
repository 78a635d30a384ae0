"""Fitting text to a terminal: how wide it is, and cutting or wrapping what would not fit.

A table fits a 100-column terminal: output to a pipe or a file assumes that width, output to a
terminal uses the terminal's own. What gives way is free text (a message, a list of labels),
or a list such as `get gpus`' JOBS, never the cells that say which object a row is.
"""

import os
import re
from typing import TextIO

WIDTH = 100  # columns, when the output is no terminal (a pipe, a file, a test)
MIN_ROOM = 20  # a free-text cell keeps at least this much, even when that overflows the line
MIN_NARROWED = 12  # a column narrowed before the last (get gpus' JOBS) keeps at least this much

_COUNT = re.compile(r" \(x\d+\)$")  # `(x3)`: how often an event happened, kept when cut
_SPACE = re.compile(r"\s")


def screen_width(out: TextIO) -> int:
    """The width of the terminal `out` writes to, or WIDTH when it writes to none."""
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns or WIDTH
    except (OSError, ValueError):  # no descriptor (a test's StringIO), or not a terminal
        pass
    return WIDTH


def room(width: int, used: int) -> int:
    """What a line `width` wide leaves after `used` columns, at least MIN_ROOM."""
    return max(width - used, MIN_ROOM)


def cut(text: str, room: int) -> str:
    """`text` in at most `room` columns, ending in `...` when cut; a trailing `(x3)` stays."""
    if len(text) <= room:
        return text
    count = _COUNT.search(text)
    suffix = count.group() if count else ""
    body = text[: len(text) - len(suffix)]
    return body[: max(room - len(suffix) - 3, 1)].rstrip() + "..." + suffix


def wrap(text: str, room: int) -> list[str]:
    """`text` in lines of at most `room` columns: broken at its spaces, or a list without
    spaces (`team=nlp,gctl/sweep=grid`) between its items, the line break in place of the
    comma; a word longer than a line is split where it must be. Line breaks and tabs in
    `text` are spaces."""
    text = _SPACE.sub(" ", text)
    if "," in text and " " not in text:
        return _pack(text.split(","), ",", room)
    return _pack(text.split(" "), " ", room)


def _pack(items: list[str], glue: str, room: int) -> list[str]:
    """Items joined by `glue`, as many to a line as fit in `room`."""
    lines: list[str] = []
    line = ""
    for item in items:
        if line and len(line) + len(glue) + len(item) <= room:
            line += glue + item
            continue
        if line:
            lines.append(line)
        rest = item
        while len(rest) > room:
            lines.append(rest[:room])
            rest = rest[room:]
        line = rest
    lines.append(line)
    return [text.rstrip() for text in lines]
