"""The Binding kind: one attempt of one Job on one node with specific GPUs."""

import hashlib
from collections.abc import Iterable
from datetime import datetime
from typing import ClassVar, Final, Literal

from pydantic import Field

from gctl.api import kinds, meta

# Pending: bound, not started; Armed: a queued attempt its agent has taken while the attempts
# before it still run, with a supervisor waiting to start it the moment they end (the
# scheduler asks for it back with spec.disarm); Starting: a queued attempt its agent has taken
# and is starting (the controller may no longer move it); Running: the process runs; Exited;
# Lost.
BindingPhase = Literal["Pending", "Armed", "Starting", "Running", "Exited", "Lost"]
ACTIVE_PHASES: frozenset[str] = frozenset({"Pending", "Armed", "Starting", "Running"})

# Why the controller asks the agent to stop an attempt (spec.stopReason).
STOP_DELETED = "Deleted"
STOP_DEADLINE = "DeadlineExceeded"
STOP_SUSPENDED = "Suspended"
STOP_PREEMPTED = "Preempted"  # a higher-priority Job needs the GPUs
STOP_EVICTED = "Evicted"  # `gctl drain --evict`
STOP_GPU_MEMORY = "GPUMemoryExceeded"  # used more GPU memory than it declared (pool enforces)
STOP_RERUN = "Rerun"  # `gctl rerun`: the Job starts again; not counted as a failure
# A multi-node attempt's member ended badly (failed, lost, stopped): the others stop too.
STOP_MEMBER_ENDED = "MemberEnded"

# Why an attempt ended without an outcome of its own (status.reason); none counts as a failure.
REASON_NODE_LOST = "NodeLost"  # Lost: the controller gave up on its node (silent, or deleted)
REASON_LOST = "Lost"  # Lost: its agent found it gone (its supervisor died without an exit)
REASON_FENCED = "Fenced"  # Exited: its supervisor stopped it because its agent went silent

# What the node saw of the Job's spec.successFile when the attempt exited (status.successFile).
SUCCESS_FILE_FOUND: Final = "Found"  # written (created or modified) after the attempt started
SUCCESS_FILE_MISSING: Final = "Missing"  # absent, or older than the attempt (a stale marker)
SuccessFile = Literal["Found", "Missing"]


class BindingSpec(meta.Model):
    """Written by the scheduler."""

    job_name: str
    job_uid: str = Field(alias="jobUID")
    attempt: int = Field(ge=1)
    node: str
    gpus: list[int] = Field(default_factory=list)
    gpu_share: float = Field(default=1.0, ge=0, le=1)  # of each GPU; 0 for a CPU-only job
    gpu_memory: int | None = None  # bytes of each GPU the job declared (resources.gpuMemory)
    # Stop the job when its processes use more GPU memory than gpu_memory (the pool says so).
    enforce_gpu_memory: bool = Field(default=False, alias="enforceGPUMemory")
    stop_reason: str | None = None  # set by the controller or `gctl drain`: stop this attempt
    # Bound ahead (a queued attempt): the uids of the attempts on its GPUs that must end before
    # it starts. Its agent starts it the moment they have, without a round trip through the
    # controller; until its agent takes it (phase Starting) the scheduler may move it.
    after: list[str] = Field(default_factory=list)
    # Set by the controller on an Armed attempt it wants back (to move it, give its place, or
    # because its Job changed): the agent takes it from its supervisor, if the job has not
    # started, and reports it Pending again; the agent neither takes nor arms it while set.
    disarm: bool = False
    # One member of a multi-node attempt (Job resources.nodes > 1): its rank, and every
    # member's node by rank (rank 0's first). The members are bound together, run together
    # and stopped together; the agent tells the process its rank and where rank 0 listens
    # (MASTER_ADDR, MASTER_PORT: `master_addr`, the hostname rank 0's node reports, and
    # `master_port`, the same for every member). Single-node attempts leave these unset.
    rank: int | None = Field(default=None, ge=0)
    members: list[str] = Field(default_factory=list)
    master_addr: str | None = None
    master_port: int | None = Field(default=None, ge=1, le=65535)


class BindingStatus(meta.Model):
    """Written by the node agent that runs the attempt."""

    phase: BindingPhase = "Pending"
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)
    pid: int | None = None
    start_time: datetime | None = None
    finish_time: datetime | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    log_path: str | None = None
    signal: str | None = None
    success_file: SuccessFile | None = None  # set only when the Job names a successFile


def name_of(job_name: str, attempt: int, rank: int = 0) -> str:
    """An attempt's Binding: `<job>-<attempt>`, a multi-node attempt's other members
    `<job>-<attempt>-r<rank>` (no other Job's attempt has that name: it ends in digits after
    its last `-`); so two passes cannot both bind it."""
    return f"{job_name}-{attempt}" if rank == 0 else f"{job_name}-{attempt}-r{rank}"


# Where rank 0 of a multi-node attempt listens (MASTER_PORT): torchrun's default, 29500, and
# the 999 ports above it, where clusters open their firewalls for it; all below Linux's
# ephemeral ports (32768 up), so an outgoing connection seldom holds one.
MASTER_PORTS = range(29500, 30500)


def master_port(job_uid: str) -> int:
    """The port rank 0 of the Job's attempts listens on: the same for every member (each works
    it out alone, from the uid), stable across processes and versions (a hash of the uid, not
    Python's salted `hash`), and spread over MASTER_PORTS so that two multi-node Jobs whose
    rank 0 share a host seldom ask for the same port (one in a thousand for two)."""
    digest = hashlib.sha256(job_uid.encode()).digest()
    return MASTER_PORTS.start + int.from_bytes(digest[:8], "big") % len(MASTER_PORTS)


def latest_attempt(attempts: Iterable["Binding"]) -> list["Binding"]:
    """The Bindings of the latest attempt among `attempts`: its one, or a multi-node attempt's
    members, by rank."""
    found = list(attempts)
    latest = max((b.spec.attempt for b in found), default=None)
    its = [b for b in found if b.spec.attempt == latest]
    return sorted(its, key=lambda b: b.spec.rank or 0)


def queued(spec: BindingSpec, status: BindingStatus) -> bool:
    """Bound ahead and not yet taken by its agent: it waits for the attempts in `after`, holds
    no GPU yet, and the scheduler may still move it."""
    return bool(spec.after) and status.phase == "Pending"


def armed(status: BindingStatus) -> bool:
    """Taken by its agent ahead of time: its supervisor waits for the attempts before it."""
    return status.phase == "Armed"


def movable(spec: BindingSpec, status: BindingStatus) -> bool:
    """Bound ahead and not started: queued, or armed (moved once its agent gives it back)."""
    return queued(spec, status) or (bool(spec.after) and armed(status))


def succeeded(status: BindingStatus) -> bool:
    """Whether an exited attempt did its work: its success file decides when the Job names
    one (a training script may exit non-zero in teardown after writing it), else exit code 0."""
    if status.success_file is not None:
        return status.success_file == SUCCESS_FILE_FOUND
    return status.exit_code == 0


class Binding(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.BINDING

    kind: Literal["Binding"] = "Binding"
    spec: BindingSpec
    status: BindingStatus = Field(default_factory=BindingStatus)
