"""The body of `gctl get gpus`: a row for every GPU of every node, from the Nodes and the
Bindings that hold their GPUs (`views.gpu_rows`).

The top level imports no SQLAlchemy and no pydantic: `get gpus` lists through `listing`.
"""

from __future__ import annotations

import sys

from gctl.api import errors, kinds, selector
from gctl.cli import cells, fitting, printers, views


def get_gpus(
    *,
    nodes: list[str],
    output: str,
    selector_text: str | None,
    following: bool,
    db_url: str | None,
) -> None:
    from gctl.cli import commands

    if following:
        raise errors.Invalid(
            "get gpus: -w, --watch-only and --show-labels are for stored kinds; "
            "use them with nodes or bindings"
        )
    if output not in ("", "wide", "yaml", "json"):
        raise errors.Invalid(f"-o {output}: gpus print as a table, wide, yaml or json")
    label_selector = selector.parse(selector_text) if selector_text else None
    node_wires = commands._list(db_url, kinds.NODE, None, nodes or None).wires
    missing = sorted(set(nodes) - {w["metadata"]["name"] for w in node_wires})
    if missing:
        raise errors.NotFound(f'node "{missing[0]}" not found')
    if label_selector is not None:
        node_wires = [
            w for w in node_wires if label_selector.matches(w["metadata"].get("labels", {}))
        ]
    bindings = commands._list(db_url, kinds.BINDING, None, None).wires
    rows = views.gpu_rows(node_wires, bindings)
    if output in ("yaml", "json"):
        text = printers.dump_yaml(rows) if output == "yaml" else printers.dump_json(rows) + "\n"
        sys.stdout.write(text)
        return
    if not rows:
        print("No resources found.", file=sys.stderr)
        return
    wide, width = output == "wide", fitting.screen_width(sys.stdout)
    table = printers.Table(cells.GPU_VIEW, wide, namespaces=False, show_labels=False, width=width)
    printers.print_objects(rows, output, table, single=False)
