"""How objects are printed: kubectl-style tables, and -o yaml | json | name.

Printers work on wire dicts (as stored), never on validated models: `gctl get` over thousands
of objects must not pay for validation. What each table's columns show is in `cells`.
"""

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from gctl.api import kinds
from gctl.cli import cells

Wire = dict[str, Any]


class Table:
    """Columns padded with three spaces, as kubectl prints them. Widths are fixed by the first
    batch, so rows printed later by a watch line up with it."""

    def __init__(self, kind: str, wide: bool, namespaces: bool, show_labels: bool) -> None:
        base, extra = cells.COLUMNS[kind]
        self.columns = list(base) + (extra if wide else [])
        if namespaces:
            self.columns.insert(0, ("NAMESPACE", cells.field("metadata", "namespace")))
        if show_labels:
            self.columns.append(("LABELS", cells.labels))
        self.widths: list[int] | None = None

    def lines(self, wires: Sequence[Wire], now: datetime, header: bool) -> list[str]:
        cells = [[read(w, now) for _, read in self.columns] for w in wires]
        titles = [title for title, _ in self.columns]
        if self.widths is None:
            self.widths = [
                max([len(titles[i])] + [len(row[i]) for row in cells]) for i in range(len(titles))
            ]
        rows = ([titles] if header else []) + cells
        last = len(self.widths) - 1
        return [
            "   ".join(
                cell if i == last else cell.ljust(self.widths[i]) for i, cell in enumerate(row)
            ).rstrip()
            for row in rows
        ]


def ref(w: Wire) -> str:
    return f"{str(w['kind']).lower()}.gctl/{w['metadata']['name']}"


def as_list(wires: Sequence[Wire]) -> Wire:
    return {"apiVersion": kinds.API_VERSION, "kind": "List", "items": list(wires)}


def dump_yaml(document: Any) -> str:
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text: str = yaml.dump(
        document, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True
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
