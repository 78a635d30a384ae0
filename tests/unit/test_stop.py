"""notify.Stop: the stop of the daemons and of the commands that wait, which their signal
handlers set."""

import select
import subprocess
import sys
import threading
import time

import pytest

from gctl.store import notify

# A signal handler runs in the main thread between two of its bytecodes, wherever it is. This
# script runs the handler that the daemons (`daemons._stop_on_signals`) and the waiting commands
# (`following.interruptible`) install, in place of a signal, at each bytecode in turn of what
# their main thread does with its stop meanwhile: one run per bytecode, until a run has fewer.
# A handler that waited for a lock its main thread held would hang the script. After each run
# the stop must be set, and readable for the waiters that poll it.
AT_EVERY_BYTECODE = r"""
import select
import signal
import sys

from gctl.cli import daemons, following
from gctl.store import notify


def readable(stop):
    return bool(select.select([stop], [], [], 0)[0])


def at_every_bytecode(what, handler, reset, stop, checks_after):
    position = 0
    while True:
        position += 1
        reset()
        seen = 0

        def tracer(frame, event, arg):
            nonlocal seen
            frame.f_trace_opcodes = True
            if event == "opcode":
                seen += 1
                if seen == position:
                    handler()
            return tracer

        sys.settrace(tracer)
        try:
            what()
        finally:
            sys.settrace(None)
        if seen < position:
            return position - 1
        if checks_after and not (stop.is_set() and readable(stop)):
            raise SystemExit(f"set at bytecode {position}, but not set and readable after it")
        if stop.is_set() != readable(stop):
            raise SystemExit(f"set at bytecode {position}: set {stop.is_set()}, "
                             f"readable {readable(stop)}")


stop, received = daemons._stop_on_signals()
term = signal.getsignal(signal.SIGTERM)


def daemon_reset():
    received.clear()
    stop.clear()


counts = [
    at_every_bytecode(lambda: stop.wait(0.001), lambda: term(signal.SIGTERM, None),
                      daemon_reset, stop, True),
    at_every_bytecode(lambda: stop.set(), lambda: term(signal.SIGTERM, None),
                      daemon_reset, stop, True),
    at_every_bytecode(lambda: stop.clear(), lambda: term(signal.SIGTERM, None),
                      daemon_reset, stop, False),
]
command_stop = notify.Stop()
with following.interruptible(command_stop) as interrupted:
    ctrl_c = signal.getsignal(signal.SIGINT)

    def command_reset():
        command_stop.clear()
        interrupted.clear()

    counts += [
        at_every_bytecode(lambda: command_stop.wait(0.001), lambda: ctrl_c(signal.SIGINT, None),
                          command_reset, command_stop, True),
        at_every_bytecode(lambda: command_stop.clear(), lambda: ctrl_c(signal.SIGINT, None),
                          command_reset, command_stop, False),
    ]
print(" ".join(map(str, counts)))
"""


def test_a_signal_handler_sets_it_at_any_bytecode_of_the_main_thread_and_never_waits() -> None:
    """The deadlock behind a `gctl up` that SIGINT did not stop: threading.Event.set() from a
    handler, while the main thread was inside the Event's wait() holding its lock."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", AT_EVERY_BYTECODE],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a handler that sets the stop never returned: it waits for its main thread")
    assert done.returncode == 0, done.stderr
    counts = [int(word) for word in done.stdout.split()]
    assert len(counts) == 5, counts
    assert min(counts) >= 10, counts  # every run was traced


def _readable(stop: notify.Stop) -> bool:
    return bool(select.select([stop], [], [], 0)[0])


def test_set_clear_and_wait_keep_the_flag_and_the_descriptor_together() -> None:
    stop = notify.Stop()
    assert not stop.is_set()
    assert not _readable(stop)
    assert stop.wait(0.01) is False
    assert stop.wait(0) is False
    stop.set()
    stop.set()  # twice: one clear still clears it
    assert stop.is_set()
    assert _readable(stop)
    assert stop.wait(0) is True
    assert stop.wait() is True
    assert stop.wait(float("inf")) is True
    stop.clear()
    assert not stop.is_set()
    assert not _readable(stop)
    assert stop.wait(0.01) is False


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["forever", "timeout"])
def test_a_waiter_in_another_thread_wakes_when_it_is_set(timeout: float | None) -> None:
    stop = notify.Stop()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(stop.wait(timeout)))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()
    stop.set()
    waiter.join(10)
    assert woke == [True]


def test_a_wait_ends_at_its_timeout() -> None:
    stop = notify.Stop()
    started = time.monotonic()
    assert stop.wait(0.2) is False
    assert time.monotonic() - started >= 0.2
