"""Sweep: one Job per item, config file or matrix point, from a Job template."""

from typing import ClassVar, Literal

from pydantic import Field

from gctl.api import kinds, meta


class SweepSpec(meta.Model):
    pass


class SweepStatus(meta.Model):
    conditions: list[meta.Condition] = Field(default_factory=list)


class Sweep(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.SWEEP

    kind: Literal["Sweep"] = "Sweep"
    spec: SweepSpec = Field(default_factory=SweepSpec)
    status: SweepStatus = Field(default_factory=SweepStatus)
