"""Shared fixtures: real daemons in subprocesses, and an in-process app for middleware tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import Daemon, make_home  # noqa: E402


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons with a given config; all are stopped at the end of the test."""
    started: list[Daemon] = []

    def start(config_text: str | None = None, api_key: str = "", wait: bool = True,
              sub: str = "", **kwargs) -> Daemon:
        home = make_home(tmp_path / (sub or f"d{len(started)}"), config_text)
        daemon = Daemon(home, api_key=api_key, **kwargs)
        started.append(daemon)
        return daemon.start(wait=wait)

    yield start
    for daemon in started:
        try:
            daemon.stop()
        except RuntimeError:
            pass


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon (no API key) shared by the read-mostly tests of a module."""
    home = make_home(tmp_path_factory.mktemp("shared"))
    daemon = Daemon(home).start()
    yield daemon
    daemon.stop()
