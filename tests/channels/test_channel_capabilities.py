"""The table of which adapters show typing and reactions (agentd/channels/lifecycle.py,
which configure-time checks and docs/channels/index.md read) against the adapters
themselves: an adapter is listed exactly when it implements the call. Likewise the "Files and
images" table: every adapter has a row, saying "no" exactly where the adapter lists no
files or sends none."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import pytest

from agentd.channels import adapters as registry
from agentd.channels.adapter import Adapter
from agentd.channels.lifecycle import REACTIONS, TYPING


def adapter_classes(name: str) -> list[type]:
    module = importlib.import_module(f"agentd.channels.adapters.{name}")
    # A private class (nostr's one connection per relay) is a part of the adapter, not one.
    found = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, Adapter) and v.__module__ == module.__name__
             and not v.__name__.startswith("_")]
    return found or [registry.load(name)]


@pytest.mark.parametrize("name", sorted(registry.ADAPTERS))
def test_listed_exactly_when_implemented(name):
    classes = adapter_classes(name)
    types = {cls.send_typing is not Adapter.send_typing for cls in classes}
    reacts = {cls.react is not Adapter.react for cls in classes}
    assert types == {name in TYPING}, f"{name}: typing table and adapter disagree"
    assert reacts == {name in REACTIONS}, f"{name}: reactions table and adapter disagree"


def test_the_docs_table_matches():
    text = open("docs/channels/index.md", encoding="utf-8").read()
    text = text.split("## Typing, reactions, approvals and edits", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| ") and line.count("|") >= 5}
    for name in registry.ADAPTERS:
        assert name in rows, f"docs/channels/index.md: no row for {name} in the typing/reactions table"
        cells = [c.strip() for c in rows[name].split("|")[2:4]]
        assert cells[0].startswith("yes") == (name in TYPING), f"{name}: typing cell"
        assert cells[1].startswith("yes") == (name in REACTIONS), f"{name}: reactions cell"


def files_section() -> dict[str, list[str]]:
    text = open("docs/channels/index.md", encoding="utf-8").read()
    text = text.split("## Files and images", 1)[1].split("\n## ", 1)[0]
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in text.splitlines() if line.startswith("| ") and line.count("|") >= 5}


def lists_files(cls: type) -> bool:
    """An adapter (or a platform class it builds on) makes `Attachment`s of inbound messages."""
    for klass in cls.__mro__:
        if klass is Adapter or not issubclass(klass, Adapter):
            continue
        tree = ast.parse(inspect.getsource(inspect.getmodule(klass)))
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Attachment" for n in ast.walk(tree)):
            return True
    return False


def sends_files(cls: type) -> bool:
    """`send_file` is overridden by something other than a refusal with the platform's reason."""
    if cls.send_file is Adapter.send_file:
        return False
    body = ast.parse(textwrap.dedent(inspect.getsource(cls.send_file))).body[0].body
    body = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return not (len(body) == 1 and isinstance(body[0], ast.Raise))


@pytest.mark.parametrize("name", sorted(registry.ADAPTERS))
def test_the_files_table_matches(name):
    rows = files_section()
    assert name in rows, f"docs/channels/index.md: no row for {name} in the files table"
    inbound, hosts, outbound = rows[name]
    classes = adapter_classes(name)  # whatsapp's QR gateway has a row of its own
    assert inbound.startswith("no") != any(map(lists_files, classes)), f"{name}: files in cell"
    assert outbound.startswith("no") != any(map(sends_files, classes)), f"{name}: files out cell"
    if inbound.startswith("no"):
        assert inbound.startswith("no: ") and hosts == "-", f"{name}: say why, and fetch from nowhere"
    assert not outbound.startswith("no") or outbound.startswith("no: "), f"{name}: say why"
