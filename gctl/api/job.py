"""The Job kind: what to run, what it needs, and where its life stands."""

import os
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gctl.api import kinds, meta, quantity

JobPhase = Literal["Pending", "Scheduled", "Running", "Succeeded", "Failed"]
FINISHED_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})

# Held while a Job has attempts to stop or clean up: deleting it waits for its process to end.
FINALIZER = "gctl/attempts"

# Condition types and reasons, side by side as Kubernetes API types declare them.
CONDITION_SCHEDULED = "Scheduled"
CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"
CONDITION_SUSPENDED = "Suspended"
REASON_COMPLETED = "Completed"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_DEADLINE = "DeadlineExceeded"
REASON_BACKOFF = "BackOff"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_WAITING_DEPENDENCIES = "WaitingForDependencies"
REASON_DEPENDENCY_FAILED = "DependencyFailed"
REASON_DEPENDENCY_CYCLE = "DependencyCycle"  # on a dependsOn cycle: it could never start
REASON_PREEMPTED = "Preempted"
REASON_EVICTED = "Evicted"
REASON_GPU_MEMORY_EXCEEDED = "GPUMemoryExceeded"
REASON_PROFILE_NOT_FOUND = "GPUProfileNotFound"
REASON_POOL_NOT_FOUND = "GPUPoolNotFound"
REASON_SUCCESS_FILE_MISSING = "SuccessFileMissing"  # spec.successFile not written by the attempt
REASON_RERUN = "Rerun"
REASON_ATTEMPT_LOST = "AttemptLost"  # lost with its node, or gone from it; retried
REASON_ATTEMPT_FENCED = "AttemptFenced"  # stopped because its agent went silent; retried
# Attempts that end for these reasons go back to the queue without spending backoffLimit.
REQUEUE_REASONS: frozenset[str] = frozenset({REASON_PREEMPTED, REASON_EVICTED})

# `gctl rerun` (and apply's re-run on change) set ANNOTATION_RERUN to a fresh token; the Job
# controller runs the Job again once per token and records the token in status.rerun.
ANNOTATION_RERUN = "gctl/rerun"
ANNOTATION_RERUN_REASON = "gctl/rerun-reason"
# On a virtual node (`gctl agent run --simulate`) a Job "runs" for SIMULATED_DURATION seconds
# of simulated time (absent: 0) and ends with SIMULATED_EXIT_CODE (absent: 0); a real node
# ignores both. Checked when applied (`simulated_run`), and again by the virtual node.
ANNOTATION_SIMULATED_DURATION = "gctl/simulated-duration"
ANNOTATION_SIMULATED_EXIT_CODE = "gctl/simulated-exit-code"
MAX_EXIT_CODE = 255  # what a process's exit status holds

# The most nodes one multi-node Job may span.
MAX_NODES = 256

# Once a Job leaves Pending these spec fields are fixed: changing them means a new run.
IMMUTABLE_ONCE_STARTED: tuple[str, ...] = ("command", "resources", "placement")


def _check_command(value: object) -> object:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("must not be empty")
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError("must not be empty")
        if not all(isinstance(item, str) for item in value):
            raise ValueError("must be a list of strings (quote numbers) or one shell string")
        return value
    raise ValueError("must be a list of strings or one string run with /bin/sh -c")


def _check_memory(value: object) -> object:
    quantity.parse_bytes(value)
    return str(value) if isinstance(value, int) else value


