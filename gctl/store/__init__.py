"""The database: SQLAlchemy tables, the Store (CRUD with compare-and-set) and the change feed.

Store functions take a session and never commit: the caller owns the transaction.
Import its modules, not names from this package.
"""
