"""The `gctl` command line: kubectl's verbs and flags over the gctl database.

Only typer and the standard library are imported here; each command imports the rest when it
runs (ruff's banned-module-level-imports and a test on sys.modules keep it so).
"""

import os
import sys
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

import gctl

if TYPE_CHECKING:
    from gctl.cli import daemons

app = typer.Typer(
    name="gctl",
    help="Declarative GPU jobs: apply manifests, watch them run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="GCTL_DB",
        show_envvar=True,
        help="Database: a SQLite file path or postgresql://user@host/db. "
        "Default: the per-user SQLite file.",
    ),
]
FilesOpt = Annotated[
    list[str],
    typer.Option("-f", "--filename", help="Manifest file or directory; - reads stdin."),
]
RecursiveOpt = Annotated[
    bool, typer.Option("-R", "--recursive", help="Read directories and their subdirectories.")
]
NamespaceOpt = Annotated[
    str | None, typer.Option("-n", "--namespace", help="Namespace (default: default).")
]
AllNamespacesOpt = Annotated[
    bool, typer.Option("-A", "--all-namespaces", help="Across all namespaces.")
]
OutputOpt = Annotated[str, typer.Option("-o", "--output", help="wide | yaml | json | name.")]
SelectorOpt = Annotated[
    str | None, typer.Option("-l", "--selector", help="Label selector, e.g. team=nlp,env!=prod.")
]


@app.callback()
def root(db: DbOpt = None) -> None:
    """Declarative GPU jobs: apply manifests, watch them run."""
    if db:  # `gctl --db URL get jobs` as well as `gctl get jobs --db URL`
        os.environ["GCTL_DB"] = db


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


@app.command()
def version() -> None:
    """Print the gctl version."""
    print(f"gctl {gctl.__version__}")


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
    db: DbOpt = None,
) -> None:
    """Create or update objects from manifests, all in one transaction."""
    from gctl.cli import commands

    commands.apply(
        files=filename,
        recursive=recursive,
        namespace=namespace,
        dry_run=dry_run,
        force=force,
        output=output,
        db_url=db,
    )


@app.command()
def diff(
    filename: FilesOpt,
    recursive: RecursiveOpt = False,
    namespace: NamespaceOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Diff as apply --force would.")] = False,
    db: DbOpt = None,
) -> None:
    """Show what apply would change, as a unified diff. Exit 0: none, 1: some, 2: error."""
    from gctl.cli import commands

    commands.diff(files=filename, recursive=recursive, namespace=namespace, force=force, db_url=db)


@app.command()
def get(
    resource: Annotated[
        str, typer.Argument(help="jobs, pools, nodes, bindings, events; or KIND/NAME.")
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
    """List objects, or stream their changes with -w."""
    from gctl.cli import commands

    commands.get(
        resource=resource,
        names=names or [],
        output=output,
        selector_text=selector,
        namespace=namespace,
        all_namespaces=all_namespaces,
        watch=watch,
        watch_only=watch_only,
        show_labels=show_labels,
        db_url=db,
    )


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
    )


controller_app = typer.Typer(
    help="The controller: schedules and follows Jobs.", no_args_is_help=True
)
agent_app = typer.Typer(help="The node agent: runs this host's bound Jobs.", no_args_is_help=True)
app.add_typer(controller_app, name="controller")
app.add_typer(agent_app, name="agent")

FakeGpusOpt = Annotated[
    int | None,
    typer.Option("--fake-gpus", help="Offer N fake GPUs instead of asking NVML.", min=0),
]
GpuModelOpt = Annotated[str, typer.Option("--gpu-model", help="Model name of fake GPUs.")]
GpuMemoryOpt = Annotated[str, typer.Option("--gpu-memory", help="Memory of each fake GPU.")]
NodeNameOpt = Annotated[
    str | None, typer.Option("--node-name", help="This node's name (default: the host name).")
]
StateDirOpt = Annotated[
    str | None,
    typer.Option(
        "--state-dir", help="Where attempts and logs live (default: ~/.local/state/gctl/NODE)."
    ),
]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", help="Node label key=value (repeatable).")
]
HeartbeatOpt = Annotated[
    float, typer.Option("--heartbeat", help="Seconds between heartbeats.", min=0.1)
]
GraceOpt = Annotated[
    float,
    typer.Option(
        "--grace-period", help="Seconds between SIGTERM and SIGKILL when stopping.", min=0
    ),
]
NodeTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--node-timeout", help="Seconds without a heartbeat before a node is lost.", min=0.5
    ),
]


def _agent_options(
    node_name: str | None,
    fake_gpus: int | None,
    gpu_model: str,
    gpu_memory: str,
    state_dir: str | None,
    labels: list[str] | None,
    heartbeat: float,
    grace: float,
) -> "daemons.AgentOptions":
    from pathlib import Path

    from gctl.cli import daemons

    return daemons.AgentOptions(
        node_name=node_name,
        fake_gpus=fake_gpus,
        gpu_model=gpu_model,
        gpu_memory=gpu_memory,
        state_dir=Path(state_dir) if state_dir else None,
        labels=labels or [],
        heartbeat_seconds=heartbeat,
        grace_seconds=grace,
    )


@app.command()
def up(
    fake_gpus: FakeGpusOpt = None,
    gpu_model: GpuModelOpt = "Fake GPU",
    gpu_memory: GpuMemoryOpt = "80Gi",
    node_name: NodeNameOpt = None,
    state_dir: StateDirOpt = None,
    label: LabelOpt = None,
    heartbeat: HeartbeatOpt = 10.0,
    grace_period: GraceOpt = 10.0,
    node_timeout: NodeTimeoutOpt = 40.0,
    db: DbOpt = None,
) -> None:
    """Run the controller and a local node agent in one foreground process."""
    from gctl.cli import daemons

    options = _agent_options(
        node_name, fake_gpus, gpu_model, gpu_memory, state_dir, label, heartbeat, grace_period
    )
    daemons.up(db, options, node_timeout)


@controller_app.command("run")
def controller_run(node_timeout: NodeTimeoutOpt = 40.0, db: DbOpt = None) -> None:
    """Run the controller in the foreground."""
    from gctl.cli import daemons

    daemons.controller(db, node_timeout)


@agent_app.command("run")
def agent_run(
    fake_gpus: FakeGpusOpt = None,
    gpu_model: GpuModelOpt = "Fake GPU",
    gpu_memory: GpuMemoryOpt = "80Gi",
    node_name: NodeNameOpt = None,
    state_dir: StateDirOpt = None,
    label: LabelOpt = None,
    heartbeat: HeartbeatOpt = 10.0,
    grace_period: GraceOpt = 10.0,
    db: DbOpt = None,
) -> None:
    """Run a node agent for this host in the foreground."""
    from gctl.cli import daemons

    options = _agent_options(
        node_name, fake_gpus, gpu_model, gpu_memory, state_dir, label, heartbeat, grace_period
    )
    daemons.agent(db, options)


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Migrate the schema to this gctl's version (also done on first use)."""
    from gctl.cli import commands

    commands.db_upgrade(db)


def main() -> None:
    """Entry point: one line and a non-zero exit for every error a user can cause."""
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:
        sys.stderr.close()  # `gctl get jobs | head`: the reader left; not an error
        raise SystemExit(0) from None
    except Exception as exc:
        from gctl.api import errors

        if isinstance(exc, errors.GctlError):
            fail(str(exc))
        raise


if __name__ == "__main__":
    main()
