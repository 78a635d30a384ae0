"""GitOps sync: a directory of manifests as the truth, applied as one ApplySet.

One pass reads every manifest under the directory. If any file is broken, nothing is applied:
the last good state stays, and the ApplySet's status (and the terminal) say which file, line
and field. Otherwise everything is applied, and members gone from the directory are pruned,
in one transaction. A pass that puts back a member someone changed or deleted by hand records
an Event `DriftReverted` on the member and on the set.

`Syncer.run` keeps passing: on every save in the directory (watchfiles, debounced; `dirwatch`
follows the directory when it is deleted and made again, or its path, a symlink, is swapped), on
every change to a member that did not come from this sync (the change feed), and once a minute
whatever happened (`PERIODIC_S`).
"""

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from controller import dirwatch
from gctl.api import applyset, errors, failures, kinds, manifest, meta
from gctl.store import applying, applysets, db, feed, planning, store

log = logging.getLogger("gctl.sync")
Key = applying.Key
Fingerprint = tuple[str, str, str]
SOURCE = "gctl-sync"  # the From of the Events a sync records
# A pass this often with no event to ask for one, as Argo CD and Flux resync on an interval:
# what no file event tells (a directory of manifests moved in or out, a symlinked file's target
# edited outside the directory) and a pass refused for a reason that has since gone (an object
# another set held until it let go) are taken up within this long.
PERIODIC_S = 60.0
DELETED_BY_HAND = "deleted by hand"


@dataclass(frozen=True)
class Options:
    directory: Path  # absolute
    name: str  # the ApplySet
    default_name: bool = False  # made from the directory's: never take another source's set
    namespace: str = kinds.DEFAULT_NAMESPACE  # for manifests that name none
    prune: bool = True
    on_spec_change: applyset.OnSpecChange | None = None
    debounce_ms: int = 200


@dataclass
class Outcome:
    """What one pass did: lines for the terminal, or the one-line error that stopped it."""

    lines: list[str] = field(default_factory=list)
    error: str | None = None
    revision: int | None = None  # what its write committed at, if it wrote


Report = Callable[[str, bool], None]  # (line, is_error)


def log_report(line: str, is_error: bool) -> None:
    (log.warning if is_error else log.info)("%s", line)


