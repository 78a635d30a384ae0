"""The GPUPool kind: a named set of GPUs, how jobs share them and how they are placed."""

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field

from gctl.api import kinds, meta, selection

# Index ranges are read in `selection` (free of pydantic, so the CLI shares it); also here.
expand_indices = selection.expand_indices


def _check_indices(value: object) -> object:
    items: list[object] = value if isinstance(value, list) else [value]
    checked: list[int | str] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise ValueError("must list GPU indices or ranges such as 0-3")
        if isinstance(item, int) and item < 0:
            raise ValueError("GPU indices are not negative")
        checked.append(item)
    expand_indices(checked)
    return checked


GPUIndices = Annotated[list[int | str], BeforeValidator(_check_indices)]


class PoolSelector(meta.Model):
    """Which GPUs belong to the pool; every given criterion must hold. Empty means all GPUs."""

    nodes: list[meta.DNSSubdomain] | None = Field(default=None, min_length=1)
    node_labels: meta.Labels | None = None
    gpu_model: str | None = Field(default=None, min_length=1)
    gpus: GPUIndices | None = Field(default=None, min_length=1)


class GPUPoolSpec(meta.Model):
    selector: PoolSelector = Field(default_factory=PoolSelector)
    # At most this many jobs share one GPU (their fractions still sum to at most 1).
    max_jobs_per_gpu: int | None = Field(default=None, ge=1, le=64, alias="maxJobsPerGPU")
    allow_fractions: bool = True
    policy: Literal["binpack", "spread"] = "binpack"
    # Among Jobs of equal priority: FIFO starts the oldest first; LongestFirst the one with the
    # longest activeDeadlineSeconds (none counts as longest), then the oldest (gctl.api.queue).
    queue_order: Literal["FIFO", "LongestFirst"] = "FIFO"
    # A pending Job may stop lower-priority preemptible Jobs when that is the only way it fits.
    preemption: bool = True
    # A job may start ahead of a blocked higher one when its deadline ends before that one
    # could start.
    backfill: bool = False
    # GPUs busier than this (as NVML reports them) take no new jobs.
    max_utilization_percent: int | None = Field(default=None, ge=0, le=100)
    max_memory_used_percent: int | None = Field(default=None, ge=0, le=100)
    # Stop a job whose processes use more GPU memory than its gpuMemory (GPUMemoryExceeded).
    enforce_gpu_memory: bool = Field(default=False, alias="enforceGPUMemory")
    # When every GPU a waiting Job could use is busy, bind it to the busy whole GPUs that free
    # soonest, queued behind their jobs: their agent starts it the moment they end.
    bind_ahead: bool = True


class GPUPoolStatus(meta.Model):
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)


class GPUPool(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.GPUPOOL

    kind: Literal["GPUPool"] = "GPUPool"
    spec: GPUPoolSpec = Field(default_factory=GPUPoolSpec)
    status: GPUPoolStatus = Field(default_factory=GPUPoolStatus)
