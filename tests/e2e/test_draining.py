"""End-to-end tests of cordon, drain and uncordon, and of the tables that show their effect:
get gpus, get nodes, get pools, get gpuprofiles, get jobs -o wide, describe job.

The real console script runs against SQLite and PostgreSQL (the `gctl` fixture). Nodes, Jobs
and Bindings are written in-process through the Store, as an agent and the controller would
write them: no daemon runs, so every state a table shows is one the test put there.
"""

import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gctl.api import binding, event, job, meta, node, pool
from gctl.store import db, store
from tests.builders import corrupt, make_binding, make_job
from tests.conftest import Gctl, Result
from tests.e2e.test_cli import Lines, error_line, revision

PROFILES = Path(__file__).resolve().parents[2] / "manifests" / "profiles"
POOLS = Path(__file__).resolve().parents[2] / "manifests" / "pools"
WAIT_SECONDS = 15.0  # how long a `drain --wait` may take to see a change


# -- setup -----------------------------------------------------------------------------------


def make_node(name: str, gpus: int = 4, labels: dict[str, str] | None = None) -> node.Node:
    ready = meta.Condition(type="Ready", status="True", reason="AgentReady")
    return node.Node(
        metadata=meta.ObjectMeta(name=name, labels=labels or {}),
        status=node.NodeStatus(
            conditions=[ready],
            gpus=[
                node.GPUInfo(
                    index=i,
                    uuid=f"GPU-{name}-{i}",
                    model="NVIDIA A100-SXM4-80GB",
                    memory_total=80 * 2**30,
                    memory_used=2**30,
                    utilization=0,
                )
                for i in range(gpus)
            ],
        ),
    )


def put(database: db.Database, *objs: Any) -> None:
    with database.write() as session:
        store.Store(session).create_many(list(objs))


def node_spec(database: db.Database, name: str) -> dict[str, Any]:
    """A Node's spec as stored, without the fields that are off (false or empty)."""
    with database.read() as session:
        found = store.Store(session).get(node.Node, name)
    return {key: value for key, value in found.wire()["spec"].items() if value}


def binding_of(database: db.Database, job_name: str) -> binding.Binding:
    with database.read() as session:
        return store.Store(session).get(binding.Binding, f"{job_name}-1", "default")


def node_events(database: db.Database, name: str) -> list[tuple[str, str]]:
    with database.read() as session:
        reader = store.Store(session)
        events = reader.events_for(reader.get(node.Node, name))
    return [(e.spec.reason, e.spec.message) for e in events]


def set_phase(database: db.Database, job_name: str, phase: str) -> None:
    """Play the agent: the attempt is over (or running)."""

    def work(writer: store.Store) -> None:
        bound = writer.get(binding.Binding, f"{job_name}-1", "default")
        bound.status.phase = phase  # type: ignore[assignment]
        writer.update_status(bound)

    store.transact(database, work)


def rows(out: str) -> dict[str, list[str]]:
    """A table's rows by their first cells (NODE and GPU for `get gpus`)."""
    header, *lines = out.splitlines()
    found = {}
    for line in lines:
        cells = line.split()
        key = f"{cells[0]}/{cells[1]}" if header.startswith("NODE") else cells[0]
        found[key] = cells
    return found


def gpu_states(gctl: Gctl) -> dict[str, str]:
    return {key: cells[-1] for key, cells in rows(gctl.ok("get", "gpus")).items()}


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.out + result.err, result.err


# -- cordon and uncordon ---------------------------------------------------------------------


