"""`gctl up`, `gctl controller run`, `gctl agent run`: the long-running parts, in the foreground.

The only module of the CLI that imports the controller and the node agent, and only when one of
these commands runs.
"""

import contextlib
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from gctl.api import errors, names
from gctl.cli import ctrlc

if TYPE_CHECKING:
    import nodeagent.agent
    import nodeagent.virtual
    from controller import sync as syncer
    from gctl.store import db


@dataclass(frozen=True)
class AgentOptions:
    node_name: str | None
    fake_gpus: int | None
    gpu_model: str
    gpu_memory: str
    state_dir: Path | None
    labels: list[str]
    heartbeat_seconds: float
    grace_seconds: float
    fence_seconds: float = 30.0
    address: str | None = None  # where other nodes reach this one (None: its hostname)


@dataclass(frozen=True)
class VirtualOptions:
    """`gctl agent run --simulate`: virtual nodes whose jobs run for a simulated time."""

    nodes: int
    gpus_per_node: int
    name_prefix: str
    gpu_model: str
    gpu_memory: str
    labels: list[str]
    heartbeat_seconds: float
    time_scale: float
    state_dir: Path | None = None  # where its lock lives (None: agent.default_virtual_state_dir)


def _logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    # Of Alembic's lines on a new database, only the migrations it runs say something.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.getLogger("alembic.runtime.migration").addFilter(
        lambda record: record.getMessage().startswith("Running upgrade")
    )


def _stop_on_signals(*, agent_process: bool = False) -> tuple[threading.Event, list[str]]:
    """The event SIGTERM and SIGINT set, and the names of the signals received. Every wait of
    the daemons' threads wakes on it at once (`notify.Stop`), so that they end in moments.
    `agent_process`: `gctl up`'s (`_AgentProcess`), which leaves Ctrl-C to `gctl up` (SIGINT
    is ignored; `gctl up` stops it) and says nothing of a signal: `gctl up` does, from its exit
    code (`SIGNALLED`), a second signal's too."""
    from gctl.store import notify

    stop = notify.Stop()
    received: list[str] = []

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if received:  # a second one: do not wait for the parts (`STOP_GRACE_S`)
            if not agent_process:
                logging.getLogger("gctl").warning("received %s again: leaving at once", name)
            logging.shutdown()
            os._exit(SIGNALLED + signum if agent_process else 0)
        received.append(name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN if agent_process else handler)
    if not agent_process and ctrlc.take():  # one whose KeyboardInterrupt Python dropped
        handler(signal.SIGINT, None)
    return stop, received


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        try:
            if not eq:
                raise ValueError(f"{pair!r} is not key=value")
            labels[names.check_label_key(key)] = names.check_label_value(value)
        except ValueError as exc:
            raise errors.Invalid(f"--label: {exc}") from None
    return labels


def _agent_runner(
    opened: "_Opened", db_url: str | None, options: AgentOptions
) -> Callable[[threading.Event], None]:
    from nodeagent import agent, gpus

    node_name = options.node_name or socket.gethostname().split(".")[0].lower()
    try:
        names.check_dns_subdomain(node_name)
    except ValueError as exc:
        raise errors.Invalid(f"--node-name: {exc}") from None
    backend, how = gpus.detect(
        options.fake_gpus, options.gpu_model, options.gpu_memory, node_name=node_name
    )
    state_dir = (options.state_dir or agent.default_state_dir(node_name)).resolve()
    database = opened.database(db_url)
    with _state_dir_errors(state_dir):
        the_agent = agent.Agent(
            database,
            node_name,
            backend,
            state_dir,
            labels=_labels(options.labels),
            heartbeat_seconds=options.heartbeat_seconds,
            grace_seconds=options.grace_seconds,
            fence_seconds=options.fence_seconds,
            address=options.address,
        )
    try:
        the_agent.claim()  # a second agent for the node stops here, in one line
    except BaseException:
        # Built again (`_built`, the database away) or not at all: its hold on the state
        # directory must not be left to refuse the next one as "another agent".
        the_agent.abandon()
        raise
    opened.agent = the_agent
    logging.getLogger("gctl.agent").info("node %s: %s; state in %s", node_name, how, state_dir)
    return the_agent.run


