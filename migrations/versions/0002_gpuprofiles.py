"""gpuprofiles: named GPU requirements that Jobs refer to with resources.profile

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gpuprofiles",
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
        sa.PrimaryKeyConstraint("uid", name="pk_gpuprofiles"),
    )
    op.create_index(
        "uq_gpuprofiles_namespace_name", "gpuprofiles", ["namespace", "name"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_gpuprofiles_namespace_name", table_name="gpuprofiles")
    op.drop_table("gpuprofiles")
