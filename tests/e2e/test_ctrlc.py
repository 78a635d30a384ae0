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

from controller import scheduling
from gctl.api import meta
from gctl.store import db, store
from tests.builders import make_job, put_ready_node
from tests.conftest import Gctl

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
print("dropped", file=sys.stderr, flush=True)  # here, so the KeyboardInterrupt went nowhere
"""


def _run(then: str, env: dict[str, str] | None = None) -> "subprocess.CompletedProcess[str]":
    """Run DROPPED and then `then`, with a stdin that stays open (nothing is ever written)."""
    reader, writer = os.pipe()
    try:
        done = subprocess.run(
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
    assert done.stderr.startswith("dropped\n"), done.stderr  # and Python said nothing of it
    return done


def _gctl(gctl: Gctl, *argv: str) -> "subprocess.CompletedProcess[str]":
    """`gctl ARGV` in this process's interpreter after a lost Ctrl-C, as the entry point runs
    it (not served: a served command's child is forked from a server that lost nothing)."""
    env = {**gctl.env(), "GCTL_CLI_SERVER": "0"}
    return _run(
        f"from gctl.cli import client\nsys.argv = {['gctl', *argv]!r}\nclient.main()\n", env
    )


def test_the_read_of_stdin_ends_at_once() -> None:
    done = _run("from gctl.cli import following\nfollowing.read_stdin()\n")
    assert done.returncode == -signal.SIGINT, done.stderr  # KeyboardInterrupt, uncaught


def test_a_wait_is_interrupted_from_its_start_and_the_next_one_is_not() -> None:
    """The first wait acts on it; a second (`run --attach`'s wait for its process to stop,
    after Ctrl-C deleted the Job) waits for a Ctrl-C of its own."""
    done = _run(
        "from gctl.cli import following\n"
        "from gctl.store import notify\n"
        "for _ in range(2):\n"
        "    stop = notify.Stop()\n"
        "    with following.interruptible(stop) as interrupted:\n"
        "        print(interrupted.is_set(), stop.is_set())\n"
    )
    assert (done.returncode, done.stdout) == (0, "True True\nFalse False\n"), done.stderr


def test_the_daemons_stop() -> None:
    done = _run(
        "from gctl.cli import daemons\n"
        "stop, received = daemons._stop_on_signals()\n"
        "print(stop.is_set(), received)\n"
    )
    assert (done.returncode, done.stdout) == (0, "True ['SIGINT']\n"), done.stderr


def test_a_served_command_is_sent_it() -> None:
    """The command server's client relays it to the child that runs the command."""
    done = _run(
        "from gctl.cli import client\n"
        "with client._Relay([]) as relay:\n"
        "    print(relay.pending == [signal.SIGINT])\n"
        "    relay.pending.clear()\n"
    )
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


def test_gctl_apply_from_stdin_exits_130(gctl: Gctl, tmp_path: Path) -> None:
    done = _gctl(gctl, "apply", "-f", "-")
    assert (done.returncode, done.stdout) == (130, ""), done.stderr
    assert gctl.read("Job", "anything") is None
    assert not any(tmp_path.glob("*.db"))  # nothing written, not even a database


def test_a_command_that_does_not_wait_finishes_and_exits_130(gctl: Gctl) -> None:
    """As with the Ctrl-C a moment later: what it did stays done, and a loop around it stops."""
    manifest = gctl.cwd / "job.yaml"
    manifest.write_text(make_job("hello").yaml())
    done = _gctl(gctl, "apply", "-f", str(manifest))
    assert (done.returncode, done.stdout) == (130, "job.gctl/hello created\n"), done.stderr
    assert gctl.object("Job", "hello")


def test_gctl_get_watch_exits_130(gctl: Gctl) -> None:
    gctl.ok("apply", "-f", "-", stdin=make_job("hello").yaml())
    done = _gctl(gctl, "get", "jobs", "-w", "-o", "name")
    assert (done.returncode, done.stdout) == (130, "job.gctl/hello\n"), done.stderr


def test_gctl_get_gpus_watch_exits_130(gctl: Gctl, database: db.Database) -> None:
    with database.write() as session:
        put_ready_node(store.Store(session), "n1", 1, meta.utcnow())
    done = _gctl(gctl, "get", "gpus", "-w", "-o", "json")
    assert done.returncode == 130, done.stderr
    assert '"node": "n1"' in done.stdout


def test_gctl_delete_that_waits_exits_130(gctl: Gctl, database: db.Database) -> None:
    """The Job is bound, and no controller runs to stop its attempts: the delete waits."""
    with database.write() as session:
        writer = store.Store(session)
        put_ready_node(writer, "n1", 1, meta.utcnow())
        writer.create(make_job("busy").build())
    store.transact(database, lambda w: scheduling.schedule(w, meta.utcnow()))
    done = _gctl(gctl, "delete", "job", "busy")
    assert (done.returncode, done.stdout) == (130, 'job.gctl "busy" deleted\n'), done.stderr
    assert gctl.object("Job", "busy")["metadata"]["deletionTimestamp"]


def test_an_ignored_sigint_stays_ignored_in_a_wait() -> None:
    """A shell script's background job (`gctl logs -f x &`): Ctrl-C is not this command's, in
    a wait as before it, and a served command's child ignores it too."""
    script = (
        "import os, signal\n"
        "from gctl.cli import ctrlc, following\n"
        "from gctl.store import notify\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "ctrlc.install()\n"
        "stop = notify.Stop()\n"
        "with following.interruptible(stop) as interrupted:\n"
        "    print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    print(interrupted.is_set(), stop.is_set())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT_S, check=False
    )
    assert (done.returncode, done.stdout) == (0, "True\nFalse False\n"), done.stderr


def test_other_exceptions_python_drops_are_still_said() -> None:
    script = (
        "from gctl.cli import ctrlc\n"
        "class Broken:\n"
        "    def __del__(self):\n"
        "        raise ValueError('in a finalizer')\n"
        "ctrlc.install()\n"
        "Broken()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT_S, check=False
    )
    assert done.returncode == 0
    assert "Exception ignored in" in done.stderr
    assert "ValueError: in a finalizer" in done.stderr


def test_stdin_is_read_whole_with_its_line_ends_made_lf() -> None:
    """As a manifest file's are (manifest._read_file); UTF-8 is decoded, and a read that spans
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
