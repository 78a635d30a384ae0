"""The bodies of the CLI commands; `main` imports this module only when a command runs."""

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gctl.api import errors, kinds, manifest, meta, selector
from gctl.cli import apply as applying
from gctl.cli import printers
from gctl.store import db, feed, store


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
) -> None:
    _check_output(output)
    manifests = manifest.load(files, recursive, namespace or meta.DEFAULT_NAMESPACE)
    _check_namespace(manifests, namespace)
    database = db.Database.open(db_url)
    results = applying.apply(database, manifests, force, dry_run)
    suffix = " (dry run)" if dry_run else ""
    if output in ("yaml", "json"):
        printers.print_objects(
            [obj.wire() for _, obj in results], output, None, single=len(results) == 1
        )
        return
    lines = []
    for action, obj in results:
        name = obj.ref()
        lines.append(name if output == "name" else f"{name} {action.verb}{suffix}")
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
    *, files: list[str], recursive: bool, namespace: str | None, force: bool, db_url: str | None
) -> None:
    try:
        manifests = manifest.load(files, recursive, namespace or meta.DEFAULT_NAMESPACE)
        _check_namespace(manifests, namespace)
        text = applying.diff(db.Database.open(db_url), manifests, force)
    except errors.GctlError as exc:
        _fail(str(exc), code=2)
        return
    sys.stdout.write(text)
    raise SystemExit(1 if text else 0)


def _resource_and_names(resource: str, names: list[str]) -> tuple[type[meta.Resource], list[str]]:
    """`jobs a b`, `job/a`: the kind and the names."""
    word, slash, name = resource.partition("/")
    cls = kinds.by_word(word)
    if slash:
        if not name:
            raise errors.Invalid(f"{resource}: name the object after the slash")
        names = [name, *names]
    return cls, names


def _where(cls: type[meta.Resource], namespace: str | None, all_namespaces: bool) -> str | None:
    if not cls.NAMESPACED:
        return None
    return None if all_namespaces else (namespace or meta.DEFAULT_NAMESPACE)


def _no_resources(cls: type[meta.Resource], where: str | None) -> None:
    place = f" in {where} namespace" if where is not None and cls.NAMESPACED else ""
    print(f"No resources found{place}.", file=sys.stderr)


def get(
    *,
    resource: str,
    names: list[str],
    output: str,
    selector_text: str | None,
    namespace: str | None,
    all_namespaces: bool,
    watch: bool,
    watch_only: bool,
    show_labels: bool,
    db_url: str | None,
) -> None:
    _check_output(output)
    cls, names = _resource_and_names(resource, names)
    label_selector = selector.parse(selector_text) if selector_text else None
    where = _where(cls, namespace, all_namespaces)
    database = db.Database.open(db_url)
    with database.read() as session:
        reader = store.Store(session)
        revision = reader.current_revision()
        wires = reader.list_wire(cls, where, label_selector, names or None)
    missing = sorted(set(names) - {w["metadata"]["name"] for w in wires})
    table = None
    if output in ("", "wide"):
        table = printers.Table(
            cls.KIND,
            output == "wide",
            namespaces=cls.NAMESPACED and where is None,
            show_labels=show_labels,
        )
    if not watch_only:
        if wires:
            printers.print_objects(wires, output, table, single=len(names) == 1)
        elif not names and not (watch or watch_only):
            _no_resources(cls, where)
    if missing and not (watch or watch_only):
        for name in missing:
            print(f"error: {store.namespaced_not_found(cls, name, where)}", file=sys.stderr)
        raise SystemExit(1)
    if watch or watch_only:
        sys.stdout.flush()
        _watch(
            database=database,
            cls=cls,
            revision=revision,
            where=where,
            label_selector=label_selector,
            names=set(names),
            output=output,
            table=table,
        )


def _watch(
    *,
    database: db.Database,
    cls: type[meta.Resource],
    revision: int,
    where: str | None,
    label_selector: selector.Selector | None,
    names: set[str],
    output: str,
    table: printers.Table | None,
) -> None:
    with feed.Watch(database, since=revision, kinds=[cls.KIND]) as changes:
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
    from gctl.cli import describe as describing

    cls, names = _resource_and_names(resource, names)
    where = _where(cls, namespace, False)
    database = db.Database.open(db_url)
    with database.read() as session:
        reader = store.Store(session)
        wires = reader.list_wire(cls, where, names=names or None)
        if names and len(wires) < len(set(names)):
            found = {w["metadata"]["name"] for w in wires}
            missing = sorted(set(names) - found)[0]
            raise errors.NotFound(store.namespaced_not_found(cls, missing, where))
        if not wires:
            _no_resources(cls, where)
            return
        texts = []
        for wire in wires:
            obj = cls.model_validate(wire)
            texts.append(describing.render(wire, reader.events_for(obj), datetime.now(UTC)))
    sys.stdout.write("\n\n".join(texts))


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
) -> None:
    targets = _delete_targets(
        resource=resource,
        names=names,
        files=files,
        recursive=recursive,
        selector_text=selector_text,
        all_=all_,
        namespace=namespace,
    )
    database = db.Database.open(db_url)
    with database.read() as session:
        revision = store.Store(session).current_revision()

    def work(writer: store.Store) -> tuple[list[tuple[Any, bool]], list[str]]:
        done, missing = [], []
        for cls, name, where in _expand(writer, targets, selector_text, all_):
            try:
                done.append(writer.delete(cls, name, where))
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


Target = tuple[type[meta.Resource], str | None, str | None]  # kind, name (None: by query), ns


def _delete_targets(
    *,
    resource: str | None,
    names: list[str],
    files: list[str],
    recursive: bool,
    selector_text: str | None,
    all_: bool,
    namespace: str | None,
) -> list[Target]:
    if files:
        if resource is not None:
            raise errors.Invalid("name objects either with -f or as KIND NAME, not both")
        manifests = manifest.load(files, recursive, namespace or meta.DEFAULT_NAMESPACE)
        return [(type(m.obj), m.obj.name, m.obj.metadata.namespace) for m in manifests]
    if resource is None:
        raise errors.Invalid(
            "say what to delete: KIND NAME..., KIND/NAME, -f FILE, KIND -l SELECTOR or KIND --all"
        )
    cls, names = _resource_and_names(resource, names)
    where = _where(cls, namespace, False)
    if names:
        return [(cls, name, where) for name in names]
    if not (all_ or selector_text):
        raise errors.Invalid(f"name the {cls.PLURAL} to delete, or use -l SELECTOR or --all")
    return [(cls, None, where)]


def _expand(
    reader: store.Store, targets: list[Target], selector_text: str | None, all_: bool
) -> list[tuple[type[meta.Resource], str, str | None]]:
    expanded = []
    for cls, name, where in targets:
        if name is not None:
            expanded.append((cls, name, where))
            continue
        label_selector = selector.parse(selector_text) if selector_text and not all_ else None
        for wire in reader.list_wire(cls, where, label_selector):
            expanded.append((cls, wire["metadata"]["name"], where))
    return expanded


def _wait_gone(database: db.Database, revision: int, uids: set[str | None]) -> None:
    with feed.Watch(database, since=revision) as changes:
        for batch in changes:
            uids -= {c.uid for c in batch if c.type == "DELETED"}
            if not uids:
                return


def db_upgrade(db_url: str | None) -> None:
    database = db.Database.open(db_url, migrate=False)
    before, after = database.upgrade()
    where = db.display_url(database.url)
    if before == after:
        print(f"{where}: schema {after}, up to date")
    else:
        print(f"{where}: schema upgraded from {before or 'empty'} to {after}")
