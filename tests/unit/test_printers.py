"""kubectl-style ages and tables."""

from datetime import UTC, datetime, timedelta

import pytest

from gctl.cli import printers

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (45, "45s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (15 * 60, "15m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (5 * 3600 + 30 * 60, "5h30m"),
        (20 * 3600, "20h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (30 * 86400, "30d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert printers.human_duration(seconds) == text


def _job(name: str, phase: str = "Pending", **spec: object) -> dict[str, object]:
    created = (NOW - timedelta(minutes=5)).isoformat()
    return {
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        "spec": {"command": ["true"], **spec},
        "status": {"phase": phase},
    }


def test_job_table_columns_align_and_fit() -> None:
    table = printers.Table("Job", wide=False, namespaces=False, show_labels=False)
    lines = table.lines(
        [_job("a", resources={"gpus": 0.5, "gpuMemory": "8Gi"}), _job("long-name", suspend=True)],
        NOW,
        header=True,
    )
    assert lines[0].split() == ["NAME", "STATUS", "GPUS", "POOL", "PRIORITY", "AGE"]
    assert lines[1].split() == ["a", "Pending", "0.5x8Gi", "default", "0", "5m"]
    assert lines[2].split() == ["long-name", "Suspended", "1", "default", "0", "5m"]
    assert len({line.index(line.split()[1]) for line in lines}) == 1  # STATUS column aligned
    assert all(len(line) <= 100 for line in lines)


def test_watch_rows_keep_the_first_widths() -> None:
    table = printers.Table("Job", wide=False, namespaces=True, show_labels=False)
    first = table.lines([_job("a")], NOW, header=True)
    later = table.lines([_job("b", phase="Running")], NOW, header=False)
    assert len(later) == 1
    assert first[1].index("Pending") == later[0].index("Running")
