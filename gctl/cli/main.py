"""The `gctl` command line: kubectl's verbs and flags over the gctl database.

The Typer app, the commands registered on it (their signatures live in `objects`, `workloads`
and `serving`), and `main`, which turns every error a user can cause into one line.

Only typer and the standard library are imported here and in those modules; each command
imports the rest when it runs (ruff's banned-module-level-imports and a test on sys.modules
keep it so).
"""

import functools
import os
import sys
from typing import Any

import typer
import typer.main
from typer.core import TyperGroup

import gctl
from gctl.cli import ctrlc, objects, serving, workloads
from gctl.cli.options import DbOpt, fail


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

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """The command and its arguments, with kubectl's `--dry-run=VALUE` read for `apply`."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if name == "apply":
            rest = _kubectl_dry_run(rest)
        return name, cmd, rest


def _kubectl_dry_run(args: list[str]) -> list[str]:
    """`--dry-run=client` and `=server` as `--dry-run`, `=none` as no dry run at all.

    kubectl has deprecated a bare `--dry-run` for these, so they are what its users type; gctl
    has one kind of dry run, which reads the database as kubectl's server-side one does, so
    both values mean it. Rewritten here because typer cannot declare a flag whose value is
    optional."""
    kept = []
    for arg in args:
        value = arg.removeprefix("--dry-run=") if arg.startswith("--dry-run=") else None
        if value not in (None, "client", "server", "none"):
            fail(f"{arg}: use --dry-run, or kubectl's --dry-run=client, =server or =none", 2)
        if value != "none":
            kept.append(arg if value is None else "--dry-run")
    return kept


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


# The commands, in the order `gctl --help` lists them.
app.command()(objects.apply)
app.command()(objects.diff)
app.command()(objects.sync)
app.command()(objects.get)
app.command()(objects.describe)
app.command()(objects.delete)
app.command()(workloads.logs)
app.command(context_settings={"allow_interspersed_args": False})(workloads.run)
app.command()(objects.wait)
app.command()(workloads.rerun)
app.command()(workloads.cordon)
app.command()(workloads.drain)
app.command()(workloads.uncordon)
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
    exit 2 as click's. A command given no arguments that needs some prints its help, exit 2.

    A command that succeeded after a Ctrl-C that Python lost and no wait took (`ctrlc`) exits
    130, as a shell counts an interrupted command, so that a loop around it stops."""
    try:
        _run()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    if ctrlc.take():
        raise SystemExit(130)


def _run() -> None:
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
