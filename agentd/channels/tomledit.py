"""Table-level edits of config.toml that keep the rest of the file as it was.

tomlkit parses the file with its comments and layout; only the `[channels.<name>]` table
(with its sub-tables) is replaced or removed, and a new one is added at the end of the
file. Comments and blank lines closing a table belong to what follows it, so they stay
where they are. The result is parsed back with `tomllib` and checked before it is
written (temp file + rename).
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.container import Container
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Comment, Item, Table, Whitespace

from agentd import tomlsafe
from agentd.errors import AgentdError


class ConfigEditError(AgentdError):
    """The file could not be edited safely (it is left untouched)."""

    status = 409


def render_section(path: list[str], values: dict[str, Any]) -> str:
    """TOML text of the table `path` holding `values` (sub-tables for dict values)."""
    doc = tomlkit.document()
    container: Any = doc
    for part in path[:-1]:
        container.add(part, tomlkit.table(is_super_table=True))
        container = container[part]
    container.add(path[-1], tomlkit.item(values))
    return doc.as_string()


def replace_section(text: str, path: list[str], values: dict[str, Any] | None) -> str:
    """`text` with table `path` set to `values` (None removes it), everything else kept.
    Raises tomlkit's errors for a file it cannot parse, ConfigEditError for a table
    defined in a form other than `[a.b]` headers."""
    doc = tomlkit.parse(text)
    chain = _find(doc.body, path)
    if chain is None:
        if _lookup(doc.unwrap(), path) is not None:
            raise ConfigEditError(f"[{'.'.join(path)}] is defined in a form this editor does not "
                                  "rewrite; edit the file by hand")
        if values is None:
            return text
        out = text
        if out and not out.endswith("\n"):
            out += "\n"
        if out.strip():
            out += "\n"
        return out + render_section(path, values)
    # The bodies are edited as lists: tomlkit's keyed edits would take a table's closing
    # comments along with it, and give a parent written only through sub-table headers
    # (`[channels.irc]` with no `[channels]`) a header of its own.
    body, index = chain[-1]
    closing = _take_closing(body[index][1])
    # What the file goes on with after the table: a line of text, a blank line or nothing.
    after = _starts(closing) or next((c for c in (_starts(b[i + 1:]) for b, i in reversed(chain)) if c), "")
    if values is None:
        into, at = _preceding(chain)
        del body[index]
        into[at:at] = [(None, item) for item in closing]
        if after in ("\n", "") and at and _blank(into[at - 1][1]):
            del into[at - 1]  # the blank line that separated the removed table
    else:
        new = tomlkit.item(values)
        if after not in ("\n", ""):
            closing.insert(0, Whitespace("\n"))
        _closing_body(new).body.extend((None, item) for item in closing)
        body[index] = (body[index][0], new)
    return doc.as_string()


Body = list[tuple[Any, Item]]


def _find(body: Body, path: list[str]) -> list[tuple[Body, int]] | None:
    """Where the table `path`, written with `[a.b]` headers, is: (body, index) at each level."""
    for i, (key, item) in enumerate(body):
        if key is None or key.key != path[0] or not isinstance(item, Table) or key.is_dotted():
            continue
        if len(path) == 1:
            return [(body, i)]
        if (inner := _find(item.value.body, path[1:])) is not None:
            return [(body, i)] + inner
    return None


def _preceding(chain: list[tuple[Body, int]]) -> tuple[Body, int]:
    """(body, position): what is inserted there renders right where the table at the end
    of `chain` starts, after what precedes it (in the body of the previous table, when
    one precedes: a body of its own would give a header-less parent its header back)."""
    level = len(chain) - 1
    body, index = chain[level]
    while index == 0 and level > 0 and chain[level - 1][0][chain[level - 1][1]][1].is_super_table():
        level -= 1
        body, index = chain[level]
    if index and isinstance(body[index - 1][1], Table):
        inner = _closing_body(body[index - 1][1]).body
        return inner, len(inner)
    return body, index


def _closing_body(table: Table) -> Container:
    """The body rendered last in `table`: its own, or its last sub-table's."""
    body = table.value
    while body.body and isinstance(body.body[-1][1], Table):
        body = body.body[-1][1].value
    return body


def _take_closing(table: Table) -> list[Item]:
    """Remove and return the comments and blank lines that close `table`."""
    body = _closing_body(table).body
    taken: list[Item] = []
    while body and body[-1][0] is None and isinstance(body[-1][1], (Comment, Whitespace)):
        taken.insert(0, body.pop()[1])
    return taken


def _starts(items: list[Any]) -> str:
    """What `items` render first: "\\n" for a blank line, "" for nothing, else its first character."""
    for entry in items:
        item = entry[1] if isinstance(entry, tuple) else entry
        if isinstance(item, Table):
            return "["
        if isinstance(item, Whitespace):
            if "\n" in item.as_string():
                return "\n"
            continue
        return item.as_string()[:1] or "x"
    return ""


def _blank(item: Item) -> bool:
    return isinstance(item, Whitespace) and "\n" in item.as_string()


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
    try:
        new = replace_section(text, table, values)
        parsed = tomlsafe.loads(new)
    except ConfigEditError as exc:
        raise ConfigEditError(f"cannot edit {path}: {exc.message}") from None
    except (TOMLKitError, tomllib.TOMLDecodeError) as exc:
        raise ConfigEditError(f"cannot edit {path}: the edited file would not parse ({exc})") from None
    if _lookup(parsed, table) != values:
        # The table is also defined some other way (inline table, dotted keys).
        raise ConfigEditError(f"cannot edit {path}: [{'.'.join(table)}] is defined in a form "
                              "this editor does not rewrite; edit the file by hand")
    try:
        write_atomic(path, new)
    except OSError as exc:
        from agentd.store.outage import translate

        # A full disk or a read-only home is the daemon's outage (507/503, retry later),
        # not a bug to answer 500 for.
        raise (translate(exc) or ConfigEditError(f"cannot write {path}: {exc}", status=500)) from None


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
