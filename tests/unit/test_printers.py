"""kubectl-style ages and tables."""

import gc
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
import yaml

from gctl.api import queue
from gctl.cli import cells, describe, fitting, printers, views

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (45, "45s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (15 * 60, "15m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (5 * 3600 + 30 * 60, "5h30m"),
        (20 * 3600, "20h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (30 * 86400, "30d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert cells.human_duration(seconds) == text


def _job(name: str, phase: str = "Pending", **spec: object) -> dict[str, object]:
    created = (NOW - timedelta(minutes=5)).isoformat()
    return {
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": {"command": ["true"], **spec},
        "status": {"phase": phase},
    }


def test_job_table_columns_align_and_fit() -> None:
    table = printers.Table("Job", wide=False, namespaces=False, show_labels=False)
    lines = table.lines(
        [_job("a", resources={"gpus": 0.5, "gpuMemory": "8Gi"}), _job("long-name", suspend=True)],
        NOW,
        header=True,
    )
    assert lines[0].split() == ["NAME", "STATUS", "GPUS", "POOL", "PRIORITY", "AGE"]
    assert lines[1].split() == ["a", "Pending", "0.5x8Gi", "default", "0", "5m"]
    assert lines[2].split() == ["long-name", "Suspended", "1", "default", "0", "5m"]
    assert len({line.index(line.split()[1]) for line in lines}) == 1  # STATUS column aligned
    assert all(len(line) <= 100 for line in lines)


def test_job_duration_counts_the_run_to_its_completion_or_now() -> None:
    """-o wide's DURATION, as kubectl's (and squeue's TIME): from the run's start to its
    completion, to now while it runs or waits to retry; none before it started."""
    started = (NOW - timedelta(minutes=3)).isoformat()
    running = _job("r", "Running")
    running["status"] = {"phase": "Running", "startTime": started}
    done = _job("d", "Succeeded")
    done["status"] = {
        "phase": "Succeeded",
        "startTime": started,
        "completionTime": (NOW - timedelta(seconds=45)).isoformat(),
    }
    retrying = _job("b")
    retrying["status"] = {"phase": "Pending", "startTime": started, "failed": 1}
    table = printers.Table("Job", wide=True, namespaces=False, show_labels=False)
    header, *lines = table.lines([running, done, retrying, _job("p")], NOW, header=True)
    at = header.split().index("DURATION")
    assert [line.split()[at] for line in lines] == ["3m", "2m15s", "3m", "<none>"]


def test_watch_rows_keep_the_first_widths() -> None:
    table = printers.Table("Job", wide=False, namespaces=True, show_labels=False)
    first = table.lines([_job("a")], NOW, header=True)
    later = table.lines([_job("b", phase="Running")], NOW, header=False)
    assert len(later) == 1
    assert first[1].index("Pending") == later[0].index("Running")


# -- views: GPU and node states, pools -------------------------------------------------------


def _node(
    name: str,
    gpus: int = 2,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    model: str = "NVIDIA A100-SXM4-80GB",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "gpus": [{"index": i, "uuid": f"u{i}", "model": model} for i in range(gpus)],
        },
    }


def _bound(job: str, node: str, gpus: list[int], phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{job}-1", "namespace": "default"},
        "spec": {"jobName": job, "node": node, "gpus": gpus},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("spec", "ready", "busy", "state"),
    [
        ({}, True, False, "Ready"),
        ({"cordonedGPUs": [0]}, True, True, "Cordoned"),
        ({"unschedulable": True}, True, False, "Cordoned"),
        ({"drainingGPUs": [0]}, True, True, "Draining"),
        ({"drainingGPUs": [0]}, True, False, "Drained"),
        ({"draining": True, "unschedulable": True}, True, True, "Draining"),
        ({"draining": True, "unschedulable": True}, True, False, "Drained"),
        ({"drainingGPUs": [1]}, True, False, "Ready"),  # another GPU drains
        ({}, False, False, "NotReady"),
        # What it comes back as, as get nodes says NotReady,SchedulingDisabled.
        ({"cordonedGPUs": [0]}, False, False, "NotReady,Cordoned"),
        ({"cordonedGPUs": [1]}, False, False, "NotReady"),
        ({"draining": True, "unschedulable": True}, False, True, "NotReady,Draining"),
    ],
)
def test_gpu_state(spec: dict[str, Any], ready: bool, busy: bool, state: str) -> None:
    assert views.gpu_state(_node("n", ready=ready, **spec), 0, busy) == state


@pytest.mark.parametrize(
    ("spec", "ready", "busy", "status"),
    [
        ({}, True, False, "Ready"),
        ({"unschedulable": True}, True, True, "Ready,SchedulingDisabled"),
        ({"unschedulable": True}, False, True, "NotReady,SchedulingDisabled"),
        ({"draining": True, "unschedulable": True}, True, True, "Ready,Draining"),
        ({"draining": True, "unschedulable": True}, True, False, "Ready,Drained"),
        ({"draining": True}, True, None, "Ready,Draining"),  # unknown: a watch's row
        ({"cordonedGPUs": [0, 1]}, True, False, "Ready"),  # GPUs are `get gpus`' business
    ],
)
def test_node_status(spec: dict[str, Any], ready: bool, busy: bool | None, status: str) -> None:
    assert views.node_status(_node("n", ready=ready, **spec), busy) == status


def test_node_table_shows_drained_only_when_no_binding_holds_it() -> None:
    nodes = [_node("a", draining=True), _node("b", draining=True)]
    bindings = [_bound("x", "a", [0]), _bound("y", "b", [0], phase="Exited")]

    viewed = views.with_node_views(nodes, bindings)
    table = printers.Table("Node", wide=False, namespaces=False, show_labels=False)
    lines = table.lines(viewed, NOW, header=True)

    assert [line.split()[1] for line in lines[1:]] == ["Ready,Draining", "Ready,Drained"]
    assert all(views.VIEW not in n for n in nodes)  # the listed objects are left as they were


def test_node_gpus_count_each_gpu_once_as_scheduling_sees_it() -> None:
    """ALLOC/TOTAL, and in -o wide the rest: a GPU counts in the first of allocated (a gctl job
    holds it, or a share of it), cordoned (takes no new jobs), other (processes gctl did not
    start), free; a job bound ahead holds nothing yet."""
    a = _node("a", gpus=6, cordonedGPUs=[1, 2], drainingGPUs=[3])
    a["status"]["gpus"][4]["processes"] = [{"pid": 77, "usedMemory": 2**30}]
    ahead = _bound("next", "a", [5], "Pending")
    ahead["spec"]["after"] = ["uid-x"]
    shared = _bound("half", "a", [0])
    shared["spec"]["gpuShare"] = 0.5
    bindings = [shared, _bound("c", "a", [1]), _bound("gone", "a", [2], "Exited"), ahead]
    nodes = [a, _node("b", ready=False), _node("c", gpus=0)]

    table = printers.Table("Node", wide=True, namespaces=False, show_labels=False)
    lines = table.lines(views.with_node_views(nodes, bindings), NOW, header=True)

    header, *rows = [line.split() for line in lines]
    assert header[:6] == ["NAME", "STATUS", "GPUS", "MODEL", "AGE", "FREE"]
    assert header[6:8] == ["CORDONED", "OTHER"]
    assert [row[:3] + row[5:8] for row in rows] == [
        ["a", "Ready", "2/6", "1", "2", "1"],  # 0 (half of it), 1; cordoned 2, drained 3; 4
        ["b", "NotReady", "0/2", "0", "2", "0"],
        ["c", "Ready", "0/0", "0", "0", "0"],
    ]
    assert rows[0][3] == "A100-SXM4-80GB"  # the vendor dropped, as `get gpus` does


def test_node_table_fits_100_columns_with_long_names() -> None:
    name = "dgx-h100-80gb-hbm3-rack07-node12"
    node = _node(name, gpus=8, model="NVIDIA H100 80GB HBM3", unschedulable=True)
    for gpu in node["status"]["gpus"]:
        gpu["fake"] = True
    node["metadata"]["creationTimestamp"] = (NOW - timedelta(days=300)).isoformat()
    bindings = [_bound(f"j{i}", name, [i]) for i in range(8)]

    table = printers.Table("Node", wide=False, namespaces=False, show_labels=False)
    [_, row] = table.lines(views.with_node_views([node], bindings), NOW, header=True)

    cells = [name, "Ready,SchedulingDisabled", "8/8 (fake)", "H100 80GB HBM3", "300d"]
    assert row.split("   ") == cells  # each as wide as its column: the longest cell
    assert len(row) <= fitting.WIDTH


def test_gpu_rows_mark_drained_gpus() -> None:
    nodes = [_node("a", gpus=3, drainingGPUs=[0, 1])]
    rows = views.gpu_rows(nodes, [_bound("x", "a", [0]), _bound("old", "a", [1], "Exited")])
    assert [r["status"] for r in rows] == ["Draining", "Drained", "Ready"]
    assert [[j["name"] for j in r["jobs"]] for r in rows] == [["x"], [], []]


def test_pool_gpus_every_criterion_must_hold() -> None:
    nodes = [
        _node("a1", gpus=4, labels={"gpu": "a100"}),
        _node("a2", gpus=4, labels={"gpu": "a100"}, model="NVIDIA H100 80GB HBM3"),
        _node("l1", gpus=2, labels={"gpu": "l40s"}),
    ]

    def matched(**selector: Any) -> list[tuple[str, int]]:
        return sorted(views.pool_gpus({"spec": {"selector": selector}}, nodes))

    assert len(matched()) == 10
    assert matched(nodeLabels={"gpu": "l40s"}) == [("l1", 0), ("l1", 1)]
    assert matched(nodes=["a1"], gpus=["1-2"]) == [("a1", 1), ("a1", 2)]
    assert matched(gpus=[3, "0"], nodeLabels={"gpu": "a100"}) == [
        ("a1", 0),
        ("a1", 3),
        ("a2", 0),
        ("a2", 3),
    ]
    assert matched(gpuModel="*h100*") == [("a2", i) for i in range(4)]
    assert matched(gpuModel="A100*") == []  # a glob over the whole name, as the scheduler reads it
    assert matched(nodes=["gone"]) == []


def test_pool_views_count_allocations_and_queues() -> None:
    nodes = [_node("a", gpus=4, labels={"gpu": "a100"}), _node("b", gpus=2)]
    pools: list[dict[str, Any]] = [
        {"metadata": {"name": "a100"}, "spec": {"selector": {"nodeLabels": {"gpu": "a100"}}}},
        {"metadata": {"name": "default"}, "spec": {}},
    ]
    ahead = _bound("next", "b", [0], "Pending")  # bound ahead of s: it waits, holding nothing
    ahead["spec"] |= {"after": ["uid-s"], "jobUID": "uid-next"}
    bindings = [
        _bound("t", "a", [0, 1]),
        _bound("s", "b", [0]),
        _bound("o", "a", [3], "Lost"),
        ahead,
    ]

    def job(name: str, phase: str, **spec: Any) -> dict[str, Any]:
        metadata = {"name": name, "uid": f"uid-{name}", "namespace": "default"}
        return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}

    now = datetime(2026, 1, 1, tzinfo=UTC)
    backing_off = job("retry", "Pending")
    backing_off["status"]["retryAfter"] = (now + timedelta(seconds=30)).isoformat()
    backed_off = job("retried", "Pending")
    backed_off["status"]["retryAfter"] = (now - timedelta(seconds=30)).isoformat()
    jobs = [
        job("t", "Running", pool="a100"),
        job("q", "Pending", pool="a100"),
        job("waits", "Pending", pool="a100", dependsOn=["t"]),
        job("s", "Scheduled"),
        job("next", "Scheduled"),
        job("w", "Pending"),
        job("after-done", "Pending", dependsOn=["done-ok"]),
        job("held", "Pending", suspend=True),
        backing_off,
        backed_off,
        job("done", "Failed"),
    ]
    succeeded = {("default", "done-ok")}

    viewed = {
        p["metadata"]["name"]: p[views.VIEW]
        for p in views.with_pool_views(pools, nodes, bindings, jobs, now=now, succeeded=succeeded)
    }

    # QUEUED counts exactly the Jobs the queue numbers (POS in `get jobs -o wide`).
    places = queue.positions(jobs, now, succeeded)
    assert sorted(places) == [
        ("default", "after-done"),
        ("default", "q"),
        ("default", "retried"),
        ("default", "w"),
    ]
    matched = {name: view.pop("matched") for name, view in viewed.items()}  # describe's
    assert viewed == {
        "a100": {"gpus": 4, "allocated": 2, "running": 1, "queued": 1, "held": 1, "ahead": 0},
        "default": {"gpus": 6, "allocated": 3, "running": 1, "queued": 3, "held": 2, "ahead": 1},
    }
    assert {name: len(gpus) for name, gpus in matched.items()} == {"a100": 4, "default": 6}
    assert matched["a100"] == sorted(matched["a100"])


