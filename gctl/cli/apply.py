"""`gctl apply`, `gctl diff` and `gctl delete -f`: manifests against what the database holds.

The decision and its one-transaction write live in `gctl.store.applying`, shared with the
GitOps sync; this module is the CLI's side of them: the lines apply prints and diff's text.
"""

import difflib
from collections.abc import Sequence
from pathlib import Path

from gctl.api import applyset, errors, manifest, meta
from gctl.store import applying, applysets

# `gctl apply` (gctl.cli.commands) calls the engine through this module: it chooses whether the
# driver alone or the Store does the work.
apply_at = applying.apply_at


def set_options(
    name: str | None, prune: bool, on_spec_change: str | None, files: Sequence[str]
) -> applying.SetOptions | None:
    """`--applyset NAME [--prune] [--on-spec-change P]` as the engine takes them."""
    if name is None:
        if prune:
            raise errors.Invalid(
                "--prune needs --applyset NAME: gctl prunes only the objects a set applied"
            )
        if on_spec_change is not None:
            raise errors.Invalid(
                "--on-spec-change needs --applyset NAME; a Job can say spec.onSpecChange itself"
            )
        return None
    policy = checked_set_flags(name, on_spec_change)
    sources = [f if f == manifest.STDIN else str(Path(f).resolve()) for f in files]
    return applying.SetOptions(
        name=name, prune=prune, on_spec_change=policy, source=", ".join(sources)
    )


def checked_set_flags(name: str, on_spec_change: str | None) -> applyset.OnSpecChange | None:
    """`--applyset NAME` and `--on-spec-change P`, as `apply` and `sync` both take them."""
    try:
        applyset.check_name(name)
    except ValueError as exc:
        raise errors.Invalid(f"--applyset: {exc}") from None
    try:
        return applyset.policy(on_spec_change) if on_spec_change is not None else None
    except ValueError as exc:
        raise errors.Invalid(f"--on-spec-change: {exc}") from None


def line(action: applying.Action, obj: meta.Resource, suffix: str) -> str:
    """`job.gctl/hello created`, `job.gctl/old pruned (dry run)`, and why a Job runs again."""
    why = f" (rerun: {action.rerun})" if action.rerun else ""
    return f"{obj.ref()} {action.verb}{why}{suffix}"


def diff(
    url: str,
    manifests: Sequence[manifest.Manifest],
    force: bool,
    options: applying.SetOptions | None = None,
) -> str:
    """A unified diff of each object as stored against what apply would make it; a pruned
    object is diffed against nothing."""
    actions = applying.decide_at(url, manifests, force, options)
    chunks: list[str] = []
    for action in actions:
        if action.verb == "unchanged":
            continue
        name = "/".join(part for part in applysets.key_of(action.desired) if part)
        before = _diffable(action.current) if action.current and action.verb != "replaced" else ""
        after = "" if action.verb == "pruned" else _diffable(action.desired)
        chunks.extend(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"live/{name}" if action.current else "/dev/null",
                tofile="/dev/null" if action.verb == "pruned" else f"merged/{name}",
            )
        )
    return "".join(chunks)


def _diffable(obj: meta.Resource) -> str:
    """The object as it would read after apply, without fields that apply does not decide."""
    from gctl.cli import printers

    wire = obj.wire()
    metadata = {
        k: v
        for k, v in wire["metadata"].items()
        if k in ("name", "namespace", "labels", "annotations")
    }
    document = {
        "apiVersion": wire["apiVersion"],
        "kind": wire["kind"],
        "metadata": metadata,
        "spec": wire["spec"],
    }
    return printers.dump_yaml(document)
