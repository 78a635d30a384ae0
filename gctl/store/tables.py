"""The schema as SQLAlchemy 2 typed models; migrations/ must agree with it (a test checks)."""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator, TypeEngine

from gctl.store import schema

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class JSONDocument(TypeDecorator[Any]):
    """JSON; JSONB on PostgreSQL. Not `JSON().with_variant(JSONB(), ...)`: importing JSONB
    imports the whole PostgreSQL dialect and its five drivers, 45-75 ms of every process's
    start on SQLite; here the dialect is asked for only where it is in use already."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


# SQLite auto-increments only an INTEGER PRIMARY KEY.
BigSerial = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps are UTC in the database and timezone-aware in Python, on both dialects."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        dict[str, Any]: JSONDocument(),
        list[str]: JSONDocument(),
        list[dict[str, Any]]: JSONDocument(),
        datetime: UTCDateTime(),
    }


class ObjectRow:
    """Columns every stored object has; spec and status are JSON documents in wire form."""

    uid: Mapped[str] = mapped_column(String(36), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(63))  # "" for cluster-scoped kinds
    name: Mapped[str] = mapped_column(String(253))
    labels: Mapped[dict[str, Any]]
    annotations: Mapped[dict[str, Any]]
    finalizers: Mapped[list[str]]
    owner_references: Mapped[list[dict[str, Any]]]
    generation: Mapped[int] = mapped_column(BigInteger)
    resource_version: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    deleted_at: Mapped[datetime | None]
    spec: Mapped[dict[str, Any]]
    status: Mapped[dict[str, Any]]


class JobRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["Job"]
    __table_args__ = (
        Index("uq_jobs_namespace_name", "namespace", "name", unique=True),
        # The scheduler's queue: pending jobs by priority, then age.
        Index("ix_jobs_queue", "phase", "priority", "created_at"),
        # The latest successes, whose run times estimate the queue's start times (0006).
        Index("ix_jobs_phase_created", "phase", "created_at"),
    )
    phase: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str | None] = mapped_column(String(253))


class GPUPoolRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["GPUPool"]
    __table_args__ = (Index("uq_gpupools_namespace_name", "namespace", "name", unique=True),)


class GPUProfileRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["GPUProfile"]
    __table_args__ = (Index("uq_gpuprofiles_namespace_name", "namespace", "name", unique=True),)


class ApplySetRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["ApplySet"]
    __table_args__ = (Index("uq_applysets_namespace_name", "namespace", "name", unique=True),)


class SweepRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["Sweep"]
    __table_args__ = (Index("uq_sweeps_namespace_name", "namespace", "name", unique=True),)


class NodeRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["Node"]
    __table_args__ = (Index("uq_nodes_namespace_name", "namespace", "name", unique=True),)


class BindingRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["Binding"]
    __table_args__ = (
        Index("uq_bindings_namespace_name", "namespace", "name", unique=True),
        Index("ix_bindings_node", "node", "phase"),
        Index("ix_bindings_job_uid", "job_uid"),
        # The active attempts, which every scheduling pass reads, among all kept (0005).
        Index("ix_bindings_phase", "phase"),
    )
    node: Mapped[str] = mapped_column(String(253))
    job_uid: Mapped[str] = mapped_column(String(36))
    phase: Mapped[str] = mapped_column(String(16))


class EventRow(ObjectRow, Base):
    __tablename__ = schema.TABLES["Event"]
    __table_args__ = (
        Index("uq_events_namespace_name", "namespace", "name", unique=True),
        Index("ix_events_involved_uid", "involved_uid"),
    )
    involved_uid: Mapped[str | None] = mapped_column(String(36))


class RevisionRow(Base):
    """One row: the global revision. Bumping it locks the row, so write transactions commit in
    revision order and a watcher that reads `revision > N` never skips one."""

    __tablename__ = "revision"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger)


class ChangeRow(Base):
    """The change feed: one row per object written, with the object as it was after the write."""

    __tablename__ = "changes"
    __table_args__ = (Index("ix_changes_revision", "revision"),)
    id: Mapped[int] = mapped_column(BigSerial, primary_key=True, autoincrement=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    type: Mapped[str] = mapped_column(String(8))  # ADDED | MODIFIED | DELETED
    kind: Mapped[str] = mapped_column(String(32))
    namespace: Mapped[str] = mapped_column(String(63))
    name: Mapped[str] = mapped_column(String(253))
    uid: Mapped[str] = mapped_column(String(36))
    object: Mapped[dict[str, Any]]


class LogRequestRow(Base):
    """A request for one attempt's log, from a `gctl logs` on any host to the agent of the
    attempt's node, which answers with LogChunkRows (gctl.store.logstreams). Not an object:
    no revision, no change feed; the requester deletes it when done, the agent when its lease
    lapses."""

    __tablename__ = "log_requests"
    __table_args__ = (Index("ix_log_requests_node", "node"),)
    id: Mapped[int] = mapped_column(BigSerial, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(253))
    binding_uid: Mapped[str] = mapped_column(String(36))
    path: Mapped[str] = mapped_column(Text)  # the log, as the attempt's Binding reports it
    follow: Mapped[bool] = mapped_column(Boolean)
    lease_seconds: Mapped[float] = mapped_column(Float)
    renewed_at: Mapped[datetime]  # the requester's clock; the agent only sees it change
    state: Mapped[str] = mapped_column(String(16))  # Pending | Serving | Done | Failed
    message: Mapped[str | None] = mapped_column(Text)
    sent: Mapped[int] = mapped_column(BigInteger)  # bytes the agent has written as chunks
    received: Mapped[int] = mapped_column(BigInteger)  # bytes the requester has taken


class LogChunkRow(Base):
    """Bytes `position` to `position + len(data)` of a requested log, until its requester has
    taken them."""

    __tablename__ = "log_chunks"
    request_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("log_requests.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


def table_of(kind: str) -> Table:
    """The table that stores a kind."""
    return Base.metadata.tables[ROWS[kind].__tablename__]  # type: ignore[attr-defined]


_READABLE: dict[str, list[ColumnElement[Any]]] = {}


class JSONAsText(FunctionElement[str]):
    """A JSON column read as its text: as stored on SQLite, `CAST(... AS TEXT)` on PostgreSQL,
    whose psycopg would otherwise decode every jsonb document on arrival, empty ones too, with
    the kind-less exact reader (gctl.store.jsontext)."""

    type = Text()
    name = "json_as_text"
    inherit_cache = True


@compiles(JSONAsText)
def _as_stored(element: JSONAsText, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(JSONAsText, "postgresql")
def _as_text(element: JSONAsText, compiler: Any, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS TEXT)"


def readable(table: Table) -> list[ColumnElement[Any]]:
    """The table's columns for a read that `listing.row_to_wire` decodes: `select(*readable(t))`
    in place of `select(t)`. The JSON documents come back as text (`JSONAsText`), not decoded
    by SQLAlchemy or psycopg: `row_to_wire` decodes them itself, by kind, and skips the empty
    ones most rows hold (labels, annotations, finalizers and owner references), which would be
    passed to a JSON reader one by one: 4 of a Job's 6 documents, a third of the time it takes
    to read one."""
    columns = _READABLE.get(table.name)
    if columns is None:
        columns = _READABLE[table.name] = [
            JSONAsText(c).label(c.name) if isinstance(c.type, JSONDocument) else c
            for c in table.columns
        ]
    return columns


ROWS: dict[str, type[ObjectRow]] = {
    "Job": JobRow,
    "GPUPool": GPUPoolRow,
    "GPUProfile": GPUProfileRow,
    "ApplySet": ApplySetRow,
    "Sweep": SweepRow,
    "Node": NodeRow,
    "Binding": BindingRow,
    "Event": EventRow,
}