def test_implicit_default_pool_only_when_none_is_stored() -> None:
    stored = [{"metadata": {"name": "a100"}, "spec": {}}]
    assert [p["metadata"]["name"] for p in views.with_implicit_default(stored)] == [
        "a100",
        "default",
    ]
    with_default = [*stored, {"metadata": {"name": "default"}, "spec": {"policy": "spread"}}]
    assert views.with_implicit_default(with_default) == with_default


# -- cells -----------------------------------------------------------------------------------


def _gpu_row(**fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "node": "n",
        "index": 0,
        "uuid": "u",
        "model": "NVIDIA A100-SXM4-80GB",
        "memoryUsed": None,
        "memoryTotal": None,
        "utilization": None,
        "status": "Ready",
        "jobs": [],
        "foreignProcesses": [],
    }
    return row | fields


@pytest.mark.parametrize(
    ("used", "total", "text"),
    [
        (int(79.3 * 2**30), 80 * 2**30, "79.3/80Gi"),
        (0, 80 * 2**30, "0/80Gi"),
        (512 * 2**20, 80 * 2**30, "512Mi/80Gi"),
        (None, 80 * 2**30, "?/80Gi"),
        (None, None, "<none>"),
    ],
)
def test_gpu_memory_says_the_unit_once(used: int | None, total: int | None, text: str) -> None:
    row = _gpu_row(memoryUsed=used, memoryTotal=total)
    assert cells._gpu_memory(row, NOW) == text