def _check_gpus(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number: a fraction in (0,1] or a whole number of GPUs")
    quantity.check_gpus(value)  # an int as it is: one too large for a float is refused too
    return value


def _check_duration(value: int, info: ValidationInfo) -> int:
    """A deadline or TTL is at most a year in what users give; a stored one is read as it is
    (the Job and the scheduler cope with one no time can be added to)."""
    limit = quantity.MAX_DURATION_SECONDS
    if value > limit and meta.is_input(info):
        raise ValueError(f"must be less than or equal to {limit} ({limit // 86_400} days)")
    return value


Command = Annotated[list[str] | str, BeforeValidator(_check_command)]
MemoryQuantity = Annotated[str, BeforeValidator(_check_memory)]
Duration = Annotated[int, AfterValidator(_check_duration)]  # seconds
GPUCount = Annotated[
    float,
    BeforeValidator(_check_gpus),
    PlainSerializer(lambda value: int(value) if value == int(value) else value),
]


class Resources(meta.Model):
    """What a Job needs. Fields left out come from the named GPUProfile, then the defaults
    (one whole GPU, any model, no memory declared)."""

    gpus: GPUCount | None = None
    gpu_memory: MemoryQuantity | None = None
    gpu_model: str | None = Field(default=None, min_length=1)
    profile: meta.DNSSubdomain | None = None
    # A multi-node Job (Slurm's --nodes, a PyTorchJob's replicas): this many nodes at once,
    # `gpus` whole GPUs on each, started together and ended together. Absent: one node.
    nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)

    @model_validator(mode="after")
    def _default_count(self) -> "Resources":
        """One GPU unless a profile says otherwise: `gpus: 1` and no `gpus` are the same Job."""
        if self.gpus is None and self.profile is None:
            self.gpus = 1
        return self

    def node_count(self) -> int:
        """The nodes the Job runs on at once: one unless it is a multi-node Job."""
        return self.nodes or 1

    def gpu_count(self) -> float:
        """The GPUs asked for, before any profile is applied."""
        return 1.0 if self.gpus is None else self.gpus

    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory is None else quantity.parse_bytes(self.gpu_memory)


class StopWarning(meta.Model):
    """A signal sent this many seconds before a stop's SIGTERM (Slurm's --signal=USR1@60), so a
    job can checkpoint before it is preempted, evicted or reaches its deadline."""

    signal: str = "SIGUSR1"
    seconds: int = Field(default=60, gt=0, le=86_400)

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        return signal_name(value)


def signal_name(value: str) -> str:
    """`usr1`, `SIGUSR1` or `10` -> `SIGUSR1`; ValueError names the choices."""
    import signal as signals

    text = value.strip().upper()
    if text.isdigit():
        try:
            return signals.Signals(int(text)).name
        except ValueError:
            pass
    else:
        name = text if text.startswith("SIG") else f"SIG{text}"
        if name in signals.Signals.__members__ and name not in ("SIGKILL", "SIGSTOP"):
            return name
    raise ValueError(
        f"{value!r} is not a signal a job can catch: use e.g. SIGUSR1, SIGINT, SIGTERM"
    )


class Placement(meta.Model):
    """Pinning: run on this node (or on some of `nodes`) and/or on these GPU indices. As many
    GPUs as the Job asks for pin it to them; more are the GPUs it may use, the scheduler
    choosing among them (the allowed-GPU lists of the schedulers gctl replaces, `0-3` for a
    1-GPU job). A multi-node Job's `gpus` are the indices it may use on each of its nodes, and
    its `nodes` the nodes it may use (as many as it asks for pin it to them)."""

    node: meta.DNSSubdomain | None = None
    nodes: list[meta.DNSSubdomain] | None = Field(default=None, min_length=1)
    gpus: list[Annotated[int, Field(ge=0)]] | None = None

    @field_validator("nodes")
    @classmethod
    def _distinct_nodes(cls, nodes: list[str] | None) -> list[str] | None:
        if nodes is not None and len(set(nodes)) != len(nodes):
            raise ValueError("lists a node twice")
        return nodes

    @model_validator(mode="after")
    def _node_or_nodes(self) -> "Placement":
        if self.node is not None and self.nodes is not None:
            raise meta.FieldError("nodes", "give node (one) or nodes (a list), not both")
        return self

    def allowed_nodes(self) -> list[str] | None:
        """The nodes the Job may run on, if pinned to some."""
        if self.node is not None:
            return [self.node]
        return self.nodes

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, gpus: list[int] | None) -> list[int] | None:
        if gpus is not None and len(set(gpus)) != len(gpus):
            raise ValueError("lists a GPU index twice")
        return gpus


