"""Facts about the schema that code without SQLAlchemy needs: its version and table names."""

# The newest migration; the Store upgrades a database whose alembic_version differs.
HEAD = "0003"

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
