"""File tools, confined to the agent's workspace directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool

READ_LIMIT = 1_048_576
LIST_LIMIT = 1000
_PATH = {"type": "string", "description": "Path relative to the agent workspace"}


def workspace_root(ctx: ToolContext) -> Path:
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    return ctx.workspace.resolve()


def confine(ctx: ToolContext, raw: str) -> Path:
    """Resolve `raw` inside the workspace; refuse absolute paths, `..` escapes and symlinks out."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in raw:
        raise ToolError("path contains a NUL byte")
    root = workspace_root(ctx)
    candidate = Path(raw)
    if candidate.is_absolute():
        raise ToolError(f"path escapes the agent workspace: {raw!r} is absolute; use a relative path")
    # resolve() follows symlinks, so a link pointing outside is caught here too.
    resolved = (root / candidate).resolve()
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"path escapes the agent workspace: {raw!r}")
    return resolved


def shown(ctx: ToolContext, path: Path) -> str:
    """A path as the model should see it: relative to the workspace."""
    return str(path.relative_to(workspace_root(ctx)))  # the root itself is "."


def read_text(path: Path, raw: str) -> str:
    if not path.exists():
        raise ToolError(f"no such file: {raw}")
    if path.is_dir():
        raise ToolError(f"{raw} is a directory; use file_list")
    if not path.is_file():  # a FIFO or device would block or never end
        raise ToolError(f"{raw} is not a regular file")
    if path.stat().st_size > READ_LIMIT:
        raise ToolError(f"{raw} is larger than {READ_LIMIT} bytes")
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise ToolError(f"{raw} looks like a binary file")
    return data.decode(errors="replace")  # UTF-8, the only default


def write_text(path: Path, content: str) -> int:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode()
    tmp = path.with_name(f".{path.name}.agentd-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(data)


@tool("file_read", "Read a UTF-8 text file from the agent workspace.", {"path": _PATH}, ("path",),
      read_only=True)
def file_read(ctx: ToolContext, args: dict[str, Any]) -> str:
    return read_text(confine(ctx, args["path"]), args["path"])


@tool("file_write", "Write (create or replace) a text file in the agent workspace.",
      {"path": _PATH, "content": {"type": "string", "description": "The full new content"}},
      ("path", "content"))
def file_write(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = confine(ctx, args["path"])
    if path.is_dir():
        raise ToolError(f"{args['path']} is a directory")
    size = write_text(path, args["content"])
    return f"wrote {size} bytes to {shown(ctx, path)}"


@tool("file_list", "List a directory of the agent workspace (directories end with '/').",
      {"path": {**_PATH, "description": "Directory relative to the workspace (default '.')"}}, read_only=True)
def file_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    raw = args.get("path") or "."
    path = confine(ctx, raw)
    if not path.exists():
        raise ToolError(f"no such directory: {raw}")
    if not path.is_dir():
        raise ToolError(f"{raw} is a file, not a directory")
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if not entries:
        return f"{shown(ctx, path)} is empty"
    more = f"\n... and {len(entries) - LIST_LIMIT} more" if len(entries) > LIST_LIMIT else ""
    return "\n".join(entries[:LIST_LIMIT]) + more


@tool("create_directory", "Create a directory (and its parents) in the agent workspace.", {"path": _PATH},
      ("path",))
def create_directory(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = confine(ctx, args["path"])
    if path.exists() and not path.is_dir():
        raise ToolError(f"{args['path']} exists and is a file")
    path.mkdir(parents=True, exist_ok=True)
    return f"created directory {shown(ctx, path)}"


@tool("apply_patch",
      "Apply a multi-file patch: '*** Begin Patch', then '*** Add File: p' (lines starting '+'), "
      "'*** Update File: p' (hunks after '@@' with ' ' context, '-' removed and '+' added lines) or "
      "'*** Delete File: p', then '*** End Patch'.",
      {"patch": {"type": "string", "description": "The patch text"}}, ("patch",))
def apply_patch(ctx: ToolContext, args: dict[str, Any]) -> str:
    from agentd.agents.tools.patch import apply

    return apply(args["patch"], lambda raw: confine(ctx, raw), lambda p: shown(ctx, p))
