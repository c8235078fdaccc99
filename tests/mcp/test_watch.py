"""agentd.mcp.watch: the config file's `[[mcp_servers]]` applied live (in process, looks made by hand)."""

from __future__ import annotations

from pathlib import Path

from agentd.mcp.watch import ConfigWatch


def servers(*names: str) -> str:
    return "".join(f'\n[[mcp_servers]]\nname = "{n}"\ncommand = "mcp-{n}"\n' for n in names)


def test_a_change_is_applied_once_the_file_stays_the_same_for_a_look(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers("a", "b"))
    applied: list[list[str]] = []
    watch = ConfigWatch(path, lambda specs: applied.append([s.name for s in specs]))
    assert watch.check() is False and applied == []
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
