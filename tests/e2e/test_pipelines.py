"""Sweeps and pipelines for real: `gctl up` on fake GPUs, real processes, real files.

The example pipeline goes in through stdin, so its steps get the absolute workingDir that
applying its file would give them; each test gives the steps a work directory of its own.
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Gctl, sqlite_unless_asked
from tests.e2e.conftest import REPO
from tests.e2e.test_cli import error_line
from tests.e2e.test_jobs import job, wait_for


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only: dependencies and sweeps are decided by the controller, tested in-process on both
    (tests/integration/test_sweeps.py, test_controller.py, test_scheduling.py)."""
    return sqlite_unless_asked(request, tmp_path)


PIPELINE = REPO / "manifests" / "examples" / "pipeline" / "pipeline.yaml"


def _apply(gctl: Gctl, documents: list[dict[str, Any]], *args: str) -> None:
    gctl.ok("apply", "-f", "-", *args, stdin=json.dumps({"kind": "List", "items": documents}))


def _sweep(gctl: Gctl, name: str, namespace: str = "default") -> dict[str, Any]:
    return gctl.object("Sweep", name, namespace)


def _phase(gctl: Gctl, name: str, namespace: str = "default") -> str | None:
    phase: str | None = gctl.object("Job", name, namespace)["status"].get("phase")
    return phase


def _pipeline(work: Path, *, without_eval: bool = False) -> list[dict[str, Any]]:
    """The example pipeline, its steps writing to `work`; without eval as its README says."""
    documents = [d for d in yaml.safe_load_all(PIPELINE.read_text()) if d]
    for document in documents:
        spec = (
            document["spec"]["template"]["spec"]
            if document["kind"] == "Sweep"
            else document["spec"]
        )
        spec["env"]["WORK"] = str(work)
        spec["workingDir"] = str(PIPELINE.parent)  # `.` in the file: its directory
    if without_eval:
        documents = [d for d in documents if d["metadata"]["name"] != "eval"]
        collect = next(d for d in documents if d["metadata"]["name"] == "collect")
        collect["spec"]["dependsOn"].remove("eval")
    return documents


@pytest.mark.usefixtures("up")
def test_a_sweep_over_twenty_config_files_runs_twenty_jobs(gctl: Gctl, tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    for i in range(20):
        (configs / f"run-{i:02d}.toml").write_text(f"seed = {i}\n")
    sweep = {
        "apiVersion": "gctl/v1",
        "kind": "Sweep",
        "metadata": {"name": "cfg"},
        "spec": {
            "files": "configs/*.toml",
            "template": {
                "spec": {
                    "command": "mkdir -p out && cp {file} out/{stem}.txt && sleep 0.1",
                    "workingDir": str(tmp_path),
                }
            },
        },
    }
    _apply(gctl, [sweep])

    def done() -> bool:
        return gctl.ok("get", "sweeps").splitlines()[1].split()[1:2] == ["20/20"]

    wait_for(done, "the sweep to show 20/20", timeout=90)
    row = gctl.ok("get", "sweeps").splitlines()[1].split()
    assert row[:6] == ["cfg", "20/20", "0", "0", "0", "Succeeded"]
    names = gctl.ok("get", "jobs", "-l", "gctl/sweep=cfg", "-o", "name").split()
    assert len(names) == 20
    assert "job.gctl/cfg-run-07" in names
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"run-{i:02d}.txt" for i in range(20)
    ]
    status = _sweep(gctl, "cfg")["status"]
    assert (status["succeeded"], status["total"], status["phase"]) == (20, 20, "Succeeded")


def test_the_example_pipeline_run_again_without_eval_says_eval_was_skipped(
    tmp_path: Path,
) -> None:
    """Its steps share $WORK from run to run: a run without eval must not report the last
    run's evaluation."""

    def step(*argv: str) -> None:
        subprocess.run(
            [sys.executable, *argv],
            cwd=PIPELINE.parent,
            env={**os.environ, "WORK": str(tmp_path)},
            check=True,
            capture_output=True,
        )

    for seed in ("1", "2", "3"):
        step("train.py", "--seed", seed)
    for script in ("merge.py", "eval.py", "collect.py"):
        step(script)
    assert (tmp_path / "report.txt").read_text().splitlines()[-1].startswith("eval: mse=")
    for script in ("merge.py", "collect.py"):  # the same pipeline, eval left out
        step(script)
    assert (tmp_path / "report.txt").read_text().splitlines()[-1] == "eval: skipped"


