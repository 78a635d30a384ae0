"""Facts about the schema that code without SQLAlchemy needs: its version, table names, and the
columns copied out of spec and status."""

from typing import Any

# The newest migration; the Store upgrades a database whose alembic_version differs.
HEAD = "0006"

TABLES: dict[str, str] = {
    "Job": "jobs",
    "GPUPool": "gpupools",
    "GPUProfile": "gpuprofiles",
    "ApplySet": "applysets",
    "Sweep": "sweeps",
    "Node": "nodes",
    "Binding": "bindings",
    "Event": "events",
}


def derived(kind: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The columns copied out of an object's spec and status, so that queries can filter and
    sort on them (the scheduler's queue, a node's attempts, an object's events).

    gctl.store.tables declares the columns for SQLAlchemy; the Store and gctl.store.driver both
    fill them from here."""
    if kind == "Job":
        return {
            "phase": status.get("phase", "Pending"),
            "priority": spec.get("priority", 0),
            "pool": spec.get("pool"),
        }
    if kind == "Binding":
        return {
            "node": spec.get("node", ""),
            "job_uid": spec.get("jobUID", ""),
            "phase": status.get("phase", "Pending"),
        }
    if kind == "Event":
        return {"involved_uid": spec.get("involvedObject", {}).get("uid")}
    return {}
