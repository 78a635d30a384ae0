"""A Ctrl-C whose KeyboardInterrupt Python dropped still ends what the command goes on to do.

Python drops an exception raised in a finalizer; the import system runs one each time it frees
a module lock, so a Ctrl-C in the middle of a command's imports was lost now and then, and
`gctl apply -f -` went on to wait for its stdin. Each test runs a fresh interpreter that loses
one the same way (the handler runs inside a `__del__`), then does what a command does next.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WAIT_S = 30

DROPPED = r"""
import signal
import sys

from gctl.cli import ctrlc


class Finalized:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # its handler runs here: Python drops what it raises


ctrlc.install()
Finalized()
"""


def _run(then: str, env: dict[str, str] | None = None) -> "subprocess.CompletedProcess[str]":
    """Run DROPPED and then `then`, with a stdin that stays open (nothing is ever written)."""
    reader, writer = os.pipe()
    try:
        return subprocess.run(
            [sys.executable, "-c", DROPPED + then],
            stdin=reader,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the lost Ctrl-C did not end it: it waited on")
    finally:
        os.close(reader)
        os.close(writer)


def _dropped(done: "subprocess.CompletedProcess[str]") -> None:
    """The Ctrl-C was lost as the tests mean it to be: Python said so."""
    assert "Exception ignored in" in done.stderr, done.stderr
    assert "KeyboardInterrupt" in done.stderr, done.stderr


def test_the_read_of_stdin_ends_at_once() -> None:
    done = _run("from gctl.cli import following\nfollowing.read_stdin()\n")
    _dropped(done)
    assert done.returncode == -signal.SIGINT, done.stderr  # KeyboardInterrupt, uncaught


def test_a_wait_is_interrupted_from_its_start() -> None:
    done = _run(
        "from gctl.cli import following\n"
        "from gctl.store import notify\n"
        "stop = notify.Stop()\n"
        "with following.interruptible(stop) as interrupted:\n"
        "    print(interrupted.is_set(), stop.is_set())\n"
    )
    _dropped(done)
    assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr


def test_the_daemons_stop() -> None:
    done = _run(
        "from gctl.cli import daemons\n"
        "stop, received = daemons._stop_on_signals()\n"
        "print(stop.is_set(), received)\n"
    )
    _dropped(done)
    assert (done.returncode, done.stdout) == (0, "True ['SIGINT']\n"), done.stderr


def test_a_served_command_is_sent_it() -> None:
    """The command server's client relays it to the child that runs the command."""
    done = _run(
        "from gctl.cli import client\n"
        "with client._Relay([]) as relay:\n"
        "    print(relay.pending == [signal.SIGINT])\n"
        "    relay.pending.clear()\n"
    )
    _dropped(done)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


def test_gctl_apply_from_stdin_exits_130(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GCTL_CLI_SERVER": "0",
        "GCTL_DB": str(tmp_path / "gctl.db"),
        "HOME": str(tmp_path),
    }
    done = _run(
        "from gctl.cli import client\nsys.argv = ['gctl', 'apply', '-f', '-']\nclient.main()\n",
        env,
    )
    _dropped(done)
    assert (done.returncode, done.stdout) == (130, ""), done.stderr
    assert not (tmp_path / "gctl.db").exists()  # nothing written


def test_stdin_is_read_whole_and_decoded_as_sys_stdin_would() -> None:
    """CRLF line ends become LF (universal newlines), UTF-8 is decoded, and a read that spans
    several chunks of the pipe comes back whole."""
    text = "kind: Job\r\nname: é\r\n" + "x" * 200_000 + "\n"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom gctl.cli import following\n"
            "sys.stdout.write(repr(following.read_stdin()))\n",
        ],
        input=text.encode(),
        capture_output=True,
        timeout=WAIT_S,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        check=True,
    )
    assert done.stdout.decode() == repr(text.replace("\r\n", "\n"))
