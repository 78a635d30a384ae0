"""Options several `gctl` commands share, and the one way a command fails.

Typer and the standard library only: the CLI's top level stays light (see gctl/cli/main.py).
"""

import sys
from typing import Annotated, NoReturn

import typer

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


def _checked_namespace(value: str | None) -> str | None:
    """A namespace names directories on every node (its Jobs' logs), so it is checked where it
    is given, for every command, as Kubernetes checks one: a DNS-1123 label."""
    if value is None:
        return None
    from gctl.api import names  # plain regular expressions: nothing heavy

    try:
        return names.check_dns_label(value)
    except ValueError as exc:
        fail(f"-n/--namespace: {exc}")


NamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "-n", "--namespace", help="Namespace (default: default).", callback=_checked_namespace
    ),
]
AllNamespacesOpt = Annotated[
    bool, typer.Option("-A", "--all-namespaces", help="Across all namespaces.")
]
OutputOpt = Annotated[str, typer.Option("-o", "--output", help="wide | yaml | json | name.")]
SelectorOpt = Annotated[
    str | None, typer.Option("-l", "--selector", help="Label selector, e.g. team=nlp,env!=prod.")
]


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)
