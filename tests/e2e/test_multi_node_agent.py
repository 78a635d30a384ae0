"""A multi-node Job's members on their nodes: what each one's process is told of the others.

Two real agents (`gctl agent run`, fake GPUs) play nodes n1 and n2; no controller runs: the
test binds the members itself, as the scheduler would (one Binding a member, `binding.name_of`),
so that it tests the agent alone. Real supervisors and processes.
"""

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gctl.api import binding, job, meta
from gctl.store import db, store
from tests.builders import make_job, stored
from tests.e2e.conftest import until
from tests.e2e.test_jobs import Cluster

MASTER = "n1.lab.example"  # rank 0's node's hostname, as the controller would bind it


def bind_members(
    database: db.Database, name: str, nodes: list[str], command: str, **spec: Any
) -> job.Job:
    """Create a Job on `len(nodes)` nodes, one GPU each, and bind attempt 1's members."""
    builder = make_job(name).command("sh", "-c", command)
    builder.spec["resources"] = {"gpus": 1, "nodes": len(nodes)}
    builder.spec.update(spec)
    with database.write() as session:
        writer = store.Store(session)
        created = writer.create(builder.build())
        bind(writer, created, nodes, range(len(nodes)))
    return created


def bind(writer: store.Store, owner: job.Job, nodes: list[str], ranks: Iterable[int]) -> None:
    """Attempt 1's members `ranks`, in that order: rank R on `nodes[R]`, GPU R (not the same
    index on every node, as the scheduler may place them)."""
    name, uid = owner.name, owner.metadata.uid or ""
    for rank in ranks:
        writer.create(
            binding.Binding(
                metadata=meta.ObjectMeta(name=binding.name_of(name, 1, rank), namespace="default"),
                spec=binding.BindingSpec(
                    job_name=name,
                    job_uid=uid,
                    attempt=1,
                    node=nodes[rank],
                    gpus=[rank],
                    rank=rank,
                    members=nodes,
                    master_addr=MASTER,
                    master_port=binding.master_port(uid),
                ),
            )
        )


def member(database: db.Database, name: str, rank: int) -> binding.Binding:
    return stored(database, binding.Binding, binding.name_of(name, 1, rank))


def ended(database: db.Database, name: str, rank: int) -> binding.Binding:
    def check() -> binding.Binding | None:
        found = member(database, name, rank)
        return found if found.status.phase == "Exited" else None

    return until(check, f"rank {rank} of {name} to end", timeout=30)


def test_each_member_is_told_its_rank_and_where_rank_0_listens(
    cluster: Cluster, database: db.Database, tmp_path: Path
) -> None:
    """As a PyTorchJob's pods: MASTER_ADDR/PORT, WORLD_SIZE, RANK, torchrun's PET_ variables
    and gctl's own; the Job's `env` wins over the launchers' variables, not over gctl's. The
    members start, run and are reported as any attempt is."""
    cluster.agent("n1")
    cluster.agent("n2")
    dump = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    created = bind_members(
        database,
        "ddp",
        ["n1", "n2"],
        f'{sys.executable} -c "{dump}" {tmp_path}/env-$GCTL_NODE',
        env={"NNODES": "from-the-job", "GCTL_NNODES": "from-the-job"},
    )

    reports = [ended(database, "ddp", rank) for rank in (0, 1)]

    port = str(binding.master_port(created.metadata.uid or ""))
    for rank, node_name in enumerate(["n1", "n2"]):
        env = json.loads((tmp_path / f"env-{node_name}").read_text())
        expected = {
            "MASTER_ADDR": MASTER,
            "MASTER_PORT": port,
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "NODE_RANK": str(rank),
            "NNODES": "from-the-job",
            "PET_NNODES": "2",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": MASTER,
            "PET_MASTER_PORT": port,
            "GCTL_ATTEMPT": "1",
            "GCTL_GPUS": str(rank),
            "GCTL_NODE": node_name,
            "GCTL_NODE_RANK": str(rank),
            "GCTL_NNODES": "2",
            "GCTL_NODES": "n1,n2",
        }
        assert {name: env.get(name) for name in expected} == expected
        assert env["CUDA_VISIBLE_DEVICES"] == str(rank)
    for report in reports:
        assert (report.status.exit_code, report.status.reason) == (0, "Completed")
        assert report.status.log_path is not None
        assert report.status.pid is not None
