"""Following a directory of files that may be deleted and made again, without polling.

watchfiles (inotify) watches the directory's inode, not its name: once the directory is removed,
the watch is dead and reports nothing more, even when a directory of the same name comes back
(a CI re-clone, `rm -rf` and `cp`; the new one often gets the old inode number, too). So
`changes` watches the directory while it is there; when the directory itself is deleted or moved
away, it watches the nearest ancestor that exists, not recursively, until the directory is back,
and then watches the new one. Idle, it sleeps in the watcher; every `TICK_MS` it also looks
whether the directory is still the one it watches (a stat), in case the event that said so was
lost.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from watchfiles._rust_notify import RustNotify

log = logging.getLogger("gctl.sync")

TICK_MS = 5_000  # watchfiles' own wait between looks at its stop event
STEP_MS = 50  # watchfiles' default: how often the watcher looks for the end of a debounce
POLL_DELAY_MS = 300  # only where the watcher must poll (no inotify); watchfiles' default
DELETED = 3  # watchfiles.Change.deleted, which it reports for a watched root moved away, too
# A directory that comes back is read once nothing in it has changed for this long: a copy
# made in place is read whole (replace it at once, by `mv` or a symlink, to skip the wait).
SETTLE_MS = 2_000

CHANGED = "changed"  # a wanted file under the directory changed
GONE = "gone"  # the directory was deleted or moved away
SETTLING = "settling"  # it is there again, still being written: read nothing of it yet
BACK = "back"  # it is there again (and what it holds was not watched while it was away)

Identity = tuple[int, int]


def changes(
    directory: Path,
    wanted: Callable[[str], bool],
    stop: threading.Event,
    *,
    debounce_ms: int,
    tick_ms: int = TICK_MS,
) -> Iterator[str]:
    """CHANGED, GONE, SETTLING or BACK, each time one happens to `directory` (absolute),
    until `stop`.

    `wanted` says which changed paths count. Each of the three is a reason to read the
    directory again; BACK comes once the new directory is watched and has been quiet for
    `SETTLE_MS`, so that a read that follows sees the whole of it and misses nothing saved
    after.
    """
    back = False  # not watched since it came (back): say so once it is
    while not stop.is_set():
        identity = _identity(directory)
        if identity is None:
            _wait_until_there(directory, stop, tick_ms)
            back = True
            continue
        try:
            watcher = RustNotify([str(directory)], False, False, POLL_DELAY_MS, True, False)
        except (OSError, RuntimeError) as exc:  # gone again, or no inotify watch left
            log.warning("watching %s: %s", directory, exc)
            stop.wait(tick_ms / 1000)
            back = True
            continue
        with watcher:
            if back:
                yield SETTLING
                if not _settled(watcher, stop, debounce_ms, wanted):
                    return
                if _identity(directory) != identity:  # gone again while it settled
                    continue
                yield BACK
                back = False
            for batch in _batches(watcher, stop, debounce_ms, tick_ms):
                if any(wanted(path) for _, path in batch):
                    yield CHANGED
                if (DELETED, str(directory)) in batch or _identity(directory) != identity:
                    yield GONE
                    back = True
                    break


def _settled(
    watcher: RustNotify, stop: threading.Event, debounce_ms: int, wanted: Callable[[str], bool]
) -> bool:
    """Wait until no wanted file of the directory that came back has changed for `SETTLE_MS`
    (False on `stop`): it is being made again, and a pass over half of it would prune the rest
    (300 files copied in: 147 Jobs pruned, then made again). Other files (a log written on and
    on, `.git`) do not hold it back."""
    quiet_since = time.monotonic()
    while True:
        left_ms = SETTLE_MS - (time.monotonic() - quiet_since) * 1000
        if left_ms <= 0:
            return True
        raw = watcher.watch(debounce_ms, STEP_MS, max(1, int(left_ms)), stop)
        if raw == "timeout":
            continue
        if not isinstance(raw, set):  # "stop", or "signal" (only the main thread sees one)
            return False
        if any(wanted(path) for _, path in raw):
            quiet_since = time.monotonic()


def _batches(
    watcher: RustNotify, stop: threading.Event, debounce_ms: int, tick_ms: int
) -> Iterator[set[tuple[int, str]]]:
    """Each debounced batch of changes, and an empty one every `tick_ms`, until `stop`."""
    while True:
        raw = watcher.watch(debounce_ms, STEP_MS, tick_ms, stop)
        if raw == "timeout":
            yield set()
        elif isinstance(raw, set):
            yield raw
        else:  # "stop", or "signal" (only the main thread sees one)
            return


def _wait_until_there(directory: Path, stop: threading.Event, tick_ms: int) -> None:
    """Sleep until `directory` exists, or `stop`: watch the nearest ancestor that does, one
    level deep, and look again when anything in it changes (a step toward the directory)."""
    while not stop.is_set():
        ancestor = _nearest_existing(directory)
        if ancestor == directory:
            return
        try:
            watcher = RustNotify([str(ancestor)], False, False, POLL_DELAY_MS, False, False)
        except (OSError, RuntimeError):  # the ancestor went too, or no inotify watch left
            stop.wait(tick_ms / 1000)
            continue
        with watcher:
            # Looked at again once watched: a step made before the watch began is not missed.
            for _ in _batches(watcher, stop, 0, tick_ms):
                if _nearest_existing(directory) != ancestor:
                    break


def _nearest_existing(path: Path) -> Path:
    """`path` if it is a directory, else its nearest ancestor that is."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return candidate
    return Path(path.anchor)


def _identity(path: Path) -> Identity | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)
