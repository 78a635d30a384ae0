"""The body of `gctl get`, and the reads it shares with describe, delete and `get gpus`.

Which objects a command names (`KIND NAME...`, `KIND/NAME...`) and in which namespace; their
lists, read through the driver alone when it can answer (`list_kind`); what the tables add to
them (queue places, node and pool views); then `get` itself: tables printed page by page,
-o yaml | json | name, and with -w the changes as the feed reports them.

Its top level imports no SQLAlchemy and no pydantic: `get` lists through `listing` and must stay
fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gctl.api import errors, fields, kinds, queue, selector
from gctl.cli import fitting, printers, views
from gctl.store import bulk, listing, locations

if TYPE_CHECKING:
    from gctl.store import db


def resource_and_names(
    resource: str, names: list[str], views: tuple[str, ...] = ()
) -> list[tuple[kinds.KindInfo, list[str]]]:
    """`jobs a b`, `sweeps,jobs` (each kind, with the names if any), or `job/a job/b sweep/c`
    as kubectl takes them: the names of each kind, the kinds in the order first named. An
    unknown KIND's error lists the kinds and `views` (`get` takes `gpus` too, not as gpus/NAME)."""
    if "/" not in resource:
        slashed = next((n for n in names if "/" in n), None)
        if slashed is not None:
            raise errors.Invalid(
                f"{slashed}: name objects as KIND NAME... or as KIND/NAME..., not both"
            )
        found = {info.kind: info for info in (kinds.by_word(w, views) for w in resource.split(","))}
        return [(info, names) for info in found.values()]
    groups: dict[str, tuple[kinds.KindInfo, list[str]]] = {}
    for given in [resource, *names]:
        word, slash, name = given.partition("/")
        if not slash:
            raise errors.Invalid(f"{given}: after {resource}, name every object as KIND/NAME")
        if not name:
            raise errors.Invalid(f"{given}: name the object after the slash")
        info = kinds.by_word(word)
        groups.setdefault(info.kind, (info, []))[1].append(name)
    return list(groups.values())


def scope(info: kinds.KindInfo, namespace: str | None, all_namespaces: bool) -> str | None:
    """The namespace a read of `info` covers: None for a cluster kind, or with -A."""
    if not info.namespaced:
        return None
    return None if all_namespaces else (namespace or kinds.DEFAULT_NAMESPACE)


def no_resources(info: kinds.KindInfo, where: str | None) -> None:
    """kubectl's words for an empty list, on stderr."""
    place = f" in {where} namespace" if where is not None and info.namespaced else ""
    print(f"No resources found{place}.", file=sys.stderr)


def not_found(info: kinds.KindInfo, name: str, where: str | None) -> str:
    """The message for a named object that is not there."""
    place = f' in namespace "{where}"' if info.namespaced and where is not None else ""
    return f'{info.kind.lower()} "{name}" not found{place}'


def list_kind(
    db_url: str | None, info: kinds.KindInfo, where: str | None, names: Sequence[str] | None
) -> listing.Snapshot:
    """Read through the driver alone when it can answer at once; otherwise (no database yet, a
    schema to migrate, a lock it would not wait for) take the full path, which creates,
    migrates and waits as it should, and says what is wrong in its own words."""
    snapshot = listing.read(locations.resolve_url(db_url), info, where, names)
    if snapshot is not None:
        return snapshot
    from gctl.store import db, store

    database = db.Database.open(db_url, create=False)
    try:
        with database.read() as session:
            reader = store.Store(session)
            revision = reader.current_revision()
            wires = reader.list_wire(kinds.model(info.kind), where, names=names)
    finally:
        database.close()
    return listing.Snapshot(revision, wires)


def watched(db_url: str | None) -> db.Database:
    """The database a watch (-w, --watch-only) follows, opened before anything is listed: an
    absent SQLite file reads as an empty database but has no change feed to follow, and the
    watch fails at once, in one line, rather than after printing an empty list."""
    from gctl.store import db

    database = db.Database.open(db_url, create=False)
    try:
        database.must_exist("watch")
    except BaseException:
        database.close()
        raise
    return database


def number_queue(
    shown: list[views.Wire], jobs: list[views.Wire], pools: list[views.Wire], read: queue.ReadNamed
) -> None:
    """Give the queued Jobs shown their place in their pool's queue, for printing only: of
    `jobs` (every pending Job, at least), those the scheduling pass queues, in the order of
    their pool (of `pools`, the stored GPUPools). Those it leaves alone (suspended, in
    back-off, waiting for a dependency) get none; what they depend on is read with `read`, as
    the pass looks it up (`queue.succeeded_among`)."""
    succeeded = queue.succeeded_among(queue.needed(jobs), read)
    orders = queue.orders(pools)
    places = queue.positions(jobs, datetime.now(UTC), succeeded, orders)
    for wire in shown:
        if (key := queue.key(wire)) in places:
            wire["status"]["queuePosition"] = places[key]
            wire["status"]["queueOrder"] = orders.get(queue.pool_of(wire), queue.FIFO)


