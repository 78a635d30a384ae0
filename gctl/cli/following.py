"""Following a Job as it runs: its attempts through the change feed, an attempt's log through
watchfiles (or through its node's agent, `nodelogs`, when it is on another host), and Ctrl-C
as an event.

Nothing here waits on a timer. A `View` is a Job and its attempts read at one revision;
`await_view` re-reads it after every change to them until a decision function answers. `show`
prints an attempt's log and, following it, copies what is appended until the feed says the
attempt ended. Ctrl-C sets an event that ends these waits instead of raising KeyboardInterrupt,
which a wait inside the change feed's watcher can swallow.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gctl.api import errors
from gctl.cli import ctrlc

if TYPE_CHECKING:
    from gctl.api import binding, job
    from gctl.store import db, notify

ENDED = frozenset({"Exited", "Lost"})  # Binding phases of an attempt that is over
FINISHED = frozenset({"Succeeded", "Failed"})  # job.FINISHED_PHASES
WATCHED_KINDS = ("Job", "Binding")
INTERRUPTED = 130  # the exit code of a command ended by Ctrl-C, as shells report SIGINT
READ_SIZE = 1 << 16
T = TypeVar("T")


class Interrupted(Exception):
    """Ctrl-C arrived while a command waited."""


@contextmanager
def interruptible(stop: notify.Stop) -> Iterator[notify.Stop]:
    """While inside, Ctrl-C sets `stop` and the event yielded instead of raising; both are
    set at once where a Ctrl-C came before that nothing acted on (`ctrlc.take`: its
    KeyboardInterrupt may have been lost). An ignored SIGINT (a shell script's background
    job) stays ignored. Both are notify.Stop: a handler that sets a threading.Event may wait for
    itself forever."""
    from gctl.store import notify

    interrupted = notify.Stop()

    def handler(_signum: int, _frame: object) -> None:
        interrupted.set()
        stop.set()

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, handler)
    if ctrlc.take():
        handler(signal.SIGINT, None)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def read_stdin() -> str:
    """All of stdin, its line ends made `\n` as a manifest file's are; Ctrl-C ends the read
    with KeyboardInterrupt, one that came before it too (`interruptible`)."""
    import io
    import os
    import select

    from gctl.store import notify

    if sys.stdin is None:
        raise errors.Invalid("<stdin>: cannot read: it is closed")
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (an embedding's StringIO)
        return sys.stdin.read()
    chunks = []
    with interruptible(notify.Stop()) as interrupted:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(interrupted.fileno(), select.POLLIN)
        while True:
            poller.poll()  # at once where a Ctrl-C came before (interruptible set it)
            if interrupted.is_set():
                break
            try:
                chunk = os.read(fd, READ_SIZE)
            except OSError as exc:
                raise errors.Invalid(f"<stdin>: cannot read: {exc.strerror}") from None
            if not chunk:
                break
            chunks.append(chunk)
    if interrupted.is_set():  # in the read, or after its end before the handler was put back
        raise KeyboardInterrupt
    # Decoded as sys.stdin decodes; a TextIOWrapper's universal newlines make the line ends.
    text = io.TextIOWrapper(
        io.BytesIO(b"".join(chunks)), encoding=sys.stdin.encoding, errors=sys.stdin.errors
    )
    return text.read()


class _Either:
    """Set when any of its events is: a stop event for watchfiles, which only asks is_set()."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


# -- a Job and its attempts, re-read after every change ------------------------------------------


@dataclass(frozen=True)
class View:
    """One Job (None once it is gone or replaced) and its attempts, read at `revision`: of a
    multi-node Job, the Bindings of member `rank` alone, one an attempt."""

    namespace: str
    name: str
    revision: int
    job: job.Job | None
    attempts: list[binding.Binding]
    rank: int = 0


def read_view(
    database: db.Database, namespace: str, name: str, uid: str | None = None, rank: int = 0
) -> View:
    """Read the head revision first: every change after it is then seen by a watch from it."""
    from gctl.api import job
    from gctl.store import store

    with database.read() as session:
        reader = store.Store(session)
        revision = reader.current_revision()
        found = reader.find(job.Job, name, namespace)
        if found is not None and uid is not None and found.metadata.uid != uid:
            found = None  # deleted and created again: not the Job we follow
        owner = uid or (found.metadata.uid if found is not None else None)
        attempts = reader.bindings_of(owner) if owner else []
    # A single-node attempt's one Binding has no rank: it is rank 0 of one.
    ranked = [a for a in attempts if (a.spec.rank or 0) == rank]
    return View(namespace, name, revision, found, ranked, rank)


