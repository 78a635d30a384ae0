"""Label selectors as kubectl takes them: `a=b,c!=d,e,!f,g in (x,y),h notin (z)`."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gctl.api import errors, names

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQUALITY = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # in | notin | exists | !exists
    values: frozenset[str]

    def matches(self, labels: Mapping[str, Any]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        value = labels.get(self.key)
        found = value if isinstance(value, str) else None  # a stored value that is no text
        return (found in self.values) == (self.operator == "in")


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Any) -> bool:
        """Labels stored in a form that does not validate (written by an older gctl, or by
        hand) match as far as they are a map of text: what is no map is none."""
        found = labels if isinstance(labels, Mapping) else {}
        return all(requirement.matches(found) for requirement in self.requirements)


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def parse(text: str) -> Selector:
    requirements: list[Requirement] = []
    for part in _split(text):
        requirements.append(_requirement(part))
    return Selector(tuple(requirements))


def _requirement(part: str) -> Requirement:
    try:
        if match := _SET.match(part):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            for value in values:
                names.check_label_value(value)
            return Requirement(names.check_label_key(match.group(1)), match.group(2), values)
        if match := _EQUALITY.match(part):
            operator = "notin" if match.group(2) == "!=" else "in"
            value = names.check_label_value(match.group(3))
            return Requirement(names.check_label_key(match.group(1)), operator, frozenset({value}))
        if match := _EXISTS.match(part):
            operator = "!exists" if match.group(1) else "exists"
            return Requirement(names.check_label_key(match.group(2)), operator, frozenset())
    except ValueError as exc:
        raise errors.Invalid(f"-l {part.strip()!r}: {exc}") from None
    raise errors.Invalid(
        f"-l {part.strip()!r}: not a selector; use key=value, key!=value, key, !key, "
        "key in (a,b) or key notin (a,b)"
    )
