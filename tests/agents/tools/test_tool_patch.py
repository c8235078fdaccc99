"""apply_patch in process: the patch format's every header, hunk and error text, hunks found
exactly before whitespace-tolerantly, in order, and nothing written when one part fails.
Run through the real tool (workspace confinement of files.py) and `patch.parse` directly."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentd.agents.tools import ToolContext, ToolError, get_tool, validate_args
from agentd.agents.tools.patch import FileOp, parse
from agentd.config import ToolsConfig


@pytest.fixture()
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext("agent-1", tmp_path / "ws", {}, ToolsConfig(), cancel=threading.Event())


def patch(ctx: ToolContext, *body: str) -> str:
    text = "\n".join(("*** Begin Patch", *body, "*** End Patch"))
    tool = get_tool("apply_patch")
    validate_args(tool, {"patch": text})
    return tool.run(ctx, {"patch": text})


def refused(ctx: ToolContext, *body: str) -> str:
    with pytest.raises(ToolError) as info:
        patch(ctx, *body)
    return str(info.value)


def put(ctx: ToolContext, name: str, text: str) -> Path:
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    path = ctx.workspace / name
    path.write_text(text)
    return path


def test_parse_headers_and_lines() -> None:
    ops = parse("\n\n*** Begin Patch\n*** Add File:  a.txt \n+x\n*** Update File: b.py\n@@\n-y\n"
                "*** Delete File: c\n*** End Patch\n\n")
    assert ops == [FileOp("add", "a.txt", ["+x"]), FileOp("update", "b.py", ["@@", "-y"]), FileOp("delete", "c", [])]
    assert FileOp("add", "p").lines == [] and FileOp("add", "q").lines is not FileOp("add", "r").lines
    # Markers are matched with their trailing space; a header line is never a hunk line.
    ops = parse("  *** Begin Patch  \n*** Delete File: d\n*** Update File:e\n*** End Patch  ")
    assert ops == [FileOp("delete", "d", ["*** Update File:e"])]
    # Blank lines (spaces, tabs) before the first marker and after the last do not count.
    ops = parse(" \t\n\n*** Begin Patch\n*** Delete File: d\n*** End Patch\n  \n\t\n")
    assert ops == [FileOp("delete", "d", [])]


@pytest.mark.parametrize("text, error", [
    ("", "patch must start with '*** Begin Patch'"),
    ("\n\n", "patch must start with '*** Begin Patch'"),
    ("--- a\n+++ b", "patch must start with '*** Begin Patch'"),
    ("*** Begin Patches\n*** End Patch", "patch must start with '*** Begin Patch'"),
    ("*** Begin Patch", "patch must end with '*** End Patch'"),
    ("*** Begin Patch\n*** Add File: a\n+x", "patch must end with '*** End Patch'"),
    ("*** Begin Patch\n*** End Patch", "patch contains no file operations"),
    ("*** Begin Patch\n+x\n*** End Patch", "unexpected line before any file header: '+x'"),
])
def test_parse_errors(text: str, error: str) -> None:
    with pytest.raises(ToolError) as info:
        parse(text)
    assert str(info.value) == error


def test_add_update_delete_and_the_report(ctx) -> None:
    put(ctx, "a.py", "one\ntwo\nthree\n")
    put(ctx, "old.txt", "bye\n")
    out = patch(ctx, "*** Update File: a.py", "@@", " one", "-two", "+TWO", " three",
                "*** Add File: new/b.txt", "+fresh", "+", "+file", "*** Delete File: old.txt")
    assert out == "updated a.py\nadded new/b.txt\ndeleted old.txt"
    assert (ctx.workspace / "a.py").read_text() == "one\nTWO\nthree\n"
    assert (ctx.workspace / "new/b.txt").read_text() == "fresh\n\nfile\n"
    assert not (ctx.workspace / "old.txt").exists()


def test_an_empty_added_file_is_one_newline(ctx) -> None:
    assert patch(ctx, "*** Add File: empty.txt") == "added empty.txt"
    assert (ctx.workspace / "empty.txt").read_text() == "\n"


def test_add_refusals(ctx) -> None:
    put(ctx, "here.txt", "x\n")
    assert refused(ctx, "*** Add File: here.txt", "+y") == "here.txt already exists (use *** Update File)"
    assert refused(ctx, "*** Add File: n.txt", "+ok", " context") == (
        "n.txt: every line of an added file must start with '+'")
    assert refused(ctx, "*** Add File: n.txt", "+ok", "") == "n.txt: every line of an added file must start with '+'"
    assert not (ctx.workspace / "n.txt").exists()


def test_delete_refusals(ctx) -> None:
    (ctx.workspace / "dir").mkdir(parents=True)
    assert refused(ctx, "*** Delete File: gone.txt") == "cannot delete gone.txt: no such file"
    assert refused(ctx, "*** Delete File: dir") == "cannot delete dir: no such file"
    assert (ctx.workspace / "dir").is_dir()


def test_update_of_a_missing_file(ctx) -> None:
    assert refused(ctx, "*** Update File: nope.txt", "@@", "-a") == "no such file: nope.txt"


def test_hunk_without_header_blank_context_and_end_of_file_marker(ctx) -> None:
    put(ctx, "f.txt", "a\n\nb\n")
    assert patch(ctx, "*** Update File: f.txt", " a", "", "-b", "+B", "*** End of File") == "updated f.txt"
    assert (ctx.workspace / "f.txt").read_text() == "a\n\nB\n"


def test_bad_hunk_line(ctx) -> None:
    put(ctx, "f.txt", "a\n")
    assert refused(ctx, "*** Update File: f.txt", "@@", " a", "*b") == (
        "f.txt: hunk line must start with ' ', '+' or '-': '*b'")
    assert refused(ctx, "*** Update File: f.txt", "x") == "f.txt: hunk line must start with ' ', '+' or '-': 'x'"
    assert refused(ctx, "*** Update File: f.txt", "@@", "X a") == "f.txt: hunk line must start with ' ', '+' or '-': 'X a'"


def test_hunks_apply_in_order_after_the_previous_one(ctx) -> None:
    put(ctx, "f.txt", "k\nm\nk\n")
    # The first hunk inserts after the first k; the second must then change the LAST k.
    patch(ctx, "*** Update File: f.txt", "@@", " k", "+ins", "@@", "-k", "+K")
    assert (ctx.workspace / "f.txt").read_text() == "k\nins\nm\nK\n", "BUG: a hunk is searched from the start again"
    put(ctx, "g.txt", "x\ny\nx\ny\n")
    patch(ctx, "*** Update File: g.txt", "@@", " x", "-y", "+Y", "@@", " x", "-y", "+Z")
    assert (ctx.workspace / "g.txt").read_text() == "x\nY\nx\nZ\n"
    put(ctx, "h.txt", "p\nq\n")
    assert refused(ctx, "*** Update File: h.txt", "@@", "-q", "+Q", "@@", "-p", "+P") == (
        "h.txt: hunk does not match the file (looking for:\np)")


def test_empty_hunks_are_dropped(ctx) -> None:
    put(ctx, "f.txt", "a\nb\n")
    patch(ctx, "*** Update File: f.txt", "@@", "@@", "*** End of File", "@@", "-b", "+B")
    assert (ctx.workspace / "f.txt").read_text() == "a\nB\n", "BUG: an empty hunk moved the search to the end"


def test_a_pure_addition_hunk_appends(ctx) -> None:
    put(ctx, "f.txt", "a\n")
    patch(ctx, "*** Update File: f.txt", "@@", "+b", "+c")
    assert (ctx.workspace / "f.txt").read_text() == "a\nb\nc\n"


def test_removing_every_line_leaves_an_empty_file(ctx) -> None:
    put(ctx, "f.txt", "only\n")
    patch(ctx, "*** Update File: f.txt", "@@", "-only")
    assert (ctx.workspace / "f.txt").read_text() == ""


def test_exact_match_wins_over_a_trailing_whitespace_match(ctx) -> None:
    put(ctx, "f.txt", "v = 1  \nw\nv = 1\nw\n")
    patch(ctx, "*** Update File: f.txt", "@@", "-v = 1", "+v = 2")
    assert (ctx.workspace / "f.txt").read_text() == "v = 1  \nw\nv = 2\nw\n", "BUG: the exact match comes first"


def test_trailing_whitespace_is_tolerated_when_nothing_matches_exactly(ctx) -> None:
    put(ctx, "f.txt", "a\t\nb  \nc\n")
    patch(ctx, "*** Update File: f.txt", "@@", " a", "-b", "+B")
    # The matched lines are replaced by the hunk's, context included (as written in the patch).
    assert (ctx.workspace / "f.txt").read_text() == "a\nB\nc\n"
    put(ctx, "g.txt", "x\n")
    patch(ctx, "*** Update File: g.txt", "@@", "-x   ", "+y")
    assert (ctx.workspace / "g.txt").read_text() == "y\n"
    put(ctx, "h.txt", "  lead\n")
    assert refused(ctx, "*** Update File: h.txt", "@@", "-lead", "+x").startswith("h.txt: hunk does not match")


def test_a_hunk_at_the_very_end_and_one_running_past_it(ctx) -> None:
    put(ctx, "f.txt", "a\nb\nc\n")
    patch(ctx, "*** Update File: f.txt", "@@", " b", "-c", "+C")
    assert (ctx.workspace / "f.txt").read_text() == "a\nb\nC\n"
    assert refused(ctx, "*** Update File: f.txt", "@@", " C", "-d") == (
        "f.txt: hunk does not match the file (looking for:\nC\nd)")


def test_mismatch_preview_shows_the_first_three_old_lines(ctx) -> None:
    put(ctx, "f.txt", "a\n")
    assert refused(ctx, "*** Update File: f.txt", "@@", " one", "-two", "+new", " three", "-four") == (
        "f.txt: hunk does not match the file (looking for:\none\ntwo\nthree)")


def test_nothing_is_written_when_a_later_part_fails(ctx) -> None:
    put(ctx, "a.txt", "a\n")
    put(ctx, "d.txt", "d\n")
    assert refused(ctx, "*** Update File: a.txt", "-a", "+A", "*** Delete File: d.txt", "*** Add File: n.txt", "+n",
                   "*** Update File: a.txt", "-missing") == (
        "a.txt: hunk does not match the file (looking for:\nmissing)")
    assert (ctx.workspace / "a.txt").read_text() == "a\n" and (ctx.workspace / "d.txt").exists()
    assert not (ctx.workspace / "n.txt").exists()


def test_paths_are_confined_and_shown_relative(ctx) -> None:
    assert refused(ctx, "*** Add File: ../x", "+x").startswith("path escapes the agent workspace")
    assert refused(ctx, "*** Delete File: /etc/hostname").startswith("path escapes the agent workspace")
    assert patch(ctx, "*** Add File: ./sub/../z.txt", "+z") == "added z.txt"
