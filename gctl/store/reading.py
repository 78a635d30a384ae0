"""The Store's reading layer: objects read from their tables.

Every read the Store names (`get`, `find`, `list_wire`, the attempts of Jobs, the shared reads
of `shared`), and how an object's row becomes its wire form (`row_to_wire`). The Store's top
layer (`store.Store`, the writes) builds on this one: a write reads the row it guards here.
"""

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import Row, Select, Table, bindparam, select

from gctl.api import binding, errors, job, meta, selector
from gctl.store import jsontext, listing, revisions, shared, stored, tables

T = TypeVar("T", bound=meta.Resource)


def namespace_of(cls: type[meta.Resource], namespace: str | None) -> str:
    return listing.namespace_of(cls.INFO, namespace)


def row_to_wire(cls: type[meta.Resource], row: Row[Any]) -> dict[str, Any]:
    return listing.row_to_wire(cls.INFO, row._mapping)


def namespaced_not_found(cls: type[meta.Resource], name: str, namespace: str | None) -> str:
    where = f' in namespace "{namespace_of(cls, namespace)}"' if cls.NAMESPACED else ""
    return f'{cls.KIND.lower()} "{name}" not found{where}'


class Reads(revisions.Revisions):
    """The reads of a Store."""

    def _rows(
        self,
        cls: type[meta.Resource],
        namespace: str | None,
        names: Sequence[str] | None = None,
        *,
        for_update: bool = False,
        decoded: bool = False,
    ) -> Sequence[Row[Any]]:
        """The rows, for `row_to_wire`; `decoded`: with the JSON documents decoded, to use."""
        by_namespace = namespace is not None or not cls.NAMESPACED
        locked = for_update and self._dialect.name == "postgresql"  # SQLite's writers are serial
        query = _rows_query(
            tables.table_of(cls.KIND), decoded, by_namespace, names is not None, locked
        )
        params: dict[str, Any] = {"names": list(names or ())}
        if by_namespace:
            params["namespace"] = namespace_of(cls, namespace)
        return self.execute(query, params).all()

    def list_wire(
        self,
        cls: type[meta.Resource],
        namespace: str | None = None,
        label_selector: selector.Selector | None = None,
        names: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Objects in wire form, sorted by namespace and name; `namespace=None` means all."""
        wires = [row_to_wire(cls, row) for row in self._rows(cls, namespace, names)]
        if label_selector is not None:
            wires = [w for w in wires if label_selector.matches(w["metadata"].get("labels", {}))]
        return wires

    def list_wire_labelled(
        self, cls: type[meta.Resource], namespace: str, key: str, value: str
    ) -> list[dict[str, Any]]:
        """Objects of one namespace whose label `key` is `value`, in wire form, sorted by name;
        the label is matched in SQL (a Sweep's Jobs, out of a namespace of many)."""
        from sqlalchemy import func, type_coerce
        from sqlalchemy.dialects import postgresql

        table = tables.table_of(cls.KIND)
        if self._dialect.name == "postgresql":  # JSONB containment, `labels @> '{key: value}'`
            matches = type_coerce(table.c.labels, postgresql.JSONB).contains({key: value})
        else:  # a quoted member name: `/` and `.` in the key are plain characters there
            if '"' in key:  # a label key never holds one (meta.Labels); SQLite cannot quote it
                raise ValueError(f"label key {key!r}: no double quotes")
            matches = func.json_extract(table.c.labels, f'$."{key}"') == value
        query = select(*tables.readable(table)).where(
            table.c.namespace == namespace_of(cls, namespace), matches
        )
        rows = self.execute(query.order_by(table.c.name)).all()
        return [row_to_wire(cls, row) for row in rows]

    def list_objects(
        self,
        cls: type[T],
        namespace: str | None = None,
        label_selector: selector.Selector | None = None,
    ) -> list[T]:
        return [stored.validated(cls, w) for w in self.list_wire(cls, namespace, label_selector)]

    def lock_objects(self, cls: type[T], namespace: str | None = None) -> list[T]:
        """Read objects and hold them until this transaction ends, for a write that must not
        lose a race it cannot win by retrying: a cordon against an agent whose status writes
        come faster than a CLI process can read and write (PostgreSQL; on SQLite the write
        transaction holds the whole database already)."""
        if self._dialect.name == "postgresql":
            # Every writer locks the revision row first (its first write bumps it): so must
            # this one, before the objects, or it deadlocks with a writer waiting on them.
            self.execute(select(revisions.REVISION.c.revision).with_for_update())
        rows = self._rows(cls, namespace, for_update=True)
        return [stored.validated(cls, row_to_wire(cls, row)) for row in rows]

    def find(self, cls: type[T], name: str, namespace: str | None = None) -> T | None:
        rows = self._rows(cls, namespace_of(cls, namespace), [name])
        return stored.validated(cls, row_to_wire(cls, rows[0])) if rows else None

    def get(self, cls: type[T], name: str, namespace: str | None = None) -> T:
        found = self.find(cls, name, namespace)
        if found is None:
            raise errors.NotFound(namespaced_not_found(cls, name, namespace))
        return found

    def pending_wires(self) -> list[dict[str, Any]]:
        """Jobs waiting for a place, unvalidated: higher priority first, then older first. A
        shared read (`shared`): read them, never change them."""
        return shared.wires(self.execute, job.Job, _pending())

    def job_waits(self) -> list[tuple[str, str, str, Any]]:
        """Every Job as (namespace, name, phase, its spec's dependsOn), unvalidated (a hand
        edit may have left anything there, or nothing): what a controller that starts needs
        of them, without reading and decoding every Job (100,000 took seconds and 200 MB more
        than the controller holds after)."""
        table = tables.table_of(job.Job.KIND)
        depends = table.c.spec["dependsOn"]
        query = select(table.c.namespace, table.c.name, table.c.phase, depends)
        rows: Sequence[Any] = self.execute(query).all()
        return [tuple(row) for row in rows]

    def pending_wires_of(self, uids: Sequence[str]) -> list[dict[str, Any]]:
        """`pending_wires` among these Jobs (by uid), in no order."""
        found: list[dict[str, Any]] = []
        for start in range(0, len(uids), shared.CHUNK):
            chunk = uids[start : start + shared.CHUNK]
            found.extend(shared.wires(self.execute, job.Job, _pending_of(), {"among": chunk}))
        return found

    def shared_wires(
        self, cls: type[meta.Resource], namespace: str, names: Sequence[str]
    ) -> list[dict[str, Any]]:
        """The named objects of one namespace in wire form, by a shared read: read them, never
        change them."""
        params = {"namespace": namespace_of(cls, namespace), "names": list(names)}
        return shared.wires(self.execute, cls, _named(cls), params)

    def shared_objects(self, cls: type[T]) -> list[T]:
        """Every object of a kind, sorted by namespace and name, by a shared read: the objects
        are shared too, validated once per version; read them, never change them."""
        return shared.objects(self.execute, cls, _every(cls))

    def shared_active_bindings(self) -> list[binding.Binding]:
        """`active_bindings()` by a shared read: read them, never change them (copy first)."""
        return shared.objects(self.execute, binding.Binding, _active())

    def shared_bindings_on(
        self,
        node_name: str,
        phases: frozenset[str],
        *,
        skipped: list[errors.StoredInvalid] | None = None,
    ) -> list[binding.Binding]:
        """`active_bindings(node_name, phases, skipped=skipped)` by a shared read, sorted by
        namespace and name: read them, never change them (copy first)."""
        params = {"node": node_name, "phases": sorted(phases)}
        return shared.objects(self.execute, binding.Binding, _on_node(), params, skipped)

    def find_many(self, cls: type[T], namespace: str, names: Sequence[str]) -> list[T]:
        """The named objects of one namespace that exist, sorted by name."""
        found: list[T] = []
        ordered = sorted(set(names))
        for start in range(0, len(ordered), 500):
            rows = self._rows(cls, namespace_of(cls, namespace), ordered[start : start + 500])
            found.extend(stored.validated(cls, row_to_wire(cls, row)) for row in rows)
        return found

    def bindings_of_many(self, job_uids: Sequence[str]) -> dict[str, list[binding.Binding]]:
        """`bindings_of` for many Jobs at once, by Job uid (a Job with none is left out)."""
        found: dict[str, list[binding.Binding]] = {}
        ordered = sorted(set(job_uids))
        for start in range(0, len(ordered), 500):
            chunk = ordered[start : start + 500]
            for row in self.execute(_bindings_of_query(), {"uids": chunk}):
                b = stored.validated(binding.Binding, row_to_wire(binding.Binding, row))
                found.setdefault(row.job_uid, []).append(b)
        for attempts in found.values():
            attempts.sort(key=lambda b: b.spec.attempt)
        return found

    def bindings_of(self, job_uid: str) -> list[binding.Binding]:
        """Every attempt of one Job, oldest first."""
        rows = self.execute(_bindings_of_query(), {"uids": [job_uid]}).all()
        found = [stored.validated(binding.Binding, row_to_wire(binding.Binding, r)) for r in rows]
        return sorted(found, key=lambda b: b.spec.attempt)

    def active_bindings(
        self,
        node_name: str | None = None,
        phases: frozenset[str] = binding.ACTIVE_PHASES,
        *,
        skipped: list[errors.StoredInvalid] | None = None,
    ) -> list[binding.Binding]:
        """Attempts that hold GPUs (bound, not yet exited or lost), or those in other phases.
        One that no longer validates raises StoredInvalid, or with `skipped` goes there."""
        query = _active_bindings_query(node_name is not None)
        params = {"phases": sorted(phases), "node": node_name}
        rows = self.execute(query, params).all()
        found = (
            stored.validated_or_skipped(binding.Binding, row_to_wire(binding.Binding, r), skipped)
            for r in rows
        )
        return [b for b in found if b is not None]

    def any_queued_bindings(self) -> bool:
        """Whether some attempt is bound ahead and not started: not taken by its agent, or
        armed (the scheduler may still want either elsewhere)."""
        table = tables.table_of(binding.Binding.KIND)
        rows = self.execute(select(table.c.spec).where(table.c.phase.in_(("Pending", "Armed"))))
        return any(
            (jsontext.loads(spec) if isinstance(spec, str) else spec or {}).get("after")
            for (spec,) in rows
        )


# The queries of the hot reads, built once per shape: building one and deriving its cache key
# takes SQLAlchemy 100-150 us, several times what SQLite takes to run it.


@functools.cache
def _rows_query(
    table: Table, decoded: bool, by_namespace: bool, by_names: bool, locked: bool
) -> Select[Any]:
    """`_rows`'s query: parameters `namespace` and `names` (a list)."""
    query = select(table) if decoded else select(*tables.readable(table))
    if by_namespace:
        query = query.where(table.c.namespace == bindparam("namespace"))
    if by_names:
        query = query.where(table.c.name.in_(bindparam("names", expanding=True)))
    if locked:
        query = query.with_for_update()
    return query.order_by(table.c.namespace, table.c.name)


@functools.cache
def _bindings_of_query() -> Select[Any]:
    """The Bindings of the Jobs whose uids are the list `uids`."""
    table = tables.table_of(binding.Binding.KIND)
    return select(*tables.readable(table)).where(
        table.c.job_uid.in_(bindparam("uids", expanding=True))
    )


@functools.cache
def _active_bindings_query(on_node: bool) -> Select[Any]:
    """The Bindings whose phase is in the list `phases` (and with `on_node`, on Node `node`)."""
    table = tables.table_of(binding.Binding.KIND)
    query = select(*tables.readable(table)).where(
        table.c.phase.in_(bindparam("phases", expanding=True))
    )
    return query.where(table.c.node == bindparam("node")) if on_node else query


@functools.cache
def _pending() -> shared.Query:
    """Pending Jobs, higher priority first, then older first: found through the queue's index,
    and those not read before looked up by uid (`_pending_of`)."""
    table = tables.table_of(job.Job.KIND)
    order = (table.c.priority.desc(), table.c.created_at, table.c.name)
    fetched = [_unindexed(table.c.phase) == "Pending"]
    return shared.query(job.Job, [table.c.phase == "Pending"], order, fetched)


@functools.cache
def _pending_of() -> shared.Query:
    """Pending Jobs among the uids of the list `among`. Their phase is compared as an
    expression (`_unindexed`): SQLite, which keeps no statistics, took the queue's index on
    phase for `phase = 'Pending'` and read every pending Job to find the few named (3 ms a
    pass behind 10,000 of them, `throughput-deep`), rather than look each up by its uid."""
    table = tables.table_of(job.Job.KIND)
    among = table.c.uid.in_(bindparam("among", expanding=True))
    return shared.query(job.Job, [_unindexed(table.c.phase) == "Pending", among], ())


def _unindexed(column: Any) -> Any:
    """`column` as an expression (`column || ''`: the same text), which no index holds."""
    return column + ""


@functools.cache
def _named(cls: type[meta.Resource]) -> shared.Query:
    """The objects of one `namespace` named in the list `names`, by name."""
    table = tables.table_of(cls.KIND)
    where = [
        table.c.namespace == bindparam("namespace"),
        table.c.name.in_(bindparam("names", expanding=True)),
    ]
    return shared.query(cls, where, (table.c.name,))


@functools.cache
def _every(cls: type[meta.Resource]) -> shared.Query:
    table = tables.table_of(cls.KIND)
    return shared.query(cls, [], (table.c.namespace, table.c.name))


@functools.cache
def _on_node() -> shared.Query:
    """The attempts on Node `node` whose phase is in the list `phases`, by namespace and name."""
    table = tables.table_of(binding.Binding.KIND)
    where = [
        table.c.node == bindparam("node"),
        table.c.phase.in_(bindparam("phases", expanding=True)),
    ]
    return shared.query(binding.Binding, where, (table.c.namespace, table.c.name))


@functools.cache
def _active() -> shared.Query:
    """The attempts that hold GPUs, by namespace and name."""
    table = tables.table_of(binding.Binding.KIND)
    where = [table.c.phase.in_(sorted(binding.ACTIVE_PHASES))]
    return shared.query(binding.Binding, where, (table.c.namespace, table.c.name))
