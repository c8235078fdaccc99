"""The table of which adapters show typing and reactions (agentd/channels/lifecycle.py,
which configure-time checks and docs/channels/index.md read) against the adapters
themselves: an adapter is listed exactly when it implements the call."""

from __future__ import annotations

import importlib

import pytest

from agentd.channels import adapters as registry
from agentd.channels.adapter import Adapter
from agentd.channels.lifecycle import REACTIONS, TYPING


def adapter_classes(name: str) -> list[type]:
    module = importlib.import_module(f"agentd.channels.adapters.{name}")
    found = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, Adapter) and v.__module__ == module.__name__]
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
