"""A multi-node Job across two real agents (two nodes on this host): its members start
together, meet at MASTER_ADDR:MASTER_PORT as torchrun's would, and one failing stops the other."""

import json
import sys
from pathlib import Path

from tests.conftest import Gctl
from tests.e2e.test_jobs import Cluster, apply_job, job, phase_is, wait_for

# Rank 0 listens at MASTER_ADDR:MASTER_PORT and waits to hear from every other rank; each other
# rank connects and says who it is. Each writes what it saw into OUT/rank-N.
RENDEZVOUS = """
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
seen = [os.environ[k] for k in ("NODE_RANK", "NNODES", "GCTL_NODES", "CUDA_VISIBLE_DEVICES")]
if rank == 0:
    server = socket.create_server(("", port))
    server.settimeout(60)
    heard = []
    for _ in range(world - 1):
        peer, _ = server.accept()
        heard.append(peer.recv(100).decode())
        peer.close()
    seen.append("heard " + " ".join(sorted(heard)))
else:
    for _ in range(600):
        try:
            peer = socket.create_connection((address, port), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall(f"{rank}@{os.environ['GCTL_NODE']}".encode())
    peer.close()
with open(os.path.join(sys.argv[1], f"rank-{rank}"), "w") as out:
    out.write(" ".join(seen))
print(f"rank {rank} done")
"""


def test_a_two_node_job_meets_at_rank_0_and_succeeds(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent("n1", gpus=2)
    cluster.agent("n2", gpus=2)
    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    apply_job(
        gctl,
        "ddp",
        [sys.executable, str(script), str(tmp_path)],
        resources={"gpus": 2, "nodes": 2},
    )
    done = wait_for(phase_is(gctl, "ddp", "Succeeded", "Failed"), "ddp to end", timeout=60)
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])
    nodes = done["status"]["nodes"]
    assert sorted(nodes) == ["n1", "n2"]
    assert done["status"]["node"] == nodes[0]
    assert (tmp_path / "rank-0").read_text() == f"0 2 {','.join(nodes)} 0,1 heard 1@{nodes[1]}"
    assert (tmp_path / "rank-1").read_text() == f"1 2 {','.join(nodes)} 0,1"
    bound = f"attempt 1 bound to 2 nodes: {nodes[0]}, GPUs [0,1]; {nodes[1]}, GPUs [0,1]"
    assert bound in gctl.ok("describe", "job", "ddp")
    bindings = {
        b["metadata"]["name"]: b["spec"]
        for b in json.loads(gctl.ok("get", "bindings", "-o", "json"))["items"]
    }
    assert {name: spec["node"] for name, spec in bindings.items()} == {
        "ddp-1": nodes[0],
        "ddp-1-r1": nodes[1],
    }


def test_a_failing_member_stops_the_other_and_fails_the_job(
    cluster: Cluster, gctl: Gctl, tmp_path: Path
) -> None:
    cluster.controller()
    cluster.agent("n1", gpus=1)
    cluster.agent("n2", gpus=1)
    apply_job(
        gctl,
        "broken",
        'if [ "$RANK" = 1 ]; then exit 7; fi; exec sleep 300',
        resources={"gpus": 1, "nodes": 2},
    )
    failed = wait_for(phase_is(gctl, "broken", "Failed"), "broken to fail", timeout=60)
    rank_1 = failed["status"]["nodes"][1]
    assert failed["status"]["message"] == (
        f"attempt 1 failed: rank 1 on {rank_1}: exit code 7; backoffLimit 0 reached"
    )
    rank_0 = json.loads(gctl.ok("get", "binding", "broken-1", "-o", "json"))["status"]
    assert (rank_0["phase"], rank_0["reason"]) == ("Exited", "MemberEnded")
    assert job(gctl, "broken")["status"]["exitCode"] == 7