def with_default_pool(pools: list[views.Wire], *, filled: bool) -> list[views.Wire]:
    """`views.with_implicit_default`; `filled`: its spec filled in with the defaults the
    scheduler uses for it, so that it says how it behaves (describe, -o yaml|json), which
    loads the model."""
    found = views.with_implicit_default(pools)
    if filled:
        from gctl.api import pool

        for p in found:
            if "uid" not in p["metadata"]:
                spec = pool.GPUPoolSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
                p["spec"] = spec
    return found


def with_named_default(
    info: kinds.KindInfo, wires: list[views.Wire], names: Sequence[str], *, filled: bool
) -> list[views.Wire]:
    """Pools found by name, and the implicit default one (`with_default_pool`) where `names`
    name it and none is stored: what `get pools` lists can be got by name."""
    if info is not kinds.GPUPOOL or views.DEFAULT_POOL not in names:
        return wires
    return with_default_pool(wires, filled=filled)


def with_views(db_url: str | None, kind: str, wires: list[views.Wire]) -> list[views.Wire]:
    """Nodes and pools as their tables show them: with what the Bindings and Jobs say."""
    if not wires or kind not in (kinds.NODE.kind, kinds.GPUPOOL.kind):
        return wires
    bindings = list_kind(db_url, kinds.BINDING, None, None).wires
    if kind == kinds.NODE.kind:
        return views.with_node_views(wires, bindings)
    nodes = list_kind(db_url, kinds.NODE, None, None).wires
    jobs = list_kind(db_url, kinds.JOB, None, None).wires
    # What the Jobs wait for, looked up as `number_queue` does: QUEUED counts what POS numbers.
    succeeded = queue.succeeded_among(
        queue.needed(jobs), lambda kind, ns, its: list_kind(db_url, kind, ns, its).wires
    )
    return views.with_pool_views(
        wires, nodes, bindings, jobs, now=datetime.now(UTC), succeeded=succeeded
    )


def _print_pages(
    pages: Iterator[list[dict[str, Any]]],
    keep: Callable[[views.Wire], bool] | None,
    info: kinds.KindInfo,
    where: str | None,
    show_labels: bool,
) -> None:
    """A table printed page by page as it is read, as kubectl prints chunks: the first page
    fixes the column widths, later rows follow them."""
    table = printers.Table(
        info.kind,
        False,
        namespaces=info.namespaced and where is None,
        show_labels=show_labels,
        width=fitting.screen_width(sys.stdout),
    )
    printed = False
    for page in pages:
        shown = page if keep is None else [w for w in page if keep(w)]
        if shown:
            lines = table.lines(shown, datetime.now(UTC), header=not printed)
            sys.stdout.writelines(line + "\n" for line in lines)
            sys.stdout.flush()
            printed = True
    if not printed:
        no_resources(info, where)


@dataclass(frozen=True)
class GetFlags:
    """How `gctl get` lists each kind it is asked for: its flags."""

    output: str
    selector_text: str | None
    namespace: str | None
    all_namespaces: bool
    watch: bool
    watch_only: bool
    show_labels: bool
    db_url: str | None
    field_selector_text: str | None = None


def _selection(info: kinds.KindInfo, flags: GetFlags) -> Callable[[views.Wire], bool] | None:
    """Which objects to show, by their labels (-l) and fields (--field-selector); None: all."""
    labels = selector.parse(flags.selector_text) if flags.selector_text else None
    text = flags.field_selector_text
    by_field = fields.parse(text, info) if text else None
    if labels is None and by_field is None:
        return None

    def keep(wire: views.Wire) -> bool:
        if labels is not None and not labels.matches(wire["metadata"].get("labels", {})):
            return False
        return by_field is None or by_field.matches(wire)

    return keep


def get(*, resource: str, names: list[str], flags: GetFlags) -> None:
    """`gctl get`: each kind named in turn, a blank line between their tables (as kubectl);
    a name not found fails the command once every kind is printed."""
    printers.check_output(flags.output)
    groups = resource_and_names(resource, names, views=("gpus",))
    if (flags.selector_text or flags.field_selector_text) and any(g for _, g in groups):
        # As kubectl: a named object the selector does not match was said to be not found.
        raise errors.Invalid("-l and --field-selector go with KIND alone, not names")
    if len(groups) > 1 and (flags.watch or flags.watch_only):
        raise errors.Invalid("watch one kind at a time")
    if len(groups) > 1 and flags.output in ("yaml", "json"):
        _get_documents(groups, flags.output, flags.namespace, flags.db_url)
        return
    failed = 0
    for number, (info, group) in enumerate(groups):
        if number and flags.output in ("", "wide"):
            sys.stdout.write("\n")
        try:
            if flags.watch or flags.watch_only:
                _get_kind(info, group, flags)
            else:
                with bulk.collector_paused():
                    _get_kind(info, group, flags)
        except SystemExit as exc:  # some names not found: said, go on with the next kind
            failed = exc.code if isinstance(exc.code, int) else 1
    if failed:
        raise SystemExit(failed)


