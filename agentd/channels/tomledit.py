"""Section-level edits of config.toml that keep every other byte of the file.

`toml` (the stack's writer) would drop comments if we re-dumped the whole document,
so we splice text: the `[channels.<name>]` table (and its sub-tables) is replaced or
removed, everything else stays byte-identical. The result is parsed back with
`tomllib` and checked before it is written (temp file + rename).
"""

from __future__ import annotations

import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import toml

from agentd.errors import AgentdError

# A table header line: `[a.b]` or `[[a.b]]`, optional trailing comment.
_HEADER = re.compile(r"^\s*\[\[?\s*([^\]\[#]+?)\s*\]\]?\s*(#.*)?$")


class ConfigEditError(AgentdError):
    """The file could not be edited safely (it is left untouched)."""

    status = 409


def _norm(header: str) -> list[str]:
    return [part.strip().strip('"').strip("'") for part in header.split(".")]


def _spans(lines: list[str], path: list[str]) -> list[tuple[int, int]]:
    """Line ranges [start, end) of the table `path` and of its sub-tables."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    in_multiline = False
    for i, line in enumerate(lines):
        # Header-looking lines inside multi-line strings are not headers.
        if line.count('"""') % 2 == 1 or line.count("'''") % 2 == 1:
            in_multiline = not in_multiline
        match = None if in_multiline else _HEADER.match(line)
        if match is None:
            continue
        if start is not None:
            spans.append((start, _trim(lines, start, i)))
            start = None
        if _norm(match.group(1))[:len(path)] == path:
            start = i
    if start is not None:
        spans.append((start, _trim(lines, start, len(lines))))
    return spans


def _trim(lines: list[str], start: int, end: int) -> int:
    """Comments and blank lines closing a table belong to what follows: keep them."""
    while end - 1 > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return end


def render_section(path: list[str], values: dict[str, Any]) -> str:
    """TOML text of the table `path` holding `values` (sub-tables for dict values)."""
    doc: dict[str, Any] = dict(values)
    for part in reversed(path):
        doc = {part: doc}
    text = toml.dumps(doc)
    if not values:  # toml omits empty tables; keep the header so the section exists
        text = "[" + ".".join(path) + "]\n"
    return text


def replace_section(text: str, path: list[str], values: dict[str, Any] | None) -> str:
    """`text` with table `path` set to `values` (None removes it), comments elsewhere kept."""
    lines = text.splitlines(keepends=True)
    spans = _spans(lines, path)
    new = "" if values is None else render_section(path, values)
    if spans:
        first = spans[0][0]
        keep = [line for i, line in enumerate(lines) if not any(s <= i < e for s, e in spans)]
        before = keep[:first]
        after = keep[first:]
        if new and after and after[0].strip():
            new += "\n"
        if not new and before and not before[-1].strip() and (not after or not after[0].strip()):
            before = before[:-1]  # the blank line that separated the removed table
        out = "".join(before) + new + "".join(after)
    else:
        out = text
        if new:
            if out and not out.endswith("\n"):
                out += "\n"
            if out.strip():
                out += "\n"
            out += new
    return out


def _lookup(doc: dict[str, Any], path: list[str]) -> Any:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def edit_file(path: Path, table: list[str], values: dict[str, Any] | None) -> None:
    """Set (or with None remove) one table of a TOML file atomically."""
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigEditError(f"cannot read {path}: {exc}", status=500) from None
    new = replace_section(text, table, values)
    try:
        parsed = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigEditError(f"cannot edit {path}: the edited file would not parse ({exc})") from None
    if _lookup(parsed, table) != values:
        # The table is also defined some other way (inline table, dotted keys).
        raise ConfigEditError(f"cannot edit {path}: [{'.'.join(table)}] is defined in a form "
                              "this editor does not rewrite; edit the file by hand")
    try:
        write_atomic(path, new)
    except OSError as exc:
        raise ConfigEditError(f"cannot write {path}: {exc}", status=500) from None


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and rename over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
