"""The fixture of the end-to-end tests that run gctl's daemons."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Gctl
from tests.e2e.test_jobs import Cluster


@pytest.fixture
def cluster(gctl: Gctl, tmp_path: Path) -> Iterator[Cluster]:
    """A controller and agents that the test starts; stopped after it, and what they logged
    printed (pytest shows it with a failure's report only)."""
    running = Cluster(gctl, tmp_path)
    yield running
    running.stop()
    print(running.logs())