class Syncer:
    def __init__(
        self,
        database: db.Database,
        options: Options,
        *,
        report: Report = log_report,
        clock: Callable[[], datetime] = meta.utcnow,
    ) -> None:
        self.db = database
        self.options = options
        self.report = report
        self.clock = clock
        # The directory came back and is still being written (dirwatch.SETTLING): no pass
        self._settling = threading.Event()
        # Per member: what the source said at the last good pass (a change of the stored object
        # that the source did not make is drift), and the object as this sync last wrote it.
        self._source: dict[Key, Fingerprint] = {}
        self._stored: dict[Key, Fingerprint] = {}
        self._own: set[int] = set()  # revisions this sync wrote
        self._lock = threading.Lock()
        self._failures = failures.FailureLog(log)
        self.periodic_s = PERIODIC_S

    # -- one pass -------------------------------------------------------------------------------

    def sync_once(self, *, periodic: bool = False) -> Outcome:
        """Read the directory and apply it, or record why not; never raises a user's error.
        `periodic`: a pass no event asked for (`PERIODIC_S`), which says nothing when it
        changed nothing."""
        with self._lock:
            outcome = self._pass()
        quiet = periodic and outcome.error is None and len(outcome.lines) <= 1
        for line in [] if quiet else outcome.lines:
            self.report(line, False)
        if outcome.error is not None:
            self.report(f"error: {outcome.error}", True)
        return outcome

    def _pass(self) -> Outcome:
        now = self.clock()
        texts: dict[str, str] = {}
        try:
            texts = dict(manifest.read_sources([str(self.options.directory)], recursive=True))
            manifests = manifest.load([str(self.options.directory)], True, self.options.namespace)
        except errors.Invalid as exc:
            located = _locate(texts, str(exc))
            return self._fail(applyset.REASON_INVALID_MANIFEST, located, now)
        set_options = self._set_options(applyset.source_hash(list(texts.values())))
        try:
            outcome, stored = store.transact(
                self.db,
                lambda writer: self._apply(writer, manifests, set_options, now),
                retry_on=(errors.Conflict, errors.AlreadyExists),
            )
        except applysets.OtherSource as exc:  # not this directory's set: leave it alone
            return Outcome(error=str(exc))
        except (errors.Invalid, errors.Forbidden, errors.NotFound, errors.Conflict) as exc:
            located = _locate(texts, str(exc))
            return self._fail(applyset.REASON_APPLY_REFUSED, located, now)
        # Committed: from now on a change that is not ours is drift.
        self._source = {applying.key_of(m.obj): _source_fingerprint(m) for m in manifests}
        self._stored = stored
        if outcome.revision is not None:
            self._own.add(outcome.revision)
        return outcome

    def _apply(
        self,
        writer: store.Store,
        manifests: Sequence[manifest.Manifest],
        options: applying.SetOptions,
        now: datetime,
    ) -> tuple[Outcome, dict[Key, Fingerprint]]:
        held = applysets.members(writer, options.name)
        actions = applying.decide(writer, manifests, False, options, now, held=held)
        results = list(zip(actions, applying.execute(writer, actions), strict=True))
        sources = {applying.key_of(m.obj): _source_fingerprint(m) for m in manifests}
        outcome = Outcome()
        drift: list[tuple[meta.Resource, str]] = []
        for action, obj in results:
            if action.verb == "unchanged":
                continue
            why = self._drift(action, sources)
            if why is not None:
                drift.append((obj, why))
            note = f" (drift reverted: {why})" if why else ""
            rerun = f" (rerun: {action.rerun})" if action.rerun else ""
            outcome.lines.append(f"{planning.ref_of(obj)} {action.verb}{rerun}{note}")
        the_set = applysets.record_set(
            writer, options, results, now, held=held, drift_reverted=len(drift)
        )
        outcome.lines.append(f"applyset.gctl/{the_set.name} synced: {the_set.status.summary}")
        for obj, why in drift:
            done = "recreated" if why == DELETED_BY_HAND else "reverted"
            message = f"{planning.ref_of(obj)}: {why}; {done} from {self.options.directory}"
            writer.record_event(
                obj, applyset.REASON_DRIFT_REVERTED, message, type_="Warning", source=SOURCE
            )
            writer.record_event(
                the_set, applyset.REASON_DRIFT_REVERTED, message, type_="Warning", source=SOURCE
            )
        for action, obj in results:
            if action.verb == "pruned":
                message = f"{planning.ref_of(obj)}: gone from {self.options.directory}; deleted"
                writer.record_event(the_set, applyset.REASON_PRUNED, message, source=SOURCE)
        outcome.revision = writer.written_revision
        stored = {
            applying.key_of(obj): planning.applied_fingerprint(obj.wire())
            for action, obj in results
            if action.verb != "pruned"
        }
        return outcome, stored

    def _drift(self, action: planning.Action, sources: dict[Key, Fingerprint]) -> str | None:
        """Why the stored object differed though its source did not: a change made by hand."""
        key = applying.key_of(action.desired)
        if action.verb not in ("created", "configured") or self._source.get(key) is None:
            return None
        if self._source[key] != sources.get(key):
            return None  # the file changed: this is the sync's own change, not drift
        if action.current is None:
            return DELETED_BY_HAND
        return f"{planning.changed_field(action.current, action.desired)} changed by hand"

    def _set_options(self, source_hash: str | None = None) -> applysets.SetOptions:
        return applysets.SetOptions(
            name=self.options.name,
            prune=self.options.prune,
            on_spec_change=self.options.on_spec_change,
            source=str(self.options.directory),
            source_hash=source_hash,
            default_name=self.options.default_name,
        )

    def _fail(self, reason: str, error: applyset.SourceError, now: datetime) -> Outcome:
        set_options = self._set_options()
        message = f"{error.message}; the last good state stays"
        try:
            revision = store.transact(
                self.db,
                lambda writer: _written(
                    writer, applysets.record_failure(writer, set_options, reason, error, now)
                ),
            )
        except applysets.OtherSource as exc:  # not this directory's set: its status stays
            return Outcome(error=f"{exc} (and {message})")
        except errors.GctlError as exc:  # the database is away: say both
            return Outcome(error=f"{message} (and the status could not be written: {exc})")
        if revision is not None:
            self._own.add(revision)
        return Outcome(error=message)

    # -- watching ---------------------------------------------------------------------------

    def drifted(self, changes: Sequence[store.Change]) -> bool:
        """Whether any of these changes, not written by this sync, touched what the sync
        applied to a member: its spec, labels or annotations, or its existence."""
        found = False
        with self._lock:  # a pass in flight: wait for what it wrote to be known as its own
            own, stored = set(self._own), dict(self._stored)
        for change in changes:
            if change.revision in own:
                continue
            key = (change.kind, change.namespace, change.name)
            if change.object["metadata"].get("ownerReferences"):
                continue  # a Sweep's Jobs: their owner is the member
            labels = change.object["metadata"].get("labels", {})
            if key not in stored:
                found |= labels.get(applyset.LABEL) == self.options.name  # joined by hand
            elif change.type == "DELETED":
                found = True
            else:
                found |= planning.applied_fingerprint(change.object) != stored[key]
        if changes:
            with self._lock:
                self._own = {r for r in self._own if r > changes[-1].revision}
        return found

    def run(self, stop: threading.Event) -> None:
        """Pass now, then on every change to the directory or to a member, until `stop`."""
        with self.db.read() as session:
            since = store.Store(session).current_revision()
        wakeups: queue.Queue[str] = queue.Queue()
        threads = [
            threading.Thread(target=self._watch_files, args=(wakeups, stop), daemon=True),
            threading.Thread(target=self._watch_feed, args=(since, wakeups, stop), daemon=True),
        ]
        for thread in threads:
            thread.start()
        log.info("syncing %s as applyset %s", self.options.directory, self.options.name)
        wakeups.put("start")
        while not stop.is_set():
            periodic = False
            try:
                wakeups.get(timeout=self.periodic_s)  # the watchers wake it as they stop
            except queue.Empty:
                periodic = True  # what no event tells: see PERIODIC_S
            if stop.is_set():
                break
            while not wakeups.empty():  # one pass for everything that came together
                wakeups.get_nowait()
            if self._settling.is_set():  # its BACK brings the pass (drift, retries wait)
                continue
            try:
                self.sync_once(periodic=periodic)
            except Exception as exc:  # the database went away: the loop must not die
                self._failures.failed(f"sync of {self.options.directory}", exc)
                stop.wait(1.0)
                wakeups.put("retry")
        for thread in threads:
            thread.join(timeout=5)

    def _watch_files(self, wakeups: "queue.Queue[str]", stop: threading.Event) -> None:
        try:
            self._follow_files(wakeups, stop)
        finally:
            wakeups.put("stop")  # wakes the loop, which then sees the stop

    def _follow_files(self, wakeups: "queue.Queue[str]", stop: threading.Event) -> None:
        directory = self.options.directory
        while not stop.is_set():
            try:
                for what in dirwatch.changes(
                    directory,
                    _manifest_filter(directory),
                    stop,
                    debounce_ms=self.options.debounce_ms,
                ):
                    if what == dirwatch.SETTLING:  # no pass reads it until it is whole
                        self._settling.set()
                        continue
                    if what == dirwatch.BACK:
                        log.info("%s is back; following it again", directory)
                    self._settling.clear()
                    wakeups.put("files")
            except (OSError, RuntimeError) as exc:  # the watcher failed: start it again, then pass
                log.warning("watching %s: %s", directory, exc)
                stop.wait(2.0)
                wakeups.put("files")

    def _watch_feed(self, since: int, wakeups: "queue.Queue[str]", stop: threading.Event) -> None:
        said = failures.FailureLog(log)  # this thread's own
        while not stop.is_set():
            try:
                with feed.Watch(self.db, since=since, kinds=kinds.APPLIABLE, stop=stop) as changes:
                    for batch in changes:
                        since = batch[-1].revision
                        if self.drifted(batch):
                            wakeups.put("drift")
            except Exception as exc:  # the database went away: reconnect, then look again
                said.failed("change feed", exc)  # once a minute, while the database is away
                stop.wait(1.0)
                wakeups.put("resync")


def _written(writer: store.Store, _obj: Any) -> int | None:
    return writer.written_revision


def _manifest_filter(directory: Path) -> Callable[[str], bool]:
    """Changes to manifest files under `directory`, not in hidden files or directories."""

    def wanted(path: str) -> bool:
        try:
            parts = Path(path).relative_to(directory).parts
        except ValueError:
            return False
        hidden = any(part.startswith(".") for part in parts)
        return path.endswith(manifest.MANIFEST_SUFFIXES) and not hidden

    return wanted


def _locate(texts: dict[str, str], message: str) -> applyset.SourceError:
    """The file, line and field of an error about one of the files read."""
    for file in sorted(texts, key=len, reverse=True):  # the longest name that matches
        if message.startswith(f"{file}: "):
            return applyset.locate(file, texts[file], message)
    return applyset.SourceError(message=message)


def _source_fingerprint(m: manifest.Manifest) -> Fingerprint:
    return planning.applied_fingerprint(m.obj.wire())
