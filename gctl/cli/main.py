"""The `gctl` command line: kubectl's verbs and flags over the gctl database.

Only typer and the standard library are imported here; each command imports the rest when it
runs (ruff's banned-module-level-imports and a test on sys.modules keep it so).
"""

import functools
import os
import sys
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

import gctl
from gctl.cli import serving
from gctl.cli.options import (
    AllNamespacesOpt,
    DbOpt,
    FilesOpt,
    NamespaceOpt,
    OutputOpt,
    RecursiveOpt,
    SelectorOpt,
    fail,
)


class _Root(TyperGroup):
    """Ends quietly, with 0, when the reader of gctl's output leaves (`gctl get jobs | head`).

    Caught here, inside typer's own handling, which would otherwise turn it into exit 1."""

    def invoke(self, ctx: Any) -> Any:  # typer vendors click: its Context type is private
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # inside the try: buffered output would break the pipe later
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so that flushing at exit cannot fail again
            raise SystemExit(0) from None
        return result


app = typer.Typer(
    name="gctl",
    cls=_Root,
    help="Declarative GPU jobs: apply manifests, watch them run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@app.callback()
def root(db: DbOpt = None) -> None:
    """Declarative GPU jobs: apply manifests, watch them run."""
    if db:  # `gctl --db URL get jobs` as well as `gctl get jobs --db URL`
        os.environ["GCTL_DB"] = db


@app.command()
def version() -> None:
    """Print the gctl version."""
    print(f"gctl {gctl.__version__}")


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


@app.command()
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


@app.command()
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


@app.command()
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


@app.command()
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
        )
        return
    from gctl.cli import commands

    flags = commands.GetFlags(
        output=output,
        selector_text=selector,
        namespace=namespace,
        all_namespaces=all_namespaces,
        watch=watch,
        watch_only=watch_only,
        show_labels=show_labels,
        db_url=db,
    )
    commands.get(resource=resource, names=names or [], flags=flags)


@app.command()
def describe(
    resource: Annotated[str, typer.Argument(help="Kind, or KIND/NAME.")],
    names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None,
    namespace: NamespaceOpt = None,
    db: DbOpt = None,
) -> None:
    """Show an object's spec, status, conditions and recent events."""
    from gctl.cli import commands

    commands.describe(resource=resource, names=names or [], namespace=namespace, db_url=db)


@app.command()
def delete(
    resource: Annotated[str | None, typer.Argument(help="Kind, or KIND/NAME.")] = None,
    names: Annotated[list[str] | None, typer.Argument(help="Names.")] = None,
    filename: Annotated[
        list[str] | None, typer.Option("-f", "--filename", help="Delete what these name.")
    ] = None,
    recursive: RecursiveOpt = False,
    selector: SelectorOpt = None,
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
    """Delete objects by name, by manifest, by label selector or all of a kind."""
    from gctl.cli import commands

    commands.delete(
        resource=resource,
        names=names or [],
        files=filename or [],
        recursive=recursive,
        selector_text=selector,
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


FromNodeOpt = Annotated[
    bool,
    typer.Option(
        "--from-node",
        help="Read the output through its node's agent even if its path exists here "
        "(a directory shared over NFS, which does not see another host's appends).",
    ),
]


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="The Job, as NAME or job/NAME.")],
    namespace: NamespaceOpt = None,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing output until the attempt ends.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option("--attempt", help="Show attempt N (default: the latest).", min=1)
    ] = None,
    previous: Annotated[
        bool, typer.Option("-p", "--previous", help="Show the attempt before the latest.")
    ] = False,
    from_node: FromNodeOpt = False,
    db: DbOpt = None,
) -> None:
    """Print the output of a Job's latest attempt (or another one); -f follows it."""
    from gctl.cli import running

    running.logs(
        name=job,
        namespace=namespace,
        follow=follow,
        attempt=attempt,
        previous=previous,
        db_url=db,
        from_node=from_node,
    )


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="What to run, after -- when it has options of its own.",
            metavar="-- COMMAND [ARGS]",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The Job's name (default: run-XXXXX).")
    ] = None,
    namespace: NamespaceOpt = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="GPUs: a fraction in (0,1], a whole number, or 0.")
    ] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="Memory needed on each GPU, e.g. 24Gi.")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="A GPUProfile for what --gpus and --gpu-memory leave out."),
    ] = None,
    priority: Annotated[str | None, typer.Option("--priority", help="Higher runs first.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE in the environment (repeatable).")
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="The GPUPool to run in.")] = None,
    node: Annotated[str | None, typer.Option("--node", help="Run on this node only.")] = None,
    gpu_ids: Annotated[
        str | None,
        typer.Option(
            "--gpu-ids",
            help="Run on these GPU indices, e.g. 0,1 or 0-3 (--gpus defaults to as many).",
        ),
    ] = None,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="Stream the output and exit with the Job's exit code; Ctrl-C deletes the Job.",
        ),
    ] = False,
    from_node: FromNodeOpt = False,
    labels: Annotated[
        list[str] | None, typer.Option("-l", "--labels", help="key=value labels (repeatable).")
    ] = None,
    db: DbOpt = None,
) -> None:
    """Create a Job that runs a command in this directory, like kubectl run or srun."""
    from gctl.cli import running

    running.run(
        command=command or [],
        name=name,
        namespace=namespace,
        gpus=gpus,
        gpu_memory=gpu_memory,
        profile=profile,
        priority=priority,
        env=env or [],
        pool=pool,
        labels=labels or [],
        attach=attach,
        db_url=db,
        node=node,
        gpu_ids=gpu_ids,
        from_node=from_node,
    )


