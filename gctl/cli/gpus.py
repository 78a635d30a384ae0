"""The body of `gctl get gpus`: a row for every GPU of every node, from the Nodes and the
Bindings that hold their GPUs (`views.gpu_rows`), and with -w the rows again as they change.

A watch keeps the Nodes and the Bindings that hold GPUs as the change feed reports them
(`Tracker`) and prints a GPU's row again when what it says about who may use the GPU changes:
its jobs, its state, the processes gctl did not start on it, the GPU itself. Not for readings
alone (memory used, utilization): every node's heartbeat brings new ones every few seconds.

The top level imports no SQLAlchemy and no pydantic: `get gpus` lists through `listing`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gctl.api import errors, kinds, selector
from gctl.cli import cells, fitting, printers, views

if TYPE_CHECKING:
    from gctl.store import db, store

Wire = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); "" for a Node's namespace


def get_gpus(
    *,
    nodes: list[str],
    output: str,
    selector_text: str | None,
    watch: bool,
    watch_only: bool,
    show_labels: bool,
    db_url: str | None,
    field_selector: str | None = None,
) -> None:
    from gctl.cli import getting

    if show_labels:
        raise errors.Invalid("get gpus: --show-labels is for stored kinds; select nodes with -l")
    if field_selector is not None:
        raise errors.Invalid("get gpus: --field-selector is for stored kinds; name the nodes")
    if output not in ("", "wide", "yaml", "json"):
        raise errors.Invalid(f"-o {output}: gpus print as a table, wide, yaml or json")
    watching = watch or watch_only
    label_selector = selector.parse(selector_text) if selector_text else None

    def wanted(node: Wire) -> bool:
        return (not nodes or node["metadata"]["name"] in nodes) and (
            label_selector is None or label_selector.matches(node["metadata"].get("labels", {}))
        )

    database = getting.watched(db_url) if watching else None
    listed = getting.list_kind(db_url, kinds.NODE, None, nodes or None)
    missing = sorted(set(nodes) - {w["metadata"]["name"] for w in listed.wires})
    if missing and not watching:
        raise errors.NotFound(f'node "{missing[0]}" not found')
    held = getting.list_kind(db_url, kinds.BINDING, None, None)
    tracker = Tracker(wanted)
    tracker.start(listed.wires, held.wires)
    rows = tracker.changed(tracker.nodes)
    table = None
    if output in ("", "wide"):
        wide, width = output == "wide", fitting.screen_width(sys.stdout)
        table = printers.Table(cells.GPU_VIEW, wide, False, show_labels=False, width=width)
    if not watch_only:
        if output in ("yaml", "json"):
            text = printers.dump_yaml(rows) if output == "yaml" else printers.dump_json(rows)
            sys.stdout.write(text if output == "yaml" else text + "\n")
        elif rows:
            printers.print_objects(rows, output, table, single=False)
        elif not watching:
            print("No resources found.", file=sys.stderr)
    if database is not None:
        sys.stdout.flush()
        _watch(database, min(listed.revision, held.revision), tracker, output, table)


def _watch(
    database: db.Database,
    revision: int,
    tracker: Tracker,
    output: str,
    table: printers.Table | None,
) -> None:
    """Print the rows that change, from `revision` on, until interrupted (Ctrl-C: exit 130,
    as `get -w` of the other kinds)."""
    from datetime import UTC, datetime

    from gctl.cli import following
    from gctl.store import feed, notify

    stop = notify.Stop()
    try:
        kinds_watched = [kinds.NODE.kind, kinds.BINDING.kind]
        with (
            following.interruptible(stop) as interrupted,
            feed.Watch(database, since=revision, kinds=kinds_watched, stop=stop) as changes,
        ):
            for batch in changes:
                rows = tracker.changed(tracker.apply(batch))
                if not rows:
                    continue
                if table is not None:
                    lines = table.lines(rows, datetime.now(UTC), header=table.widths is None)
                    sys.stdout.write("".join(line + "\n" for line in lines))
                elif output == "yaml":
                    sys.stdout.write("".join("---\n" + printers.dump_yaml(r) for r in rows))
                else:
                    sys.stdout.write("".join(printers.dump_json(r) + "\n" for r in rows))
                sys.stdout.flush()
    finally:
        database.close()
    if interrupted.is_set():
        raise SystemExit(following.INTERRUPTED)


class Tracker:
    """The Nodes and the Bindings that hold their GPUs, as the change feed last reported them,
    and what each GPU's row said when it was last printed (or listed, for --watch-only).

    The Nodes and the Bindings are listed in two reads, and the watch starts from the older:
    a change the listing already holds comes again, and is known by its revision (no later
    than the version held, ever, of that object), so it never takes a row back in time."""

    def __init__(self, wanted: Callable[[Wire], bool]) -> None:
        self._wanted = wanted
        self._nodes: dict[str, Wire] = {}
        self._holding: dict[str, dict[Key, Wire]] = {}  # node -> its Bindings that hold GPUs
        self._versions: dict[tuple[str, Key], int] = {}  # (kind, key) -> revision known
        self._said: dict[tuple[str, int], tuple[Any, ...]] = {}  # (node, GPU) -> what a row said

    @property
    def nodes(self) -> set[str]:
        return set(self._nodes)

    def start(self, nodes: Iterable[Wire], bindings: Iterable[Wire]) -> None:
        """Take the listed objects, at the versions they were listed at."""
        for kind, wires in ((kinds.NODE.kind, nodes), (kinds.BINDING.kind, bindings)):
            for wire in wires:
                self._take(kind, wire, int(wire["metadata"]["resourceVersion"]), deleted=False)

    def apply(self, changes: Iterable[store.Change]) -> set[str]:
        """Take changes from the feed; the names of the nodes whose rows they may change."""
        touched = set()
        for change in changes:
            if self._take(change.kind, change.object, change.revision, change.type == "DELETED"):
                touched.add(_node_of(change.kind, change.object))
        return touched

    def changed(self, names: Iterable[str]) -> list[Wire]:
        """The rows of these nodes' GPUs that say something new (all of them, the first time),
        in `get gpus`' order; a node that is gone, or not asked for, has none."""
        shown = [self._nodes[n] for n in names if n in self._nodes]
        shown = [n for n in shown if self._wanted(n)]
        holding = [b for n in shown for b in self._holding.get(n["metadata"]["name"], {}).values()]
        rows = []
        for row in views.gpu_rows(shown, holding):
            gpu, said = (row["node"], row["index"]), _what_it_says(row)
            if self._said.get(gpu) != said:
                self._said[gpu] = said
                rows.append(row)
        return rows

    def _take(self, kind: str, wire: Wire, revision: int, deleted: bool) -> bool:
        """Keep a Node's or Binding's version unless one as new is kept; whether it changed
        what the rows are made of."""
        key = (wire["metadata"].get("namespace", ""), wire["metadata"]["name"])
        if self._versions.get((kind, key), -1) >= revision:
            return False
        self._versions[(kind, key)] = revision
        if kind == kinds.NODE.kind:
            if deleted:
                self._nodes.pop(key[1], None)
                self._said = {gpu: s for gpu, s in self._said.items() if gpu[0] != key[1]}
            else:
                self._nodes[key[1]] = wire
            return True
        try:
            node, holds = _node_of(kind, wire), not deleted and views.holding(wire)
        except Exception:
            if not views.malformed(kind, wire):
                raise
            return False  # what it holds cannot be read: the rows leave it out (views)
        holding = self._holding.setdefault(node, {})
        if not holds:
            return holding.pop(key, None) is not None
        holding[key] = wire
        return True


def _node_of(kind: str, wire: Wire) -> str:
    """The node a Node or a Binding is about."""
    node: str = wire["metadata"]["name"] if kind == kinds.NODE.kind else wire["spec"]["node"]
    return node


def _what_it_says(row: Wire) -> tuple[Any, ...]:
    """What a GPU's row says that -w prints again when it changes: not memory used or
    utilization, nor how much memory foreign processes use, which heartbeats bring anew."""
    jobs = tuple((j["namespace"], j["name"], j["share"]) for j in row["jobs"])
    foreign = tuple(sorted(p["pid"] for p in row["foreignProcesses"]))
    return (row["status"], jobs, foreign, row["uuid"], row["model"], row["memoryTotal"])
