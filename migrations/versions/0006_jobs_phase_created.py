"""ix_jobs_phase_created: the latest successful Jobs found through an index, not sorted

The controller estimates when waiting Jobs start from the run times of the latest 200
successful Jobs, read again every 10 s (controller.reading). The queue's index orders by
priority before age, so SQLite read every successful Job and sorted them: 117 ms over 100,000
of them, against a read of 200 through this index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_phase_created", "jobs", ["phase", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_phase_created", table_name="jobs")
