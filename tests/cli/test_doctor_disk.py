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


@pytest.mark.parametrize("free_bytes, status, tail", [
    (5000 * MB, "ok", ""),
    (100 * MB, "ok", ""),
    (100 * MB - 1, "warn", " (under 100 MB)"),
    (10 * MB, "warn", " (under 100 MB)"),
    (10 * MB - 1, "fail", ": under 10 MB writes will soon answer 507; free some space"),
])
def test_low_disk_is_reported(tmp_path: Path, monkeypatch, free_bytes: int, status: str, tail: str) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**12, 0, free_bytes))
    check = check_disk(tmp_path / "data")
    assert check.as_dict() == {"check": "disk_space", "status": status,
                               "message": f"{free_bytes // MB} MB free on the disk holding {tmp_path / 'data'}{tail}"}


def test_the_nearest_directory_that_exists_is_measured(tmp_path: Path, monkeypatch) -> None:
    measured = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: measured.append(path) or Usage(10**12, 0, 500 * MB))
    where = tmp_path / "not" / "yet" / "made"
    assert check_disk(where).as_dict() == {"check": "disk_space", "status": "ok",
                                           "message": f"500 MB free on the disk holding {where}"}
    assert measured == [tmp_path]


def test_an_unwritable_home_fails(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**12, 0, 5000 * MB))
    asked = []

    def access(path: Path, mode: int) -> bool:
        asked.append((path, mode))
        return False

    monkeypatch.setattr(os, "access", access)
    assert check_disk(tmp_path).as_dict() == {"check": "disk_space", "status": "fail", "message":
        f"{tmp_path} is not writable: every write would answer 503 (5000 MB free on the disk holding {tmp_path})"}
    assert asked == [(tmp_path, os.W_OK)]
