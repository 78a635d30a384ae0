"""An attempt's log read through its node's agent, for a log that is not on this machine (or
with `--from-node`): the requester's half of gctl.store.logstreams.

`show` writes a request, prints the chunks the agent sends as they come, byte for byte and in
order, and takes them (which moves the agent's window on), until the agent says it sent
everything; a thread renews the request's lease meanwhile. An agent that has not taken the
request within `ANSWER_SECONDS` is not answering: down, or too old to know requests; one that
sends nothing for a lease's length is given up once its attempt is declared lost or its own
heartbeat has stopped (a quiet job's agent heartbeats on). Whatever way `show` ends, it
deletes its request.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING

from gctl.api import errors
from gctl.cli import following

if TYPE_CHECKING:
    from gctl.api import binding
    from gctl.store import db, feed

ANSWER_SECONDS = 5.0  # for the node's agent to take a request
LEASE_SECONDS = 10.0  # the agent drops a request not renewed for this long
RENEW_SECONDS = LEASE_SECONDS / 4
READ_BYTES = 4 << 20  # chunks read at once, at most about this many bytes


class NotAnswering(errors.Unavailable):
    """The node's agent did not take the request in time."""


def show(
    database: db.Database, attempt: binding.Binding, follow: bool, stop: threading.Event
) -> None:
    """Print the attempt's log as its node's agent sends it; with `follow`, until the attempt
    ends. Interrupted when `stop` is set first; NotAnswering when the agent does not answer."""
    from gctl.api import meta
    from gctl.store import logstreams

    assert attempt.status.log_path is not None
    with logstreams.writing(database) as session:
        request_id = logstreams.open_request(
            session,
            node=attempt.spec.node,
            binding_uid=attempt.metadata.uid or "",
            path=attempt.status.log_path,
            follow=follow,
            lease_seconds=LEASE_SECONDS,
            now=meta.utcnow(),
        )
    done = threading.Event()
    renewer = threading.Thread(
        target=_renew, args=(database, request_id, done), daemon=True, name="log-lease"
    )
    try:
        waker = logstreams.waker(database, stop, logstreams.for_request(request_id))
        try:
            renewer.start()
            _print(database, attempt, request_id, waker, stop)
        finally:
            waker.close()
    finally:
        done.set()
        with contextlib.suppress(errors.GctlError), logstreams.writing(database) as session:
            logstreams.close(session, request_id)
        if renewer.is_alive():
            renewer.join(timeout=5)


def _print(
    database: db.Database,
    attempt: binding.Binding,
    request_id: int,
    waker: feed.Waker,
    stop: threading.Event,
) -> None:
    """Copy the chunks to stdout as they come, until the agent has sent everything."""
    from gctl.store import logstreams

    out = sys.stdout.buffer
    node = attempt.spec.node
    where = following.attempt_words(attempt)
    answer_by = time.monotonic() + ANSWER_SECONDS
    agent = _Agent(database, node)
    heard: tuple[str, int] | None = None  # the request's state and bytes sent, last seen
    heard_at = time.monotonic()  # when they last moved
    position = 0
    while True:
        with database.read() as session:
            request, chunks = logstreams.read(session, request_id, position, READ_BYTES)
        if request is None:
            raise errors.Unavailable(f"node {node} dropped the request for the log of {where}")
        if (request.state, request.sent) != heard:
            heard, heard_at = (request.state, request.sent), time.monotonic()
        for chunk in chunks:
            if chunk.position != position:  # never: the agent appends in order
                raise errors.Unavailable(
                    f"node {node} sent the log of {where} out of order "
                    f"(byte {chunk.position}, expected {position})"
                )
            out.write(chunk.data)
            position += len(chunk.data)
        if chunks:
            out.flush()
            with logstreams.writing(database) as session:
                logstreams.take(session, request, position)
        if request.state == logstreams.FAILED:
            raise errors.NotFound(f"{where} ran on node {node}: {request.message}")
        if request.state == logstreams.DONE and position >= request.sent:
            return
        if stop.is_set():
            raise following.Interrupted
        if position < request.sent:
            continue  # more was sent than read at once
        if request.state == logstreams.PENDING:
            left = answer_by - time.monotonic()
            if left <= 0:
                raise NotAnswering(
                    f"node {node} is not answering: its agent did not take the request for "
                    f"the log of {where} within {ANSWER_SECONDS:g}s (is gctl agent running "
                    "there, and as new as this gctl?)"
                )
            waker.wait(left)
            continue
        # Silence is measured on a deadline, not by the wake-up timing out: on SQLite the
        # wake-up is every log's doorbell, which this reader's own renewals ring.
        quiet = time.monotonic() - heard_at
        if quiet < LEASE_SECONDS:
            waker.wait(LEASE_SECONDS - quiet)
            continue
        if _lost(database, attempt):
            raise errors.Unavailable(
                f"node {node} stopped sending the log of {where}: the attempt was lost"
            )
        silent = agent.silent_for()
        if silent is not None:
            raise NotAnswering(
                f"node {node} is not answering: its agent stopped sending the log of {where} "
                f"and has not heartbeated for {silent:.0f}s"
            )
        waker.wait(RENEW_SECONDS)  # a quiet job, say: look again in a while


def _lost(database: db.Database, attempt: binding.Binding) -> bool:
    """Whether the attempt was declared lost (its node went silent) or deleted: its agent
    may never send the rest."""
    from gctl.api import binding
    from gctl.store import store

    with database.read() as session:
        found = store.Store(session).find(binding.Binding, attempt.name, attempt.namespace)
    return (
        found is None
        or found.metadata.uid != attempt.metadata.uid
        or (found.status.phase == "Lost")
    )


class _Agent:
    """Whether the node's agent has gone silent: its Node's heartbeat not moving for a few of
    its beats, timed on this host's monotonic clock from when this reader saw it move (as the
    controller judges nodes), so that hosts' clocks need not agree. It answers even when no
    controller runs to declare the attempt lost (`gctl up` killed whole)."""

    def __init__(self, database: db.Database, node: str) -> None:
        self.database = database
        self.node = node
        self.beat: object = None
        self.seen_at = time.monotonic()
        self.silent_for()

    def silent_for(self) -> float | None:
        """Seconds since the heartbeat last moved, once that is past silence; else None."""
        from gctl.api import node
        from gctl.store import store

        with self.database.read() as session:
            found = store.Store(session).find(node.Node, self.node)
        now = time.monotonic()
        beat = found.status.heartbeat_time if found is not None else None
        if beat != self.beat:
            self.beat, self.seen_at = beat, now
        instance = found.status.agent_instance if found is not None else None
        allowed = instance.silent_after() if instance is not None else node.SILENT_MIN_S
        quiet = now - self.seen_at
        return quiet if quiet >= allowed else None


def _renew(database: db.Database, request_id: int, done: threading.Event) -> None:
    """Renew the request's lease until `done`, or until the request is gone."""
    from gctl.api import meta
    from gctl.store import logstreams

    while not done.wait(RENEW_SECONDS):
        try:
            with logstreams.writing(database) as session:
                if not logstreams.renew(session, request_id, meta.utcnow()):
                    return
        except errors.GctlError:
            continue  # the database is away for now; the lease may still hold
