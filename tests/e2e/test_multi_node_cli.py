"""The CLI over multi-node Jobs: `get` (GPUS per node and how many nodes, NODE as rank 0's and
how many more), `describe` (the members by rank), `logs --rank`'s errors, `run --nodes`, and
`get bindings -o wide` (RANK). The real console script, on SQLite and PostgreSQL; the Jobs and
their members are written through the Store, as the controller would leave them.
"""

from typing import Any

from gctl.api import binding, job, meta
from gctl.store import db, store
from tests.builders import make_job, stored
from tests.conftest import Gctl
from tests.e2e.test_cli import table
from tests.e2e.test_running import error_line

NODES = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]


def running_on(
    database: db.Database, name: str, nodes: list[str], gpus: list[list[int]], **resources: Any
) -> job.Job:
    """A Job Running attempt 1 on `nodes` (one node: a single-node Job), rank R on nodes[R]
    with GPUs gpus[R], each member's Binding Running."""
    builder = make_job(name).command("torchrun", "train.py")
    builder.spec["resources"] = {"gpus": len(gpus[0]), **resources}
    if len(nodes) > 1:
        builder.spec["resources"]["nodes"] = len(nodes)
    multi = len(nodes) > 1
    with database.write() as session:
        writer = store.Store(session)
        created = writer.create(builder.build())
        uid = created.metadata.uid or ""
        for rank, (node_name, its) in enumerate(zip(nodes, gpus, strict=True)):
            member = writer.create(
                binding.Binding(
                    metadata=meta.ObjectMeta(
                        name=binding.name_of(name, 1, rank), namespace="default"
                    ),
                    spec=binding.BindingSpec(
                        job_name=name,
                        job_uid=uid,
                        attempt=1,
                        node=node_name,
                        gpus=its,
                        rank=rank if multi else None,
                        members=nodes if multi else [],
                        master_addr=nodes[0] if multi else None,
                        master_port=binding.master_port(uid) if multi else None,
                    ),
                )
            )
            member.status.phase = "Running"
            writer.update_status(member)
        created.status.phase = "Running"
        created.status.attempts = 1
        created.status.node = nodes[0]
        created.status.gpus = gpus[0]
        created.status.nodes = nodes if multi else None
        created.status.start_time = meta.utcnow()
        writer.update_status(created)
    return created


def test_get_jobs_shows_gpus_per_node_and_rank_0s_node(gctl: Gctl, database: db.Database) -> None:
    """GPUS `4/node*3` (not `3x4`: `x` says each GPU's memory); -o wide's NODE is rank 0's
    node and how many more; a single-node Job's cells are as before."""
    running_on(database, "pretrain-llama-70b", NODES, [[0, 1, 2, 3]] * 3)
    running_on(database, "pretrain-80g", NODES[1:], [[4, 5], [0, 1]], gpuMemory="80Gi")
    running_on(database, "eval", ["gpu-node-c"], [[6, 7]])

    out = gctl.ok("get", "jobs")
    wide = gctl.ok("get", "jobs", "-o", "wide")

    header, rows = table(out)
    gpus = header.index("GPUS")
    assert {row[0]: row[gpus] for row in rows} == {
        "eval": "2",
        "pretrain-80g": "2x80Gi/node*2",
        "pretrain-llama-70b": "4/node*3",
    }
    assert max(len(line) for line in out.splitlines()) <= 100
    header, rows = table(wide)
    node, ids = header.index("NODE"), header.index("GPU-IDS")
    assert {row[0]: (row[node], row[ids]) for row in rows} == {
        "eval": ("gpu-node-c", "6-7"),
        "pretrain-80g": ("gpu-node-b+1", "4-5"),  # rank 0's
        "pretrain-llama-70b": ("gpu-node-a+2", "0-3"),
    }


