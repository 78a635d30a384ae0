"""Starting a daemon's parts while the database is away (gctl/cli/daemons.py `_built`): each
try that fails closes what it opened, so that a daemon waiting for its database does not pile
up engines and connections, one set every START_RETRY_S."""

import os
import threading
from pathlib import Path

import pytest

from gctl.api import errors
from gctl.cli import daemons


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
