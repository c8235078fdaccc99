"""`agentd doctor`'s disk check: the free space on the disk holding the database against
its two thresholds, and an unwritable directory."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from agentd.cli.doctor import check_disk

Usage = namedtuple("Usage", "total used free")
MB = 1024 * 1024


@pytest.mark.parametrize("free_mb, status, words", [
    (5000, "ok", "5000 MB free on the disk holding"),
    (99, "warn", "99 MB free on the disk holding"),
    (9, "fail", "writes will soon answer 507; free some space"),
])
def test_low_disk_is_reported(tmp_path: Path, monkeypatch, free_mb: int, status: str, words: str) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**12, 0, free_mb * MB))
    check = check_disk(tmp_path / "data")
    assert (check.name, check.status) == ("disk_space", status)
    assert words in check.message and str(tmp_path / "data") in check.message


def test_an_unwritable_home_fails(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    check = check_disk(tmp_path)
    assert check.status == "fail" and check.message.startswith(f"{tmp_path} is not writable")
