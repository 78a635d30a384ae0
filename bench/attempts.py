"""What one attempt's processes cost the machine, for throughput-1000: the runtime alone.

`true` attempts launched one after another through the agent's own door (nodeagent.runtime:
its fork server, a supervisor for each attempt, the job), each waited for, with no database,
no controller and no agent pass: the machine's user and system CPU per attempt (/proc/stat),
less what this process spent launching and waiting. What is left is the floor under any
agent that runs a job under a supervisor process of its own, beside the bare pool's
fork/exec of the floor.
"""

import os
import time
from pathlib import Path

from bench.store import BenchError
from nodeagent import runtime

WARM_UP = 20
POLL_S = 0.0005
TIMEOUT_S = 30.0  # for one `true` attempt to end


def cpu_ms_per_attempt(state_dir: Path, attempts: int) -> tuple[float, float]:
    """(user, system) CPU milliseconds of the machine per attempt, this process's left out."""
    node = runtime.Runtime(state_dir)
    try:
        for index in range(WARM_UP):
            _run(node, state_dir, f"warm-{index}")
        machine, mine = machine_cpu(), os.times()
        for index in range(attempts):
            _run(node, state_dir, f"a-{index}")
        after, mine_after = machine_cpu(), os.times()
    finally:
        node.close()
    user = after[0] - machine[0] - (mine_after.user - mine.user)
    system = after[1] - machine[1] - (mine_after.system - mine.system)
    return user * 1000 / attempts, system * 1000 / attempts


def _run(node: runtime.Runtime, state_dir: Path, uid: str) -> None:
    launch = runtime.Launch(
        uid=uid,
        argv=["true"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        cwd=None,
        log_path=state_dir / "logs" / uid / "attempt-1.log",
        grace_seconds=1.0,
    )
    node.launch(launch)
    deadline = time.monotonic() + TIMEOUT_S
    while (phase := node.state(uid).phase) != "exited":
        if time.monotonic() > deadline:  # its fork server died with it, say: nothing retries
            raise BenchError(f"attempt {uid} of `true` not ended after {TIMEOUT_S:g} s: {phase}")
        time.sleep(POLL_S)


def machine_cpu() -> tuple[float, float]:
    """Seconds of user and of system CPU the whole machine has used since boot, every process
    and the kernel's work (/proc/stat: all but idle and iowait); other programs count too."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, irq, softirq = fields[0], fields[1], fields[2], fields[5], fields[6]
    return (user + nice) / ticks, (system + irq + softirq) / ticks
