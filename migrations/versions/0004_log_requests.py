"""log_requests and log_chunks: an attempt's log sent through the database by its node's agent

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIMESTAMP = sa.DateTime(timezone=True)
# SQLite auto-increments only an INTEGER PRIMARY KEY.
BIG_SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "log_requests",
        sa.Column("id", BIG_SERIAL, autoincrement=True, nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("binding_uid", sa.String(36), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("follow", sa.Boolean(), nullable=False),
        sa.Column("lease_seconds", sa.Float(), nullable=False),
        sa.Column("renewed_at", TIMESTAMP, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("sent", sa.BigInteger(), nullable=False),
        sa.Column("received", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_log_requests"),
    )
    op.create_index("ix_log_requests_node", "log_requests", ["node"])
    op.create_table(
        "log_chunks",
        sa.Column("request_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["log_requests.id"],
            name="fk_log_chunks_request_id_log_requests",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("request_id", "position", name="pk_log_chunks"),
    )


def downgrade() -> None:
    op.drop_table("log_chunks")
    op.drop_index("ix_log_requests_node", table_name="log_requests")
    op.drop_table("log_requests")
