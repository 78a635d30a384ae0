"""Which `gctl` commands the command server runs, how it tells that its modules changed, and
what the client does with a signal that comes before it knows the command's process."""

import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gctl.cli import client, cmdchild, cmdloop, ctrlc


@pytest.fixture(autouse=True)
def sigint_as_it_was(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A _Relay leaves SIGINT to ctrlc's handler, and a Ctrl-C that handler takes stays on
    ctrlc's record, which every later _Relay of the process would relay: a process is one
    command, but pytest's runs the tests one after another. Both are put back after each."""
    monkeypatch.setattr(ctrlc._Record, "came", False)
    previous = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    ("argv", "served"),
    [
        (["apply", "-f", "job.yaml"], True),
        (["--db", "x.db", "get", "jobs"], True),
        (["--db=x.db", "describe", "job/a"], True),
        (["get", "jobs", "-o", "wide"], True),
        (["logs", "train"], True),
        (["delete", "-f", "job.yaml"], True),  # -f is a file here, not --follow
        (["run", "--", "python", "--attach"], False),  # the command's own word: here, to be safe
        (["run", "--", "python", "-w"], True),
        (["get", "jobs", "-l", "--", "-w"], False),  # `--` as an option's value
        (["--db", "--", "get", "jobs", "-w"], False),
        (["logs", "train", "-n", "--", "-f"], False),
        (["get", "jobs", "-w"], False),
        (["get", "jobs", "--watch-only"], False),
        (["get", "jobs", "-Aw"], False),
        (["logs", "-f", "train"], False),
        (["logs", "train", "--follow"], False),
        (["run", "--attach", "--", "true"], False),
        (["drain", "gpu0", "--wait"], False),
        (["drain", "gpu0", "--timeout=5m"], False),
        (["up"], False),
        (["agent", "run"], False),
        (["controller", "run"], False),
        (["sync", "gitops/"], False),
        (["wait", "job/a"], False),
        (["db", "upgrade"], False),
        (["--help"], False),
        ([], False),
    ],
)
def test_short_commands_are_served_and_streaming_ones_are_not(
    argv: list[str], served: bool
) -> None:
    assert client.is_served(argv) is served


def test_the_socket_directory_must_be_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    monkeypatch.setenv(client.DIR_ENV, str(open_dir))
    assert client.socket_path() is None

    made = tmp_path / "made"
    monkeypatch.setenv(client.DIR_ENV, str(made))
    path = client.socket_path()
    assert path is not None
    assert Path(path).parent == made
    assert made.stat().st_mode & 0o777 == 0o700


def test_a_relative_socket_directory_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(client.DIR_ENV, "relative")
    assert client.socket_dir() == str(tmp_path / "relative")


def test_the_startup_environment_is_what_python_and_the_libraries_read_as_they_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in (("TYPER_USE_RICH", "0"), ("LANG", "C"), ("GCTL_DB", "x.db")):
        monkeypatch.setenv(name, value)
    startup = client.startup_environment()
    assert (startup["TYPER_USE_RICH"], startup["LANG"]) == ("0", "C")
    assert "GCTL_DB" not in startup


def test_the_identity_tells_a_nicer_process_apart() -> None:
    import os
    import subprocess
    import sys

    probe = "from gctl.cli import client; import sys; sys.stdout.buffer.write(client.identity())"
    same, nicer = (
        subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            check=True,
            preexec_fn=(lambda: os.nice(5)) if nice else None,
        ).stdout
        for nice in (False, True)
    )
    assert same == client.identity()
    assert nicer != same


def test_a_requests_mask_keeps_only_the_signals_a_mask_may_name() -> None:
    """glibc's own 32 and 33 (reported by a caller started with them blocked) would make the
    child's pthread_sigmask warn on the command's stderr, or fail under -W error."""
    message = {
        "argv": ["gctl", "version"],
        "env": {},
        "umask": 0o022,
        "ignored": [],
        "blocked": [0, -1, 2, 10, 32, 33, 34, signal.SIGRTMAX, signal.NSIG],
        "stdio": [["utf-8", "strict"]] * 3,
    }
    request = cmdchild.Request.parse(message, [-1] * cmdchild.FDS)
    assert request.blocked == [2, 10, 34, int(signal.SIGRTMAX)]


def test_a_socket_path_too_long_for_unix_sockets_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 100)
    monkeypatch.setenv(client.DIR_ENV, str(deep))
    assert client.socket_path() is None


def test_the_fingerprint_changes_when_an_imported_module_file_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fingerprinted_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    module = package / "mod.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fingerprinted_pkg.mod")
    try:
        files = cmdloop.watched_files((os.path.join(str(package), ""),))
        before = cmdloop.fingerprint(files)
        assert any(path == str(module) for path, _, _ in before)
        assert cmdloop.fingerprint(files) == before

        info = module.stat()
        os.utime(module, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
        assert cmdloop.fingerprint(files) != before
    finally:
        for name in ("fingerprinted_pkg.mod", "fingerprinted_pkg"):
            sys.modules.pop(name, None)


def test_a_signal_before_the_command_has_a_process_is_passed_on_once_it_has() -> None:
    command = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with client._Relay([]) as relay:
            os.kill(os.getpid(), signal.SIGTERM)  # before the server's answer: kept
            assert command.poll() is None
            relay.attach(command.pid)
            assert command.wait(timeout=10) == -signal.SIGTERM
    finally:
        command.kill()
        command.wait()


def test_a_signal_no_command_took_is_this_processs_own_again() -> None:
    with pytest.raises(KeyboardInterrupt), client._Relay([]):
        os.kill(os.getpid(), signal.SIGINT)  # the server never answered: Ctrl-C ends gctl
    assert signal.getsignal(signal.SIGINT) is ctrlc.handler  # the command's own handler again


def test_a_stop_before_the_command_has_a_process_waits_for_it() -> None:
    """Ctrl-Z before the server's answer stops nothing yet: stopping this process alone would
    leave the command running. (What follows, both stopping, tests/e2e/test_cmdserver.py
    checks: here it would stop the test.)"""
    with client._Relay([]) as relay:
        os.kill(os.getpid(), signal.SIGTSTP)
        assert relay.pending == [signal.SIGTSTP]
        relay.pending.clear()