def attempt_words(attempt: binding.Binding) -> str:
    """`attempt 2 of job train`, and `(rank 1)` for a multi-node attempt's other members."""
    rank = f" (rank {attempt.spec.rank})" if attempt.spec.rank else ""
    return f"attempt {attempt.spec.attempt} of job {attempt.spec.job_name}{rank}"


def await_view(
    database: db.Database, view: View, decide: Callable[[View], T | None], stop: threading.Event
) -> tuple[T, View]:
    """Return what `decide` makes of the Job, re-reading it after each change to it or its
    Bindings until `decide` answers; Interrupted when `stop` is set first."""
    from gctl.store import feed

    decided = decide(view)
    if decided is not None:
        return decided, view
    uid = view.job.metadata.uid if view.job is not None else None
    with feed.Watch(database, since=view.revision, kinds=WATCHED_KINDS, stop=stop) as changes:
        for batch in changes:
            if not any(
                c.uid == uid or c.object["spec"].get("jobUID") == uid or c.name == view.name
                for c in batch
            ):
                continue
            view = read_view(database, view.namespace, view.name, uid, view.rank)
            decided = decide(view)
            if decided is not None:
                return decided, view
    raise Interrupted


def started(attempt: binding.Binding) -> bool:
    """The agent has launched it (so it has a log), or it ended without ever starting."""
    return attempt.status.log_path is not None or attempt.status.phase in ENDED


def log_here(attempt: binding.Binding) -> bool:
    """Whether the attempt's log is on this machine: the agent reports the path only once the
    log is there, so a path whose directory is missing here was written on another host."""
    path = attempt.status.log_path
    return path is not None and Path(path).parent.is_dir()


def show(
    database: db.Database,
    attempt: binding.Binding,
    revision: int,
    follow: bool,
    stop: threading.Event,
    *,
    from_node: bool = False,
) -> None:
    """Print an attempt's log; with `follow`, keep printing until the attempt ends. A log that
    is not on this machine (or any, with `from_node`) comes through its node's agent."""
    where = attempt_words(attempt)
    if attempt.status.log_path is None:
        why = attempt.status.message or attempt.status.reason or "no reason given"
        raise errors.NotFound(f"{where} ended before it started: {why}")
    if from_node or not log_here(attempt):
        from gctl.cli import nodelogs

        nodelogs.show(database, attempt, follow and attempt.status.phase not in ENDED, stop)
        return
    tail = _Tail(Path(attempt.status.log_path))
    try:
        if follow and attempt.status.phase not in ENDED:
            _follow(database, attempt, revision, tail, stop)
        tail.pump()
    finally:
        tail.close()


class _Tail:
    """Copies what was appended to a log file since the last call to stdout, as bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: Any = None

    def pump(self) -> None:
        if self.handle is None:
            try:
                self.handle = open(self.path, "rb")  # noqa: SIM115 (closed by close())
            except FileNotFoundError:
                return  # not written yet
        out = sys.stdout.buffer
        while chunk := self.handle.read(1 << 16):
            out.write(chunk)
        out.flush()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def _follow(
    database: db.Database,
    attempt: binding.Binding,
    revision: int,
    tail: _Tail,
    stop: threading.Event,
) -> None:
    """Print the log as it grows until the feed says the attempt ended (or `stop`)."""
    import watchfiles

    ended = threading.Event()
    failure: list[BaseException] = []
    watcher = threading.Thread(
        target=_watch_end,
        args=(database, attempt.metadata.uid, revision, ended, failure),
        daemon=True,
        name="attempt-end",
    )
    watcher.start()
    name = tail.path.name  # compared by name: the watcher may report the path another way
    try:
        tail.pump()
        for _ in watchfiles.watch(
            tail.path.parent,
            watch_filter=lambda _change, changed: Path(changed).name == name,
            stop_event=_Either(ended, stop),
            debounce=200,
            step=50,
            recursive=False,
            raise_interrupt=False,
        ):
            tail.pump()
    finally:
        ended.set()  # ends the watcher if it is still waiting
        watcher.join(timeout=5)
    if failure:
        raise failure[0]
    if stop.is_set():
        raise Interrupted


def _watch_end(
    database: db.Database,
    uid: str | None,
    since: int,
    ended: threading.Event,
    failure: list[BaseException],
) -> None:
    """Set `ended` once the attempt's Binding is Exited, Lost or gone (or `ended` is set)."""
    from gctl.store import feed

    try:
        with feed.Watch(database, since=since, kinds=["Binding"], stop=ended) as changes:
            for batch in changes:
                for change in batch:
                    if change.uid == uid and (
                        change.type == "DELETED" or change.object["status"].get("phase") in ENDED
                    ):
                        return
    except BaseException as exc:  # handed to the main thread, which raises it
        failure.append(exc)
    finally:
        ended.set()
