"""The boot id a supervisor records beside a pid (nodeagent/supervisor.py): read once a
process, and a read that failed is not kept."""

from pathlib import Path

import pytest

from nodeagent import supervisor


def test_the_boot_id_is_read_once_and_a_failed_read_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(supervisor, "_BOOT", [])
    monkeypatch.setattr(supervisor, "BOOT_ID", tmp_path / "boot_id")
    assert supervisor.boot_id() == ""  # cannot be read (out of descriptors, say)
    (tmp_path / "boot_id").write_text("first\n")
    assert supervisor.boot_id() == "first"
    (tmp_path / "boot_id").write_text("second\n")
    assert supervisor.boot_id() == "first"  # a process does not outlive its boot
