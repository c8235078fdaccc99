"""The `*** Begin Patch` format used by apply_patch: parse, check every hunk, then write."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agentd.agents.tools.base import ToolError
from agentd.agents.tools.files import read_text, write_text


@dataclass
class FileOp:
    kind: str  # add | update | delete
    path: str
    lines: list[str] = field(default_factory=list)


def parse(text: str) -> list[FileOp]:
    """Split the patch into file operations; raises ToolError on malformed input."""
    lines = text.strip().splitlines()  # blank lines around the markers do not count
    if not lines or lines[0].strip() != "*** Begin Patch":
        raise ToolError("patch must start with '*** Begin Patch'")
    if lines[-1].strip() != "*** End Patch":
        raise ToolError("patch must end with '*** End Patch'")
    ops: list[FileOp] = []
    for line in lines[1:-1]:
        for marker, kind in (("*** Add File: ", "add"), ("*** Update File: ", "update"),
                             ("*** Delete File: ", "delete")):
            if line.startswith(marker):
                ops.append(FileOp(kind, line[len(marker):].strip()))
                break
        else:
            if not ops:
                raise ToolError(f"unexpected line before any file header: {line!r}")
            ops[-1].lines.append(line)
    if not ops:
        raise ToolError("patch contains no file operations")
    return ops


def _hunks(lines: list[str], path: str) -> list[list[str]]:
    hunks: list[list[str]] = []
    for line in lines:
        if line.startswith("@@"):
            hunks.append([])
        elif line == "*** End of File":
            continue
        else:
            if not hunks:
                hunks.append([])
            if line and line[0] not in " +-":
                raise ToolError(f"{path}: hunk line must start with ' ', '+' or '-': {line!r}")
            hunks[-1].append(line if line else " ")
    return [h for h in hunks if h]


def _apply_update(original: str, op: FileOp) -> str:
    lines = original.splitlines()
    pos = 0
    for hunk in _hunks(op.lines, op.path):
        # _hunks let only ' ', '+' and '-' lines through: old is all but the added ones,
        # new all but the removed ones.
        old = [l[1:] for l in hunk if l[0] != "+"]
        new = [l[1:] for l in hunk if l[0] != "-"]
        at = _find(lines, old, pos)
        if at is None:
            preview = "\n".join(old[:3])
            raise ToolError(f"{op.path}: hunk does not match the file (looking for:\n{preview})")
        lines[at:at + len(old)] = new
        pos = at + len(new)
    return "\n".join(lines) + ("\n" if lines else "")


def _find(lines: list[str], needle: list[str], start: int) -> int | None:
    """Where `needle` first occurs at or after `start`: exactly, else ignoring trailing
    whitespace; an empty needle (a hunk that only adds) matches at the end."""
    if not needle:
        return len(lines)
    for exact in (True, False):
        norm = (lambda s: s) if exact else str.rstrip
        target = [norm(s) for s in needle]
        # A window running past the end is shorter than the needle, so it never matches.
        for i in range(start, len(lines)):
            if [norm(s) for s in lines[i:i + len(needle)]] == target:
                return i
    return None


def apply(text: str, confine: Callable[[str], Path], shown: Callable[[Path], str]) -> str:
    """Validate every operation first, then write, so a bad hunk changes nothing."""
    planned: list[tuple[str, Path, str | None]] = []
    for op in parse(text):
        path = confine(op.path)
        if op.kind == "add":
            if path.exists():
                raise ToolError(f"{op.path} already exists (use *** Update File)")
            bad = [l for l in op.lines if not l.startswith("+")]
            if bad:
                raise ToolError(f"{op.path}: every line of an added file must start with '+'")
            planned.append(("added", path, "\n".join(l[1:] for l in op.lines) + "\n"))
        elif op.kind == "delete":
            if not path.is_file():
                raise ToolError(f"cannot delete {op.path}: no such file")
            planned.append(("deleted", path, None))
        else:
            planned.append(("updated", path, _apply_update(read_text(path, op.path), op)))
    for verb, path, content in planned:
        if content is None:
            path.unlink()
        else:
            write_text(path, content)
    return "\n".join(f"{verb} {shown(path)}" for verb, path, _ in planned)
