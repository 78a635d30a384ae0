"""The bodies of the commands that write to the database: apply, diff (what apply would
write), delete and db upgrade; `main` imports this module only when one of them runs.

Its top level imports no SQLAlchemy and no pydantic; each command imports what it validates or
writes with when it runs. `get` and `describe` live in `getting` and `describe`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gctl.api import errors, fields, kinds, selector
from gctl.cli import following, getting, printers
from gctl.store import bulk, locations

if TYPE_CHECKING:
    from gctl.api import manifest
    from gctl.store import db, store


def _fail(message: str, code: int = 1) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _load(files: list[str], recursive: bool, namespace: str | None) -> list[manifest.Manifest]:
    """The manifests of `-f`'s files; `-` is stdin, read so that Ctrl-C always ends the read."""
    from gctl.api import manifest

    stdin = following.read_stdin() if manifest.STDIN in files else ""
    return manifest.load(files, recursive, namespace or kinds.DEFAULT_NAMESPACE, stdin)


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
    from gctl.cli import apply as applying

    printers.check_output(output)
    options = applying.set_options(applyset, prune, on_spec_change, files)
    wait_gone = applying.DeletionWait(timeout)  # what --force replaces, once started
    with bulk.collector_paused():
        manifests = _load(files, recursive, namespace)
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
    from gctl.cli import apply as applying

    try:
        options = applying.set_options(applyset, prune, None, files)
        manifests = _load(files, recursive, namespace)
        _check_namespace(manifests, namespace)
        text = applying.diff(locations.resolve_url(db_url), manifests, force, options)
    except errors.GctlError as exc:
        _fail(str(exc), code=2)
        return
    sys.stdout.write(text)
    raise SystemExit(1 if text else 0)


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
    field_selector_text: str | None = None,
) -> None:
    from gctl.store import db, store

    targets = _delete_targets(
        resource=resource,
        names=names,
        files=files,
        recursive=recursive,
        selected=bool(selector_text or field_selector_text),
        all_=all_,
        namespace=namespace,
        all_namespaces=all_namespaces,
    )
    database = db.Database.open(db_url, create=False)
    with database.read() as session:
        revision = store.Store(session).current_revision()

    def work(writer: store.Store) -> tuple[list[tuple[Any, bool]], list[str]]:
        done, missing = [], []
        for info, name, where in _expand(writer, targets, selector_text, field_selector_text):
            try:
                done.append(writer.delete(kinds.model(info.kind), name, where))
            except errors.NotFound as exc:
                missing.append(str(exc))
        return done, missing

    done, missing = store.transact(database, work)
    for obj, _ in done:
        print(f'{obj.KIND.lower()}.gctl "{obj.name}" deleted')
    pending = {obj.metadata.uid: obj for obj, gone in done if not gone}
    sys.stdout.flush()  # what is deleted, before a wait: through a pipe too
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
    selected: bool,
    all_: bool,
    namespace: str | None,
    all_namespaces: bool = False,
) -> list[Target]:
    """What to delete: named objects, or (name None) every object of a kind that a selector
    (`selected`: -l or --field-selector) or --all picks, in one namespace or, with -A, in all
    of them (namespace None)."""
    if all_namespaces and (files or names or "/" in (resource or "")):
        raise errors.Invalid("-A/--all-namespaces goes with KIND -l SELECTOR or KIND --all")
    if selected and (all_ or files or names or "/" in (resource or "")):
        # As kubectl: `--all --field-selector status.phase=Failed` would otherwise delete every
        # Job, and `job/a --field-selector ...` job a whatever its fields.
        raise errors.Invalid("-l and --field-selector go with KIND alone, not names, -f or --all")
    if files:
        if resource is not None:
            raise errors.Invalid("name objects either with -f or as KIND NAME, not both")
        manifests = _load(files, recursive, namespace)
        return [(m.obj.INFO, m.obj.name, m.obj.metadata.namespace) for m in manifests]
    if resource is None:
        raise errors.Invalid(
            "say what to delete: KIND NAME..., KIND/NAME, -f FILE, KIND -l SELECTOR or KIND --all"
        )
    groups = getting.resource_and_names(resource, names)
    named: list[Target] = [
        (info, name, getting.scope(info, namespace, False))
        for info, group in groups
        for name in group
    ]
    if named:
        return named
    if not (all_ or selected):
        plural = " and ".join(info.plural for info, _ in groups)
        raise errors.Invalid(
            f"name the {plural} to delete, or use -l SELECTOR, --field-selector F or --all"
        )
    return [(info, None, getting.scope(info, namespace, all_namespaces)) for info, _ in groups]


def _expand(
    reader: store.Store,
    targets: list[Target],
    selector_text: str | None,
    field_selector_text: str | None,
) -> list[tuple[kinds.KindInfo, str, str | None]]:
    expanded = []
    for info, name, where in targets:
        if name is not None:
            expanded.append((info, name, where))
            continue
        label_selector = selector.parse(selector_text) if selector_text else None
        by_field = fields.parse(field_selector_text, info) if field_selector_text else None
        for wire in reader.list_wire(kinds.model(info.kind), where, label_selector):
            if by_field is not None and not by_field.matches(wire):
                continue
            metadata = wire["metadata"]
            expanded.append((info, metadata["name"], metadata.get("namespace", where)))
    return expanded


def _wait_gone(database: db.Database, revision: int, left: dict[str | None, Any]) -> None:
    """Until the objects are gone (their finalizers done: a Job's attempts stopped), saying on
    stderr after a moment, then every so often, what it waits for."""
    import threading
    import time

    from gctl.cli.apply import PROGRESS_AFTER_S, PROGRESS_EVERY_S
    from gctl.store import feed, notify

    started, notes = time.monotonic(), 0
    stop = notify.Stop()
    with (
        following.interruptible(stop) as interrupted,
        feed.Watch(database, since=revision, stop=stop) as changes,
    ):
        while True:
            due = started + (PROGRESS_EVERY_S * notes if notes else PROGRESS_AFTER_S)
            timer = threading.Timer(max(due - time.monotonic(), 0.0), stop.set)
            timer.daemon = True
            timer.start()
            try:  # until the note is due, or Ctrl-C
                for batch in changes:
                    for change in batch:
                        if change.type == "DELETED":
                            left.pop(change.uid, None)
                    if not left:
                        return
            finally:
                timer.cancel()
                timer.join()  # its set done, if it fired: a clear must not race it
            stop.clear()  # then look: a Ctrl-C's set after the look would be cleared
            if interrupted.is_set():
                raise SystemExit(following.INTERRUPTED)  # the deletion is written
            whose = "its" if len(left) == 1 else "their"
            why = (
                f"{time.monotonic() - started:.0f}s so far"
                if notes
                else f"the controller stops {whose} attempts first (is the controller running?)"
            )
            notes += 1
            print(f"waiting for {_named(left)} to be deleted: {why}", file=sys.stderr, flush=True)


def _named(objs: dict[str | None, Any], most: int = 3) -> str:
    refs = [f'{obj.KIND.lower()}.gctl "{obj.name}"' for obj in objs.values()]
    return ", ".join(refs) if len(refs) <= most else f"{len(refs)} objects"


def db_upgrade(db_url: str | None) -> None:
    from gctl.store import db

    database = db.Database.open(db_url, migrate=False)
    before, after = database.upgrade()
    where = db.display_url(database.url)
    if before == after:
        print(f"{where}: schema {after}, up to date")
    else:
        print(f"{where}: schema upgraded from {before or 'empty'} to {after}")
