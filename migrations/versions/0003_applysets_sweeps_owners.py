"""applysets and sweeps; every object gains metadata.ownerReferences

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
EXISTING_TABLES = ("jobs", "gpupools", "gpuprofiles", "nodes", "bindings", "events")
NEW_TABLES = ("applysets", "sweeps")


def _create(name: str) -> None:
    op.create_table(
        name,
        sa.Column("uid", sa.String(36), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("finalizers", JSON, nullable=False),
        sa.Column("owner_references", JSON, nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("deleted_at", TIMESTAMP, nullable=True),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("status", JSON, nullable=False),
        sa.PrimaryKeyConstraint("uid", name=f"pk_{name}"),
    )
    op.create_index(f"uq_{name}_namespace_name", name, ["namespace", "name"], unique=True)


def upgrade() -> None:
    for name in EXISTING_TABLES:
        # The default fills the rows already there; the Store always writes the column.
        op.add_column(
            name,
            sa.Column("owner_references", JSON, nullable=False, server_default=sa.text("'[]'")),
        )
    for name in NEW_TABLES:
        _create(name)


def downgrade() -> None:
    for name in NEW_TABLES:
        op.drop_index(f"uq_{name}_namespace_name", table_name=name)
        op.drop_table(name)
    for name in EXISTING_TABLES:
        with op.batch_alter_table(name) as batch:
            batch.drop_column("owner_references")
