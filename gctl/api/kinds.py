"""The registry of kinds: their names, the words users type for them, and where their models live.

Plain data, no pydantic: `gctl get` resolves `jobs` without loading any model. `model()` imports
a kind's pydantic model when a command needs it, and `malformed()` checks a stored object
against it.
"""

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from gctl.api import errors

if TYPE_CHECKING:
    from gctl.api import meta

API_VERSION: Final = "gctl/v1"
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class KindInfo:
    kind: str
    plural: str
    namespaced: bool
    aliases: tuple[str, ...]
    module: str  # where the pydantic model of the same name lives


JOB = KindInfo("Job", "jobs", True, ("job",), "gctl.api.job")
GPUPOOL = KindInfo("GPUPool", "gpupools", False, ("gpupool", "pool", "pools"), "gctl.api.pool")
NODE = KindInfo("Node", "nodes", False, ("node", "no"), "gctl.api.node")
BINDING = KindInfo("Binding", "bindings", True, ("binding",), "gctl.api.binding")
EVENT = KindInfo("Event", "events", True, ("event", "ev"), "gctl.api.event")
GPUPROFILE = KindInfo(
    "GPUProfile", "gpuprofiles", False, ("gpuprofile", "profile", "profiles"), "gctl.api.profile"
)
SWEEP = KindInfo("Sweep", "sweeps", True, ("sweep",), "gctl.api.sweep")
APPLYSET = KindInfo("ApplySet", "applysets", False, ("applyset",), "gctl.api.applyset")

ALL: tuple[KindInfo, ...] = (JOB, SWEEP, GPUPOOL, GPUPROFILE, APPLYSET, NODE, BINDING, EVENT)
# Kinds a user may apply; Nodes, Bindings and Events are written by the agent and controller,
# ApplySets by `apply --applyset` and `sync`.
APPLIABLE: frozenset[str] = frozenset({JOB.kind, SWEEP.kind, GPUPOOL.kind, GPUPROFILE.kind})
BY_KIND: dict[str, KindInfo] = {info.kind: info for info in ALL}
_BY_WORD: dict[str, KindInfo] = {
    word: info for info in ALL for word in (*info.aliases, info.kind.lower(), info.plural)
}


def by_word(word: str, views: tuple[str, ...] = ()) -> KindInfo:
    """`jobs`, `job`, `job.gctl`, `pools` -> the kind; NotFound names the known words, and
    `views`: what the command also takes that is no stored kind (`get gpus`)."""
    key = word.lower().removesuffix(".gctl")
    try:
        return _BY_WORD[key]
    except KeyError:
        known = ", ".join((*(info.plural for info in ALL), *views))
        raise errors.NotFound(
            f'the server doesn\'t have a resource type "{word}" (known: {known})'
        ) from None


def model(kind: str) -> "type[meta.Resource]":
    """The pydantic model of a kind, imported on first use."""
    info = BY_KIND[kind]
    cls: type[meta.Resource] = getattr(importlib.import_module(info.module), info.kind)
    return cls


def malformed(kind: str, wire: dict[str, Any]) -> bool:
    """Whether an object of `kind` as stored (wire form) is not as gctl writes it: written by
    an older gctl under a rule since dropped, or edited by hand in the database. It does not
    validate, or only where pydantic would convert a value of another type (a time given as
    a number): it is checked strictly, as the JSON it is stored as. For the readers of plain
    stored data that failed on one: only such an object may be left out, or shown as stored;
    for one as gctl writes it, the failure is a bug of theirs. Loads the model, and pydantic,
    only now."""
    import json

    import pydantic

    try:
        model(kind).model_validate_json(json.dumps(wire, default=str), strict=True)
    except pydantic.ValidationError:
        return True
    return False
