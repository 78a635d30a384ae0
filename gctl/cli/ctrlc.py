"""Ctrl-C in a gctl command's process: Python's KeyboardInterrupt, and a record that it came.

Python drops an exception raised in a finalizer (a `__del__`, a weakref callback: the import
system runs one each time it frees a module lock) and prints "Exception ignored in". A Ctrl-C
whose handler ran in one was lost, and a command that went on to wait (`apply -f -` on its
stdin, `logs -f`, `get -w`) waited for a second one. `handler` records that it ran before it
raises, and each wait of the CLI looks at the record once its own handler is in place
(`pressed`): `following.interruptible` (`following.read_stdin` waits in it), the command
server's client before it relays signals, and the daemons' stop.

Only the standard library's `signal`: the command server's client imports this.
"""

import signal


class _Record:
    came = False


def handler(_signum: int, _frame: object) -> None:
    """SIGINT's handler: KeyboardInterrupt, as Python's own, once the record says it came."""
    _Record.came = True
    raise KeyboardInterrupt


def install() -> None:
    """Take SIGINT over from Python's own handler; an ignored SIGINT (`nohup`) stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, handler)


def pressed() -> bool:
    """Whether a Ctrl-C has come to this process, even one whose KeyboardInterrupt was lost."""
    return _Record.came
