"""The GPUProfile kind: a named GPU requirement (`qwen2.5-7b-inst` -> 1 GPU with 24Gi), so a
Job can say `resources: {profile: qwen2.5-7b-inst}` instead of repeating the numbers."""

from typing import ClassVar, Literal

from pydantic import Field

from gctl.api import job, kinds, meta


class GPUProfileSpec(meta.Model):
    gpus: job.GPUCount = 1
    gpu_memory: job.MemoryQuantity | None = None  # per GPU
    gpu_model: str | None = Field(default=None, min_length=1)
    description: str | None = None


class GPUProfileStatus(meta.Model):
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)


class GPUProfile(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.GPUPROFILE

    kind: Literal["GPUProfile"] = "GPUProfile"
    spec: GPUProfileSpec = Field(default_factory=GPUProfileSpec)
    status: GPUProfileStatus = Field(default_factory=GPUProfileStatus)
