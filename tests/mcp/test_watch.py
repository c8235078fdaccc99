"""agentd.mcp.watch: the config file's `[[mcp_servers]]` applied live (in process: looks made by hand, then the
watcher's own thread and a real MCP hub)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from agentd.mcp.hub import McpHub
from agentd.mcp.loop import LoopThread
from agentd.mcp.watch import ConfigWatch, read_specs


def servers(*names: str) -> str:
    return "".join(f'\n[[mcp_servers]]\nname = "{n}"\ncommand = "mcp-{n}"\n' for n in names)


def test_a_change_is_applied_once_the_file_stays_the_same_for_a_look(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers("a", "b"))
    applied: list[list[str]] = []
    watch = ConfigWatch(path, lambda specs: applied.append([s.name for s in specs]))
    assert watch.check() is False and watch.check() is False and applied == [], "BUG: an unchanged file was applied"
    path.write_text("")  # a write in place, caught before its content
    assert watch.check() is False and applied == [], "BUG: a half-written file stopped the servers"
    path.write_text(servers("a", "b", "c"))
    assert watch.check() is False and applied == []
    assert watch.check() is True and applied == [["a", "b", "c"]]
    assert watch.check() is False and applied == [["a", "b", "c"]]
    path.write_text(servers("a"))  # an emptier file that stays: applied at the next look
    assert watch.check() is False
    assert watch.check() is True and applied[-1] == ["a"]


def test_a_reload_asked_for_applies_the_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers("a"))
    applied: list[list[str]] = []
    watch = ConfigWatch(path, lambda specs: applied.append([s.name for s in specs]))
    path.write_text(servers("a", "b"))
    assert watch.check() is False
    watch.reload_now()
    assert applied == [["a", "b"]]
    assert watch.check() is False and applied == [["a", "b"]], "BUG: a file already applied was applied again"


def test_a_file_replaced_is_applied_only_once_it_stays_away(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers("a"))
    applied: list[list[str]] = []
    watch = ConfigWatch(path, lambda specs: applied.append([s.name for s in specs]))
    path.unlink()  # an editor replacing the file, caught between its removal and the new file
    assert watch.check() is False and applied == [], "BUG: a file caught while replaced stopped the servers"
    assert watch.check() is True and applied == [[]]
    path.write_text(servers("a", "b"))
    assert watch.check() is False
    assert watch.check() is True and applied == [[], ["a", "b"]]


def test_a_file_that_cannot_be_used_is_logged_once_and_changes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="agentd.mcp")
    path = tmp_path / "config.toml"
    path.write_text(servers("a"))
    applied: list[list[str]] = []
    watch = ConfigWatch(path, lambda specs: applied.append([s.name for s in specs]))
    path.write_text(servers("a") + '\n[[mcp_servers]]\nname = "b')  # a writer stopped half way
    assert watch.check() is False and watch.check() is False and watch.check() is False
    path.write_text(servers("a") + '\n[[mcp_servers]]\nname = "b"\ncommand = "mcp-b"\nenv = {TOKEN = "t"}\n')
    assert watch.check() is False and watch.check() is False and watch.check() is False
    assert applied == []
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, f"MCP servers not reloaded: cannot read {path}: Unterminated string (at end of document)"),
        (logging.ERROR, "MCP servers not reloaded: config key mcp_servers[1].env: values are not allowed here "
                        "(they hold secrets): list the names of the daemon's environment variables to pass, "
                        'env = ["GITHUB_TOKEN"]')]
    path.write_text(servers("a", "c"))
    assert watch.check() is False
    assert watch.check() is True and applied == [["a", "c"]]


def test_the_watcher_looks_every_second_on_one_thread_until_closed(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers("a"))
    applied = threading.Event()
    watch = ConfigWatch(path, lambda specs: applied.set())
    path.write_text(servers("a", "b"))
    before = set(threading.enumerate())
    started = time.monotonic()
    watch.start()
    watch.start()
    threads = [t for t in threading.enumerate() if t not in before and t.name == "agentd-mcp-config"]
    assert [t.daemon for t in threads] == [True], "one thread, which never keeps the process alive"
    try:
        assert applied.wait(20), "the change was never applied"
        # Seen at the look a second after the start, applied at the next one.
        assert 1.9 <= time.monotonic() - started < 3.9
    finally:
        watch.close()
    threads[0].join(20)
    assert not threads[0].is_alive()


def test_servers_added_removed_and_changed_in_the_file_reach_the_running_servers(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers("a", "b", "keep"))
    loop = LoopThread("agentd-mcp-test")
    reloads: list[tuple[str, str, dict]] = []
    hub = McpHub(read_specs(path), loop, lambda action, target, detail: reloads.append((action, target, detail)))
    try:
        watch = ConfigWatch(path, hub.apply)
        path.write_text(servers("keep", "c") + '\n[[mcp_servers]]\nname = "b"\ncommand = "mcp-b2"\n')
        assert watch.check() is False and hub.names == ["a", "b", "keep"]
        assert watch.check() is True
        assert hub.names == ["keep", "c", "b"]
        assert reloads == [("mcp.reload", "mcp", {"added": ["a", "b", "keep"], "removed": [], "restarted": []}),
                           ("mcp.reload", "mcp", {"added": ["c"], "removed": ["a"], "restarted": ["b"]})]
    finally:
        hub.close()
        loop.close()
