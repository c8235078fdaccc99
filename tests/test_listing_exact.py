"""The text of GET /api/agents (agentd/agents/listing.py), in process: byte for byte what
encoding the items would give, each item's text reused only while nothing it shows changed.

(tests/test_agent_listing.py checks the same through the daemon.)"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from agentd.agents.listing import list_json
from agentd.agents.manifest import parse_manifest
from mgrsupport import Env, manifest


@pytest.fixture()
def mgr(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.delenv("MGR_UNSET_KEY", raising=False)
    e = Env(tmp_path)
    yield e.manager()
    e.close()


def expected(mgr) -> str:
    return json.dumps([mgr.list_item(h) for h in mgr.handles()], separators=(",", ":"))


def test_empty_and_exact_text(mgr) -> None:
    assert mgr.list_json() == "[]"
    mgr.spawn(manifest("uni", 'system_prompt = "ü"\n[identity]\nemoji = "🦊"\n'))
    mgr.spawn(manifest("b", 'api_key_env = "MGR_UNSET_KEY"\n'))
    text = mgr.list_json()
    assert text == expected(mgr) and text.isascii()
    assert [i["auth_status"] for i in json.loads(text)] == ["configured", "missing"], \
        "BUG: two agents of one provider with different key names share a key status"


def test_key_status_is_looked_up_once_per_provider_and_key_name(mgr, monkeypatch) -> None:
    calls: list = []
    real = mgr.registry.auth_status
    monkeypatch.setattr(mgr.registry, "auth_status", lambda h: calls.append(h.name) or real(h))
    for name in ("a", "b"):
        mgr.spawn(manifest(name))
    mgr.spawn(manifest("c", 'api_key_env = "MGR_UNSET_KEY"\n'))
    mgr.spawn(manifest("d", provider="anthropic", model="claude-sonnet-4-6"))
    list_json(mgr.registry, mgr.handles())
    assert calls == ["a", "c", "d"]


def test_unchanged_items_reuse_their_text(mgr) -> None:
    h = mgr.spawn(manifest("same"))
    mgr.list_json()
    cached = h.list_json
    assert cached is not None and cached[0] is h.manifest
    mgr.list_json()
    assert h.list_json is cached and h.list_json[2] is cached[2]


@pytest.mark.parametrize("change", ["state", "mode", "last_active", "provider", "model", "name", "manifest", "auth"])
def test_every_change_an_item_shows_appears(mgr, monkeypatch, change) -> None:
    h = mgr.spawn(manifest("ch", '[identity]\ncolor = "#111111"\n'))
    other = mgr.spawn(manifest("other"))
    mgr.list_json()
    kept = other.list_json
    if change == "state":
        h.state = "Paused"
    elif change == "mode":
        h.mode = "Manual"
    elif change == "last_active":
        h.last_active = h.last_active + timedelta(seconds=1)
    elif change == "provider":
        h.provider = "vllm"
    elif change == "model":
        h.model = "gpt-4o-mini"
    elif change == "name":
        h.name = "renamed"
    elif change == "manifest":
        h.manifest = parse_manifest(manifest("ch", '[identity]\ncolor = "#222222"\n'))
    elif change == "auth":
        monkeypatch.delenv("OPENAI_API_KEY")
    text = mgr.list_json()
    assert text == expected(mgr), f"BUG: a changed {change} is not in the listing"
    if change != "auth":
        assert other.list_json is kept, "an unchanged item was encoded again"


def test_tier_of_a_custom_model(mgr) -> None:
    h = mgr.spawn(manifest("own", 'base_url = "http://h/v1"\n', provider="mine", model="own-model"))
    assert json.loads(mgr.list_json())[0]["model_tier"] == "custom"
    assert json.loads(list_json(mgr.registry, [h]))[0]["model_tier"] == "custom"