class JobSpec(meta.Model):
    command: Command
    working_dir: str | None = None
    env: dict[meta.EnvName, str] = Field(default_factory=dict)
    conda_env: str | None = Field(default=None, min_length=1)
    resources: Resources = Field(default_factory=Resources)
    pool: meta.DNSSubdomain | None = None
    priority: int = Field(default=0, ge=-(10**9), le=10**9)
    placement: Placement | None = None
    backoff_limit: int = Field(default=0, ge=0, le=1000)
    active_deadline_seconds: Duration | None = Field(default=None, gt=0)
    ttl_seconds_after_finished: Duration | None = Field(default=None, ge=0)
    depends_on: list[meta.DNSLabel] = Field(default_factory=list)
    suspend: bool = False
    gpu_env: meta.EnvName = "CUDA_VISIBLE_DEVICES"
    preemptible: bool = True  # a higher-priority Job may stop this one and requeue it
    stop_warning: StopWarning | None = None
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=86_400)
    # What apply does with a change to command, resources or placement once started: Refuse
    # (say so), or Rerun (stop the run, start the new spec). Unset: its ApplySet's policy.
    on_spec_change: Literal["Refuse", "Rerun"] | None = None
    # A file the job writes when it is done: if set, it alone decides success (relative to
    # workingDir, else the agent's directory; it must be written after the attempt started).
    success_file: str | None = Field(default=None, min_length=1)

    @field_validator("placement")
    @classmethod
    def _pinned_gpus_match_request(
        cls, placement: Placement | None, info: ValidationInfo
    ) -> Placement | None:
        resources = info.data.get("resources")
        if placement is None or placement.gpus is None or not isinstance(resources, Resources):
            return placement
        if resources.gpus is None and resources.profile is not None:
            return placement  # the profile decides the count; the scheduler checks the pin
        count = resources.gpu_count()
        problem = pin_problem(len(placement.gpus), count)
        if problem is not None:
            raise ValueError(
                f"gpus lists {len(placement.gpus)} GPU(s) but resources.gpus {problem}"
            )
        return placement

    @model_validator(mode="after")
    def _multi_node(self) -> "JobSpec":
        """A multi-node Job takes whole GPUs on each node, and as many nodes as it asks for."""
        nodes = self.resources.node_count()
        gpus = self.resources.gpus
        if nodes > 1 and gpus is not None and (gpus < 1 or gpus != int(gpus)):
            raise meta.FieldError(
                "resources.gpus",
                f"a Job on {nodes} nodes takes whole GPUs on each: give 1 or more (not "
                f"{quantity.format_gpus(gpus)})",
            )
        placement = self.placement
        allowed = None if placement is None else placement.allowed_nodes()
        if allowed is not None and len(allowed) < nodes:
            field = "placement.node" if placement and placement.node else "placement.nodes"
            raise meta.FieldError(
                field,
                f"lists {len(allowed)} node(s) but resources.nodes asks for {nodes}: list at "
                f"least {nodes} in placement.nodes",
            )
        return self

    @field_validator("depends_on")
    @classmethod
    def _distinct_dependencies(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("names a Job twice")
        return names


def absolute(path: str | None, directory: meta.Directory, field: str) -> str | None:
    """`path` made absolute against `directory()` (the manifest's) if it is relative, as docker
    compose and kustomize read a path in a file: what it means then does not depend on where
    the daemon that uses it was started. Absent, empty (the agent's directory) or starting with
    `~` (left to whoever reads it, as written), it stays as it is."""
    if not path or os.path.isabs(path) or path.startswith("~"):
        return path
    base = directory()
    if base is None:
        raise meta.FieldError(
            field, f"{path!r} is relative, but the current directory is gone: give an absolute path"
        )
    return os.path.normpath(os.path.join(base, path))


def pin_problem(listed: int, count: float) -> str | None:
    """What is wrong with `listed` pinned GPU indices for a Job of `count` GPUs, or None: it
    needs at least as many as it asks for (a fraction one), and a CPU-only Job none."""
    wanted = 1 if 0 < count < 1 else int(count)
    if wanted == 0 and listed:
        return "asks for 0: list none"
    if listed < wanted:
        return f"asks for {quantity.format_gpus(count)}: list at least {wanted}"
    return None


class JobStatus(meta.Model):
    phase: JobPhase = "Pending"
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)
    attempts: int = 0
    failed: int = 0  # attempts that failed; retries stop when it exceeds backoffLimit
    retry_after: datetime | None = None
    node: str | None = None
    gpus: list[int] | None = None
    nodes: list[str] | None = None  # a multi-node Job's nodes, by rank (`node` is rank 0's)
    start_time: datetime | None = None
    completion_time: datetime | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    # While Pending, where it can be told from declared deadlines or earlier runs: when it
    # should start. (Its place in the queue is worked out when printed: gctl.api.queue.)
    estimated_start_time: datetime | None = None
    preemptions: int = 0  # attempts stopped by preemption or eviction (not counted as failed)
    rerun: str | None = None  # the last metadata.annotations[gctl/rerun] token acted upon


