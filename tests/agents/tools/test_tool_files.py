"""File tools: the exact message the model reads for each refusal, and every limit at its edge.

The model acts on these texts, so a changed message is a changed behaviour; the limits
(read size, binary sniffing window) are checked exactly at and one past their value.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.agents.tools import ToolContext, ToolError
from agentd.agents.tools.files import READ_LIMIT, confine, workspace_root
from tests.agents.tools.test_tools import make_ctx, run


@pytest.fixture()
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


def refusal(ctx: ToolContext, name: str, **args) -> str:
    with pytest.raises(ToolError) as caught:
        run(ctx, name, **args)
    return str(caught.value)


@pytest.mark.parametrize("raw", ["", "   ", "\t"])
def test_blank_paths_are_refused_with_their_message(ctx, raw) -> None:
    assert refusal(ctx, "file_read", path=raw) == "path must be a non-empty string", \
        "BUG: a blank path is not refused with its own message"


def test_a_non_string_path_is_refused_even_when_it_has_no_strip(ctx) -> None:
    with pytest.raises(ToolError) as caught:
        confine(ctx, 7)  # type: ignore[arg-type]
    assert str(caught.value) == "path must be a non-empty string", \
        "BUG: a non-string path reaches the filesystem code"


def test_nul_byte_paths_are_refused(ctx) -> None:
    assert refusal(ctx, "file_write", path="a\x00b", content="x") == "path contains a NUL byte", \
        "BUG: a path with a NUL byte is not refused before touching the filesystem"
    assert not ctx.workspace.exists(), "BUG: a NUL-byte path touched the filesystem"


def test_a_path_naming_the_workspace_itself_is_shown_as_dot(ctx) -> None:
    assert run(ctx, "create_directory", path=".") == "created directory ."
    assert run(ctx, "file_list", path="sub/..") == ". is empty", \
        "BUG: the workspace root is not shown to the model as '.'"


def test_paths_are_shown_relative_and_never_as_dot_otherwise(ctx) -> None:
    assert run(ctx, "file_write", path="x/./y.txt", content="abc") == "wrote 3 bytes to x/y.txt"


def test_read_limit_is_inclusive(ctx) -> None:
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "exact.txt").write_bytes(b"a" * READ_LIMIT)
    (ctx.workspace / "over.txt").write_bytes(b"a" * (READ_LIMIT + 1))
    assert len(run(ctx, "file_read", path="exact.txt")) == READ_LIMIT, \
        "BUG: a file of exactly the read limit is refused"
    assert refusal(ctx, "file_read", path="over.txt") == f"over.txt is larger than {READ_LIMIT} bytes"


def test_binary_sniffing_looks_at_the_first_8192_bytes_only(ctx) -> None:
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "late.bin").write_bytes(b"a" * 8191 + b"\x00")
    (ctx.workspace / "later.txt").write_bytes(b"a" * 8192 + b"\x00")
    assert refusal(ctx, "file_read", path="late.bin") == "late.bin looks like a binary file"
    assert run(ctx, "file_read", path="later.txt") == "a" * 8192 + "\x00", \
        "BUG: the binary sniffing window is not 8192 bytes"


def test_invalid_utf8_is_replaced_not_fatal(ctx) -> None:
    ctx.workspace.mkdir(parents=True)
    (ctx.workspace / "latin.txt").write_bytes("caf\u00e9".encode("latin-1"))
    assert run(ctx, "file_read", path="latin.txt") == "caf\ufffd", \
        "BUG: undecodable bytes are not replaced with U+FFFD"


def test_write_creates_missing_parents_and_reports_utf8_bytes(ctx) -> None:
    assert run(ctx, "file_write", path="a/b/c/d.txt", content="\u00e9\u20ac") == "wrote 5 bytes to a/b/c/d.txt"
    assert (ctx.workspace / "a/b/c/d.txt").read_bytes() == "\u00e9\u20ac".encode("utf-8")
    assert not list((ctx.workspace / "a/b/c").glob(".*agentd-tmp")), "BUG: the temp file of a write is left behind"


def test_a_workspace_whose_parents_are_missing_is_created(tmp_path) -> None:
    ctx = make_ctx(tmp_path)
    ctx.workspace = tmp_path / "deep" / "er" / "ws"
    assert workspace_root(ctx) == ctx.workspace.resolve()
    assert run(ctx, "file_list") == ". is empty"


def test_messages_for_wrong_kinds_of_target(ctx) -> None:
    run(ctx, "file_write", path="f.txt", content="x")
    run(ctx, "create_directory", path="d")
    assert refusal(ctx, "file_read", path="nope.txt") == "no such file: nope.txt"
    assert refusal(ctx, "file_read", path="d") == "d is a directory; use file_list"
    assert refusal(ctx, "file_write", path="d", content="x") == "d is a directory"
    assert refusal(ctx, "file_list", path="f.txt") == "f.txt is a file, not a directory"
    assert refusal(ctx, "file_list", path="gone") == "no such directory: gone"
    assert refusal(ctx, "create_directory", path="f.txt") == "f.txt exists and is a file"
    assert refusal(ctx, "file_read", path="/etc/hosts") == \
        "path escapes the agent workspace: '/etc/hosts' is absolute; use a relative path"
    assert refusal(ctx, "file_read", path="../x") == "path escapes the agent workspace: '../x'"


def test_listing_is_capped_with_a_count_of_the_rest(ctx, monkeypatch) -> None:
    ctx.workspace.mkdir(parents=True)
    for i in range(1003):
        (ctx.workspace / f"f{i:04d}").touch()
    lines = run(ctx, "file_list").split("\n")
    assert len(lines) == 1001 and lines[999] == "f0999" and lines[-1] == "... and 3 more", \
        "BUG: the listing cap or its remainder count is wrong"
    (ctx.workspace / "f1000").unlink()
    (ctx.workspace / "f1001").unlink()
    (ctx.workspace / "f1002").unlink()
    assert len(run(ctx, "file_list").split("\n")) == 1000, "BUG: exactly 1000 entries get a '... more' line"
