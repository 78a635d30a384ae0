"""A relative workingDir is the manifest's directory's, as docker compose and kustomize read a
path in a file: through the real `gctl apply`, `diff` and `sync`, each from a directory that is
not the manifest's, and a real run by `gctl up`, itself started from yet another."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Gctl, sqlite_unless_asked
from tests.e2e.test_jobs import job, phase_is, wait_for


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite only: paths are resolved by the client before anything is written."""
    return sqlite_unless_asked(request, tmp_path)


def _job(name: str, **spec: Any) -> str:
    document = {"apiVersion": "gctl/v1", "kind": "Job", "metadata": {"name": name}}
    return yaml.safe_dump({**document, "spec": {"resources": {"gpus": 0}, **spec}})


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _working_dir(gctl: Gctl, name: str) -> str | None:
    found: str | None = job(gctl, name)["spec"].get("workingDir")
    return found


@pytest.mark.usefixtures("up")  # started in the repository's root
def test_a_job_runs_in_its_working_dir_under_the_manifests_directory(
    gctl: Gctl, tmp_path: Path
) -> None:
    work = tmp_path / "proj" / "sub"
    work.mkdir(parents=True)
    _write(tmp_path / "proj" / "job.yaml", _job("here", command="pwd > where", workingDir="sub"))
    assert gctl.ok("apply", "-f", "proj/job.yaml") == "job.gctl/here created\n"
    done = wait_for(phase_is(gctl, "here", "Succeeded", "Failed"), "here to finish")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert Path((work / "where").read_text().strip()).resolve() == work.resolve()


def test_a_manifest_applies_unchanged_from_any_directory(gctl: Gctl, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    _write(project / "job.yaml", _job("a", command="true", workingDir="./src/../src"))
    assert gctl.ok("apply", "-f", "proj/job.yaml") == "job.gctl/a created\n"
    assert _working_dir(gctl, "a") == str(project / "src")
    inside = Gctl(gctl.db_url, project)
    assert inside.ok("apply", "-f", "job.yaml") == "job.gctl/a unchanged\n"
    diffed = inside("diff", "-f", "job.yaml")
    assert (diffed.code, diffed.out) == (0, "")
    # What `get -o yaml` prints holds the absolute path: it applies unchanged anywhere.
    exported = gctl.ok("get", "job", "a", "-o", "yaml")
    assert inside.ok("apply", "-f", "-", stdin=exported) == "job.gctl/a unchanged\n"


def test_from_stdin_a_relative_working_dir_is_the_current_directorys(
    gctl: Gctl, tmp_path: Path
) -> None:
    text = _job("a", command="true", workingDir="sub") + "---\n" + _job("b", command="true")
    text += "---\n" + _job("c", command="true", workingDir="~/runs")
    gctl.ok("apply", "-f", "-", stdin=text)
    assert _working_dir(gctl, "a") == str(tmp_path / "sub")
    assert _working_dir(gctl, "b") is None  # none: the agent's directory, as before
    assert _working_dir(gctl, "c") == "~/runs"  # as written


def test_sync_resolves_each_files_paths_against_its_own_directory(
    gctl: Gctl, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    _write(repo / "top.yaml", _job("top", command="true", workingDir="."))
    _write(repo / "team" / "deep.yaml", _job("deep", command="true", workingDir="../data"))
    elsewhere = Gctl(gctl.db_url, repo / "team")
    first = elsewhere.ok("sync", "..")
    assert "job.gctl/top created" in first
    real = repo.resolve()  # sync follows the directory as resolved
    assert (_working_dir(gctl, "top"), _working_dir(gctl, "deep")) == (str(real), f"{real}/data")
    again = gctl.ok("sync", "repo")  # from another directory: the same paths
    assert "created" not in again
    assert "configured" not in again
    assert json.loads(gctl.ok("get", "job", "top", "-o", "json"))["metadata"]["generation"] == 1
