"""GPU discovery behind one small interface: NVML (nvidia-ml-py) on real hosts, fake GPUs elsewhere.

Fake GPUs are a feature, not a test double: users without NVIDIA GPUs run gctl on them. An NVML
field a GPU does not support becomes None; a GPU that fails to answer is reported, not fatal.

`discover()` lists every process on each GPU; the agent tells its own jobs' processes from the
others. A fake GPU "runs" any process whose environment says so: `GCTL_FAKE_GPU_MEMORY=20Gi`
(and optionally `GCTL_FAKE_GPU_UTIL=90`) with the GPU's index in `CUDA_VISIBLE_DEVICES` or
`GCTL_GPUS`, so that memory accounting, foreign processes and memory limits can be tried
without NVIDIA hardware. Several fake nodes on one host (an agent per node, to try multi-node
Jobs) each see such a process, unless its `GCTL_NODE` names one: then only that node does (a
job's is its own node's, which gctl sets).
"""

import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from gctl.api import node, quantity

log = logging.getLogger("gctl.agent")

DEFAULT_FAKE_GPUS = 4
DEFAULT_FAKE_MODEL = "Fake GPU"
DEFAULT_FAKE_MEMORY = "80Gi"
FAKE_MEMORY_ENV = "GCTL_FAKE_GPU_MEMORY"
FAKE_UTIL_ENV = "GCTL_FAKE_GPU_UTIL"
PROC = "/proc"


class Backend(Protocol):
    kind: str  # "nvml" or "fake"

    def discover(self) -> list[node.GPUInfo]: ...

    def close(self) -> None: ...


@dataclass
class FakeGPUs:
    count: int
    model: str = DEFAULT_FAKE_MODEL
    memory: int = quantity.parse_bytes(DEFAULT_FAKE_MEMORY)
    host: str = field(default_factory=socket.gethostname)
    kind: str = "fake"
    # this node's name: a process whose GCTL_NODE names another node is not on its GPUs
    node_name: str | None = None

    def discover(self) -> list[node.GPUInfo]:
        users = [
            (pid, name, indices, memory, util)
            for pid, name, indices, memory, util, where in _fake_gpu_users()
            if where is None or self.node_name is None or where == self.node_name
        ]
        gpus = []
        for i in range(self.count):
            processes = [
                node.GPUProcess(pid=pid, used_memory=memory, name=name)
                for pid, name, indices, memory, _ in users
                if i in indices
            ]
            busy = [util for _, _, indices, _, util in users if i in indices]
            gpus.append(
                node.GPUInfo(
                    index=i,
                    uuid=f"GPU-fake-{self.host}-{i}",
                    model=self.model,
                    memory_total=self.memory,
                    memory_used=min(self.memory, sum(p.used_memory or 0 for p in processes)),
                    utilization=min(100, sum(busy)),
                    fake=True,
                    processes=processes,
                )
            )
        return gpus

    def close(self) -> None:
        pass


class NVMLGPUs:
    kind = "nvml"

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml: Any = pynvml
        self._peers: dict[int, list[int]] | None = None

    def discover(self) -> list[node.GPUInfo]:
        nvml = self._nvml
        if self._peers is None:
            self._peers = self._topology()
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(self._describe(index, handle))
            except nvml.NVMLError as exc:  # a lost GPU is reported, not a crash
                log.warning("GPU %d does not answer NVML: %s", index, exc)
        return gpus

    def _describe(self, index: int, handle: Any) -> node.GPUInfo:
        nvml = self._nvml
        memory = self._field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        utilization = self._field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        running = self._field(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        return node.GPUInfo(
            index=index,
            uuid=str(nvml.nvmlDeviceGetUUID(handle)),
            model=str(nvml.nvmlDeviceGetName(handle)),
            memory_total=None if memory is None else int(memory.total),
            memory_used=None if memory is None else int(memory.used),
            utilization=None if utilization is None else int(utilization.gpu),
            processes=[
                node.GPUProcess(pid=int(p.pid), used_memory=_memory_of(p), name=_name_of(p.pid))
                for p in running
            ],
            peers=(self._peers or {}).get(index, []),
        )

    def _topology(self) -> dict[int, list[int]]:
        """For each GPU, the others it reaches over NVLink or through one PCIe switch: the
        ones a multi-GPU job would rather have together."""
        nvml = self._nvml
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as exc:
            log.warning("NVML topology unavailable: %s", exc)
            return {}
        peers: dict[int, list[int]] = {}
        for i, first in enumerate(handles):
            for j, second in enumerate(handles):
                if i != j and self._linked(first, second):
                    peers.setdefault(i, []).append(j)
        return peers

    def _linked(self, first: Any, second: Any) -> bool:
        nvml = self._nvml
        nvlink = self._field(
            lambda: nvml.nvmlDeviceGetP2PStatus(first, second, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        )
        if nvlink == nvml.NVML_P2P_STATUS_OK:
            return True
        level = self._field(lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(first, second))
        return level is not None and level <= nvml.NVML_TOPOLOGY_MULTIPLE

    def _field(self, read: Any) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _fake_gpu_users() -> list[tuple[int, str, set[int], int, int, str | None]]:
    """(pid, name, GPU indices, memory, utilization, the node its GCTL_NODE names) of processes
    that declare fake GPU use."""
    found = []
    try:
        pids = [int(entry) for entry in os.listdir(PROC) if entry.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as handle:
                raw = handle.read()
        except OSError:  # gone, or someone else's
            continue
        if FAKE_MEMORY_ENV.encode() not in raw:
            continue
        env = dict(
            item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if item
        )
        try:
            memory = quantity.parse_bytes(env[FAKE_MEMORY_ENV])
            util = int(env.get(FAKE_UTIL_ENV, "0"))
            listed = env.get("GCTL_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
            indices = {int(part) for part in listed.split(",") if part.strip().isdigit()}
        except (ValueError, KeyError):
            continue
        name = _name_of(pid) or ""
        found.append((pid, name, indices, memory, util, env.get("GCTL_NODE") or None))
    return found


def _memory_of(process: Any) -> int | None:
    used = getattr(process, "usedGpuMemory", None)
    return int(used) if isinstance(used, int) else None


def _name_of(pid: int) -> str | None:
    try:
        with open(f"{PROC}/{pid}/comm", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:  # another PID namespace, or gone
        return None


def detect(
    fake: int | None,
    model: str = DEFAULT_FAKE_MODEL,
    memory: str = DEFAULT_FAKE_MEMORY,
    node_name: str | None = None,
) -> tuple[Backend, str]:
    """The backend to use and a line saying which: NVML when it answers, else fake GPUs (of
    the node `node_name`)."""
    memory_bytes = quantity.parse_bytes(memory)
    if fake is not None:
        return (
            FakeGPUs(fake, model, memory_bytes, node_name=node_name),
            f"using {fake} fake GPU(s) ({model}, {memory})",
        )
    try:
        backend = NVMLGPUs()
        count = len(backend.discover())
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        return (
            FakeGPUs(DEFAULT_FAKE_GPUS, model, memory_bytes, node_name=node_name),
            f"NVML not available ({reason}): using {DEFAULT_FAKE_GPUS} fake GPUs ({model}, "
            f"{memory}); pass --fake-gpus N to choose how many",
        )
    if count == 0:
        backend.close()
        return (
            FakeGPUs(DEFAULT_FAKE_GPUS, model, memory_bytes, node_name=node_name),
            f"NVML found no GPUs: using {DEFAULT_FAKE_GPUS} fake GPUs",
        )
    return backend, f"NVML: {count} GPU(s)"