@pytest.mark.parametrize(
    ("names", "text"),
    [
        ([], "<none>"),
        (["a"], "a"),
        (["eval-a(0.5)", "eval-b(0.5)"], "eval-a(0.5),eval-b(0.5)"),
        (["eval-a", "eval-b", "eval-c", "eval-d", "eval-e"], "eval-a,eval-b,eval-c,+2"),
        # The first name is always shown: cut with `...` where even it does not fit, its
        # share kept, as a long message is cut (it was shown whole, and a long sweep Job's
        # name pushed the row past 100 columns).
        (["a-very-long-job-name-indeed-yes", "b"], "a-very-long-job-na...,+1"),
        (["a-very-long-job-name-indeed-yes(0.5)", "b(0.5)"], "a-very-long-j...(0.5),+1"),
        (["lr-sweep-learning-rate-0.0003-batch-64-7"], "lr-sweep-learning-rat..."),
        (["exactly-twenty-four-char"], "exactly-twenty-four-char"),
    ],
)
def test_gpu_jobs_stay_narrow(names: list[str], text: str) -> None:
    jobs = [
        {"namespace": "default", "name": n.split("(")[0], "share": 0.5 if "(" in n else 1.0}
        for n in names
    ]
    assert cells._gpu_jobs(_gpu_row(jobs=jobs), NOW) == text


