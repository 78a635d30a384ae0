"""Alembic migrations: the schema's only source of change, one stream for SQLite and PostgreSQL."""
