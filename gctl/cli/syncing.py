"""The CLI's side of applysets: `gctl describe applyset`'s members table.

The sync itself runs in controller/sync.py, started by gctl.cli.daemons; the apply engine is
gctl.store.applying.
"""

from typing import TYPE_CHECKING, Any

from gctl.api import kinds
from gctl.cli import describe

if TYPE_CHECKING:
    from gctl.store import store

_NONE = "<none>"


def members_section(reader: "store.Store", wire: dict[str, Any]) -> list[str]:
    """`Members:` as a table of kind, namespace, name and, for a Job, its phase now."""
    members = wire["status"].get("members", [])
    if not members:
        return [f"{'Members:':<14}{_NONE}"]
    wanted: dict[str, list[str]] = {}
    for member in members:
        if member["kind"] == kinds.JOB.kind:
            wanted.setdefault(member.get("namespace", ""), []).append(member["name"])
    phases: dict[tuple[str, str], str] = {}
    for namespace, names in wanted.items():
        for job in reader.list_wire(kinds.model(kinds.JOB.kind), namespace, names=names):
            phase = job["status"].get("phase", "Pending")
            if job["metadata"].get("deletionTimestamp"):
                phase = "Terminating"
            phases[(namespace, job["metadata"]["name"])] = phase
    rows = [
        [
            member["kind"],
            member.get("namespace") or "-",
            member["name"],
            phases.get((member.get("namespace", ""), member["name"]), "-")
            if member["kind"] == kinds.JOB.kind
            else "-",
        ]
        for member in members
    ]
    return ["Members:", *describe._table(["Kind", "Namespace", "Name", "Phase"], rows)]