@pytest.mark.parametrize("count", [1, 2, 4, 12])
@pytest.mark.parametrize("share", [None, 0.25, 0.125])
def test_gpu_jobs_fit_the_narrowest_room(count: int, share: float | None) -> None:
    """Review: at the narrowest JOBS (fitting.MIN_NARROWED), `l...(0.25),+3` took 13 columns
    of 12: the share goes where not even a letter of the name fits beside it."""
    names = [f"lr-sweep-{i}{f'({share})' if share else ''}" for i in range(count)]
    text = cells.jobs_within(names, fitting.MIN_NARROWED)
    assert len(text) <= fitting.MIN_NARROWED, text
    assert text.startswith("lr")


LONG_SWEEP_JOB = "lr-sweep-learning-rate-0.0003-batch-64-7"  # a sweep's Job, named by values


@pytest.mark.parametrize("model", ["NVIDIA A100-SXM4-80GB", "NVIDIA RTX 6000 Ada Generation"])
def test_a_gpu_row_with_a_long_job_name_and_a_long_model_fits_100_columns(model: str) -> None:
    """QA: `get gpus` never cut the first job's name, so a long sweep Job's name beside a long
    model passed 100 columns through a pipe. JOBS gives way (to 24 columns, and below that
    to what the other columns leave it); -o wide names every job whole."""
    jobs = [
        {"namespace": "default", "name": LONG_SWEEP_JOB, "share": 0.5},
        {"namespace": "default", "name": LONG_SWEEP_JOB[:-1] + "8", "share": 0.5},
    ]
    readings = {"node": "gpu-node-01", "model": model, "utilization": 100}
    used = {"memoryUsed": int(79.3 * 2**30), "memoryTotal": 80 * 2**30}
    rows = [
        _gpu_row(**readings, **used, index=0, jobs=jobs, status="Draining"),
        _gpu_row(**readings, **used, index=1, jobs=jobs[:1]),
        _gpu_row(**readings, index=2, memoryUsed=2**29, memoryTotal=80 * 2**30),
    ]

    header, shared, alone, idle = printers.Table(cells.GPU_VIEW, False, False, False).lines(
        rows, NOW, header=True
    )
    wide = printers.Table(cells.GPU_VIEW, True, False, False).lines(rows, NOW, header=True)

    assert max(len(line) for line in [header, shared, alone, idle]) <= 100, [shared, alone]
    assert _jobs_cell(header, shared).startswith("lr-")
    assert _jobs_cell(header, shared).endswith("...(0.5),+1")
    assert _jobs_cell(header, alone).endswith("...(0.5)")
    assert _jobs_cell(header, idle) == "<none>"
    assert _jobs_cell(wide[0], wide[1]) == ",".join(f"{j['name']}(0.5)" for j in jobs)
    assert _jobs_cell(wide[0], wide[2]) == f"{LONG_SWEEP_JOB}(0.5)"