def test_cordon_and_uncordon_a_gpu_of_the_only_node(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"))

    assert gctl.ok("cordon", "gpu0") == "gpu box1/gpu0 cordoned\n"
    assert gctl.ok("cordon", "gpu0") == "gpu box1/gpu0 already cordoned\n"
    assert node_spec(database, "box1") == {"cordonedGPUs": [0]}
    assert gpu_states(gctl) == {
        "box1/0": "Cordoned",
        "box1/1": "Ready",
        "box1/2": "Ready",
        "box1/3": "Ready",
    }
    assert ("Cordoned", "GPU 0 cordoned") in node_events(database, "box1")

    assert gctl.ok("uncordon", "box1/gpu0") == "gpu box1/gpu0 uncordoned\n"
    assert gctl.ok("uncordon", "gpu0") == "gpu box1/gpu0 already uncordoned\n"
    assert node_spec(database, "box1") == {}
    assert set(gpu_states(gctl).values()) == {"Ready"}


def test_cordon_a_node_and_a_gpu_of_another(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"), make_node("box2", gpus=2))

    out = gctl.ok("cordon", "node", "box2")
    out += gctl.ok("cordon", "box1/gpu1", "gpu3", "--node", "box1")

    assert out.splitlines() == [
        "node/box2 cordoned",
        "gpu box1/gpu1 cordoned",
        "gpu box1/gpu3 cordoned",
    ]
    assert node_spec(database, "box2") == {"unschedulable": True}
    assert node_spec(database, "box1") == {"cordonedGPUs": [1, 3]}
    nodes = rows(gctl.ok("get", "nodes"))
    assert nodes["box1"][1] == "Ready"
    assert nodes["box2"][1] == "Ready,SchedulingDisabled"
    states = gpu_states(gctl)
    assert [states[f"box1/{i}"] for i in range(4)] == ["Ready", "Cordoned", "Ready", "Cordoned"]
    assert [states["box2/0"], states["box2/1"]] == ["Cordoned", "Cordoned"]


def test_uncordon_a_node_keeps_its_gpus_own_cordon(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"))
    gctl.ok("cordon", "gpu2")
    gctl.ok("drain", "node", "box1")

    result = gctl("uncordon", "node", "box1")

    assert result.code == 0, result.err
    assert result.out == "node/box1 uncordoned\n"
    assert "gctl uncordon box1/gpu2" in result.err
    assert node_spec(database, "box1") == {"cordonedGPUs": [2]}
    assert rows(gctl.ok("get", "nodes"))["box1"][1] == "Ready"


@pytest.mark.parametrize(
    ("argv", "nodes", "says"),
    [
        pytest.param(
            ["cordon", "gpu0"], ["box1", "box2"], "several nodes: say box1/gpu0", id="two"
        ),
        pytest.param(["drain", "gpu1"], ["box1", "box2"], "several nodes: say box1/gpu1", id="drn"),
        pytest.param(["cordon", "box9/gpu0"], ["box1"], 'node "box9" not found', id="node"),
        pytest.param(["uncordon", "node", "box9"], ["box1"], 'node "box9" not found', id="un"),
        pytest.param(["cordon", "box1/gpu7"], ["box1"], 'node "box1" has no GPU 7', id="gpu"),
        pytest.param(["drain", "gpu4"], ["box1"], "has no GPU 4 (its GPUs: 0-3)", id="range"),
        pytest.param(["cordon", "gpu0"], [], "no nodes yet", id="none"),
        pytest.param(["cordon", "box1/disk0"], ["box1"], "NODE/gpuN", id="word"),
        pytest.param(["cordon", "node"], ["box1"], "name the node", id="bare"),
    ],
)
def test_bad_targets_fail_in_one_line_and_write_nothing(
    gctl: Gctl, database: db.Database, argv: list[str], nodes: list[str], says: str
) -> None:
    if nodes:
        put(database, *(make_node(name) for name in nodes))
    before = revision(database)

    result = gctl(*argv)

    assert result.code == 1
    line = error_line(result)
    assert says in line
    if len(nodes) > 1 or "not found" in says:
        assert all(name in line for name in nodes), line  # it names the nodes there are
    assert revision(database) == before


def test_a_cordon_is_not_lost_to_a_heartbeat(gctl: Gctl, database: db.Database) -> None:
    """The agent rewrites the Node's status all the time (here 100 times a second; a real one
    every 10 s); cordons write the spec with compare-and-set and retry on a conflict, so each
    one lands and none undoes another."""
    put(database, make_node("box1", gpus=4))
    stop = threading.Event()

    def heartbeats() -> None:
        while not stop.wait(0.01):

            def work(writer: store.Store) -> None:
                current = writer.get(node.Node, "box1")
                current.status.heartbeat_time = datetime.now(UTC)
                writer.update_status(current)

            store.transact(database, work)

    beating = threading.Thread(target=heartbeats, daemon=True)
    beating.start()
    try:
        for index in range(4):
            gctl.ok("cordon", f"gpu{index}")
    finally:
        stop.set()
        beating.join(timeout=10)

    assert node_spec(database, "box1") == {"cordonedGPUs": list(range(4))}


# -- drain -----------------------------------------------------------------------------------


def test_drain_lets_jobs_finish_then_shows_drained(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"), make_binding("train", "box1", [0, 1]))

    result = gctl("drain", "gpu0", "gpu2")

    assert result.code == 0, result.err
    assert result.out.splitlines() == ["gpu box1/gpu0 draining", "gpu box1/gpu2 drained"]
    assert "default/train" in result.err
    assert binding_of(database, "train").spec.stop_reason is None  # no --evict: it runs on
    assert node_spec(database, "box1") == {"drainingGPUs": [0, 2]}
    states = gpu_states(gctl)
    assert [states[f"box1/{i}"] for i in range(4)] == ["Draining", "Ready", "Drained", "Ready"]

    set_phase(database, "train", "Exited")

    assert gpu_states(gctl)["box1/0"] == "Drained"
    assert gctl.ok("drain", "gpu0") == "gpu box1/gpu0 already drained\n"
    assert gctl.ok("cordon", "gpu0") == "gpu box1/gpu0 already draining\n"
    events = node_events(database, "box1")
    assert ("Draining", "GPU 0 draining") in events
    assert ("Drained", "GPU 2 drained") in events


def test_drain_evict_stops_the_active_attempts_there(gctl: Gctl, database: db.Database) -> None:
    put(
        database,
        make_node("box1"),
        make_node("box2"),
        make_binding("on-gpu0", "box1", [0]),
        make_binding("starting", "box1", [0, 1], phase="Pending"),
        make_binding("on-gpu2", "box1", [2]),
        make_binding("done", "box1", [0], phase="Exited"),
        make_binding("deleting", "box1", [0], stop_reason=binding.STOP_DELETED),
        make_binding("elsewhere", "box2", [0]),
    )

    result = gctl("drain", "box1/gpu0", "--evict")

    assert result.code == 0, result.err
    assert result.out == "gpu box1/gpu0 draining\n"
    assert "evicting job default/on-gpu0" in result.err
    assert "evicting job default/starting" in result.err
    reasons = {
        name: binding_of(database, name).spec.stop_reason
        for name in ("on-gpu0", "starting", "on-gpu2", "done", "deleting", "elsewhere")
    }
    assert reasons == {
        "on-gpu0": binding.STOP_EVICTED,
        "starting": binding.STOP_EVICTED,
        "on-gpu2": None,
        "done": None,
        "deleting": binding.STOP_DELETED,  # already being stopped: left as it is
        "elsewhere": None,
    }
    evicting = [m for reason, m in node_events(database, "box1") if reason == "Evicting"]
    assert len(evicting) == 2
    assert any("default/on-gpu0" in m for m in evicting)


def test_drain_a_node_with_evict(gctl: Gctl, database: db.Database) -> None:
    put(
        database,
        make_node("box2"),
        make_node("box3"),
        make_binding("big", "box2", [0, 1, 2, 3]),
        make_binding("cpu-step", "box2", []),
    )

    out = gctl.ok("drain", "node", "box2", "--evict")

    assert out == "node/box2 draining\n"
    assert node_spec(database, "box2") == {"unschedulable": True, "draining": True}
    assert binding_of(database, "big").spec.stop_reason == binding.STOP_EVICTED
    assert binding_of(database, "cpu-step").spec.stop_reason == binding.STOP_EVICTED
    assert rows(gctl.ok("get", "nodes"))["box2"][1] == "Ready,Draining"

    set_phase(database, "big", "Exited")
    set_phase(database, "cpu-step", "Exited")

    assert rows(gctl.ok("get", "nodes"))["box2"][1] == "Ready,Drained"
    assert rows(gctl.ok("get", "nodes"))["box3"][1] == "Ready"
    assert gctl.ok("drain", "node/box2") == "node/box2 already drained\n"
    assert gctl.ok("uncordon", "node", "box2") == "node/box2 uncordoned\n"
    assert node_spec(database, "box2") == {}


def test_drain_wait_returns_once_the_jobs_ended(gctl: Gctl, database: db.Database) -> None:
    put(
        database,
        make_node("box1"),
        make_binding("a", "box1", [0]),
        make_binding("b", "box1", [0, 1]),
        make_binding("other", "box1", [3]),
    )
    process = gctl.popen("drain", "gpu0", "--wait", "--timeout", "2m")
    assert process.stdout is not None
    assert process.stderr is not None
    out = Lines(process.stdout)
    try:
        out.wait_for(lambda line: line == "gpu box1/gpu0 draining")
        set_phase(database, "a", "Exited")
        assert out.find(lambda line: "drained" in line, timeout=1.0) is None  # b still runs
        assert process.poll() is None
        set_phase(database, "b", "Lost")

        assert process.wait(timeout=WAIT_SECONDS) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    out.rest()
    err = process.stderr.read()
    process.stdout.close()
    process.stderr.close()

    assert out.seen == ["gpu box1/gpu0 draining", "gpu box1/gpu0 drained"], err
    assert "job default/a ended (Exited)" in err
    assert "job default/b ended (Lost)" in err
    assert "other" not in err  # on GPU 3: not waited for
    assert ("Drained", "GPU 0 drained") in node_events(database, "box1")


def test_drain_wait_times_out_in_one_line(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"), make_binding("slow", "box1", [1]))

    result = gctl("drain", "gpu1", "--wait", "--timeout", "1s")

    assert result.code == 1
    no_traceback(result)
    assert result.out == "gpu box1/gpu1 draining\n"
    last = result.err.splitlines()[-1]
    assert last.startswith("error: timed out after 1s waiting for 1 job(s): default/slow")
    assert node_spec(database, "box1") == {"drainingGPUs": [1]}  # the drain itself stays


def test_drain_wait_on_an_empty_gpu_returns_at_once(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"), make_binding("elsewhere", "box1", [1]))

    result = gctl("drain", "gpu0", "--wait", "--timeout", "0", timeout=30)

    assert result.code == 0, result.err
    assert result.out == "gpu box1/gpu0 drained\n"


# -- tables ----------------------------------------------------------------------------------


def _pool(name: str, **spec: Any) -> pool.GPUPool:
    return pool.GPUPool(metadata=meta.ObjectMeta(name=name), spec=pool.GPUPoolSpec(**spec))


def _job(
    name: str, phase: str, pool_name: str | None = None, priority: int = 0, **status: Any
) -> job.Job:
    built = make_job(name).priority(priority)
    if pool_name:
        built.spec["pool"] = pool_name
    made = built.build()
    made.status = job.JobStatus(phase=phase, **status)
    return made


def test_get_pools_counts_gpus_allocations_and_jobs(gctl: Gctl, database: db.Database) -> None:
    selector = pool.PoolSelector(node_labels={"gpu": "a100"}, gpus=["0-1"], gpu_model="*a100*")
    put(
        database,
        make_node("a1", labels={"gpu": "a100"}),
        make_node("a2", labels={"gpu": "a100"}),
        make_node("l1", gpus=2, labels={"gpu": "l40s"}),
        _pool("a100", selector=selector, policy="binpack"),
        _pool("default", policy="spread"),
        make_binding("train", "a1", [0, 1, 2]),
        make_binding("serve", "l1", [0]),
        make_binding("old", "a2", [0], phase="Exited"),
        _job("train", "Running", "a100"),
        _job("queued-a", "Pending", "a100"),
        _job("serve", "Running"),
        _job("queued", "Pending"),
        _job("held", "Pending"),
        _job("done", "Succeeded"),
    )
    suspend = make_job("suspended")
    suspend.spec["suspend"] = True
    put(database, suspend.build())

    out = gctl.ok("get", "pools")

    header, *lines = out.splitlines()
    assert header.split() == [
        *["NAME", "GPUS", "ALLOCATED", "RUNNING", "QUEUED", "HELD", "POLICY", "AGE"]
    ]
    assert [line.split()[:7] for line in lines] == [
        ["a100", "4", "2", "1", "1", "0", "binpack"],  # GPUs 0-1 of a1 and a2; a1's two held
        ["default", "10", "4", "1", "2", "1", "spread"],  # every GPU; the suspended job is held
    ]
    assert all(len(line) <= 100 for line in out.splitlines())
    wide = gctl.ok("get", "pools", "-o", "wide").splitlines()
    assert wide[0].split()[-1] == "SELECTOR"
    assert wide[1].endswith("gpu=a100 model=*a100* gpus=0-1")


def test_get_pools_queued_counts_the_jobs_get_jobs_numbers(
    gctl: Gctl, database: db.Database
) -> None:
    """QUEUED is the number of Jobs with a POS; those the scheduling pass leaves out of the
    queue (suspended, in back-off, waiting for `dependsOn`) are HELD."""
    now = datetime.now(UTC)
    waits = make_job("waits")
    waits.spec["dependsOn"] = ["first"]
    after_done = make_job("after-done")
    after_done.spec["dependsOn"] = ["done"]
    suspended = make_job("suspended")
    suspended.spec["suspend"] = True
    put(
        database,
        make_node("n1"),
        _job("first", "Pending"),
        _job("second", "Pending", priority=5),
        _job("done", "Succeeded"),
        _job("backing-off", "Pending", retry_after=now + timedelta(hours=1)),
        _job("backed-off", "Pending", retry_after=now - timedelta(hours=1)),
        waits.build(),
        after_done.build(),
        suspended.build(),
    )

    out = gctl.ok("get", "pools")
    jobs = gctl.ok("get", "jobs", "-o", "wide").splitlines()

    header, row = out.splitlines()
    assert dict(zip(header.split(), row.split(), strict=False)) == {
        "NAME": "default",
        "GPUS": "4",
        "ALLOCATED": "0",
        "RUNNING": "0",
        "QUEUED": "4",
        "HELD": "3",
        "POLICY": "binpack",
        "AGE": "<none>",  # the implicit default pool
    }
    column = jobs[0].split().index("POS")
    places = {line.split()[0]: line.split()[column] for line in jobs[1:]}
    numbered = sorted(name for name, place in places.items() if place != "<none>")
    assert numbered == ["after-done", "backed-off", "first", "second"]
    assert all(len(line) <= 100 for line in out.splitlines())


def test_get_pools_without_a_default_shows_the_implicit_one(
    gctl: Gctl, database: db.Database
) -> None:
    put(database, make_node("box1", gpus=2), make_binding("a", "box1", [1]), _job("a", "Running"))
    put(database, _job("b", "Pending"))

    out = gctl.ok("get", "pools")

    assert [line.split() for line in out.splitlines()[1:]] == [
        ["default", "2", "1", "1", "1", "0", "binpack", "<none>"]  # never created: no age
    ]
    assert gctl.ok("get", "pools", "-o", "name") == ""


def _usage(described: str) -> dict[str, str]:
    lines = described.splitlines()
    start = lines.index("Usage:") + 1
    section = [line for line in lines[start:] if line.startswith("  ")]
    return dict(line.strip().split(":", 1) for line in section)


def test_describe_gpupool_counts_as_get_pools_and_names_its_gpus(
    gctl: Gctl, database: db.Database
) -> None:
    selector = pool.PoolSelector(node_labels={"gpu": "a100"}, gpus=["0-1"])
    put(
        database,
        make_node("a1", labels={"gpu": "a100"}),
        make_node("a2", labels={"gpu": "a100"}),
        make_node("l1", gpus=2, labels={"gpu": "l40s"}),
        _pool("a100", selector=selector),
        make_binding("train", "a1", [0, 1]),
        _job("train", "Running", "a100"),
        _job("queued-a", "Pending", "a100"),
    )

    described = gctl.ok("describe", "gpupool", "a100")

    usage = {key: value.strip() for key, value in _usage(described).items()}
    assert usage == {
        "GPUs": "4 (a1 [0-1], a2 [0-1])",
        "Allocated": "2",
        "Running": "1",
        "Queued": "1",
        "Held": "0",
        "Bound Ahead": "0",
    }
    assert all(len(line) <= 100 for line in described.splitlines())


def test_describe_gpupool_default_shows_the_implicit_one_and_its_settings(
    gctl: Gctl, database: db.Database
) -> None:
    """The default pool `get pools` shows when none is stored: its settings as the scheduler
    uses them, and its Usage; no Events (it was never created)."""
    put(database, make_node("box1", gpus=2), make_binding("a", "box1", [1]), _job("a", "Running"))

    described = gctl.ok("describe", "gpupool", "default")

    assert "  Policy:             binpack" in described.splitlines()
    assert _usage(described)["GPUs"].strip() == "2 (box1 [0-1])"
    assert _usage(described)["Allocated"].strip() == "1"
    assert described.rstrip().endswith("Events:       <none>")
    assert gctl.ok("describe", "gpupool").count("Name:") == 1


def test_get_pools_by_name_finds_the_implicit_default(gctl: Gctl, database: db.Database) -> None:
    """`get pools` lists a default pool when none is stored, and `describe` shows it: `get`
    by its name finds it too, -o yaml as describe says it behaves."""
    put(database, make_node("box1", gpus=2), _job("a", "Pending"))

    [row] = rows(gctl.ok("get", "pools", "default")).values()
    named = yaml.safe_load(gctl.ok("get", "gpupool", "default", "-o", "yaml"))
    both = yaml.safe_load(gctl.ok("get", "pool/default", "job/a", "-o", "yaml"))

    assert row[:3] == ["default", "2", "0"]
    assert named["metadata"] == {"name": "default"}
    assert (named["spec"]["policy"], named["spec"]["queueOrder"]) == ("binpack", "FIFO")
    assert [item["metadata"]["name"] for item in both["items"]] == ["default", "a"]
    assert gctl.ok("get", "pools", "default", "-o", "name") == "gpupool.gctl/default\n"
    missing = gctl("get", "pools", "default", "nope")
    assert missing.code == 1
    assert error_line(missing) == 'error: gpupool "nope" not found'


def test_a_pool_stored_in_a_form_gctl_refuses_is_listed_and_described_past(
    gctl: Gctl, database: db.Database
) -> None:
    """`get pools` lists it (what cannot be worked out of it `<invalid>`); `describe gpupool`
    describes the others and names it in one line, exit 1, as kubectl goes on past a name
    it does not find."""
    put(database, make_node("box1", gpus=2), _pool("good", selector=pool.PoolSelector(gpus=["0"])))
    put(database, _pool("broken"))
    corrupt(database, "GPUPool", "broken", spec={"selector": []})

    listed = rows(gctl.ok("get", "pools"))
    wide = gctl("get", "pools", "-o", "wide")
    done = gctl("describe", "gpupool")

    assert listed["broken"][1:3] == ["<invalid>", "<invalid>"]
    assert listed["good"][1] == "1"
    no_traceback(wide)
    assert wide.code == 0
    assert done.code == 1
    assert [line for line in done.out.splitlines() if line.startswith("Name:")] == [
        "Name:         default",
        "Name:         good",
    ]
    assert error_line(done) == (
        'error: gpupool "broken" as stored does not validate (spec.selector: must be a valid'
        " dictionary or instance of PoolSelector): written by an older gctl or edited by hand;"
        " fix or delete its row in the database"
    )


def test_nodes_and_attempts_stored_in_a_form_gctl_refuses_are_left_out_of_the_views(
    gctl: Gctl, database: db.Database
) -> None:
    """A Node whose status is no mapping is listed, its cells `<invalid>`, and has no GPUs
    to show; an attempt that names no GPU indices holds none; the rest count as before."""
    put(
        database,
        make_node("box1", gpus=2),
        make_node("box2", gpus=2),
        make_binding("a", "box1", [0]),
        make_binding("b", "box1", [1]),
        _job("a", "Running"),
        _job("b", "Running"),
    )
    corrupt(database, "Node", "box2", status=[])
    corrupt(database, "Binding", "b-1", spec={"jobName": "b", "node": "box1", "gpus": "one"})

    nodes = rows(gctl.ok("get", "nodes"))
    gpus = rows(gctl.ok("get", "gpus", "-o", "wide"))
    [pools] = rows(gctl.ok("get", "pools")).values()
    attempts = rows(gctl.ok("get", "bindings"))

    assert nodes["box1"][:3] == ["box1", "Ready", "1/2"]
    assert nodes["box2"][1:3] == ["<invalid>", "<invalid>"]
    assert {key: cells[5] for key, cells in gpus.items()} == {"box1/0": "a", "box1/1": "<none>"}
    assert pools[:4] == ["default", "2", "1", "2"]
    assert attempts["b-1"][3] == "one"  # GPUS, as stored


def test_profiles_apply_and_list(gctl: Gctl) -> None:
    dry = gctl.ok("apply", "-f", str(PROFILES), "--dry-run")
    assert "gpuprofile.gctl/qwen2.5-7b-inst created (dry run)" in dry
    gctl.ok("apply", "-f", str(PROFILES))

    out = gctl.ok("get", "gpuprofiles")

    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "GPUS", "MEMORY", "MODEL", "DESCRIPTION"]
    found = {line.split()[0]: line.split()[1:4] for line in lines}
    assert found["qwen2.5-7b-inst"] == ["1", "24Gi", "<none>"]
    assert found["llama-3.1-70b-inst"] == ["4", "64Gi", "<none>"]
    assert {"qwen2.5-14b-inst", "qwen2.5-32b-inst", "qwen2.5-72b-inst", "mistral-7b-inst"} <= set(
        found
    )
    assert all(len(line) <= 100 for line in out.splitlines())
    assert gctl.ok("get", "profile", "mistral-7b-inst", "-o", "name") == (
        "gpuprofile.gctl/mistral-7b-inst\n"
    )


def test_example_pools_apply(gctl: Gctl) -> None:
    out = gctl.ok("apply", "-f", str(POOLS), "--dry-run")
    assert "gpupool.gctl/a100 created (dry run)" in out


def test_wide_jobs_show_queue_position_and_eta(gctl: Gctl, database: db.Database) -> None:
    soon = datetime.now(UTC) + timedelta(minutes=12, seconds=30)
    put(
        database,
        _job("big", "Pending", estimated_start_time=soon),
        _job("next", "Pending", priority=5),
        _job("after", "Pending", priority=-1),
        _job("running", "Running"),
    )

    out = gctl.ok("get", "jobs", "-o", "wide")

    header, *lines = out.splitlines()
    titles = header.split()
    assert titles[-3:] == ["POS", "ETA", "REASON"]
    by_name = {line.split()[0]: line.split() for line in lines}
    pos, eta = titles.index("POS"), titles.index("ETA")
    assert [by_name[n][pos] for n in ("next", "big", "after")] == ["1", "2", "3"]
    assert re.fullmatch(r"1[12]m", by_name["big"][eta]), by_name["big"]
    assert [by_name["next"][pos], by_name["next"][eta]] == ["1", "<none>"]
    assert [by_name["running"][pos], by_name["running"][eta]] == ["<none>", "<none>"]
    assert "POS" not in gctl.ok("get", "jobs")


def test_describe_a_pending_job_says_why(gctl: Gctl, database: db.Database) -> None:
    soon = datetime.now(UTC) + timedelta(minutes=30)
    waiting = meta.Condition(
        type=job.CONDITION_SCHEDULED,
        status="False",
        reason=job.REASON_UNSCHEDULABLE,
        message="0/8 GPUs fit: 6 lack 40Gi free, 2 cordoned",
        last_transition_time=datetime.now(UTC),
    )
    put(
        database,
        _job(
            "big",
            "Pending",
            "a100",
            conditions=[waiting],
            estimated_start_time=soon,
            preemptions=1,
        ),
        _job("first", "Pending", "a100", priority=1),
        _job("elsewhere", "Pending", priority=2),
    )

    out = gctl.ok("describe", "job", "big")

    assert "Waiting:      Unschedulable: 0/8 GPUs fit: 6 lack 40Gi free, 2 cordoned" in out
    assert "Queue:        position 2 in pool a100" in out
    assert re.search(r"^Starts:\s+\S+ \(in (29|30)m\)$", out, re.MULTILINE), out
    assert re.search(r"^Preemptions:\s+1 ", out, re.MULTILINE), out


def test_drain_refuses_a_bad_timeout(gctl: Gctl) -> None:
    result = gctl("drain", "gpu0", "--timeout", "soon", "--wait")
    assert result.code == 1
    assert "--timeout 'soon'" in error_line(result)


def test_describe_node_shows_its_cordon_events(gctl: Gctl, database: db.Database) -> None:
    put(database, make_node("box1"))
    gctl.ok("cordon", "node", "box1")
    gctl.ok("uncordon", "node", "box1")

    with database.read() as session:
        reasons = [e.spec.reason for e in store.Store(session).list_objects(event.Event, None)]
    assert sorted(reasons) == ["Cordoned", "Uncordoned"]
    described = gctl.ok("describe", "node", "box1")
    assert re.search(r"Cordoned\s+\S+\s+gctl cordon\s+node cordoned", described), described
