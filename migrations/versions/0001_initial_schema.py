"""initial schema: jobs, gpupools, nodes, bindings, events, the revision counter, the change feed

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
OBJECT_TABLES = ("jobs", "gpupools", "nodes", "bindings", "events")


def _object_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("finalizers", JSON, nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("deleted_at", TIMESTAMP, nullable=True),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("status", JSON, nullable=False),
    ]


def _object_table(name: str, *extra: sa.Column[object]) -> None:
    op.create_table(
        name, *extra, *_object_columns(), sa.PrimaryKeyConstraint("uid", name=f"pk_{name}")
    )
    op.create_index(f"uq_{name}_namespace_name", name, ["namespace", "name"], unique=True)


def upgrade() -> None:
    _object_table(
        "jobs",
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(253), nullable=True),
    )
    op.create_index("ix_jobs_queue", "jobs", ["phase", "priority", "created_at"])
    _object_table("gpupools")
    _object_table("nodes")
    _object_table(
        "bindings",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("job_uid", sa.String(36), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
    )
    op.create_index("ix_bindings_node", "bindings", ["node", "phase"])
    op.create_index("ix_bindings_job_uid", "bindings", ["job_uid"])
    _object_table("events", sa.Column("involved_uid", sa.String(36), nullable=True))
    op.create_index("ix_events_involved_uid", "events", ["involved_uid"])

    revision_table = op.create_table(
        "revision",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_revision"),
    )
    op.bulk_insert(revision_table, [{"id": 1, "revision": 0}])

    op.create_table(
        "changes",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(8), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("object", JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_changes"),
    )
    op.create_index("ix_changes_revision", "changes", ["revision"])


def downgrade() -> None:
    op.drop_table("changes")
    op.drop_table("revision")
    for name in OBJECT_TABLES:
        op.drop_table(name)
