"""`gctl apply`, `diff`, `sync`, `get`, `describe`, `delete` and `wait`: the verbs over stored
objects of any kind, their flags, and the hand-over to the modules that run them.

Typer and the standard library only at the top (see gctl/cli/main.py, which registers these
functions as commands): each command imports the rest when it runs.
"""

from typing import Annotated

import typer

from gctl.cli.options import (
    AllNamespacesOpt,
    DbOpt,
    FilesOpt,
    NamespaceOpt,
    OutputOpt,
    RecursiveOpt,
    SelectorOpt,
)

ApplySetOpt = Annotated[
    str | None,
    typer.Option(
        "--applyset", help="Apply as members of this ApplySet (label gctl/applyset=NAME)."
    ),
]
PruneOpt = Annotated[
    bool,
    typer.Option("--prune", help="Delete the set's members that are no longer in the input."),
]
OnSpecChangeOpt = Annotated[
    str | None,
    typer.Option(
        "--on-spec-change",
        help="refuse | rerun: what a changed command/resources/placement does to a started Job "
        "(stored in the ApplySet; a Job's own spec.onSpecChange wins).",
    ),
]


def apply(
    filename: FilesOpt,
    recursive: RecursiveOpt = False,
    namespace: NamespaceOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and say what would happen; write nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete and recreate objects whose change is refused.")
    ] = False,
    output: OutputOpt = "",
    applyset: ApplySetOpt = None,
    prune: PruneOpt = False,
    on_spec_change: OnSpecChangeOpt = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            help="With --force: how long to wait for a started Job to be deleted (its attempts "
            "stopped) before giving up: 30s, 10m, 1h, or seconds (default: 60s plus the Job's "
            "terminationGracePeriodSeconds).",
        ),
    ] = None,
    db: DbOpt = None,
) -> None:
    """Create or update objects from manifests, all in one transaction (with --force, a
    started Job is deleted first and recreated once it is gone)."""
    from gctl.cli import commands

    commands.apply(
        files=filename,
        recursive=recursive,
        namespace=namespace,
        dry_run=dry_run,
        force=force,
        output=output,
        db_url=db,
        applyset=applyset,
        prune=prune,
        on_spec_change=on_spec_change,
        timeout=timeout,
    )


def diff(
    filename: FilesOpt,
    recursive: RecursiveOpt = False,
    namespace: NamespaceOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Diff as apply --force would.")] = False,
    applyset: ApplySetOpt = None,
    prune: PruneOpt = False,
    db: DbOpt = None,
) -> None:
    """Show what apply would change, as a unified diff. Exit 0: none, 1: some, 2: error."""
    from gctl.cli import commands

    commands.diff(
        files=filename,
        recursive=recursive,
        namespace=namespace,
        force=force,
        db_url=db,
        applyset=applyset,
        prune=prune,
    )


def sync(
    directory: Annotated[str, typer.Argument(help="The directory that holds the manifests.")],
    watch: Annotated[
        bool,
        typer.Option("-w", "--watch", help="Keep applying on every change, and revert drift."),
    ] = False,
    applyset: Annotated[
        str | None,
        typer.Option("--applyset", help="The ApplySet's name (default: the directory's name)."),
    ] = None,
    prune: Annotated[
        bool, typer.Option("--prune/--no-prune", help="Delete members gone from the directory.")
    ] = True,
    on_spec_change: OnSpecChangeOpt = None,
    namespace: NamespaceOpt = None,
    db: DbOpt = None,
) -> None:
    """Make the database hold what a directory says (recursively), as one transaction;
    with --watch, again on every save and whenever a member is changed by hand."""
    from gctl.cli import daemons

    daemons.sync(
        db,
        daemons.sync_options(directory, applyset, prune, on_spec_change, namespace),
        watch=watch,
    )


GPU_WORDS = ("gpus", "gpu")