def _jobs_cell(header: str, line: str) -> str:
    """A row's JOBS, by where its column starts and OTHER's does (a model holds spaces)."""
    return line[header.index("JOBS") : header.index("OTHER")].strip()


def test_gpu_jobs_narrowed_for_a_watch_stay_so() -> None:
    """Rows a watch prints later are read in the room the first batch left JOBS."""
    model = "NVIDIA RTX 6000 Ada Generation"
    table = printers.Table(cells.GPU_VIEW, False, False, False)
    jobs = [{"namespace": "default", "name": LONG_SWEEP_JOB, "share": 1.0}]
    first = table.lines([_gpu_row(model=model, jobs=jobs, node="gpu-node-01")], NOW, header=True)
    later = table.lines([_gpu_row(model=model, jobs=jobs * 3, node="gpu-node-01")], NOW, False)

    assert max(len(line) for line in [*first, *later]) <= 100
    assert len(_jobs_cell(first[0], later[0])) == len(_jobs_cell(first[0], first[1]))


def test_gpu_other_is_memory_of_processes_gctl_did_not_start() -> None:
    processes = [{"pid": 1, "usedMemory": 2**30}, {"pid": 2, "usedMemory": 2 * 2**30}]
    assert cells._gpu_other(_gpu_row(foreignProcesses=processes), NOW) == "3Gi"
    unknown = [{"pid": 1, "usedMemory": None}]
    assert cells._gpu_other(_gpu_row(foreignProcesses=unknown), NOW) == "?"
    assert cells._gpu_other(_gpu_row(), NOW) == "<none>"
    assert cells._gpu_other_pids(_gpu_row(foreignProcesses=processes), NOW) == "1,2"


def test_until() -> None:
    assert cells.until((NOW + timedelta(minutes=12)).isoformat(), NOW) == "12m"
    assert cells.until((NOW - timedelta(minutes=1)).isoformat(), NOW) == "now"
    assert cells.until(None, NOW) == "<none>"


def test_wide_job_table_shows_queue_position_and_eta_while_pending() -> None:
    pending = _job("big")
    pending["status"] = {
        "phase": "Pending",
        "queuePosition": 4,
        "estimatedStartTime": (NOW + timedelta(hours=2)).isoformat(),
    }
    running = _job("run", phase="Running")
    running["status"] = {"phase": "Running", "queuePosition": 1}  # stale: the Job left the queue
    table = printers.Table("Job", wide=True, namespaces=False, show_labels=False)

    header, *lines = table.lines([pending, running], NOW, header=True)

    titles = header.split()
    assert titles[-3:] == ["POS", "ETA", "REASON"]
    pos = titles.index("POS")
    assert lines[0].split()[pos : pos + 2] == ["4", "120m"]  # kubectl: minutes below 3h
    assert lines[1].split()[pos : pos + 2] == ["<none>", "<none>"]


def test_job_gpus_from_a_profile() -> None:
    job = _job("serve", resources={"profile": "qwen2.5-7b-inst"})
    assert cells._job_gpus(job, NOW) == "qwen2.5-7b-inst"
    job = _job("serve", resources={"profile": "qwen2.5-7b-inst", "gpus": 2, "gpuMemory": "8Gi"})
    assert cells._job_gpus(job, NOW) == "2x8Gi"


