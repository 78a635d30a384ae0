"""How objects are printed: kubectl-style tables, and -o yaml | json | name.

Printers work on wire dicts (as stored), never on validated models: `gctl get` over thousands
of objects must not pay for validation. What each table's columns show is in `cells`. A plain
table fits the terminal (100 columns through a pipe: `fitting`) by cutting or wrapping its
last column, free text, and narrowing a column that gives way (`get gpus`' JOBS); -o wide cuts
nothing, as kubectl's.
"""

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from gctl.api import errors, kinds
from gctl.cli import cells, fitting, views

Wire = dict[str, Any]
_GAP = "   "  # between columns, as kubectl's


class Table:
    """Columns padded with three spaces, as kubectl prints them. Widths are fixed by the first
    batch, so rows printed later by a watch line up with it.

    A plain table fits `width` columns by what its last column shows: a message is cut (-o
    wide and describe show it whole), labels wrap onto lines of their own below it; the cells
    before it, which say what the row is, are never touched. A column before it that gives way
    (`cells.NARROWING`: `get gpus`' JOBS) is narrowed to what the others leave it, where the
    first batch would pass the line. -o wide cuts nothing."""

    def __init__(
        self,
        kind: str,
        wide: bool,
        namespaces: bool,
        show_labels: bool,
        width: int = fitting.WIDTH,
    ) -> None:
        base, extra = cells.COLUMNS[kind]
        columns = list(base) + (extra if wide else [])
        if wide:
            columns = [(t, cells.WIDE_CELLS.get((kind, t), read)) for t, read in columns]
        if namespaces:
            columns.insert(0, ("NAMESPACE", cells.field("metadata", "namespace")))
        if show_labels:
            columns.append(("LABELS", cells.labels))
        self.kind = kind
        self.columns = sorted(columns, key=lambda column: column[0] == cells.FREE_TEXT)
        self.width = None if wide else width
        self.widths: list[int] | None = None
        self._narrowing = {
            i: narrowed
            for i, (title, _) in enumerate(self.columns)
            if not wide and (narrowed := cells.NARROWING.get((kind, title))) is not None
        }
        self._rooms: dict[int, int] = {}  # column -> the room it was narrowed to

    def lines(self, wires: Sequence[Wire], now: datetime, header: bool) -> list[str]:
        grid = [self._row(w, now) for w in wires]
        titles = [title for title, _ in self.columns]
        if self.widths is None:
            self.widths = _widths(titles, grid)
            if self._narrow(titles):
                grid = [self._row(w, now) for w in wires]
                self.widths = _widths(titles, grid)
        last = len(self.widths) - 1
        start = sum(self.widths[:last]) + len(_GAP) * last  # the last column's
        lines = []
        for row in [titles, *grid] if header else grid:
            head = "".join(cell.ljust(self.widths[i]) + _GAP for i, cell in enumerate(row[:last]))
            first, *more = self._fit(titles[last], row[last], start)
            lines.append((head + first).rstrip())
            lines.extend(" " * start + piece for piece in more)
        return lines

    def _narrow(self, titles: list[str]) -> bool:
        """Narrow the columns that give way by what the line passes the width by, each to no
        less than its title and fitting.MIN_NARROWED; whether any was. Later rows (a watch's)
        are read in the same room, so they line up."""
        assert self.widths is not None
        if self.width is None:
            return False
        over = sum(self.widths) + len(_GAP) * (len(self.widths) - 1) - self.width
        for i in self._narrowing:
            room = max(self.widths[i] - over, len(titles[i]), fitting.MIN_NARROWED)
            if over > 0 and room < self.widths[i]:
                self._rooms[i] = room
                over -= self.widths[i] - room
        return bool(self._rooms)

    def _row(self, w: Wire, now: datetime) -> list[str]:
        """The object's cells; where one cannot be worked out of an object that does not
        validate as stored, what `as_stored` shows instead: the row is still listed."""
        try:
            return [
                read(w, now) if i not in self._rooms else self._narrowing[i](w, self._rooms[i])
                for i, (_, read) in enumerate(self.columns)
            ]
        except Exception:
            if not views.malformed(self.kind, w):
                raise
        return [as_stored(self.kind, title, read, w, now) for title, read in self.columns]

    def _fit(self, title: str, cell: str, start: int) -> list[str]:
        """The last cell in what the line leaves it: labels wrapped, anything else cut."""
        if self.width is None:
            return [cell]
        room = fitting.room(self.width, start)
        return fitting.wrap(cell, room) if title == "LABELS" else [fitting.cut(cell, room)]


def _widths(titles: list[str], grid: list[list[str]]) -> list[int]:
    return [max([len(titles[i])] + [len(row[i]) for row in grid]) for i in range(len(titles))]


# Cells worked out of one stored value, by kind and column: the value they show as stored
# where they cannot work it out of an object that does not validate (`as_stored`).
STORED: dict[tuple[str, str], tuple[str, ...]] = {
    ("Job", "GPUS"): ("spec", "resources", "gpus"),
    ("Job", "GPU-IDS"): ("status", "gpus"),
    ("Job", "ETA"): ("status", "estimatedStartTime"),
    ("Binding", "GPUS"): ("spec", "gpus"),
    ("Node", "HEARTBEAT"): ("status", "heartbeatTime"),
    ("ApplySet", "LAST SYNC"): ("status", "lastSyncTime"),
}


def as_stored(kind: str, title: str, read: cells.Read, w: Wire, now: datetime) -> str:
    """A cell of an object that does not validate as stored: `read`'s, where it can work it
    out; else the value it is worked out of, as stored (`STORED`), where that is printable
    text or a number; else `<invalid>`."""
    try:
        return read(w, now)
    except Exception:
        path = STORED.get((kind, title))
        value = None if path is None else cells.value_at(w, path)
        printable = isinstance(value, str | int | float) and str(value).isprintable()
        return str(value) if printable and str(value) else views.INVALID


def ref(w: Wire) -> str:
    return f"{str(w['kind']).lower()}.gctl/{w['metadata']['name']}"


def as_list(wires: Sequence[Wire]) -> Wire:
    return {"apiVersion": kinds.API_VERSION, "kind": "List", "items": list(wires)}


def dump_yaml(document: Any) -> str:
    """YAML text, dumped as bulk work (gctl.store.bulk): PyYAML keeps a node for every value
    until the document is written, half a million for 10,000 Jobs."""
    import yaml

    from gctl.api import yamlcodec
    from gctl.store import bulk

    with bulk.collector_paused():
        text: str = yaml.dump(
            document,
            Dumper=yamlcodec.Dumper,
            sort_keys=False,
            default_flow_style=False,
            allow_unicode=True,
        )
    return text


def dump_json(document: Any) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)


def print_objects(
    wires: Sequence[Wire],
    output: str,
    table: Table | None,
    single: bool,
    out: TextIO | None = None,
) -> None:
    """Print a result set in the chosen format; `single` prints one object, not a List."""
    out = out or sys.stdout
    if output == "name":
        out.writelines(ref(w) + "\n" for w in wires)
    elif output in ("yaml", "json"):
        document = wires[0] if single and len(wires) == 1 else as_list(wires)
        out.write(dump_yaml(document) if output == "yaml" else dump_json(document) + "\n")
    else:
        assert table is not None
        out.writelines(line + "\n" for line in table.lines(wires, datetime.now(UTC), header=True))


OUTPUTS = ("", "wide", "yaml", "json", "name")


def check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise errors.Invalid(f"-o {output}: use one of wide, yaml, json, name")