@pytest.mark.usefixtures("up")
def test_the_example_pipeline_runs_train_merge_eval_collect(gctl: Gctl, tmp_path: Path) -> None:
    work, lean = tmp_path / "work", tmp_path / "lean"
    _apply(gctl, _pipeline(work))
    _apply(gctl, _pipeline(lean, without_eval=True), "-n", "lean")
    wait_for(lambda: _phase(gctl, "collect") == "Succeeded", "collect to succeed", timeout=90)
    report = (work / "report.txt").read_text().splitlines()
    written = [(work / f"model-{seed}.txt").read_text().strip() for seed in (1, 2, 3)]
    assert report == [
        *(f"model-{seed}: {text}" for seed, text in zip((1, 2, 3), written, strict=True)),
        f"merged: {(work / 'merged.txt').read_text().strip()}",
        f"eval: {(work / 'eval.txt').read_text().strip()}",
    ]
    steps = [job(gctl, name)["status"] for name in ("merge", "eval", "collect")]
    trained = [job(gctl, f"train-{seed}")["status"]["completionTime"] for seed in (1, 2, 3)]
    assert max(trained) <= steps[0]["startTime"]
    for before, after in itertools.pairwise(steps):
        assert before["completionTime"] <= after["startTime"]
    described = gctl.ok("describe", "job", "collect")
    assert "Depends On:" in described
    assert "merge  Job   Succeeded" in described
    wait_for(
        lambda: _phase(gctl, "collect", "lean") == "Succeeded", "collect without eval", timeout=60
    )
    assert (lean / "report.txt").read_text().splitlines()[-1] == "eval: skipped"
    assert not (lean / "eval.txt").exists()


@pytest.mark.usefixtures("up")
def test_a_failing_step_fails_its_dependents(gctl: Gctl, tmp_path: Path) -> None:
    def step(name: str, command: str, *depends: str) -> dict[str, Any]:
        spec = {"command": command, "resources": {"gpus": 0}, "dependsOn": list(depends)}
        return {"apiVersion": "gctl/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}

    grid = {
        "apiVersion": "gctl/v1",
        "kind": "Sweep",
        "metadata": {"name": "grid"},
        "spec": {
            "items": ["0", "1", "3"],
            "template": {"spec": {"command": "exit {item}", "resources": {"gpus": 0}}},
        },
    }
    _apply(
        gctl,
        [
            step("first", "exit 2"),
            step("second", "true", "first"),
            step("third", "true", "second"),
            grid,
            step("report", "true", "grid"),
        ],
    )
    for name in ("second", "third", "report"):
        wait_for(lambda n=name: _phase(gctl, n) == "Failed", f"{name} to fail", timeout=60)
    third, report = job(gctl, "third")["status"], job(gctl, "report")["status"]
    assert (third["reason"], third["message"]) == ("DependencyFailed", "dependency second failed")
    assert report["reason"] == "DependencyFailed"
    assert report["message"] == "dependency sweep grid failed (2/3 children failed)"
    assert "attempts" not in third or third["attempts"] == 0
    assert not os.path.exists(tmp_path / "never")


def _step(name: str, *depends: str) -> dict[str, Any]:
    spec = {"command": "true", "resources": {"gpus": 0}, "dependsOn": list(depends)}
    return {"apiVersion": "gctl/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def test_a_cycle_in_one_apply_is_refused_in_one_line(gctl: Gctl, tmp_path: Path) -> None:
    itself = tmp_path / "itself.yaml"
    itself.write_text(yaml.safe_dump(_step("itself", "prep", "itself")))
    refused = gctl("apply", "-f", str(itself))
    assert refused.code != 0
    assert error_line(refused) == (
        f'error: {itself}: document 1 (Job "itself"): spec.dependsOn[1]: names this Job '
        "itself: it would wait for itself for ever; remove 'itself'"
    )
    pair = tmp_path / "pair.yaml"
    pair.write_text(yaml.safe_dump_all([_step("a", "b"), _step("b", "a")]))
    refused = gctl("apply", "-f", str(pair))
    assert refused.code != 0
    assert error_line(refused) == (
        f'error: {pair}: document 1 (Job "a"): spec.dependsOn[0]: makes a dependency cycle '
        "default/a -> default/b -> default/a, so none of it could ever start: remove one of "
        "these dependsOn"
    )
    assert gctl("get", "jobs").out == ""  # nothing was written


@pytest.mark.usefixtures("up")
def test_a_cycle_made_over_two_applies_fails_its_jobs(gctl: Gctl) -> None:
    _apply(gctl, [_step("a", "b"), _step("after", "a")])
    wait_for(lambda: job(gctl, "a")["status"].get("reason"), "a to wait for b")
    _apply(gctl, [_step("b", "a")])
    for name in ("a", "b", "after"):
        wait_for(lambda n=name: _phase(gctl, n) == "Failed", f"{name} to fail", timeout=60)
    a, b = job(gctl, "a")["status"], job(gctl, "b")["status"]
    assert (a["reason"], a["message"]) == (
        "DependencyCycle",
        "dependsOn makes a cycle: default/a -> default/b -> default/a",
    )
    assert (b["reason"], b["message"]) == (
        "DependencyCycle",
        "dependsOn makes a cycle: default/b -> default/a -> default/b",
    )
    assert job(gctl, "after")["status"]["reason"] == "DependencyFailed"
    wide = {
        row.split()[0]: row.split() for row in gctl.ok("get", "jobs", "-o", "wide").splitlines()
    }
    assert (wide["a"][1], wide["a"][-1]) == ("Failed", "DependencyCycle")
    described = gctl.ok("describe", "job", "a")
    assert "DependencyCycle" in described
    assert "default/a -> default/b -> default/a" in described
