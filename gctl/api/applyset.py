"""ApplySet: a named set of objects applied together (`apply --applyset`, `sync`)."""

from typing import ClassVar, Literal

from pydantic import Field

from gctl.api import kinds, meta


class ApplySetSpec(meta.Model):
    pass


class ApplySetStatus(meta.Model):
    conditions: list[meta.Condition] = Field(default_factory=list)


class ApplySet(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.APPLYSET

    kind: Literal["ApplySet"] = "ApplySet"
    spec: ApplySetSpec = Field(default_factory=ApplySetSpec)
    status: ApplySetStatus = Field(default_factory=ApplySetStatus)