@pytest.mark.parametrize(
    ("resources", "text"),
    [
        ({"gpus": 4, "nodes": 2}, "4/node*2"),
        ({"nodes": 3}, "1/node*3"),  # one GPU on each, by default
        ({"gpus": 8, "gpuMemory": "80Gi", "nodes": 16}, "8x80Gi/node*16"),
        ({"profile": "llama-70b", "nodes": 2}, "llama-70b/node*2"),
    ],
)
def test_multi_node_job_gpus_say_per_node_and_how_many_nodes(
    resources: dict[str, Any], text: str
) -> None:
    """Not `2x4`: `x` is followed by each GPU's memory (`2x4` would be 2 GPUs of 4 bytes)."""
    assert cells._job_gpus(_job("train", resources=resources), NOW) == text
    one = _job("train", resources={**resources, "nodes": 1})  # one node said outright
    assert cells._job_gpus(one, NOW) == text.partition("/")[0]


def test_a_multi_node_job_shows_rank_0s_node_and_how_many_more() -> None:
    train = _job("ddp-llama-70b-pretrain", "Running", resources={"gpus": 8, "nodes": 64})
    nodes = [f"gpu-node-{i:03d}" for i in range(64)]
    train["status"] = {"phase": "Running", "node": nodes[0], "nodes": nodes, "gpus": [0, 1]}
    alone = _job("eval", "Running")
    alone["status"] = {"phase": "Running", "node": "gpu-node-007", "gpus": [3]}
    plain = printers.Table("Job", wide=False, namespaces=False, show_labels=False)
    wide = printers.Table("Job", wide=True, namespaces=False, show_labels=False)

    header, *rows = plain.lines([train, alone], NOW, header=True)
    wide_header, *wide_rows = wide.lines([train, alone], NOW, header=True)

    assert rows[0].split()[2] == "8/node*64"
    assert all(len(line) <= 100 for line in [header, *rows])
    node = wide_header.split().index("NODE")
    assert [r.split()[node] for r in wide_rows] == ["gpu-node-000+63", "gpu-node-007"]


def test_profile_description_is_cut_to_fit() -> None:
    profile = {
        "kind": "GPUProfile",
        "metadata": {"name": "qwen2.5-72b-inst"},
        "spec": {"gpus": 4, "gpuMemory": "64Gi", "description": "word " * 40},
    }
    table = printers.Table("GPUProfile", wide=False, namespaces=False, show_labels=False)
    lines = table.lines([profile], NOW, header=True)
    assert all(len(line) <= 100 for line in lines)
    assert lines[1].endswith("...")


# -- fitting 100 columns -------------------------------------------------------------------

FAILED = (
    "attempt 1 failed: [Errno 2] No such file or directory: "
    "'/opt/conda/envs/llama-finetune/bin/torchrun'; backoffLimit 0 reached"
)
SWEEP_JOB = "lr-search-batch128-lr0-001"  # as the example sweep names its Jobs


def _event(obj: str, reason: str, message: str, count: int = 1) -> dict[str, Any]:
    seen = (NOW - timedelta(seconds=30)).isoformat()
    return {
        "kind": "Event",
        "metadata": {"name": f"{obj}.1", "namespace": "default", "creationTimestamp": seen},
        "spec": {
            "type": "Warning",
            "reason": reason,
            "message": message,
            "count": count,
            "source": "controller/jobs",
            "involvedObject": {"kind": "Job", "name": obj},
        },
    }


def test_event_messages_are_cut_to_fit_and_keep_their_count() -> None:
    events = [
        _event(SWEEP_JOB, "BackoffLimitExceeded", FAILED),
        _event(SWEEP_JOB, "BackoffLimitExceeded", FAILED, count=3),
        _event("hello", "Started", "attempt 1 started"),
    ]
    table = printers.Table("Event", wide=False, namespaces=False, show_labels=False)

    header, cut, counted, short = table.lines(events, NOW, header=True)

    assert header.split()[-1] == "MESSAGE"
    assert [len(cut), len(counted)] == [100, 100]
    assert cut.endswith("...")
    assert counted.endswith("... (x3)")
    assert cut.split()[:4] == ["30s", "Warning", "BackoffLimitExceeded", f"job/{SWEEP_JOB}"]
    assert short.endswith("   attempt 1 started")
    on_a_wide_terminal = printers.Table("Event", False, False, False, width=240)
    assert on_a_wide_terminal.lines(events, NOW, header=False)[0].endswith(FAILED)


def test_wide_events_print_the_message_whole_and_last() -> None:
    table = printers.Table("Event", wide=True, namespaces=False, show_labels=False)

    header, row = table.lines([_event("train", "BackoffLimitExceeded", FAILED, 3)], NOW, True)

    assert header.split()[-3:] == ["SOURCE", "COUNT", "MESSAGE"]
    assert row.endswith(f"controller/jobs   3       {FAILED}")  # the count said once