class Job(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.JOB

    kind: Literal["Job"] = "Job"
    spec: JobSpec
    status: JobStatus = Field(default_factory=JobStatus)

    @model_validator(mode="after")
    def _simulation(self, info: ValidationInfo) -> "Job":
        """A manifest's simulation annotations, checked when applied; a stored Job's are the
        virtual node's to judge (it reports a bad one as the Job's start error)."""
        if info.context and info.context.get("input"):
            simulated_run(self.metadata.annotations)
        return self

    def waits_for(self) -> list[tuple[str, str]]:
        return [(f"spec.dependsOn[{i}]", name) for i, name in enumerate(self.spec.depends_on)]

    def resolve_paths(self, directory: meta.Directory) -> None:
        """A relative workingDir is the manifest's directory's (successFile and a relative
        command follow it, being relative to workingDir)."""
        if self.spec.working_dir:  # (a pydantic model's assignment costs, even unchanged)
            self.spec.working_dir = absolute(self.spec.working_dir, directory, "spec.workingDir")


def simulated_run(annotations: dict[str, str]) -> tuple[float, int]:
    """(seconds, exit code) of a Job's run on a virtual node, from its annotations: seconds a
    finite number from 0 to a year (as for a deadline: more is a typo, or no end at all), the
    exit code a whole number from 0 to 255. meta.FieldError names a bad one."""
    duration_field = f"metadata.annotations[{ANNOTATION_SIMULATED_DURATION}]"
    text = annotations.get(ANNOTATION_SIMULATED_DURATION, "0")
    try:
        seconds = float(text)
    except ValueError:
        raise meta.FieldError(duration_field, f"{text!r} is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):  # NaN fails this too
        raise meta.FieldError(
            duration_field, f"{seconds!r} is not a finite, non-negative number of seconds"
        )
    if seconds > quantity.MAX_DURATION_SECONDS:
        raise meta.FieldError(
            duration_field,
            f"{seconds:g} is more than a year ({quantity.MAX_DURATION_SECONDS} seconds)",
        )
    text = annotations.get(ANNOTATION_SIMULATED_EXIT_CODE, "0")
    try:
        code = int(text)
    except ValueError:
        code = -1
    if not 0 <= code <= MAX_EXIT_CODE:
        raise meta.FieldError(
            f"metadata.annotations[{ANNOTATION_SIMULATED_EXIT_CODE}]",
            f"{text!r} is not an exit code: give a whole number from 0 to {MAX_EXIT_CODE}",
        )
    return seconds, code


def rerun_requested(j: Job) -> str | None:
    """The token of a re-run asked for and not yet acted upon, if any."""
    token = j.metadata.annotations.get(ANNOTATION_RERUN)
    return token if token and token != j.status.rerun else None


def has_started(status: dict[str, Any]) -> bool:
    """A Job has started once it left Pending or made an attempt."""
    return status.get("phase", "Pending") != "Pending" or int(status.get("attempts", 0)) > 0
