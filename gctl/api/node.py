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
    processes: list[GPUProcess] = Field(default_factory=list)  # not started by gctl
    # GPUs of this node linked to this one by NVLink or one PCIe switch (NVML topology).
    peers: list[int] = Field(default_factory=list)

    def foreign_memory(self) -> int:
        """GPU memory held by processes gctl did not start."""
        return sum(p.used_memory or 0 for p in self.processes)


class NodeSpec(meta.Model):
    """Written by `gctl cordon`, `drain` and `uncordon`: cordoned GPUs take no new jobs;
    draining ones take none either and are Drained once their running jobs ended."""

    unschedulable: bool = False  # the whole node is cordoned
    draining: bool = False  # the whole node is draining
    cordoned_gpus: list[int] = Field(default_factory=list, alias="cordonedGPUs")
    draining_gpus: list[int] = Field(default_factory=list, alias="drainingGPUs")

    def closed(self, index: int) -> bool:
        """Whether GPU `index` takes no new work."""
        return self.gpu_state(index) is not None

    def gpu_state(self, index: int) -> str | None:
        """ "Draining" for a draining GPU, "Cordoned" for a cordoned one, else None."""
        if self.draining or index in self.draining_gpus:
            return "Draining"
        if self.unschedulable or index in self.cordoned_gpus:
            return "Cordoned"
        return None


# An agent is taken to be gone once this many of its heartbeat intervals pass without one (and
# at least SILENT_MIN_S): a slow pass or a database hiccup delays one beat, not three.
SILENT_AFTER_BEATS = 3
SILENT_MIN_S = 10.0


class AgentInstance(meta.Model):
    """The agent process that heartbeats a Node: one at a time, as one kubelet per node. A
    second agent for the node refuses a Node whose heartbeat looks fresh, and takes it over
    only once the heartbeat stood still for `gone_after` (nodeagent/ownership.py)."""

    id: str  # random, new at every start
    hostname: str
    pid: int
    started: datetime
    heartbeat_seconds: float  # how often it heartbeats: how soon its silence means it is gone
    # Its --fence-after and --grace-period: how long its jobs may outlive its last heartbeat.
    # None in a record of an agent older than these fields (and a fence of 0: none).
    fence_seconds: float | None = None
    grace_seconds: float | None = None

    def silent_after(self) -> float:
        """Seconds without a heartbeat after which this agent is taken to be gone."""
        return max(SILENT_AFTER_BEATS * self.heartbeat_seconds, SILENT_MIN_S)

    def gone_after(self) -> float:
        """Seconds without a heartbeat after which neither this agent nor its jobs run: its
        silence window, or, where longer, its fence (its supervisors stop the jobs once its
        lease, renewed after each heartbeat, is that old), their grace period (SIGTERM, then
        SIGKILL) and one more heartbeat's interval for the stop to be recorded. Another agent
        that took the Node over sooner would report those attempts lost while they still run
        on the silent agent's host, and their Jobs would run twice."""
        outlive = self.jobs_outlive()
        return self.silent_after() if outlive is None else max(self.silent_after(), outlive)

    def jobs_outlive(self) -> float | None:
        """Seconds its jobs may still run after its last heartbeat: its fence, their grace
        period and one more heartbeat's interval (the lease is renewed after each heartbeat).
        None without a fence: they run on for as long as they run."""
        if not self.fence_seconds:
            return None
        return self.fence_seconds + (self.grace_seconds or 0.0) + self.heartbeat_seconds


class NodeStatus(meta.Model):
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)
    heartbeat_time: datetime | None = None
    hostname: str | None = None
    # Where other nodes reach this one (its agent's --address): a multi-node Job's rank 0 here
    # is its members' MASTER_ADDR. None: its hostname.
    address: str | None = None
    agent_version: str | None = None
    agent_instance: AgentInstance | None = None
    # Its last agent's `AgentInstance.jobs_outlive`, kept when that agent lets go of the Node
    # (its jobs run on without it): the controller retries the attempts of a silent node only
    # once they are sure to have stopped, not at its node timeout alone (controller/nodes.py).
    jobs_outlive_seconds: float | None = None
    gpus: list[GPUInfo] = Field(default_factory=list)


class Node(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.NODE

    kind: Literal["Node"] = "Node"
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)
