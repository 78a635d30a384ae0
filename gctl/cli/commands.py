"""The bodies of the CLI commands; `main` imports this module only when a command runs.

Its top level imports no SQLAlchemy and no pydantic: `get` lists through `listing` and must stay
fast. Commands that validate or write import what they need when they run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gctl.api import errors, kinds, queue, selector
from gctl.cli import fitting, printers, views
from gctl.store import bulk, listing, locations

if TYPE_CHECKING:
    from gctl.api import manifest
    from gctl.store import db, store


def _fail(message: str, code: int = 1) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _check_output(output: str) -> None:
    if output not in printers.OUTPUTS:
        raise errors.Invalid(f"-o {output}: use one of wide, yaml, json, name")


def apply(
    *,
    files: list[str],
    recursive: bool,
    namespace: str | None,
    dry_run: bool,
    force: bool,
    output: str,
    db_url: str | None,
    applyset: str | None = None,
    prune: bool = False,
    on_spec_change: str | None = None,
    timeout: str | None = None,
) -> None:
    from gctl.api import manifest
    from gctl.cli import apply as applying

    _check_output(output)
    options = applying.set_options(applyset, prune, on_spec_change, files)
    wait_gone = applying.DeletionWait(timeout)  # what --force replaces, once started
    with bulk.collector_paused():
        manifests = manifest.load(files, recursive, namespace or kinds.DEFAULT_NAMESPACE)
    _check_namespace(manifests, namespace)
    url = locations.resolve_url(db_url)
    results = applying.apply_at(url, manifests, force, dry_run, options, wait_gone=wait_gone)
    suffix = " (dry run)" if dry_run else ""
    if output in ("yaml", "json"):
        printers.print_objects(
            [obj.wire() for _, obj in results], output, None, single=len(results) == 1
        )
        return
    lines = []
    for action, obj in results:
        name = obj.ref()
        lines.append(name if output == "name" else applying.line(action, obj, suffix))
    sys.stdout.write("".join(line + "\n" for line in lines))


def _check_namespace(manifests: Sequence[manifest.Manifest], namespace: str | None) -> None:
    """Like kubectl: a manifest's own namespace must agree with -n when both are given."""
    if namespace is None:
        return
    for m in manifests:
        given = m.obj.metadata.namespace
        if m.obj.NAMESPACED and given is not None and given != namespace:
            raise errors.Invalid(
                f'{m.source} ({m.obj.KIND} "{m.obj.name}"): metadata.namespace "{given}" '
                f'does not match -n "{namespace}"; drop one of them'
            )


def diff(
    *,
    files: list[str],
    recursive: bool,
    namespace: str | None,
    force: bool,
    db_url: str | None,
    applyset: str | None = None,
    prune: bool = False,
) -> None:
    from gctl.api import manifest
    from gctl.cli import apply as applying

    try:
        options = applying.set_options(applyset, prune, None, files)
        manifests = manifest.load(files, recursive, namespace or kinds.DEFAULT_NAMESPACE)
        _check_namespace(manifests, namespace)
        text = applying.diff(locations.resolve_url(db_url), manifests, force, options)
    except errors.GctlError as exc:
        _fail(str(exc), code=2)
        return
    sys.stdout.write(text)
    raise SystemExit(1 if text else 0)


def _resource_and_names(resource: str, names: list[str]) -> list[tuple[kinds.KindInfo, list[str]]]:
    """`jobs a b`, `sweeps,jobs` (each kind, with the names if any), or `job/a job/b sweep/c`
    as kubectl takes them: the names of each kind, the kinds in the order first named."""
    if "/" not in resource:
        slashed = next((n for n in names if "/" in n), None)
        if slashed is not None:
            raise errors.Invalid(
                f"{slashed}: name objects as KIND NAME... or as KIND/NAME..., not both"
            )
        found = {info.kind: info for info in map(kinds.by_word, resource.split(","))}
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


def _where(info: kinds.KindInfo, namespace: str | None, all_namespaces: bool) -> str | None:
    if not info.namespaced:
        return None
    return None if all_namespaces else (namespace or kinds.DEFAULT_NAMESPACE)


def _no_resources(info: kinds.KindInfo, where: str | None) -> None:
    place = f" in {where} namespace" if where is not None and info.namespaced else ""
    print(f"No resources found{place}.", file=sys.stderr)


