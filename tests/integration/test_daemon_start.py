"""Starting a daemon's parts while the database is away (gctl/cli/daemons.py `_built`): each
try that fails closes what it opened, so that a daemon waiting for its database does not pile
up engines and connections, one set every START_RETRY_S."""

import os
import threading
from pathlib import Path

import pytest

from gctl.api import errors
from gctl.cli import daemons
from nodeagent import gpus


def _open_files(path: Path) -> int:
    """How many of this process's file descriptors are open on `path`."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed meanwhile (the listing's own)
            continue
    return found


def test_a_try_that_fails_closes_the_databases_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `gctl up` when its controller's database opened and its agent's claim then found the
    database away: the first part's database is closed before the next try."""
    monkeypatch.setattr(daemons, "START_RETRY_S", 0.0)
    path = tmp_path / "gctl.db"
    tries: list[int] = []

    def build(opened: daemons._Opened) -> daemons.Runners:
        opened.database(str(path))  # the controller's, opened
        tries.append(_open_files(path))
        if len(tries) < 4:
            raise errors.Unavailable("the database went away")  # the agent's claim
        return [("controller", lambda stop: None)]

    runners = daemons._built(build, threading.Event())
    assert [name for name, _ in runners] == ["controller"]
    assert tries == [tries[0]] * 4  # no more open at the fourth try than at the first
    assert tries[0] >= 1


def test_a_try_that_fails_for_good_closes_them_too(tmp_path: Path) -> None:
    path = tmp_path / "gctl.db"

    def build(opened: daemons._Opened) -> daemons.Runners:
        opened.database(str(path))
        raise errors.Invalid("--node-name: not a DNS subdomain")

    with pytest.raises(errors.Invalid):
        daemons._built(build, threading.Event())
    assert _open_files(path) == 0


def test_a_try_that_fails_after_its_agent_claimed_lets_go_of_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `gctl up --sync DIR` when the database went away after its agent had claimed the
    Node: the agent of the next try takes the state directory, not refused as "another agent"
    by the one this process built before (its flock, never let go of)."""
    monkeypatch.setattr(daemons, "START_RETRY_S", 0.0)
    options = daemons.AgentOptions(
        node_name="n1",
        fake_gpus=1,
        gpu_model=gpus.DEFAULT_FAKE_MODEL,
        gpu_memory=gpus.DEFAULT_FAKE_MEMORY,
        state_dir=tmp_path / "state",
        labels=[],
        heartbeat_seconds=10,
        grace_seconds=10,
    )
    tries = 0

    def build(opened: daemons._Opened) -> daemons.Runners:
        nonlocal tries
        tries += 1
        runner = daemons._agent_runner(opened, str(tmp_path / "gctl.db"), options)
        if tries < 2:
            raise errors.Unavailable("the database went away")  # the sync's, opened after
        return [("agent", runner)]

    runners = daemons._built(build, threading.Event())
    assert (tries, [name for name, _ in runners]) == (2, ["agent"])
    runners[0][1].__self__.close()  # type: ignore[attr-defined]  # the Agent's run
