"""What every object shares: apiVersion and kind, metadata, conditions, and the name rules."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo
from pydantic.alias_generators import to_camel

from gctl.api import kinds, names

API_VERSION: Final = kinds.API_VERSION
DEFAULT_NAMESPACE = kinds.DEFAULT_NAMESPACE
# The directory of the manifest an object came from, worked out when first asked for (None:
# the current directory is gone): `Resource.resolve_paths`.
Directory = Callable[[], str | None]


# The validation context of what a user gives: a manifest (apply, diff, sync) or `gctl run`, all
# read by `manifest.parse`. A limit added after objects were stored holds for these only, so
# that an object an older gctl stored under a looser one still reads: it runs, shows, deletes.
INPUT: Final[dict[str, bool]] = {"input": True}


def is_input(info: ValidationInfo) -> bool:
    """Whether the object being validated is a user's input rather than a stored object."""
    return isinstance(info.context, dict) and bool(info.context.get("input"))


class FieldError(ValueError):
    """A validator's complaint about one part of the value it checks: `path` (`items[1]`,
    `template.spec.command`) is joined to the field's own path in the one-line message."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def utcnow() -> datetime:
    return datetime.now(UTC)


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        names.check_label_key(key)
        names.check_label_value(value)
    return labels


DNSLabel = Annotated[str, AfterValidator(names.check_dns_label)]
DNSSubdomain = Annotated[str, AfterValidator(names.check_dns_subdomain)]
EnvName = Annotated[str, AfterValidator(names.check_env_name)]
Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]


class Model(BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python, unknown fields refused.

    Manifests are validated with `by_name=False`, so users must write the camelCase names.
    """

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class OwnerReference(Model):
    """The object this one belongs to (a Sweep's Jobs name their Sweep): deleting the owner
    deletes what it owns. Server-side, like finalizers: never taken from a manifest."""

    kind: str
    name: str
    uid: str
    controller: bool = True  # the owner's controller manages this object


class ObjectMeta(Model):
    name: str
    namespace: str | None = None
    labels: Labels = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Model):
    """Shaped like a Kubernetes condition; the transition time moves only when status flips."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    *,
    generation: int | None = None,
    now: datetime | None = None,
) -> bool:
    """Set a condition in place; return whether anything changed."""
    for index, existing in enumerate(conditions):
        if existing.type != type_:
            continue
        flipped = existing.status != status
        changed = flipped or (existing.reason, existing.message, existing.observed_generation) != (
            reason,
            message,
            generation,
        )
        if changed:
            conditions[index] = Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=(
                    (now or utcnow()) if flipped else existing.last_transition_time
                ),
                observed_generation=generation,
            )
        return changed
    conditions.append(
        Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=now or utcnow(),
            observed_generation=generation,
        )
    )
    return True


class Resource(Model):
    """One stored object. Subclasses fix `kind` and type `spec` and `status`."""

    INFO: ClassVar[kinds.KindInfo]
    KIND: ClassVar[str]
    PLURAL: ClassVar[str]
    NAMESPACED: ClassVar[bool]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        info = cls.__dict__.get("INFO")
        if info is not None:  # the registry is the one place a kind's names are written
            cls.KIND, cls.PLURAL, cls.NAMESPACED = info.kind, info.plural, info.namespaced

    api_version: Literal["gctl/v1"] = API_VERSION
    kind: str
    metadata: ObjectMeta
    spec: Any
    status: Any

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or ""

    def ref(self) -> str:
        """`job.gctl/hello`, as kubectl names objects in its messages."""
        return f"{self.KIND.lower()}.gctl/{self.metadata.name}"

    def waits_for(self) -> list[tuple[str, str]]:
        """(field path, name) of each Job or Sweep of its namespace that this object waits
        for: a Job's or a Sweep's dependsOn; nothing for other kinds."""
        return []

    def resolve_paths(self, directory: Directory) -> None:
        """Make the relative paths of its spec absolute against `directory()`, the directory
        of the manifest it came from (None: not known, the current directory being gone),
        asked for only where a path is relative; only a Job's and a Sweep's have paths."""

    def wire(self) -> dict[str, Any]:
        """The object as stored and printed: camelCase, without None or empty fields."""
        wire: dict[str, Any] = prune(self.model_dump(mode="json", by_alias=True, exclude_none=True))
        return wire


def prune(value: Any) -> Any:
    """Drop empty mappings and lists, as Kubernetes' `omitempty` does; keep the empty status."""
    if type(value) is dict:
        return _pruned_dict(value)
    if type(value) is list:
        return _pruned_list(value)
    return value


# What model_dump(mode="json") makes is plain dicts, lists and scalars: exact type checks, and
# calls only for containers (every object written or printed goes through here: 30 of the 42 us
# of a Job's `wire()` when this called itself for every value).
_KEPT_EMPTY = ("spec", "status")


def _pruned_dict(value: dict[str, Any]) -> dict[str, Any]:
    kept = {}
    for key, item in value.items():
        kind = type(item)
        if kind is dict:
            pruned: Any = _pruned_dict(item)
        elif kind is list:
            pruned = _pruned_list(item)
        else:
            kept[key] = item
            continue
        if pruned or key in _KEPT_EMPTY:
            kept[key] = pruned
    return kept


def _pruned_list(value: list[Any]) -> list[Any]:
    return [
        _pruned_dict(item)
        if type(item) is dict
        else _pruned_list(item)
        if type(item) is list
        else item
        for item in value
    ]