def _get_documents(
    groups: list[tuple[kinds.KindInfo, list[str]]],
    output: str,
    namespace: str | None,
    db_url: str | None,
) -> None:
    """Objects of several kinds, by name, as one List (as kubectl prints them): one document
    that tools can read, then a line for each name not found."""
    wires: list[dict[str, Any]] = []
    missing: list[str] = []
    for info, group in groups:
        where = scope(info, namespace, False)
        found = with_named_default(
            info, list_kind(db_url, info, where, group).wires, group, filled=True
        )
        wires.extend(found)
        have = {w["metadata"]["name"] for w in found}
        missing.extend(not_found(info, name, where) for name in group if name not in have)
    printers.print_objects(wires, output, None, single=False)
    for line in missing:
        print(f"error: {line}", file=sys.stderr)
    if missing:
        raise SystemExit(1)


def _get_kind(info: kinds.KindInfo, names: list[str], flags: GetFlags) -> None:
    output, db_url = flags.output, flags.db_url
    watching = flags.watch or flags.watch_only
    keep = _selection(info, flags)
    where = scope(info, flags.namespace, flags.all_namespaces)
    database = watched(db_url) if watching else None
    if output == "" and not names and not watching and info is kinds.JOB:
        pages = listing.read_pages(locations.resolve_url(db_url), info, where)
        if pages is not None:
            _print_pages(pages, keep, info, where, flags.show_labels)
            return
    snapshot = list_kind(db_url, info, where, names or None)
    wires = with_named_default(info, snapshot.wires, names, filled=output in ("yaml", "json"))
    stored = wires
    if keep is not None:
        wires = [w for w in wires if keep(w)]
    missing = sorted(set(names) - {w["metadata"]["name"] for w in wires})
    table = None
    if output in ("", "wide"):
        table = printers.Table(
            info.kind,
            output == "wide",
            namespaces=info.namespaced and where is None,
            show_labels=flags.show_labels,
            width=fitting.screen_width(sys.stdout),
        )
    if table is not None:
        if info is kinds.JOB and output == "wide":
            whole = where is None and not names and keep is None
            every = wires if whole else list_kind(db_url, kinds.JOB, None, None).wires
            number_queue(
                wires,
                every,
                list_kind(db_url, kinds.GPUPOOL, None, None).wires,
                lambda kind, ns, its: list_kind(db_url, kind, ns, its).wires,
            )
        if info is kinds.GPUPOOL and not names:  # selected as a stored pool would be
            wires = [w for w in views.with_implicit_default(stored) if keep is None or keep(w)]
        wires = with_views(db_url, info.kind, wires)
    if not flags.watch_only:
        if wires or (output in ("yaml", "json") and not names):
            # Like kubectl: -o yaml|json of nothing is an empty List, which tools can read.
            printers.print_objects(wires, output, table, single=len(names) == 1)
        elif not names and not watching:
            no_resources(info, where)
    if missing and not watching:
        for name in missing:
            print(f"error: {not_found(info, name, where)}", file=sys.stderr)
        raise SystemExit(1)
    if database is not None:
        sys.stdout.flush()
        _watch(
            db_url=db_url,
            database=database,
            kind=info.kind,
            revision=snapshot.revision,
            where=where,
            keep=keep,
            names=set(names),
            output=output,
            table=table,
        )


def _watch(
    *,
    db_url: str | None,
    database: db.Database,
    kind: str,
    revision: int,
    where: str | None,
    keep: Callable[[views.Wire], bool] | None,
    names: set[str],
    output: str,
    table: printers.Table | None,
) -> None:
    from gctl.cli import following
    from gctl.store import feed, notify

    stop = notify.Stop()
    with (
        following.interruptible(stop) as interrupted,
        feed.Watch(database, since=revision, kinds=[kind], stop=stop) as changes,
    ):
        for batch in changes:
            wires = [
                c.object
                for c in batch
                if (where is None or c.namespace == where)
                and (not names or c.name in names)
                and (keep is None or keep(c.object))
            ]
            if not wires:
                continue
            if table is not None:
                header = table.widths is None
                wires = with_views(db_url, kind, wires)
                lines = table.lines(wires, datetime.now(UTC), header=header)
                sys.stdout.write("".join(line + "\n" for line in lines))
            elif output == "name":
                sys.stdout.write("".join(printers.ref(w) + "\n" for w in wires))
            else:
                for wire in wires:
                    dump = printers.dump_yaml if output == "yaml" else printers.dump_json
                    text = dump(wire)
                    sys.stdout.write(
                        ("---\n" if output == "yaml" else "")
                        + text
                        + ("" if output == "yaml" else "\n")
                    )
            sys.stdout.flush()
    if interrupted.is_set():
        raise SystemExit(following.INTERRUPTED)