def test_labels_wrap_below_their_column() -> None:
    job = _job(SWEEP_JOB, phase="Succeeded", resources={"gpus": 0.5})
    job["metadata"]["labels"] = {"gctl/sweep": "lr-search", "team": "demo", "stage": "tune"}  # type: ignore[index]
    table = printers.Table("Job", wide=False, namespaces=False, show_labels=True)

    header, *rows = table.lines([job], NOW, header=True)

    start = header.index("LABELS")
    assert all(len(line) <= 100 for line in rows)
    assert len(rows) > 1
    assert all(not line[:start].strip() for line in rows[1:])  # the lines below the cell
    assert ",".join(line[start:] for line in rows) == "gctl/sweep=lr-search,stage=tune,team=demo"


@pytest.mark.parametrize(
    ("text", "room", "lines"),
    [
        ("attempt 1 bound to vm, GPUs [0]", 22, ["attempt 1 bound to vm,", "GPUs [0]"]),
        ("gctl/sweep=lr-search,team=demo", 20, ["gctl/sweep=lr-search", "team=demo"]),
        ("batch=128,lr=0.001", 40, ["batch=128,lr=0.001"]),
        ("x" * 25, 10, ["x" * 10, "x" * 10, "x" * 5]),
        ("two\nlines", 20, ["two lines"]),
        ("", 20, [""]),
    ],
)
def test_wrap(text: str, room: int, lines: list[str]) -> None:
    assert fitting.wrap(text, room) == lines


@pytest.mark.parametrize(
    ("indices", "text"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], "0-7"),
        ([1, 2], "1-2"),  # as `gctl drain` writes them
        ([0, 1, 2, 5], "0-2,5"),
        ([3, 1], "3,1"),  # the order CUDA_VISIBLE_DEVICES gets them in
        ([4], "4"),
    ],
)
def test_gpu_indices_are_written_short(indices: list[int], text: str) -> None:
    assert cells.index_ranges(indices) == text
    job = _job("train", phase="Running")
    job["status"] = {"phase": "Running", "gpus": indices}
    header, row = printers.Table("Job", True, False, False).lines([job], NOW, header=True)
    assert row.split()[header.split().index("GPU-IDS")] == text


def test_wide_jobs_say_why_a_job_waits() -> None:
    unschedulable = _job("huge")
    unschedulable["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "Scheduled", "status": "False", "reason": "Unschedulable"}],
    }
    waiting = _job("eval")
    waiting["status"] = {
        "phase": "Pending",
        "reason": "WaitingForDependencies",
        "conditions": [{"type": "Scheduled", "status": "False", "reason": "Unschedulable"}],
    }
    table = printers.Table("Job", wide=True, namespaces=False, show_labels=False)

    lines = table.lines([unschedulable, waiting, _job("new")], NOW, header=False)

    assert [line.split()[-1] for line in lines] == [
        "Unschedulable",
        "WaitingForDependencies",  # the Job's own reason comes first
        "<none>",
    ]


def test_wide_pools_say_what_they_allow_in_one_column() -> None:
    pools = [
        {"kind": "GPUPool", "metadata": {"name": "default"}, "spec": {}, "status": {}},
        {
            "kind": "GPUPool",
            "metadata": {"name": "batch"},
            "spec": {"allowFractions": False, "preemption": False, "backfill": True},
            "status": {},
        },
        {
            "kind": "GPUPool",
            "metadata": {"name": "exclusive"},
            "spec": {"allowFractions": False, "preemption": False},
            "status": {},
        },
    ]
    table = printers.Table("GPUPool", wide=True, namespaces=False, show_labels=False)

    header, *rows = table.lines(pools, NOW, header=True)

    allows = header.split().index("ALLOWS")
    assert [row.split()[allows] for row in rows] == ["fractions,preemption", "backfill", "<none>"]


def test_describe_wraps_long_messages_and_keeps_the_users_keys() -> None:
    wire = {
        "apiVersion": "gctl/v1",
        "kind": "GPUPool",
        "metadata": {"name": "a100", "labels": {"site": "lab"}},
        "spec": {"selector": {"nodeLabels": {"gpu": "a100", "rack": "r1"}}},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "NoNodes", "message": FAILED * 2}
            ]
        },
    }

    lines = describe.render(wire, [], NOW).splitlines()

    assert max(len(line) for line in lines) <= 100
    assert any(line.split() == ["Node", "Labels:", "gpu=a100,rack=r1"] for line in lines)
    message = lines.index(next(line for line in lines if line.strip().startswith("Ready")))
    column = lines[message - 2].index("Message")
    wrapped = [lines[message][column:]]
    wrapped += [line[column:] for line in lines[message + 1 :] if not line[:column].strip()]
    assert " ".join(wrapped) == FAILED * 2


