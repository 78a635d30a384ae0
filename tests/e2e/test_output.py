"""What `get` and `describe` print for the objects a real session makes: the plain tables and
every description fit a 100-column terminal (as a pipe or a script sees them: no terminal, so
100), nothing is lost on the way, and the cells say what the objects hold.

`gctl up` (the `up` fixture) runs the example sweep and the scheduler for real; what needs no
daemon is applied and read back.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gctl, sqlite_unless_asked
from tests.e2e.conftest import REPO
from tests.e2e.test_jobs import job, wait_for


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only: what is printed of what is stored; the reads themselves are tested on both
    (test_cli.py, tests/integration/test_store.py)."""
    return sqlite_unless_asked(request, tmp_path)


WIDTH = 100  # the project's rule for a table, and what gctl assumes when stdout is no terminal
SWEEP = REPO / "manifests" / "examples" / "sweep" / "matrix.yaml"  # lr-search: 6 Jobs
MISSING = "/opt/conda/envs/llama-finetune/bin/torchrun"  # a command that cannot start


def _scheduled(gctl: Gctl, name: str) -> dict[str, Any] | None:
    """The Job's Scheduled condition once the scheduler has said it cannot place it."""
    conditions = job(gctl, name)["status"].get("conditions", [])
    found = next((c for c in conditions if c["type"] == "Scheduled"), None)
    return found if found is not None and found["status"] == "False" else None


def _over(out: str) -> list[str]:
    return [line for line in out.splitlines() if len(line) > WIDTH]


def _labels(out: str) -> dict[str, str]:
    """Each row's LABELS, read back from `get --show-labels`: the lines a cell wraps onto
    start at its column, one list item or more each."""
    header, *lines = out.splitlines()
    start = header.index("LABELS")
    cells: dict[str, list[str]] = {}
    for line in lines:
        if line[:start].strip():
            name = line.split()[0]
            cells[name] = []
        cells[name].append(line[start:])
    return {name: ",".join(pieces) for name, pieces in cells.items()}


@pytest.mark.usefixtures("up")
def test_a_sweeps_tables_and_descriptions_fit_100_columns(gctl: Gctl) -> None:
    gctl.ok("apply", "-f", str(SWEEP))
    argv = [MISSING, "--nproc-per-node", "8", "train.py", "--config", "llama-3.1-8b.yaml"]
    gctl.ok("run", "--name", "finetune-llama", "--", *argv)
    gctl.ok("run", "--name", "huge", "--gpus", "16", "--", "true")

    def sweep_phase() -> str | None:
        found = json.loads(gctl.ok("get", "sweep", "lr-search", "-o", "json"))
        phase: str | None = found["status"].get("phase")
        return phase

    wait_for(lambda: sweep_phase() == "Succeeded", "lr-search to succeed", timeout=60)
    wait_for(lambda: job(gctl, "finetune-llama")["status"].get("phase") == "Failed", "the failure")
    wait_for(lambda: _scheduled(gctl, "huge"), "huge to be found unschedulable")

    commands = [
        ["get", "events"],
        ["get", "jobs"],
        ["get", "jobs", "--show-labels"],
        ["describe", "jobs"],
        ["describe", "sweep", "lr-search"],
    ]
    printed = {" ".join(c): gctl.ok(*c) for c in commands}

    assert "job/lr-search-batch128-lr0-001" in printed["get events"]
    assert {c: _over(out) for c, out in printed.items()} == {c: [] for c in printed}
    # Nothing is lost: a message cut in `get events` is whole in -o wide, and `describe`
    # wraps it rather than cutting it; the labels of every Job are all there.
    failed = job(gctl, "finetune-llama")["status"]["message"]
    assert MISSING in failed
    assert failed in gctl.ok("get", "events", "-o", "wide")
    described = gctl.ok("describe", "job", "finetune-llama")
    assert " ".join(failed.split()) in " ".join(described.split())
    labels = _labels(printed["get jobs --show-labels"])
    assert {name: labels[name] for name in labels if name.startswith("lr-search-")} == {
        f"lr-search-batch{b}-lr{lr}": "gctl/sweep=lr-search,team=demo"
        for b in (32, 64, 128)
        for lr in ("0-001", "0-01")
    }


@pytest.mark.usefixtures("up")
def test_wide_jobs_say_why_the_scheduler_cannot_place_one(gctl: Gctl) -> None:
    gctl.ok("run", "--name", "huge", "--gpus", "16", "--", "true")
    waiting = wait_for(lambda: _scheduled(gctl, "huge"), "huge to be found unschedulable")
    assert (waiting["reason"], waiting["message"]) == (
        "Unschedulable",
        "8/8 GPUs fit, but no node has 16 of them",
    )
    assert "reason" not in job(gctl, "huge")["status"]  # the condition alone says why

    header, row = gctl.ok("get", "job", "huge", "-o", "wide").splitlines()

    cells = dict(zip(header.split(), row.split(), strict=True))
    assert (cells["STATUS"], cells["REASON"]) == ("Pending", "Unschedulable")


def test_describe_sweep_prints_user_keys_as_written(gctl: Gctl) -> None:
    sweep = {
        "apiVersion": "gctl/v1",
        "kind": "Sweep",
        "metadata": {"name": "grid"},
        "spec": {
            "matrix": {"lr": [0.001, 0.01], "batch": [32, 64]},
            "template": {
                "metadata": {"labels": {"pipeline": "example", "team": "nlp"}},
                "spec": {
                    "command": "python train.py --lr {lr} --batch {batch}",
                    "env": {"run_name": "lr{lr}-batch{batch}"},
                    "resources": {"gpus": 1},
                },
            },
        },
    }
    gctl.ok("apply", "-f", "-", stdin=json.dumps(sweep))

    described = gctl.ok("describe", "sweep", "grid").splitlines()

    # as `describe job` prints its own labels
    assert any(line.split() == ["Labels:", "pipeline=example,team=nlp"] for line in described)
    assert any(line.split() == ["lr:", "0.001", "0.01"] for line in described), described
    assert any(line.split() == ["batch:", "32", "64"] for line in described), described
    assert any(line.split() == ["run_name:", "lr{lr}-batch{batch}"] for line in described)
    keys = [line.strip().split(":")[0] for line in described]
    assert not {"Pipeline", "Team", "Lr", "Batch", "Run_name"} & set(keys), described
