"""ApplySet: a named set of objects applied together (`apply --applyset`, `sync`).

Every member carries the label `gctl/applyset: NAME`; pruning deletes members that are gone
from the input and never touches anything without that label. The spec says where the set
comes from and what to do when a started Job's frozen fields change; the status says how the
last sync went. `locate` turns a manifest error into file, line and field for the status.
"""

import hashlib
import re
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import Field

from gctl.api import kinds, meta, names

LABEL = "gctl/applyset"  # on every member: its set's name

OnSpecChange = Literal["Refuse", "Rerun"]
REFUSE: OnSpecChange = "Refuse"
RERUN: OnSpecChange = "Rerun"

# Condition type and reasons, side by side.
CONDITION_SYNCED = "Synced"
REASON_APPLIED = "Applied"
REASON_INVALID_MANIFEST = "InvalidManifest"
REASON_APPLY_REFUSED = "ApplyRefused"
# Event reasons.
REASON_DRIFT_REVERTED = "DriftReverted"
REASON_PRUNED = "Pruned"


class ApplySetSpec(meta.Model):
    source: str | None = None  # the directory or files applied, as absolute paths
    on_spec_change: OnSpecChange = REFUSE  # for members' started Jobs; a Job's own field wins


class MemberRef(meta.Model):
    kind: str
    namespace: str | None = None
    name: str

    def ref(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind.lower()}.gctl/{where}{self.name}"


class SourceError(meta.Model):
    """Why the last sync applied nothing: where in the source, and what."""

    file: str | None = None
    line: int | None = None
    field: str | None = None
    message: str  # the whole line, as printed


class ApplySetStatus(meta.Model):
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)
    last_sync_time: datetime | None = None  # the last pass that applied, or tried to
    last_applied_time: datetime | None = None  # the last pass that applied
    source_hash: str | None = None  # sha256 of the files last applied
    summary: str | None = None  # "2 created, 1 configured, 1 pruned"
    members: list[MemberRef] = Field(default_factory=list)
    last_error: SourceError | None = None
    drift_reverted: int = 0  # changes made by hand that a sync put back


class ApplySet(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.APPLYSET

    kind: Literal["ApplySet"] = "ApplySet"
    spec: ApplySetSpec = Field(default_factory=ApplySetSpec)
    status: ApplySetStatus = Field(default_factory=ApplySetStatus)


def check_name(name: str) -> str:
    """An ApplySet's name is also its members' label value: a DNS-1123 subdomain of at most
    63 characters. ValueError says why not."""
    names.check_dns_subdomain(name)
    names.check_label_value(name)
    return name


def name_for_directory(directory: str) -> str:
    """`sync ~/Experiments/LLM_runs/` -> `llm-runs`: the default set name of a directory."""
    base = directory.rstrip("/").rsplit("/", 1)[-1].lower()
    text = re.sub(r"[^a-z0-9.-]+", "-", base)
    text = re.sub(r"-{2,}", "-", text)[:63].strip("-.")
    return text or "sync"


def source_hash(texts: list[str]) -> str:
    """A short digest of the files a sync applied, in their order: did the source change?"""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()[:16]


def policy(value: str) -> OnSpecChange:
    """`rerun`, `Rerun` -> `Rerun`; ValueError names the choices."""
    for choice in (REFUSE, RERUN):
        if value.lower() == choice.lower():
            return choice
    raise ValueError(f"{value!r} is not a policy: use Refuse or Rerun")


def effective_policy(job_policy: str | None, set_policy: str | None) -> OnSpecChange:
    """A Job's own `onSpecChange` wins; else its set's; else the safe refusal."""
    return policy(job_policy or set_policy or REFUSE)


# -- where a manifest error is ----------------------------------------------------------------

_DOCUMENT = re.compile(r"^document (?P<document>\d+)(?: \((?P<what>[^)]*)\))?: (?P<rest>.*)$")
_YAML_LINE = re.compile(r"^line (?P<line>\d+), column \d+: ")
_FIELD = re.compile(r"^(?P<field>[A-Za-z_][\w./\[\]-]*): ")


def locate(file: str, text: str, message: str) -> SourceError:
    """Split `manifest`'s one-line error about `file` into file, line and field.

    The line of a field is found by walking the YAML document's nodes along the field path;
    an invalid YAML error carries its own line."""
    rest = message.removeprefix(f"{file}: ")
    matched = _DOCUMENT.match(rest)
    if matched is None:
        return SourceError(file=file, message=message)
    detail = matched["rest"]
    if (yaml_line := _YAML_LINE.match(detail)) is not None:
        line = int(yaml_line["line"])
        return SourceError(file=file, line=line, message=_with_line(message, file, line))
    field_match = _FIELD.match(detail)
    if field_match is None:
        return SourceError(file=file, message=message)
    field = field_match["field"]
    at = field_line(text, int(matched["document"]), field)
    return SourceError(file=file, line=at, field=field, message=_with_line(message, file, at))


def _with_line(message: str, file: str, line: int | None) -> str:
    if line is None or not message.startswith(f"{file}: "):
        return message
    return f"{file}:{line}: " + message.removeprefix(f"{file}: ")


_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def field_line(text: str, document: int, field: str) -> int | None:
    """The 1-based line of `field` (`spec.resources.gpus`, `items[0].spec`) in a document,
    or of the deepest part of it that exists; None if the text does not compose."""
    import yaml

    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    # compose_all yields empty documents too, so its count is manifest.parse's.
    node: Any = nodes[document - 1] if 0 < document <= len(nodes) else None
    if node is None:
        return None
    line: int = node.start_mark.line + 1
    for name, index in _PART.findall(field):
        child = _child(node, name, int(index) if index else None)
        if child is None:
            break
        key_node, node = child
        line = key_node.start_mark.line + 1
    return line


def _child(node: Any, name: str, index: int | None) -> tuple[Any, Any] | None:
    """(the node that names the child, the child) of a mapping key or sequence index."""
    import yaml

    if index is not None and isinstance(node, yaml.SequenceNode):
        return (node.value[index], node.value[index]) if index < len(node.value) else None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == name:
                return key, value
    return None
