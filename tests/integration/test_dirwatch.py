"""Following a directory with the real watcher (inotify) on real directories that the tests
delete, move away and make again, as a CI re-clone or `rm -rf` + `cp` does."""

import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller import dirwatch

WAIT = 10.0


class Followed:
    """`dirwatch.changes` on a thread: what it yields, waited for with a deadline."""

    def __init__(self, directory: Path) -> None:
        self.seen: queue.Queue[str] = queue.Queue()
        self.settling = 0
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(directory,), daemon=True)
        self._thread.start()

    def _follow(self, directory: Path) -> None:
        wanted = lambda path: path.endswith(".yaml")  # noqa: E731
        for what in dirwatch.changes(directory, wanted, self.stop, debounce_ms=50):
            if what == dirwatch.SETTLING:  # before each BACK: counted, not queued
                self.settling += 1
            else:
                self.seen.put(what)

    def next(self) -> str:
        return self.seen.get(timeout=WAIT)

    def until(self, wanted: str) -> list[str]:
        """What came, up to and with `wanted`."""
        came = [self.next()]
        while came[-1] != wanted:
            came.append(self.next())
        return came

    def close(self) -> None:
        self.stop.set()
        self._thread.join(timeout=WAIT)
        assert not self._thread.is_alive()


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    directory = tmp_path / "clone" / "exp"
    directory.mkdir(parents=True)
    (directory / "a.yaml").write_text("a: 1\n")
    return directory


@pytest.fixture
def followed(exp: Path) -> Iterator[Followed]:
    watching = Followed(exp)
    for _ in range(int(WAIT * 10)):  # save until one is seen: the watch has begun
        (exp / "start.yaml").write_text("")
        try:
            assert watching.seen.get(timeout=0.1) == dirwatch.CHANGED
            break
        except queue.Empty:
            continue
    time.sleep(0.3)  # more than a debounce: the saves may have made two batches
    while not watching.seen.empty():
        watching.seen.get()
    yield watching
    watching.close()


def test_a_save_is_a_change_and_other_files_are_not(exp: Path, followed: Followed) -> None:
    (exp / "notes.txt").write_text("x")
    (exp / "a.yaml").write_text("a: 2\n")
    assert followed.next() == dirwatch.CHANGED
    assert followed.seen.empty()


def test_deleted_and_made_again(exp: Path, followed: Followed, tmp_path: Path) -> None:
    shutil.copytree(exp, tmp_path / "saved")
    shutil.rmtree(exp)
    assert followed.until(dirwatch.GONE)[-1] == dirwatch.GONE
    shutil.copytree(tmp_path / "saved", exp)  # often the inode number the old one had
    assert followed.next() == dirwatch.BACK
    (exp / "a.yaml").write_text("a: 3\n")
    assert followed.next() == dirwatch.CHANGED


def test_moved_away_and_another_put_in_its_place(
    exp: Path, followed: Followed, tmp_path: Path
) -> None:
    away = tmp_path / "away"
    os.rename(exp, away)
    assert followed.next() == dirwatch.GONE
    exp.mkdir()
    assert followed.next() == dirwatch.BACK
    (away / "a.yaml").write_text("a: 4\n")  # not the directory followed any more
    (exp / "b.yaml").write_text("b: 1\n")
    assert followed.next() == dirwatch.CHANGED
    assert followed.seen.empty()


def test_its_parent_deleted_and_made_again_level_by_level(exp: Path, followed: Followed) -> None:
    clone = exp.parent
    shutil.rmtree(clone)
    assert followed.until(dirwatch.GONE)[-1] == dirwatch.GONE
    clone.mkdir()
    (clone / "README.yaml").write_text("")  # beside it, not in it
    exp.mkdir()
    assert followed.next() == dirwatch.BACK
    (exp / "a.yaml").write_text("a: 5\n")
    assert followed.next() == dirwatch.CHANGED


def test_missing_when_it_starts(tmp_path: Path) -> None:
    later = tmp_path / "later"
    watching = Followed(later)
    try:
        time.sleep(0.5)  # for the watch to begin (on its parent): made earlier, it is no news
        later.mkdir()
        assert watching.next() == dirwatch.BACK
    finally:
        watching.close()


def test_a_directory_made_again_file_by_file_comes_back_whole(
    exp: Path, followed: Followed, tmp_path: Path
) -> None:
    """A pass over half a directory would prune the other half: BACK waits until it has been
    quiet for SETTLE_MS."""
    shutil.rmtree(exp)
    assert followed.until(dirwatch.GONE)[-1] == dirwatch.GONE
    exp.mkdir()
    gap = dirwatch.SETTLE_MS / 1000 / 4
    for index in range(8):  # a slow copy: two seconds and more in all, never quiet for long
        (exp / f"j{index}.yaml").write_text(f"j: {index}\n")
        time.sleep(gap)
    written = time.monotonic()
    assert followed.next() == dirwatch.BACK
    assert time.monotonic() - written >= dirwatch.SETTLE_MS / 1000 - 2 * gap
    assert followed.seen.empty()
    assert followed.settling == 1  # said as soon as it was there: the sync passes nothing


def test_files_that_are_not_manifests_do_not_hold_a_directory_back(
    exp: Path, followed: Followed
) -> None:
    shutil.rmtree(exp)
    assert followed.until(dirwatch.GONE)[-1] == dirwatch.GONE
    exp.mkdir()
    started = time.monotonic()
    came: queue.Queue[str] = queue.Queue()
    writer = threading.Thread(target=lambda: _scribble(exp / "train.log", came), daemon=True)
    writer.start()
    try:
        assert followed.next() == dirwatch.BACK  # a log written on and on: BACK still comes
    finally:
        came.put("done")
        writer.join(timeout=WAIT)
    assert time.monotonic() - started < WAIT


def _scribble(path: Path, done: "queue.Queue[str]") -> None:
    with path.open("a") as log:
        while done.empty():
            log.write("step\n")
            log.flush()
            time.sleep(0.1)