def _virtual_runner(
    opened: "_Opened", db_url: str | None, options: VirtualOptions
) -> Callable[[threading.Event], None]:
    from nodeagent import agent, virtual

    try:
        names.check_dns_subdomain(virtual.node_names(options.nodes, options.name_prefix)[-1])
    except ValueError as exc:
        raise errors.Invalid(f"--name-prefix: {exc}") from None
    database = opened.database(db_url)
    state_dir = (
        options.state_dir or agent.default_virtual_state_dir(options.name_prefix, database.url)
    ).resolve()
    with _state_dir_errors(state_dir):
        the_agent = virtual.VirtualAgent(
            database,
            nodes=options.nodes,
            gpus_per_node=options.gpus_per_node,
            name_prefix=options.name_prefix,
            gpu_model=options.gpu_model,
            gpu_memory=options.gpu_memory,
            labels=_labels(options.labels),
            heartbeat_seconds=options.heartbeat_seconds,
            time_scale=options.time_scale,
            state_dir=state_dir,
        )
    try:
        the_agent.claim()  # another agent for one of the Nodes stops this one here, in one line
    except BaseException:
        the_agent.abandon()
        raise
    opened.agent = the_agent
    return the_agent.run


@contextlib.contextmanager
def _state_dir_errors(state_dir: Path) -> Iterator[None]:
    """A state directory the agent cannot make or lock is one line naming it."""
    try:
        yield
    except OSError as exc:
        raise errors.Invalid(f"--state-dir {state_dir}: {exc.strerror or exc}") from None


def _controller_runner(
    opened: "_Opened", db_url: str | None, node_timeout: float, backoff: float
) -> Callable[[threading.Event], None]:
    from controller import manager
    from gctl.store import db

    database = opened.database(db_url)
    logging.getLogger("gctl.controller").info("controller on %s", db.display_url(database.url))
    return manager.Controller(
        database,
        node_timeout=timedelta(seconds=node_timeout),
        backoff_base=timedelta(seconds=backoff),
    ).run


SWITCH_INTERVAL_S = 0.0005
# How long a stop waits for the parts to finish the step they are in. A part still busy then
# (a scheduling pass over 100,000 Jobs on a loaded host) is left: the process exits, and what
# that step had not committed is rolled back, as at a crash, which loses nothing.
STOP_GRACE_S = 5.0


Runners = list[tuple[str, Callable[[threading.Event], None]]]
START_RETRY_S = 2.0  # between tries to reach a database that is not there yet
STOP_CHECK_S = 0.5  # how often a wait that cannot sleep on the stop itself looks at it
# What `gctl up`'s agent process says on its `said` pipe (`_AgentProcess`): that its part is
# built, and the error it ended with (the message follows).
READY, ERROR = b"\1", b"E"
SIGNAL_LAG_S = 1.0  # how long a signal to `gctl up` may come after the same one to its agent
# The agent process's exit code when a signal stopped it, plus the signal's number, as a
# shell's: `gctl up` says which (`_AgentProcess`), the agent says nothing of it itself.
SIGNALLED = 128