def test_describe_lists_the_members_by_rank(gctl: Gctl, database: db.Database) -> None:
    """`Nodes:` with each member's node, GPUs and phase; a single-node Job shows none."""
    running_on(database, "ddp", NODES, [[0, 1], [2, 3], [0, 1]])
    running_on(database, "alone", ["gpu-node-a"], [[4]])
    with database.write() as session:  # rank 2's process ended first
        writer = store.Store(session)
        ended = writer.get(binding.Binding, binding.name_of("ddp", 1, 2), "default")
        ended.status.phase = "Exited"
        writer.update_status(ended)

    described = gctl.ok("describe", "job", "ddp")
    alone = gctl.ok("describe", "job", "alone")

    lines = described.splitlines()
    start = lines.index("Nodes:")
    assert [line.split() for line in lines[start + 1 : start + 6]] == [
        ["Rank", "Node", "GPUs", "Phase"],
        ["----", "----", "----", "-----"],
        ["0", "gpu-node-a", "0-1", "Running"],
        ["1", "gpu-node-b", "2-3", "Running"],
        ["2", "gpu-node-c", "0-1", "Exited"],
    ]
    assert all(len(line) <= 100 for line in lines)
    assert "Nodes:" not in alone
    assert "  Node:        gpu-node-a" in alone.splitlines()  # the Status tree, as before


def test_describe_a_pending_multi_node_job_has_no_members_yet(
    gctl: Gctl, database: db.Database
) -> None:
    builder = make_job("waits").gpus(8)
    builder.spec["resources"]["nodes"] = 4
    with database.write() as session:
        store.Store(session).create(builder.build())

    described = gctl.ok("describe", "job", "waits")

    assert "Nodes:        <none>" in described.splitlines()


def test_logs_rank_names_a_member_of_a_multi_node_job(gctl: Gctl, database: db.Database) -> None:
    running_on(database, "ddp", NODES[:2], [[0], [0]])
    running_on(database, "alone", ["gpu-node-a"], [[1]])

    assert error_line(gctl("logs", "ddp", "--rank", "2")) == (
        "error: --rank 2: job ddp runs on 2 nodes: give a rank from 0 to 1"
    )
    assert error_line(gctl("logs", "alone", "--rank", "1")) == (
        "error: --rank 1: job alone runs on one node (resources.nodes is not set): leave --rank out"
    )
    assert error_line(gctl("logs", "alone", "--rank", "0")).startswith("error: --rank 0: ")
    assert error_line(gctl("logs", "ddp", "--rank", "1")) == (
        "error: rank 1 of job ddp has not started yet"  # bound, not launched: no log yet
    )
    refused = gctl("logs", "ddp", "--rank", "-1")
    assert refused.code != 0
    assert "--rank" in refused.err
    assert "Traceback" not in refused.err


def test_run_nodes_makes_a_multi_node_job(gctl: Gctl, database: db.Database) -> None:
    """--nodes sets resources.nodes, --gpus whole GPUs on each; --node a,b the nodes it may
    use; a fraction on several nodes is refused in one line, naming the field."""
    assert "--nodes" in gctl.ok("run", "--help")
    gctl.ok("run", "--name", "ddp", "--nodes", "2", "--gpus", "4", "--", "torchrun", "t.py")
    argv = ["run", "--name", "pinned", "--nodes", "2", "--node", "box1,box2,box3"]
    gctl.ok(*argv, "--", "torchrun", "t.py")

    made = stored(database, job.Job, "ddp").spec
    pinned = stored(database, job.Job, "pinned").spec
    assert (made.resources.nodes, made.resources.gpus) == (2, 4)
    assert (pinned.resources.nodes, pinned.resources.gpus) == (2, 1)
    assert pinned.placement is not None
    assert (pinned.placement.node, pinned.placement.nodes) == (None, ["box1", "box2", "box3"])
    assert gctl.ok("get", "jobs", "ddp").split()[8] == "4/node*2"
    line = error_line(gctl("run", "--nodes", "2", "--gpus", "0.5", "--", "true"))
    assert "spec.resources.gpus: a Job on 2 nodes takes whole GPUs on each" in line
    line = error_line(gctl("run", "--nodes", "3", "--node", "box1,box2", "--", "true"))
    assert "spec.placement.nodes: lists 2 node(s) but resources.nodes asks for 3" in line


def test_wide_bindings_show_each_members_rank(gctl: Gctl, database: db.Database) -> None:
    running_on(database, "ddp", NODES[:2], [[0], [1]])
    running_on(database, "alone", ["gpu-node-c"], [[2]])

    header, rows = table(gctl.ok("get", "bindings", "-o", "wide"))

    rank = header.index("RANK")
    assert {row[0]: row[rank] for row in rows} == {
        "alone-1": "<none>",
        "ddp-1": "0",
        "ddp-1-r1": "1",
    }