def _not_found(info: kinds.KindInfo, name: str, where: str | None) -> str:
    place = f' in namespace "{where}"' if info.namespaced and where is not None else ""
    return f'{info.kind.lower()} "{name}" not found{place}'


def _list(
    db_url: str | None, info: kinds.KindInfo, where: str | None, names: Sequence[str] | None
) -> listing.Snapshot:
    """Read through the driver alone when it can answer at once; otherwise (no database yet, a
    schema to migrate, a lock it would not wait for) take the full path, which creates,
    migrates and waits as it should, and says what is wrong in its own words."""
    snapshot = listing.read(locations.resolve_url(db_url), info, where, names)
    if snapshot is not None:
        return snapshot
    from gctl.store import db, store

    database = db.Database.open(db_url)
    try:
        with database.read() as session:
            reader = store.Store(session)
            revision = reader.current_revision()
            wires = reader.list_wire(kinds.model(info.kind), where, names=names)
    finally:
        database.close()
    return listing.Snapshot(revision, wires)


def _number_queue(
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


def _with_views(db_url: str | None, kind: str, wires: list[views.Wire]) -> list[views.Wire]:
    """Nodes and pools as their tables show them: with what the Bindings and Jobs say."""
    if not wires or kind not in (kinds.NODE.kind, kinds.GPUPOOL.kind):
        return wires
    bindings = _list(db_url, kinds.BINDING, None, None).wires
    if kind == kinds.NODE.kind:
        return views.with_node_views(wires, bindings)
    nodes = _list(db_url, kinds.NODE, None, None).wires
    jobs = _list(db_url, kinds.JOB, None, None).wires
    # What the Jobs wait for, looked up as `_number_queue` does: QUEUED counts what POS numbers.
    succeeded = queue.succeeded_among(
        queue.needed(jobs), lambda kind, ns, its: _list(db_url, kind, ns, its).wires
    )
    return views.with_pool_views(
        wires, nodes, bindings, jobs, now=datetime.now(UTC), succeeded=succeeded
    )


def _print_pages(
    pages: Iterator[list[dict[str, Any]]],
    label_selector: selector.Selector | None,
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
        shown = page
        if label_selector is not None:
            shown = [w for w in page if label_selector.matches(w["metadata"].get("labels", {}))]
        if shown:
            lines = table.lines(shown, datetime.now(UTC), header=not printed)
            sys.stdout.writelines(line + "\n" for line in lines)
            sys.stdout.flush()
            printed = True
    if not printed:
        _no_resources(info, where)


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


def get(*, resource: str, names: list[str], flags: GetFlags) -> None:
    """`gctl get`: each kind named in turn, a blank line between their tables (as kubectl);
    a name not found fails the command once every kind is printed."""
    _check_output(flags.output)
    groups = _resource_and_names(resource, names)
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
        where = _where(info, namespace, False)
        found = _list(db_url, info, where, group).wires
        wires.extend(found)
        have = {w["metadata"]["name"] for w in found}
        missing.extend(_not_found(info, name, where) for name in group if name not in have)
    printers.print_objects(wires, output, None, single=False)
    for line in missing:
        print(f"error: {line}", file=sys.stderr)
    if missing:
        raise SystemExit(1)


def _get_kind(info: kinds.KindInfo, names: list[str], flags: GetFlags) -> None:
    output, db_url = flags.output, flags.db_url
    following = flags.watch or flags.watch_only
    text = flags.selector_text
    label_selector = selector.parse(text) if text else None
    where = _where(info, flags.namespace, flags.all_namespaces)
    if output == "" and not names and not following and info is kinds.JOB:
        pages = listing.read_pages(locations.resolve_url(db_url), info, where)
        if pages is not None:
            _print_pages(pages, label_selector, info, where, flags.show_labels)
            return
    snapshot = _list(db_url, info, where, names or None)
    wires = snapshot.wires
    if label_selector is not None:
        wires = [w for w in wires if label_selector.matches(w["metadata"].get("labels", {}))]
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
            whole = where is None and not names and label_selector is None
            every = wires if whole else _list(db_url, kinds.JOB, None, None).wires
            _number_queue(
                wires,
                every,
                _list(db_url, kinds.GPUPOOL, None, None).wires,
                lambda kind, ns, its: _list(db_url, kind, ns, its).wires,
            )
        if info is kinds.GPUPOOL and not names and label_selector is None:
            wires = views.with_implicit_default(wires)
        wires = _with_views(db_url, info.kind, wires)
    if not flags.watch_only:
        if wires or (output in ("yaml", "json") and not names):
            # Like kubectl: -o yaml|json of nothing is an empty List, which tools can read.
            printers.print_objects(wires, output, table, single=len(names) == 1)
        elif not names and not following:
            _no_resources(info, where)
    if missing and not following:
        for name in missing:
            print(f"error: {_not_found(info, name, where)}", file=sys.stderr)
        raise SystemExit(1)
    if following:
        from gctl.store import db

        sys.stdout.flush()
        _watch(
            db_url=db_url,
            database=db.Database.open(db_url),
            kind=info.kind,
            revision=snapshot.revision,
            where=where,
            label_selector=label_selector,
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
    label_selector: selector.Selector | None,
    names: set[str],
    output: str,
    table: printers.Table | None,
) -> None:
    from gctl.store import feed

    with feed.Watch(database, since=revision, kinds=[kind]) as changes:
        for batch in changes:
            wires = [
                c.object
                for c in batch
                if (where is None or c.namespace == where)
                and (not names or c.name in names)
                and (
                    label_selector is None
                    or label_selector.matches(c.object["metadata"].get("labels", {}))
                )
            ]
            if not wires:
                continue
            if table is not None:
                header = table.widths is None
                wires = _with_views(db_url, kind, wires)
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


def describe(*, resource: str, names: list[str], namespace: str | None, db_url: str | None) -> None:
    for number, (info, group) in enumerate(_resource_and_names(resource, names)):
        if number:
            sys.stdout.write("\n\n")
        _describe_kind(info, group, namespace, db_url)


def _describe_kind(
    info: kinds.KindInfo, names: list[str], namespace: str | None, db_url: str | None
) -> None:
    from gctl.cli import describe as describing
    from gctl.store import db, store, stored

    cls = kinds.model(info.kind)
    where = _where(info, namespace, False)
    database = db.Database.open(db_url)
    with database.read() as session:
        reader = store.Store(session)
        wires = reader.list_wire(cls, where, names=names or None)
        if info is kinds.GPUPOOL and (not names or views.DEFAULT_POOL in names):
            wires = _with_default_pool(wires)
        missing = sorted(set(names) - {w["metadata"]["name"] for w in wires})
        if missing:
            raise errors.NotFound(_not_found(info, missing[0], where))
        if not wires:
            _no_resources(info, where)
            return
        events = [
            reader.events_for(stored.validated(cls, wire)) if "uid" in wire["metadata"] else []
            for wire in wires
        ]
        now, width = datetime.now(UTC), fitting.screen_width(sys.stdout)
        if info is kinds.JOB and any(queue.pending(w) and not queue.held(w, now) for w in wires):
            _number_queue(
                wires,
                reader.pending_wires(),
                reader.list_wire(kinds.model(kinds.GPUPOOL.kind)),
                lambda kind, ns, its: reader.list_wire(kinds.model(kind.kind), ns, names=its),
            )
        chain = describing.Chain(reader)  # each namespace's Jobs and Sweeps, read once
        usage = _pool_usage(db_url, wires, width) if info is kinds.GPUPOOL else {}
        texts = [
            describing.render(
                w,
                found,
                now,
                describing.related(reader, w, chain, width) + usage.get(w["metadata"]["name"], []),
                width,
            )
            for w, found in zip(wires, events, strict=True)
        ]
    sys.stdout.write("\n\n".join(texts))


def _with_default_pool(pools: list[views.Wire]) -> list[views.Wire]:
    """`views.with_implicit_default`, its spec filled in with the defaults the scheduler uses
    for it, so that `describe` says how it behaves."""
    from gctl.api import pool

    found = views.with_implicit_default(pools)
    for p in found:
        if "uid" not in p["metadata"]:
            p["spec"] = pool.GPUPoolSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    return found


def _pool_usage(db_url: str | None, pools: list[views.Wire], width: int) -> dict[str, list[str]]:
    """Each pool's Usage section, by name, counted as `get pools` counts it."""
    from gctl.cli import describe as describing

    nodes = _list(db_url, kinds.NODE, None, None).wires
    return {
        p["metadata"]["name"]: describing.pool_usage(p, views.pool_gpus(p, nodes), width)
        for p in _with_views(db_url, kinds.GPUPOOL.kind, pools)
    }


Target = tuple[kinds.KindInfo, str | None, str | None]  # kind, name (None: by query), namespace


def delete(
    *,
    resource: str | None,
    names: list[str],
    files: list[str],
    recursive: bool,
    selector_text: str | None,
    all_: bool,
    namespace: str | None,
    ignore_not_found: bool,
    wait: bool,
    db_url: str | None,
    all_namespaces: bool = False,
) -> None:
    from gctl.store import db, store

    targets = _delete_targets(
        resource=resource,
        names=names,
        files=files,
        recursive=recursive,
        selector_text=selector_text,
        all_=all_,
        namespace=namespace,
        all_namespaces=all_namespaces,
    )
    database = db.Database.open(db_url)
    with database.read() as session:
        revision = store.Store(session).current_revision()

    def work(writer: store.Store) -> tuple[list[tuple[Any, bool]], list[str]]:
        done, missing = [], []
        for info, name, where in _expand(writer, targets, selector_text, all_):
            try:
                done.append(writer.delete(kinds.model(info.kind), name, where))
            except errors.NotFound as exc:
                missing.append(str(exc))
        return done, missing

    done, missing = store.transact(database, work)
    for obj, _ in done:
        print(f'{obj.KIND.lower()}.gctl "{obj.name}" deleted')
    pending = {obj.metadata.uid for obj, gone in done if not gone}
    if wait and pending:
        _wait_gone(database, revision, pending)
    if missing and not ignore_not_found:
        for message in missing:
            print(f"error: {message}", file=sys.stderr)
        raise SystemExit(1)
    if not done and not missing and not files:
        print("No resources found", file=sys.stderr)


def _delete_targets(
    *,
    resource: str | None,
    names: list[str],
    files: list[str],
    recursive: bool,
    selector_text: str | None,
    all_: bool,
    namespace: str | None,
    all_namespaces: bool = False,
) -> list[Target]:
    """What to delete: named objects, or (name None) every object of a kind that the selector
    or --all picks, in one namespace or, with -A, in all of them (namespace None)."""
    if all_namespaces and (files or names or "/" in (resource or "")):
        raise errors.Invalid("-A/--all-namespaces goes with KIND -l SELECTOR or KIND --all")
    if files:
        from gctl.api import manifest

        if resource is not None:
            raise errors.Invalid("name objects either with -f or as KIND NAME, not both")
        manifests = manifest.load(files, recursive, namespace or kinds.DEFAULT_NAMESPACE)
        return [(m.obj.INFO, m.obj.name, m.obj.metadata.namespace) for m in manifests]
    if resource is None:
        raise errors.Invalid(
            "say what to delete: KIND NAME..., KIND/NAME, -f FILE, KIND -l SELECTOR or KIND --all"
        )
    groups = _resource_and_names(resource, names)
    named: list[Target] = [
        (info, name, _where(info, namespace, False)) for info, group in groups for name in group
    ]
    if named:
        return named
    if not (all_ or selector_text):
        plural = " and ".join(info.plural for info, _ in groups)
        raise errors.Invalid(f"name the {plural} to delete, or use -l SELECTOR or --all")
    return [(info, None, _where(info, namespace, all_namespaces)) for info, _ in groups]


def _expand(
    reader: store.Store, targets: list[Target], selector_text: str | None, all_: bool
) -> list[tuple[kinds.KindInfo, str, str | None]]:
    expanded = []
    for info, name, where in targets:
        if name is not None:
            expanded.append((info, name, where))
            continue
        label_selector = selector.parse(selector_text) if selector_text and not all_ else None
        for wire in reader.list_wire(kinds.model(info.kind), where, label_selector):
            metadata = wire["metadata"]
            expanded.append((info, metadata["name"], metadata.get("namespace", where)))
    return expanded


def _wait_gone(database: db.Database, revision: int, uids: set[str | None]) -> None:
    from gctl.store import feed

    with feed.Watch(database, since=revision) as changes:
        for batch in changes:
            uids -= {c.uid for c in batch if c.type == "DELETED"}
            if not uids:
                return


def db_upgrade(db_url: str | None) -> None:
    from gctl.store import db

    database = db.Database.open(db_url, migrate=False)
    before, after = database.upgrade()
    where = db.display_url(database.url)
    if before == after:
        print(f"{where}: schema {after}, up to date")
    else:
        print(f"{where}: schema upgraded from {before or 'empty'} to {after}")
