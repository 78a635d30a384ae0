"""Ctrl-C in a gctl command's process: Python's KeyboardInterrupt, and a record that it came.

Python drops an exception raised in a finalizer (a `__del__`, a weakref callback: the import
system runs one each time it frees a module lock) and prints "Exception ignored in". A Ctrl-C
whose handler ran in one was lost, and a command that went on to wait (`apply -f -` on its
stdin, `logs -f`, `get -w`) waited for a second one. `handler` records that it ran before it
raises, and each wait of the CLI takes the record once its own handler is in place (`take`),
so that no signal falls between the two: `following.interruptible` (`following.read_stdin`
waits in it), the command server's client before it relays signals, and the daemons' stop.
A command that does not wait finishes what it was doing and then exits 130 (`main.main`), as
it would have had the Ctrl-C come a moment later.

Only the standard library's `signal` and `sys`: the command server's client imports this.
"""

import signal
import sys


class _Record:
    came = False  # an attribute: the handler's store is one step, and never waits


def handler(_signum: int, _frame: object) -> None:
    """SIGINT's handler: KeyboardInterrupt, as Python's own, once the record says it came."""
    _Record.came = True
    raise KeyboardInterrupt


def install() -> None:
    """Take SIGINT over from Python's own handler (an ignored SIGINT, as a shell script leaves
    it to its background jobs, stays ignored), and keep quiet about a KeyboardInterrupt that
    Python drops: the record holds it."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, handler)
    if sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _unraisable


def take() -> bool:
    """Whether a Ctrl-C came that nothing has acted on yet, even one whose KeyboardInterrupt
    was lost; the caller acts on it (the record is cleared). Call it with a handler of one's own
    in place of `handler`, so that no Ctrl-C comes between."""
    came, _Record.came = _Record.came, False
    return came


def _unraisable(unraisable: "sys.UnraisableHookArgs") -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _Record.came:
        return
    sys.__unraisablehook__(unraisable)