class _Opened:
    """The databases one try at building the parts opened, and the agent it claimed a Node
    with. A try that fails closes them: the parts are built again every START_RETRY_S while
    the database is away, and each try would otherwise leave its engines, and their
    connections, behind (a controller's, where the agent built after it failed), and an agent
    its hold on the state directory, which refused the next try's agent as "another agent"
    (`gctl up --sync DIR`, the sync's database away after the agent's claim). `stop`: the
    daemons' stop, for a part whose building waits (`_AgentProcess.runner`)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.databases: list[db.Database] = []
        self.agent: nodeagent.agent.Agent | nodeagent.virtual.VirtualAgent | None = None

    def database(self, db_url: str | None) -> "db.Database":
        from gctl.store import db

        opened = db.Database.open(db_url)
        self.databases.append(opened)
        return opened

    def close(self) -> None:
        if self.agent is not None:
            self.agent.abandon()
            self.agent = None
        for database in self.databases:
            database.close()
        self.databases.clear()


Build = Callable[[_Opened], Runners]


def _built(build: Build, stop: threading.Event, what: str = "starting") -> Runners:
    """The parts, built once the database answers: a host that boots before its database
    server, or a server restarting, is waited for (said once a minute, as `what` failing),
    not an exit. A stop meanwhile builds nothing: the parts are none."""
    from gctl.api import failures

    said = failures.FailureLog(logging.getLogger("gctl"))
    while not stop.is_set():
        opened = _Opened(stop)
        try:
            return build(opened)
        except BaseException as exc:
            opened.close()
            if not isinstance(exc, errors.Unavailable):
                raise
            said.failed(what, exc)
            stop.wait(START_RETRY_S)
    return []


def _run(build: Build, *, jobs_outlive: bool = False, parent: int | None = None) -> str | None:
    """Build the parts and run them in threads until a signal, or until one of them fails;
    then stop them all; returns the name of the signal that stopped them, if one did.
    `jobs_outlive`: an agent is among them, whose jobs go on running without it. The signals
    are handled from the start: one that comes while the parts are built (opening the
    database, claiming the Node: seconds where the database is busy) stops them as they
    start, and is said, rather than killing the process silently. `parent`: the read end of a
    pipe whose end (`gctl up` stopping, or gone) stops them too; SIGINT is then ignored, and
    `gctl up` says why they stopped (a signal too), and the error they stopped with."""
    stop, received = _stop_on_signals(agent_process=parent is not None)
    if parent is not None:
        threading.Thread(
            target=_stop_at_end, args=(parent, stop), name="parent", daemon=True
        ).start()
    # `gctl up` says its own start's failures: its agent's name the agent.
    runners = _built(build, stop, "starting" if parent is None else "starting the node agent")
    # A thread back from a database call waits for the GIL until the busy one yields it, up
    # to the switch interval (5 ms by default); every hand-off between the controller, the
    # agent and their feeds pays that several times. Yield sooner.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    failures: list[BaseException] = []

    def guarded(name: str, run: Callable[[threading.Event], None]) -> None:
        try:
            run(stop)
        except BaseException as exc:  # one part failing stops the others
            if parent is None or not isinstance(exc, errors.GctlError):  # else `gctl up` says it
                logging.getLogger("gctl").error("%s stopped: %s", name, exc)
            failures.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=guarded, args=(name, run), name=name, daemon=True)
        for name, run in runners
    ]
    for thread in threads:
        thread.start()
    while not stop.wait(0.5):
        pass
    why = f"received {received[0]}" if received else "a part stopped"
    outlive = "; running jobs keep running" if jobs_outlive else ""
    if parent is None:  # else `gctl up` says why
        logging.getLogger("gctl").info("%s: shutting down%s", why, outlive)
    deadline = time.monotonic() + STOP_GRACE_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    if busy := [t.name for t in threads if t.is_alive()]:
        logging.getLogger("gctl").warning(
            "%s still busy after %gs: leaving it (what it had not committed is rolled back)",
            ", ".join(busy),
            STOP_GRACE_S,
        )
        logging.shutdown()
        sys.stdout.flush()
        code = 1 if failures else 0
        if not failures and received and parent is not None:  # `gctl up` says the signal
            code = _signalled(received[0])
        os._exit(code)  # not the interpreter's exit: it would wait for them
    # The interpreter's exit collects every object the daemons made, a hundred thousand of
    # them (models, SQLAlchemy): most of a second on a busy host. Frozen, they are left to the
    # exit, which frees the process's memory in one piece anyway.
    gc.freeze()
    if failures and isinstance(failures[0], errors.GctlError):
        raise failures[0]
    if failures:
        raise SystemExit(1)
    return received[0] if received else None


def _stop_at_end(fd: int, stop: threading.Event) -> None:
    """Set `stop` once the pipe `fd` reads at its end: its writer closed it, or died."""
    with contextlib.suppress(OSError):
        while os.read(fd, 64):
            pass
    stop.set()


class _AgentProcess:
    """`gctl up`'s node agent, in a process of its own, forked as `gctl up` starts: after it
    imports the agent's modules, which both processes then share (`up`), and before it opens
    anything or starts a thread. The controller and the agent each get an interpreter,
    and its lock (the GIL), to themselves: in one process, the agent's reports and launches
    waited for the controller's passes and the other way round, and `gctl up` could use no
    more than one core's worth of Python (docs/decisions.md).

    Two pipes join them. On `said`, the agent writes READY once its part is built (its Node
    claimed, or another agent's heartbeat being watched), and `gctl up` waits for it before it
    starts its parts; and, if it ends with an error, the error, which `gctl up` then says as
    its own: a refused agent stops `gctl up` before anything runs, its error the last line, as
    when both ran in one process. `gctl up` holds the write end of `stop`: it closes it to
    stop the agent, and the kernel closes it when `gctl up` dies, even of SIGKILL, so an agent
    is never left behind. Ctrl-C is `gctl up`'s: the agent ignores SIGINT, and stops when `gctl
    up` closes the pipe. An agent that ends on its own stops `gctl up` (exit 1), as a part
    that fails does."""

    def __init__(self, pid: int, said: int, stop: int) -> None:
        self.pid = pid
        self._said = said  # read end
        self._ready = False  # whether READY came
        self._stop: int | None = stop  # write end; None once closed
        self._status: int | None = None  # its wait status, once reaped

    @classmethod
    def fork(cls, db_url: str | None, options: AgentOptions) -> "_AgentProcess":
        said_r, said_w = os.pipe()
        stop_r, stop_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(said_r)
            os.close(stop_w)
            _agent_process_main(db_url, options, said_w, stop_r)
        os.close(said_w)
        os.close(stop_r)
        return cls(pid, said_r, stop_w)

    def runner(self, stop: threading.Event) -> Callable[[threading.Event], None]:
        """Once the agent's part is built: what watches it among `gctl up`'s parts. A stop
        meanwhile returns at once (the parts then stop, and the agent with them); an agent
        that ends first, refused or not, is an error (`gctl up` then runs nothing)."""
        from gctl.store import notify

        while not self._ready and not stop.is_set():
            watched = [self._said, *[fd for fd in [notify.stop_fd(stop)] if fd is not None]]
            if self._said not in select.select(watched, [], [], STOP_CHECK_S)[0]:
                continue
            said = os.read(self._said, len(READY))
            if said == READY:
                self._ready = True
                break
            status = self._wait()  # it ended: the pipe is at its end, or its error follows
            if _stopped(status) and stop.wait(SIGNAL_LAG_S):  # stopped with `gctl up`
                break
            raise self._ended(status, "before it started", said)
        return self._watch

    def _watch(self, stop: threading.Event) -> None:
        """Until `stop` (then the agent is stopped and waited for: its parts stop in moments,
        STOP_GRACE_S at most) or the agent's end (an error: a part of `gctl up` stopped)."""
        status = self._wait(stop)
        # A signal to the whole group (systemd's stop) stops the agent too, and it may end
        # first: a clean end, or one on a signal, is an error only if `gctl up` was not being
        # stopped as well.
        if status is None or (_stopped(status) and stop.wait(SIGNAL_LAG_S)):
            self.stop()
            if self._status is not None and (error := self._last_words()) is not None:
                raise errors.GctlError(error)  # while it stopped
            return
        raise self._ended(status)

    def _ended(self, status: int | None, when: str = "", head: bytes = b"") -> errors.GctlError:
        """The error of an agent that ended on its own: its own if it said one (`head`: what
        of it was read already), else how."""
        error = self._last_words(head)
        if error is not None:
            return errors.GctlError(error)
        code = 1 if status is None else os.waitstatus_to_exitcode(status)
        if (on := _signal_of(code)) is not None:
            how = f"stopped on {on}"
        elif code >= 0:
            how = f"exit {code}"
        else:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name
                how = f"killed by signal {-code}"
        ended = f"the node agent's process (pid {self.pid}) ended ({how})"
        return errors.GctlError(f"{ended} {when}" if when else ended)

    def _last_words(self, head: bytes = b"") -> str | None:
        """The error an agent that has ended wrote to `said`, if any (`head`: its first bytes,
        read already)."""
        os.set_blocking(self._said, False)  # never waits: its writer has ended
        data = head
        with contextlib.suppress(OSError):
            while chunk := os.read(self._said, 65536):
                data += chunk
        error = data.removeprefix(READY).removeprefix(ERROR)
        return error.decode(errors="replace") if error else None

    def stop(self, timeout: float | None = None) -> None:
        """Close the `stop` pipe, and wait for the agent to end (`timeout`: at most so long)."""
        if self._stop is not None:
            os.close(self._stop)
            self._stop = None
        self._wait(timeout=timeout)

    def _wait(
        self, stop: threading.Event | None = None, timeout: float | None = None
    ) -> int | None:
        """The agent's wait status once it has ended; None if `stop` is set, or `timeout`
        seconds pass, first."""
        from gctl.store import notify

        if self._status is not None:
            return self._status
        deadline = None if timeout is None else time.monotonic() + timeout
        stop_fd = notify.stop_fd(stop)
        pidfd = _pidfd(self.pid)
        watched = [fd for fd in (pidfd, stop_fd) if fd is not None]
        # Without a descriptor for each thing it waits on, it looks every STOP_CHECK_S.
        every = STOP_CHECK_S if pidfd is None or (stop is not None and stop_fd is None) else None
        try:
            while stop is None or not stop.is_set():
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self._status = status
                    return status
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                naps = [t for t in (left, every) if t is not None]
                select.select(watched, [], [], min(naps) if naps else None)
            return None
        finally:
            if pidfd is not None:
                os.close(pidfd)


def _signalled(name: str) -> int:
    """The agent process's exit code when the signal `name` stopped it (`SIGNALLED`)."""
    return SIGNALLED + signal.Signals[name].value


def _signal_of(code: int) -> str | None:
    """The signal that stopped the agent process, from its exit code (`SIGNALLED`); None if
    none did."""
    if code <= SIGNALLED:
        return None
    try:
        return signal.Signals(code - SIGNALLED).name
    except ValueError:
        return None


def _stopped(status: int | None) -> bool:
    """Whether the agent process ended as a stop does: cleanly, or on a signal it handles."""
    if status is None:
        return False
    code = os.waitstatus_to_exitcode(status)
    return code == 0 or _signal_of(code) is not None


def _pidfd(pid: int) -> int | None:
    """A descriptor readable once process `pid` ends; None where the system gives none (Linux
    before 5.3, or a seccomp profile older than pidfd_open: waits then poll)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _agent_process_main(db_url: str | None, options: AgentOptions, said: int, parent: int) -> None:
    """The agent process of `gctl up` (`_AgentProcess`): runs the agent until `gctl up` closes
    `parent`, or a signal, saying on `said` when its part is built and the error it ends with;
    never returns (os._exit: `gctl up`'s exit handlers are not this process's)."""
    code = 1
    try:

        def build(opened: _Opened) -> Runners:
            runner = _agent_runner(opened, db_url, options)
            with contextlib.suppress(OSError):  # `gctl up` gone: `parent` stops this one
                os.write(said, READY)
            return [("agent", runner)]

        received = _run(build, jobs_outlive=True, parent=parent)
        code = 0 if received is None else _signalled(received)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except errors.GctlError as exc:
        try:
            os.write(said, ERROR + str(exc).encode())
        except OSError:  # `gctl up` is gone: say it here
            print(f"error: {exc}", file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        logging.shutdown()
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def up(
    db_url: str | None,
    options: AgentOptions,
    node_timeout: float,
    backoff: float,
    syncs: "Sequence[syncer.Options]" = (),
) -> None:
    _logging()
    # The agent's modules, and with them the Store, its models, SQLAlchemy and pydantic that
    # the controller runs on as well, imported once, before the fork (importing them opens
    # nothing and starts no thread: tests/unit/test_agent_process.py): each process importing
    # them again cost a second of CPU at every start on a slow 2-core day.
    import nodeagent.agent  # noqa: F401

    agent_process = _AgentProcess.fork(db_url, options)
    try:
        _run(
            lambda opened: [
                ("controller", _controller_runner(opened, db_url, node_timeout, backoff)),
                ("agent", agent_process.runner(opened.stop)),
                *(_sync_runner(opened, db_url, sync_options, None) for sync_options in syncs),
            ],
            jobs_outlive=True,
        )
    finally:
        agent_process.stop(timeout=STOP_GRACE_S)


def controller(
    db_url: str | None,
    node_timeout: float,
    backoff: float,
    syncs: "Sequence[syncer.Options]" = (),
) -> None:
    _logging()
    _run(
        lambda opened: [
            ("controller", _controller_runner(opened, db_url, node_timeout, backoff)),
            *(_sync_runner(opened, db_url, options, None) for options in syncs),
        ]
    )


def sync_options(
    directory: str,
    applyset_name: str | None,
    prune: bool,
    on_spec_change: str | None,
    namespace: str | None,
) -> "syncer.Options":
    """`gctl sync DIR [--applyset NAME] ...` checked; the set's name defaults to the
    directory's."""
    from controller import sync as syncer
    from gctl.api import applyset, kinds
    from gctl.cli import apply as applying

    # Absolute, but not resolved: a symlink swapped to another directory (the README's way to
    # replace the truth at once) is followed, the link read again at each pass.
    path = Path(os.path.abspath(directory))
    if not path.is_dir():
        raise errors.Invalid(f"{directory}: not a directory (sync takes the directory to follow)")
    name = applyset_name or applyset.name_for_directory(str(path))
    policy = applying.checked_set_flags(name, on_spec_change)
    try:
        if namespace is not None:
            names.check_dns_label(namespace)
    except ValueError as exc:
        raise errors.Invalid(f"-n: {exc}") from None
    return syncer.Options(
        directory=path,
        name=name,
        default_name=applyset_name is None,
        namespace=namespace or kinds.DEFAULT_NAMESPACE,
        prune=prune,
        on_spec_change=policy,
    )


def _print_report(line: str, is_error: bool) -> None:
    """A sync's lines on the terminal: changes on stdout, errors on stderr."""
    stream = sys.stderr if is_error else sys.stdout
    stream.write(line + "\n")
    stream.flush()


def _sync_runner(
    opened: _Opened,
    db_url: str | None,
    options: "syncer.Options",
    report: "syncer.Report | None",
) -> tuple[str, Callable[[threading.Event], None]]:
    from controller import sync as syncer

    the_sync = syncer.Syncer(opened.database(db_url), options, report=report or syncer.log_report)
    return f"sync-{options.name}", the_sync.run


def sync(db_url: str | None, options: "syncer.Options", watch: bool) -> None:
    """`gctl sync DIR`: one pass (exit 1 with the error if it applied nothing), or with
    --watch, passes until Ctrl-C or SIGTERM (exit 0)."""
    if watch:
        _logging()
        _run(lambda opened: [_sync_runner(opened, db_url, options, _print_report)])
        return
    from controller import sync as syncer
    from gctl.store import db

    database = db.Database.open(db_url)
    try:
        outcome = syncer.Syncer(database, options, report=_print_report).sync_once()
    finally:
        database.close()
    if outcome.error is not None:
        raise SystemExit(1)


def agent(db_url: str | None, options: AgentOptions) -> None:
    _logging()
    _run(lambda opened: [("agent", _agent_runner(opened, db_url, options))], jobs_outlive=True)


def virtual_agent(db_url: str | None, options: VirtualOptions) -> None:
    _logging()
    _run(lambda opened: [("agent", _virtual_runner(opened, db_url, options))])
