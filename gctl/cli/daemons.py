"""`gctl up`, `gctl controller run`, `gctl agent run`: the long-running parts, in the foreground.

The only module of the CLI that imports the controller and the node agent, and only when one of
these commands runs.
"""

import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from gctl.api import errors, names


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


def _logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


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


def _agent_runner(db_url: str | None, options: AgentOptions) -> Callable[[threading.Event], None]:
    from gctl.store import db
    from nodeagent import agent, gpus

    node_name = options.node_name or socket.gethostname().split(".")[0].lower()
    try:
        names.check_dns_subdomain(node_name)
    except ValueError as exc:
        raise errors.Invalid(f"--node-name: {exc}") from None
    backend, how = gpus.detect(options.fake_gpus, options.gpu_model, options.gpu_memory)
    state_dir = (options.state_dir or agent.default_state_dir(node_name)).resolve()
    the_agent = agent.Agent(
        db.Database.open(db_url),
        node_name,
        backend,
        state_dir,
        labels=_labels(options.labels),
        heartbeat_seconds=options.heartbeat_seconds,
        grace_seconds=options.grace_seconds,
        fence_seconds=options.fence_seconds,
    )
    logging.getLogger("gctl.agent").info("node %s: %s; state in %s", node_name, how, state_dir)
    return the_agent.run


def _controller_runner(
    db_url: str | None, node_timeout: float, backoff: float
) -> Callable[[threading.Event], None]:
    from controller import manager
    from gctl.store import db

    database = db.Database.open(db_url)
    logging.getLogger("gctl.controller").info("controller on %s", db.display_url(database.url))
    return manager.Controller(
        database,
        node_timeout=timedelta(seconds=node_timeout),
        backoff_base=timedelta(seconds=backoff),
    ).run


SWITCH_INTERVAL_S = 0.0005


def _run(runners: list[tuple[str, Callable[[threading.Event], None]]]) -> None:
    stop = _stop_on_signals()
    # A thread back from a database call waits for the GIL until the busy one yields it, up
    # to the switch interval (5 ms by default); every hand-off between the controller, the
    # agent and their feeds pays that several times. Yield sooner.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    failures: list[BaseException] = []

    def guarded(name: str, run: Callable[[threading.Event], None]) -> None:
        try:
            run(stop)
        except BaseException as exc:  # one part failing stops the others
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
    for thread in threads:
        thread.join(timeout=10)
    if failures and isinstance(failures[0], errors.GctlError):
        raise failures[0]
    if failures:
        raise SystemExit(1)


def up(db_url: str | None, options: AgentOptions, node_timeout: float, backoff: float) -> None:
    _logging()
    _run(
        [
            ("controller", _controller_runner(db_url, node_timeout, backoff)),
            ("agent", _agent_runner(db_url, options)),
        ]
    )


def controller(db_url: str | None, node_timeout: float, backoff: float) -> None:
    _logging()
    _run([("controller", _controller_runner(db_url, node_timeout, backoff))])


def agent(db_url: str | None, options: AgentOptions) -> None:
    _logging()
    _run([("agent", _agent_runner(db_url, options))])