@app.command()
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
    from gctl.cli import running

    running.wait(
        resource=resource,
        names=names or [],
        conditions=for_ or [],
        timeout=timeout,
        namespace=namespace,
        db_url=db,
    )


TargetsArg = Annotated[
    list[str],
    typer.Argument(
        help="gpuN (on the only node, or --node), NODE/gpuN, or node NAME...",
        metavar="TARGET...",
        show_default=False,
    ),
]
NodeFlagOpt = Annotated[
    str | None, typer.Option("--node", help="The node of a bare gpuN when there are several.")
]


@app.command()
def rerun(
    resource: Annotated[str, typer.Argument(help="job, or job/NAME.")],
    names: Annotated[list[str] | None, typer.Argument(help="The Job's name.")] = None,
    namespace: NamespaceOpt = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why, for the Event (default: gctl rerun).")
    ] = None,
    db: DbOpt = None,
) -> None:
    """Run a Job again, whatever its phase: a running attempt is stopped (not counted as a
    failure), a finished Job goes back to the queue; attempt numbers go on."""
    from gctl.cli import rerunning

    rerunning.rerun(
        resource=resource, names=names or [], namespace=namespace, reason=reason, db_url=db
    )


@app.command()
def cordon(targets: TargetsArg, node: NodeFlagOpt = None, db: DbOpt = None) -> None:
    """Start no new jobs on GPUs or a node; running jobs go on.

    Targets: gpu0 (GPU 0 of the only node, or of --node), box2/gpu1, node box2.
    """
    from gctl.cli import draining

    draining.cordon(words=targets, node_flag=node, db_url=db)


@app.command()
def drain(
    targets: TargetsArg,
    node: NodeFlagOpt = None,
    evict: Annotated[
        bool,
        typer.Option(
            "--evict", help="Stop the jobs there now; they go back to the queue, not failed."
        ),
    ] = False,
    wait_: Annotated[
        bool, typer.Option("--wait", help="Return once no job is left there.")
    ] = False,
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", help="With --wait: give up after 30s, 10m, 1h (default: never)."),
    ] = None,
    db: DbOpt = None,
) -> None:
    """Let the jobs on GPUs or a node finish and start no new ones, as Slurm drains.

    The target shows Draining, then Drained once no job is left. With --evict the jobs are
    stopped now and go back to the queue (not counted as failures). Targets: gpu0 (GPU 0 of
    the only node, or of --node), box2/gpu1, node box2.
    """
    from gctl.cli import draining

    draining.drain(
        words=targets, node_flag=node, evicting=evict, wait=wait_, timeout=timeout, db_url=db
    )


@app.command()
def uncordon(targets: TargetsArg, node: NodeFlagOpt = None, db: DbOpt = None) -> None:
    """Open GPUs or a node to new jobs again: clears cordon and drain.

    Targets: gpu0 (GPU 0 of the only node, or of --node), box2/gpu1, node box2.
    """
    from gctl.cli import draining

    draining.uncordon(words=targets, node_flag=node, db_url=db)


app.add_typer(serving.controller_app, name="controller")
app.add_typer(serving.agent_app, name="agent")
app.command()(serving.up)


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Migrate the schema to this gctl's version (also done on first use)."""
    from gctl.cli import commands

    commands.db_upgrade(db)


@functools.cache
def command() -> Any:
    """typer's click command for `app`, built once a process (8 ms): the command server builds
    it before it forks its children."""
    return typer.main.get_command(app)


def main() -> None:
    """Run `gctl` with sys.argv: one line and a non-zero exit for every error a user can cause.

    click's own errors (a missing argument, an unknown flag, a bad value) too: click would
    print the usage and a box around the message; here they are one line naming the command,
    exit 2 as click's. A command given no arguments that needs some prints its help, exit 2."""
    from typer._click import exceptions as usage

    try:
        # The program's name, given: click would take a served command's from the server's
        # `python -m gctl.cli.cmdserver`.
        code = command()(prog_name="gctl", standalone_mode=False)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except usage.NoArgsIsHelpError as exc:  # the help is printed already
        raise SystemExit(exc.exit_code) from None
    except usage.ClickException as exc:
        where = getattr(exc, "ctx", None)
        hint = f" (see '{where.command_path} -h')" if where is not None else ""
        fail(exc.format_message().rstrip(".") + hint, exc.exit_code)
    except typer.Abort:
        fail("aborted")
    except Exception as exc:
        from gctl.api import errors

        if isinstance(exc, errors.GctlError):
            fail(str(exc))
        raise
    if isinstance(code, int) and code:  # `ctx.exit(N)`, which click returns unraised
        raise SystemExit(code)


if __name__ == "__main__":
    main()
