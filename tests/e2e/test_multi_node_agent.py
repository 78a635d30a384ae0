"""A multi-node Job's members on their nodes: what each one's process is told of the others,
and `gctl logs --rank` reading each member's output where it ran.

Two real agents (`gctl agent run`, fake GPUs) play nodes n1 and n2; no controller runs: the
test binds the members itself, as the scheduler would (one Binding a member, `binding.name_of`),
so that it tests the agent and the CLI alone. Real supervisors, processes and log servers.
"""

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gctl.api import binding, job, meta
from gctl.store import db, store
from tests.builders import make_job, stored
from tests.conftest import Gctl
from tests.e2e.conftest import until
from tests.e2e.test_jobs import Cluster
from tests.e2e.test_running import error_line, find_job, finish

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
            "PET_NPROC_PER_NODE": "1",
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


def test_logs_of_each_rank_come_from_its_own_node(
    gctl: Gctl, cluster: Cluster, database: db.Database, tmp_path: Path
) -> None:
    """Rank 0's output by default; `--rank R` member R's, read here or through the agent of
    the node it ran on (`--from-node`); -f follows a member until it ends."""
    cluster.agent("n1")
    cluster.agent("n2")
    go = tmp_path / "go"
    bind_members(
        database,
        "train",
        ["n1", "n2"],
        f"echo rank $RANK on $GCTL_NODE; until [ -e {go} ]; do sleep 0.05; done; echo done $RANK",
    )
    until(lambda: member(database, "train", 1).status.phase == "Running", "rank 1 to run")
    following = gctl.popen("logs", "train", "-f", "--rank", "1")
    assert following.stdout is not None
    assert following.stdout.readline() == "rank 1 on n2\n"
    go.touch()

    followed = finish(following)

    assert (followed.code, followed.out) == (0, "done 1\n"), followed.err  # after the first
    for rank in (0, 1):
        ended(database, "train", rank)
    assert gctl.ok("logs", "train") == "rank 0 on n1\ndone 0\n"
    assert gctl.ok("logs", "train", "--rank", "0") == "rank 0 on n1\ndone 0\n"
    assert gctl.ok("logs", "train", "--rank", "1", "--attempt", "1") == "rank 1 on n2\ndone 1\n"
    assert gctl.ok("logs", "train", "--rank", "1", "--from-node") == "rank 1 on n2\ndone 1\n"
    assert error_line(gctl("logs", "train", "--rank", "2")) == (
        "error: --rank 2: job train runs on 2 nodes: give a rank from 0 to 1"
    )


def test_run_attach_streams_rank_0s_output(
    gctl: Gctl, cluster: Cluster, database: db.Database
) -> None:
    """`run --attach` of a multi-node Job streams rank 0's output, whichever member was bound
    or started first, and ends with the Job."""
    cluster.agent("n1")
    cluster.agent("n2")
    argv = ["run", "--attach", "--name", "ddp", "--nodes", "2", "--gpus", "1", "--"]
    attached = gctl.popen(*argv, "sh", "-c", "echo rank $RANK")
    try:
        owner = until(lambda: find_job(database, "ddp"), "the Job to be created")
        with database.write() as session:  # no controller: bound here, rank 1 first
            bind(store.Store(session), owner, ["n1", "n2"], [1, 0])
        for rank in (0, 1):
            ended(database, "ddp", rank)
        with database.write() as session:  # as the controller would say once both exited
            writer = store.Store(session)
            done = writer.get(job.Job, "ddp")
            done.status.phase = "Succeeded"
            writer.update_status(done)
    except BaseException:
        attached.kill()
        attached.communicate()
        raise

    result = finish(attached)

    assert (result.code, result.out) == (0, "rank 0\n"), result.err
