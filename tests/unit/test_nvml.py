"""NVML discovery (`nodeagent.gpus.NVMLGPUs`) against a stand-in `pynvml` module: the GPU
boundary is the one place a fake belongs. It answers as nvidia-ml-py does on a host with two
NVLinked GPUs and one that does not answer."""

import logging
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent import gpus

GIB = 2**30


class NVMLError(Exception):
    pass


@dataclass
class _Memory:
    total: int
    used: int


@dataclass
class _Utilization:
    gpu: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # nvidia-ml-py's own name


def _nvml(count: int = 2, *, lost: int | None = None, failing_init: bool = False) -> Any:
    """A `pynvml` module with `count` GPUs; GPU `lost` fails to answer; GPU 1 cannot tell its
    utilization; this test's own process uses 3 GiB of GPU 0."""
    nvml: Any = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.NVML_P2P_CAPS_INDEX_NVLINK = 6
    nvml.NVML_P2P_STATUS_OK = 0
    nvml.NVML_TOPOLOGY_MULTIPLE = 20
    nvml.calls = []

    def init() -> None:
        if failing_init:
            raise NVMLError("Driver Not Loaded")

    def handle(index: int) -> int:
        if index == lost:
            raise NVMLError("GPU is lost")
        return index

    def utilization(h: int) -> _Utilization:
        if h == 1:
            raise NVMLError("Not Supported")
        return _Utilization(40 + h)

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = handle
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: _Memory(80 * GIB, (h + 1) * GIB)
    nvml.nvmlDeviceGetUtilizationRates = utilization
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [_Process(os.getpid(), 3 * GIB)] if h == 0 else []
    )
    nvml.nvmlDeviceGetP2PStatus = lambda a, b, caps: 0 if {a, b} == {0, 1} else 4
    nvml.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 50  # across the CPU socket
    return nvml


def test_discovery_reports_what_nvml_says(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _nvml(3)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    backend, line = gpus.detect(None)
    assert line == "NVML: 3 GPU(s)"
    assert backend.kind == "nvml"
    first, second, third = backend.discover()
    assert (first.index, first.uuid, first.model) == (0, "GPU-00000000", "NVIDIA H100 80GB HBM3")
    assert (first.memory_total, first.memory_used, first.utilization) == (80 * GIB, GIB, 40)
    assert [(p.pid, p.used_memory) for p in first.processes] == [(os.getpid(), 3 * GIB)]
    own_name = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert first.processes[0].name == own_name
    assert second.utilization is None  # not supported: a field left empty, not an error
    assert (first.peers, second.peers, third.peers) == ([1], [0], [])
    backend.close()
    assert nvml.calls == ["shutdown"]


def test_a_gpu_that_does_not_answer_is_reported_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(3, lost=1))
    backend, _ = gpus.detect(None)
    with caplog.at_level(logging.WARNING, logger="gctl.agent"):
        found = backend.discover()
    assert [g.index for g in found] == [0, 2]
    assert "GPU 1 does not answer NVML: GPU is lost" in caplog.text


@pytest.mark.parametrize(
    ("nvml", "said"),
    [
        (_nvml(failing_init=True), "NVML not available (Driver Not Loaded): using 4 fake GPUs"),
        (_nvml(0), "NVML found no GPUs: using 4 fake GPUs"),
    ],
)
def test_without_working_nvml_the_agent_offers_fake_gpus(
    monkeypatch: pytest.MonkeyPatch, nvml: Any, said: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    backend, line = gpus.detect(None)
    assert backend.kind == "fake"
    assert line.startswith(said)
    assert len(backend.discover()) == gpus.DEFAULT_FAKE_GPUS
