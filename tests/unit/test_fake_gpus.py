"""Fake GPUs see the processes that declare fake GPU use, real processes read from /proc; one
whose GCTL_NODE names a node is seen by that node's fake GPUs alone (several fake nodes on one
host, each an agent of its own, as one tries multi-node Jobs)."""

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from nodeagent import gpus


@pytest.fixture
def users() -> Iterator[dict[str, int]]:
    """Three `sleep`s on fake GPU 1: one of node a's, one of node b's, one of nobody's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GCTL_")}
    started = {}
    for owner in ("a", "b", ""):
        env = base | {"GCTL_FAKE_GPU_MEMORY": "1Gi", "CUDA_VISIBLE_DEVICES": "1"}
        if owner:
            env["GCTL_NODE"] = owner
        started[owner or "nobody"] = subprocess.Popen(["sleep", "30"], env=env)
    deadline = time.monotonic() + 10
    pids = {name: p.pid for name, p in started.items()}
    while time.monotonic() < deadline:  # until each has exec'd sleep with its environment
        seen = {pid for pid, *_ in gpus._fake_gpu_users()}
        if set(pids.values()) <= seen:
            break
        time.sleep(0.01)
    yield pids
    for process in started.values():
        process.kill()
        process.wait()


def test_a_process_naming_its_node_is_on_that_nodes_fake_gpus_alone(
    users: dict[str, int],
) -> None:
    def on_gpu_1(backend: gpus.FakeGPUs) -> set[int]:
        found = {p.pid for p in backend.discover()[1].processes}
        return found & set(users.values())

    assert on_gpu_1(gpus.FakeGPUs(2, node_name="a")) == {users["a"], users["nobody"]}
    assert on_gpu_1(gpus.FakeGPUs(2, node_name="b")) == {users["b"], users["nobody"]}
    assert on_gpu_1(gpus.FakeGPUs(2, node_name="c")) == {users["nobody"]}
    assert on_gpu_1(gpus.FakeGPUs(2)) == set(users.values())  # no node: every one
    on_gpu_0 = {p.pid for p in gpus.FakeGPUs(2, node_name="a").discover()[0].processes}
    assert not on_gpu_0 & set(users.values())
