"""ix_bindings_phase: the active attempts found by their phase, not among every attempt

Every scheduling pass reads the active attempts (phase Pending, Armed, Starting or Running).
Bindings are kept as long as their Jobs, and without this index each pass read them all: 20 ms
a pass over 100,000 finished attempts on SQLite, against 0.02 ms through it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_bindings_phase", "bindings", ["phase"])


def downgrade() -> None:
    op.drop_index("ix_bindings_phase", table_name="bindings")
