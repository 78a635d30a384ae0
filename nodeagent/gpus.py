"""GPU discovery behind one small interface: NVML (nvidia-ml-py) on real hosts, fake GPUs elsewhere.

Fake GPUs are a feature, not a test double: users without NVIDIA GPUs run gctl on them. An NVML
field a GPU does not support becomes None; a GPU that fails to answer is reported, not fatal.
"""

import contextlib
import logging
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from gctl.api import node, quantity

log = logging.getLogger("gctl.agent")

DEFAULT_FAKE_GPUS = 4
DEFAULT_FAKE_MODEL = "Fake GPU"
DEFAULT_FAKE_MEMORY = "80Gi"


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

    def discover(self) -> list[node.GPUInfo]:
        return [
            node.GPUInfo(
                index=i,
                uuid=f"GPU-fake-{self.host}-{i}",
                model=self.model,
                memory_total=self.memory,
                memory_used=0,
                utilization=0,
                fake=True,
            )
            for i in range(self.count)
        ]

    def close(self) -> None:
        pass


class NVMLGPUs:
    kind = "nvml"

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml: Any = pynvml

    def discover(self) -> list[node.GPUInfo]:
        nvml = self._nvml
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
            processes=[node.GPUProcess(pid=int(p.pid), used_memory=_memory_of(p)) for p in running],
        )

    def _field(self, read: Any) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _memory_of(process: Any) -> int | None:
    used = getattr(process, "usedGpuMemory", None)
    return int(used) if isinstance(used, int) else None


def detect(
    fake: int | None, model: str = DEFAULT_FAKE_MODEL, memory: str = DEFAULT_FAKE_MEMORY
) -> tuple[Backend, str]:
    """The backend to use and a line saying which: NVML when it answers, else fake GPUs."""
    memory_bytes = quantity.parse_bytes(memory)
    if fake is not None:
        return FakeGPUs(fake, model, memory_bytes), f"using {fake} fake GPU(s) ({model}, {memory})"
    try:
        backend = NVMLGPUs()
        count = len(backend.discover())
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        return (
            FakeGPUs(DEFAULT_FAKE_GPUS, model, memory_bytes),
            f"NVML not available ({reason}): using {DEFAULT_FAKE_GPUS} fake GPUs ({model}, "
            f"{memory}); pass --fake-gpus N to choose how many",
        )
    if count == 0:
        backend.close()
        return (
            FakeGPUs(DEFAULT_FAKE_GPUS, model, memory_bytes),
            f"NVML found no GPUs: using {DEFAULT_FAKE_GPUS} fake GPUs",
        )
    return backend, f"NVML: {count} GPU(s)"