def test_describe_shows_memory_in_binary_units() -> None:
    """A Node's GPUs as NVML reports them in bytes: read as `get gpus` shows them."""
    gpu = {"index": 0, "memoryTotal": 80 * 2**30, "memoryUsed": 0, "utilization": 0}
    process = {"pid": 7, "usedMemory": 3 * 2**29}
    wire = {
        "apiVersion": "gctl/v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "spec": {},
        "status": {"gpus": [gpu | {"foreignProcesses": [process]}]},
    }

    lines = [line.split() for line in describe.render(wire, [], NOW).splitlines()]

    assert ["Memory", "Total:", "80Gi"] in lines
    assert ["Memory", "Used:", "0"] in lines
    assert ["Used", "Memory:", "1.5Gi"] in lines
    assert ["Utilization:", "0"] in lines


def test_the_width_is_the_terminals_and_100_through_a_pipe() -> None:
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    read_end, write_end = os.pipe()
    with open(follower, "w") as terminal, open(write_end, "w") as pipe:
        assert fitting.screen_width(terminal) == 160
        assert fitting.screen_width(pipe) == 100
    os.close(leader)
    os.close(read_end)


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("ttlSecondsAfterFinished", "TTL Seconds After Finished"),
        ("enforceGPUMemory", "Enforce GPU Memory"),
        ("jobUID", "Job UID"),
        ("gpuEnv", "GPU Env"),
        ("maxJobsPerGPU", "Max Jobs Per GPU"),
    ],
)
def test_describe_titles_split_words_and_keep_acronyms(key: str, shown: str) -> None:
    assert describe.title(key) == shown


class _Probe:
    """A value whose representer notes whether the cycle collector runs while it is dumped."""

    seen: ClassVar[list[bool]] = []


def _represent_probe(dumper: yaml.SafeDumper, _probe: _Probe) -> yaml.ScalarNode:
    _Probe.seen.append(gc.isenabled())
    return dumper.represent_str("probe")


@pytest.mark.parametrize("collecting", [True, False])
def test_yaml_is_dumped_with_the_cycle_collector_paused_and_left_as_found(
    collecting: bool,
) -> None:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    yaml.add_representer(_Probe, _represent_probe, Dumper=dumper)
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    _Probe.seen.clear()
    try:
        assert printers.dump_yaml({"a": [1, _Probe()]}) == "a:\n- 1\n- probe\n"
        assert _Probe.seen == [False]
        assert gc.isenabled() is collecting
        with pytest.raises(yaml.representer.RepresenterError):
            printers.dump_yaml({"a": object()})
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
        del dumper.yaml_representers[_Probe]


# -- objects stored in a form gctl refuses (an older gctl wrote them, or a hand edit) --------


@pytest.mark.parametrize(
    ("gpus", "shown"), [("lots", "lots"), ({"n": 2}, "<invalid>"), ("two\nlines", "<invalid>")]
)
def test_a_cell_that_cannot_be_worked_out_shows_the_value_as_stored(gpus: Any, shown: str) -> None:
    """The row is listed: a cell worked out of one value shows it as stored where it is
    printable; any other cell that cannot be worked out, `<invalid>`."""
    table = printers.Table("Job", wide=True, namespaces=False, show_labels=False)
    broken = _job("a", resources={"gpus": gpus})
    [row, other] = table.lines([broken, {**_job("b"), "spec": []}], NOW, header=False)
    assert row.split()[:3] == ["a", "Pending", shown]
    assert other.split()[:3] == ["b", "<invalid>", "<invalid>"]


def test_a_cell_that_fails_on_an_object_as_gctl_writes_it_is_a_bug_and_raises() -> None:
    """Only an object that does not validate as stored may show `<invalid>`."""
    from tests.builders import make_job

    table = printers.Table("Job", wide=False, namespaces=False, show_labels=False)
    table.columns.append(("BROKEN", lambda _w, _now: str(1 // 0)))
    valid = make_job("a").build().wire()
    with pytest.raises(ZeroDivisionError):
        table.lines([valid], NOW, header=False)
    [line] = table.lines([{**valid, "spec": []}], NOW, header=False)
    assert line.split()[-1] == "<invalid>"
