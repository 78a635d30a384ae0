"""The Node kind: a GPU host as its agent registers and reports it."""

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from gctl.api import kinds, meta


class GPUProcess(meta.Model):
    """A process on a GPU that gctl did not start (someone's notebook)."""

    pid: int
    used_memory: int | None = None
    name: str | None = None


class GPUInfo(meta.Model):
    """One GPU as NVML reports it; a field the GPU does not support is None."""

    index: int
    uuid: str
    model: str
    memory_total: int | None = None
    memory_used: int | None = None
    utilization: int | None = None
    fake: bool = False
    processes: list[GPUProcess] = Field(default_factory=list)


class NodeSpec(meta.Model):
    unschedulable: bool = False
    cordoned_gpus: list[int] = Field(default_factory=list, alias="cordonedGPUs")
    draining_gpus: list[int] = Field(default_factory=list, alias="drainingGPUs")


class NodeStatus(meta.Model):
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)
    heartbeat_time: datetime | None = None
    hostname: str | None = None
    agent_version: str | None = None
    gpus: list[GPUInfo] = Field(default_factory=list)


class Node(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.NODE

    kind: Literal["Node"] = "Node"
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)
