"""Field selectors as kubectl takes them: `status.phase=Running,spec.pool!=a100`.

`gctl get jobs --field-selector status.phase!=Succeeded` is the queue as squeue shows it: what
a label cannot say, since gctl writes the phase. As in Kubernetes, each kind offers a few
fields (those a user filters a long list by), with `=`, `==` and `!=`; a field without a value
matches the empty string, and a field the kind does not offer is refused, so that a typo never
reads as "nothing matches". A field stored only when it is not its default (a Job's
`spec.pool`) reads as its default, as the tables show it: `spec.pool=default` matches a Job
that names no pool.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gctl.api import errors, kinds, queue

_COMMON = ("metadata.name", "metadata.namespace")
SUPPORTED: dict[str, tuple[str, ...]] = {
    kinds.JOB.kind: (*_COMMON, "spec.pool", "status.phase", "status.node", "status.reason"),
    kinds.SWEEP.kind: (*_COMMON, "status.phase", "status.reason"),
    kinds.BINDING.kind: (*_COMMON, "spec.jobName", "spec.node", "status.phase"),
    kinds.EVENT.kind: (
        *_COMMON,
        "spec.type",
        "spec.reason",
        "spec.involvedObject.kind",
        "spec.involvedObject.name",
    ),
}

# Fields left out of a stored object where they hold their default, and that default.
_DEFAULTS = {(kinds.JOB.kind, "spec.pool"): queue.DEFAULT_POOL}

_TERM = re.compile(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*([^\s,]*)\s*$")


@dataclass(frozen=True)
class Term:
    path: tuple[str, ...]
    value: str
    equal: bool  # `=` or `==`; False for `!=`
    default: str = ""  # what the field reads as where the object leaves it out

    def matches(self, wire: Mapping[str, Any]) -> bool:
        found: Any = wire
        for key in self.path:
            found = found.get(key) if isinstance(found, Mapping) else None
        text = self.default if found is None else str(found)
        return (text == self.value) == self.equal


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[Term, ...]

    def matches(self, wire: Mapping[str, Any]) -> bool:
        return all(term.matches(wire) for term in self.terms)


def parse(text: str, info: kinds.KindInfo) -> FieldSelector:
    """The selector for objects of `info`'s kind; errors.Invalid naming the term at fault."""
    offered = SUPPORTED.get(info.kind, _COMMON)
    terms = []
    for part in (p for p in text.split(",") if p.strip()):
        match = _TERM.match(part)
        if match is None:
            raise errors.Invalid(
                f"--field-selector {part.strip()!r}: not a field selector; use field=value, "
                "field==value or field!=value"
            )
        field, operator, value = match.groups()
        if field not in offered:
            raise errors.Invalid(
                f"--field-selector {part.strip()!r}: {info.plural} have no field {field} to "
                f"select by (use {', '.join(offered)})"
            )
        default = _DEFAULTS.get((info.kind, field), "")
        terms.append(Term(tuple(field.split(".")), value, operator != "!=", default))
    return FieldSelector(tuple(terms))