def get(
    resource: Annotated[
        str,
        typer.Argument(
            help="jobs, sweeps, pools, gpuprofiles, nodes, bindings, events, gpus; or KIND/NAME."
        ),
    ],
    names: Annotated[list[str] | None, typer.Argument(help="Names to show.")] = None,
    output: OutputOpt = "",
    selector: SelectorOpt = None,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    watch: Annotated[bool, typer.Option("-w", "--watch", help="Then stream changes.")] = False,
    watch_only: Annotated[
        bool, typer.Option("--watch-only", help="Stream changes without the list first.")
    ] = False,
    show_labels: Annotated[
        bool, typer.Option("--show-labels", help="Add a LABELS column.")
    ] = False,
    field_selector: Annotated[
        str | None,
        typer.Option(
            "--field-selector", help="By field, e.g. status.phase!=Succeeded,spec.pool=a100."
        ),
    ] = None,
    db: DbOpt = None,
) -> None:
    """List objects, or stream their changes with -w. `gctl get gpus` lists every GPU."""
    if resource.lower() in GPU_WORDS:  # a view of Nodes and Bindings, not a stored kind
        from gctl.cli import gpus

        gpus.get_gpus(
            nodes=names or [],
            output=output,
            selector_text=selector,
            watch=watch,
            watch_only=watch_only,
            show_labels=show_labels,
            db_url=db,
            field_selector=field_selector,
        )
        return
    from gctl.cli import getting

    flags = getting.GetFlags(
        output=output,
        selector_text=selector,
        namespace=namespace,
        all_namespaces=all_namespaces,
        watch=watch,
        watch_only=watch_only,
        show_labels=show_labels,
        db_url=db,
        field_selector_text=field_selector,
    )
    getting.get(resource=resource, names=names or [], flags=flags)


def describe(
    resource: Annotated[str, typer.Argument(help="Kind, or KIND/NAME.")],
    names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None,
    namespace: NamespaceOpt = None,
    db: DbOpt = None,
) -> None:
    """Show an object's spec, status, conditions and recent events."""
    from gctl.cli import describe as describing

    describing.describe(resource=resource, names=names or [], namespace=namespace, db_url=db)


def delete(
    resource: Annotated[str | None, typer.Argument(help="Kind, or KIND/NAME.")] = None,
    names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None,
    filename: Annotated[
        list[str] | None, typer.Option("-f", "--filename", help="Delete what these name.")
    ] = None,
    recursive: RecursiveOpt = False,
    selector: SelectorOpt = None,
    field_selector: Annotated[
        str | None,
        typer.Option("--field-selector", help="By field, e.g. status.phase=Failed."),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every object of the kind.")] = False,
    namespace: NamespaceOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    ignore_not_found: Annotated[
        bool, typer.Option("--ignore-not-found", help="Treat a missing object as deleted.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until the objects are gone.")
    ] = True,
    db: DbOpt = None,
) -> None:
    """Delete objects by name, by manifest, by label or field selector, or all of a kind."""
    from gctl.cli import commands

    commands.delete(
        resource=resource,
        names=names or [],
        files=filename or [],
        recursive=recursive,
        selector_text=selector,
        field_selector_text=field_selector,
        all_=all_,
        namespace=namespace,
        ignore_not_found=ignore_not_found,
        wait=wait,
        db_url=db,
        all_namespaces=all_namespaces,
    )


TimeoutOpt = Annotated[
    str,
    typer.Option("--timeout", help="How long to wait: 30s, 10m, 1h, or seconds; 0 checks once."),
]


def wait(
    resource: Annotated[str, typer.Argument(help="KIND/NAME, or KIND followed by names.")],
    names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None,
    for_: Annotated[
        list[str] | None,
        typer.Option(
            "--for",
            help="condition=TYPE[=true|false] (e.g. condition=Complete), or delete; "
            "given twice, either one will do.",
        ),
    ] = None,
    timeout: TimeoutOpt = "30s",
    namespace: NamespaceOpt = None,
    db: DbOpt = None,
) -> None:
    """Wait until objects meet a condition or are deleted, like kubectl wait."""
    from gctl.cli import waiting

    waiting.wait(
        resource=resource,
        names=names or [],
        conditions=for_ or [],
        timeout=timeout,
        namespace=namespace,
        db_url=db,
    )
