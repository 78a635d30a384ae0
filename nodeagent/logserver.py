"""Serving this node's logs to `gctl logs` and `gctl run --attach` on other hosts, through the
database (gctl.store.logstreams says how a request goes).

A loop of its own in the agent, level-based like the agent's: every pass reads this node's
requests and moves each one step: take a new one (or refuse it, saying why), send what the
window allows from where the last chunk ended, mark it Done once everything is sent (a followed
log: once its attempt has ended), drop one whose requester stopped renewing its lease. It wakes
on the requests' wake-ups, on a followed log growing, on the supervisors' records of exits
(`supervisor.NOTIFY`) and at the next lease's end; with no request it waits for the first and
uses no CPU.
"""

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from gctl.api import errors, failures
from gctl.store import db, feed, logstreams, notify

log = logging.getLogger("gctl.agent")
CHUNK_BYTES = 256 * 1024
WINDOW_BYTES = 16 * CHUNK_BYTES  # sent and not yet taken by the requester, at most
# A followed log that grows wakes the loop this long after it first grew: a job printing a
# line at a time is sent in chunks, not a write of the database per line.
GATHER_SECONDS = 0.05
# A request whose step failed (the database refusing writes, say) is tried again after this
# long, not at once: a failure that repeats must not spin the loop.
RETRY_SECONDS = 1.0


@dataclass
class _Stream:
    """What the loop keeps of a request between passes."""

    renewed_at: datetime
    seen_at: float  # when a renewal was last seen, on this host's monotonic clock
    handle: BinaryIO | None = None
    watch: threading.Event | None = None  # set to stop the thread that watches its file

    def close(self) -> None:
        if self.watch is not None:
            self.watch.set()
        if self.handle is not None:
            self.handle.close()
            self.handle = None


class LogServer:
    def __init__(
        self,
        database: db.Database,
        node_name: str,
        logs_dir: Path,
        *,
        exits_bell: Path,
        ended: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = database
        self.node = node_name
        self.logs_dir = logs_dir.resolve()
        self.exits_bell = exits_bell
        self.ended = ended  # whether an attempt (by its Binding's uid) has ended on this host
        self.clock = clock
        self.wake = threading.Event()
        self._streams: dict[int, _Stream] = {}
        self._failures = failures.FailureLog(log, clock=clock)

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set."""
        wakers = [
            threading.Thread(target=self._wake_on_requests, args=(stop,), daemon=True),
            threading.Thread(target=self._wake_on_exits, args=(stop,), daemon=True),
            threading.Thread(target=self._wake_on_stop, args=(stop,), daemon=True),
        ]
        for thread in wakers:
            thread.start()
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    wait = self.serve()
                except Exception as exc:  # the loop never dies: log, and try again shortly
                    self._failures.failed("serving logs", exc)
                    wait = RETRY_SECONDS
                self.wake.wait(feed.RESYNC_SECONDS if wait is None else wait)
        finally:
            for thread in wakers:
                thread.join(timeout=5)
            self.close()

    def close(self) -> None:
        """Let go of the files being sent (a restarted server resumes from the database)."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def _wake_on_stop(self, stop: threading.Event) -> None:
        """The loop sleeps on `wake` alone: a stop must wake it too."""
        stop.wait()
        self.wake.set()

    def _wake_on_requests(self, stop: threading.Event) -> None:
        said = failures.FailureLog(log)  # this thread's own
        while not stop.is_set():
            try:
                waker = logstreams.waker(self.db, stop, logstreams.for_node(self.node))
            except errors.GctlError as exc:  # the database is away: the loop retries too
                said.failed("log requests", exc)  # once a minute, while the database is away
                stop.wait(2.0)
                continue
            try:
                while not stop.is_set():
                    if waker.wait(feed.RESYNC_SECONDS):
                        self.wake.set()
            except Exception as exc:
                said.failed("log requests", exc)
                self.wake.set()
                stop.wait(2.0)
            finally:
                waker.close()

    def _wake_on_exits(self, stop: threading.Event) -> None:
        """An attempt that ends ends its followers' streams."""
        bell = notify.bell(self.exits_bell, stop)
        try:
            while not stop.is_set():
                if bell.wait(feed.RESYNC_SECONDS) and self._streams:
                    self.wake.set()
        finally:
            bell.close()

    # -- one pass ------------------------------------------------------------------------------

    def serve(self) -> float | None:
        """One pass over this node's requests; the seconds until the next pass is due: a
        lease may end, or a failed step is to be tried again (None: no request to watch)."""
        with self.db.read() as session:
            requests = logstreams.requests_for(session, self.node)
        for gone in set(self._streams) - {r.id for r in requests}:
            self._streams.pop(gone).close()  # its requester closed it
        now = self.clock()
        next_end: float | None = None
        for request in requests:
            stream = self._streams.get(request.id)
            if stream is None:
                stream = self._streams[request.id] = _Stream(request.renewed_at, now)
            elif stream.renewed_at != request.renewed_at:
                stream.renewed_at, stream.seen_at = request.renewed_at, now
            ends = stream.seen_at + request.lease_seconds
            if now >= ends:
                log.info("log request %d lapsed: its requester is gone", request.id)
                self._drop(request)
                continue
            next_end = ends if next_end is None else min(next_end, ends)
            try:
                self._step(request, stream)
            except errors.GctlError as exc:  # the database is away, say: again shortly
                self._failures.failed(f"log request {request.id}", exc)
                next_end = min(next_end, now + RETRY_SECONDS)
        return None if next_end is None else max(0.0, next_end - self.clock())

    def _drop(self, request: logstreams.Request) -> None:
        self._streams.pop(request.id).close()
        with logstreams.writing(self.db) as session:
            logstreams.close(session, request.id)

    def _step(self, request: logstreams.Request, stream: _Stream) -> None:
        if request.state == logstreams.PENDING:
            request = self._take(request)
        if request.state != logstreams.SERVING:
            return  # Done or Failed: its requester takes the rest and closes it
        # Whether the attempt has ended, asked before reading: what it wrote before it ended
        # is in the file by then, so a read to the end sends all of it.
        over = not request.follow or self.ended(request.binding_uid)
        try:
            handle = self._open(request, stream)
        except OSError as exc:
            with logstreams.writing(self.db) as session:
                logstreams.answer(
                    session, request, logstreams.FAILED, f"{exc.strerror}: {exc.filename}"
                )
            return
        while handle is not None:
            room = WINDOW_BYTES - (request.sent - request.received)
            if room <= 0:
                return  # the window is full: the requester's take wakes the loop
            chunks = _read(handle, request.sent, room)
            if not chunks:
                break  # at the end of the file, for now
            with logstreams.writing(self.db) as session:
                if not logstreams.send(session, request, chunks):
                    return  # gone meanwhile; the next pass forgets it
            request = dataclasses.replace(request, sent=chunks[-1].position + len(chunks[-1].data))
        if over:
            with logstreams.writing(self.db) as session:
                logstreams.finish(session, request)
            stream.close()
        elif stream.watch is None:
            self._watch(request, stream)

    def _take(self, request: logstreams.Request) -> logstreams.Request:
        """Serve a new request, or refuse it saying why."""
        refusal = self._refusal(request)
        state = logstreams.FAILED if refusal else logstreams.SERVING
        with logstreams.writing(self.db) as session:
            taken = logstreams.answer(session, request, state, refusal)
        if refusal:
            log.info("log request %d refused: %s", request.id, refusal)
        return dataclasses.replace(request, state=state) if taken else request

    def _refusal(self, request: logstreams.Request) -> str | None:
        """Why this agent will not send that file, or None."""
        path = Path(request.path)
        try:
            inside = path.resolve().is_relative_to(self.logs_dir)
        except OSError:
            inside = False
        if not inside:
            return f"{request.path} is not a log of node {self.node}"
        if not path.is_file() and not (request.follow and not self.ended(request.binding_uid)):
            return f"its log {request.path} is not on node {self.node}"
        return None

    def _open(self, request: logstreams.Request, stream: _Stream) -> BinaryIO | None:
        """The log, read from where the last chunk sent ended; None while it does not exist
        (a followed attempt's supervisor opens it as it starts the job)."""
        if stream.handle is None:
            try:
                stream.handle = open(request.path, "rb")  # noqa: SIM115 (closed by close())
            except FileNotFoundError:
                return None
        stream.handle.seek(request.sent)
        return stream.handle

    def _watch(self, request: logstreams.Request, stream: _Stream) -> None:
        """Wake the loop whenever a followed log grows."""
        stream.watch = threading.Event()
        threading.Thread(
            target=self._wake_on_growth,
            args=(Path(request.path), stream.watch),
            daemon=True,
            name=f"log-{request.id}",
        ).start()

    def _wake_on_growth(self, path: Path, stop: threading.Event) -> None:
        if not path.parent.is_dir():
            return
        bell = notify.bell(path, stop)
        try:
            while not stop.is_set():
                if bell.wait(feed.RESYNC_SECONDS):
                    stop.wait(GATHER_SECONDS)
                    self.wake.set()
        finally:
            bell.close()


def _read(handle: BinaryIO, position: int, room: int) -> list[logstreams.Chunk]:
    """Up to `room` bytes from `position`, in chunks."""
    chunks = []
    while room > 0:
        data = handle.read(min(CHUNK_BYTES, room))
        if not data:
            break
        chunks.append(logstreams.Chunk(position, data))
        position += len(data)
        room -= len(data)
    return chunks
