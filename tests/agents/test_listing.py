"""GET /api/agents reuses each agent's item text between listings (agents/listing.py): the
bytes are what jsonify sent, and every change an item shows appears in the next listing."""

from __future__ import annotations

import json
from pathlib import Path
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home
from datetime import timedelta
import pytest
from agentd.agents.listing import list_json
from agentd.agents.manifest import parse_manifest
from mgrsupport import Env, manifest


def _items(d: Daemon) -> dict[str, dict]:
    r = d.get("/api/agents")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    # Byte for byte what flask.jsonify sends with this app (compact, ASCII, keys in order, "\n").
    assert r.content == (json.dumps(r.json(), separators=(",", ":")) + "\n").encode(), \
        "BUG: the listing is not encoded like the API's other JSON answers"
    return {item["name"]: item for item in r.json()}


def test_listing_shows_every_change_of_what_an_item_shows(tmp_path: Path, fake_llm) -> None:
    d = Daemon(make_home(tmp_path, llm_config(fake_llm)),
               env_extra={**LLM_ENV, "GROQ_API_KEY": ""}).start()
    try:
        ids = {}
        for name, extra in (("plain", ""), ("emoji-agent", '[identity]\nemoji = "🦊"\ncolor = "#ff0000"\n'),
                            ("keyless", '[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n')):
            r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\nprofile = "minimal"\n{extra}'})
            assert r.status_code == 201, r.text
            ids[name] = r.json()["agent_id"]
        first = _items(d)
        assert list(first) == ["plain", "emoji-agent", "keyless"], "BUG: listing order is creation order"
        assert first["emoji-agent"]["identity"] == {"emoji": "🦊", "avatar_url": None, "color": "#ff0000"}
        assert first["keyless"]["auth_status"] == "missing" and first["keyless"]["ready"] is False
        assert first["plain"]["mode"] == "Auto"
        assert _items(d) == first, "BUG: an unchanged listing changed"

        # Mode: the next listing shows it (and only that item's mode changed).
        assert d.put(f"/api/agents/{ids['plain']}/mode", json={"mode": "Observe"}).status_code == 200
        after_mode = _items(d)
        assert after_mode["plain"]["mode"] == "Observe"
        assert after_mode["plain"]["last_active"] != first["plain"]["last_active"]
        assert after_mode["emoji-agent"] == first["emoji-agent"]

        # A message moves last_active.
        r = d.post(f"/api/agents/{ids['emoji-agent']}/message", json={"message": "hello"})
        assert r.status_code == 200, r.text
        after_message = _items(d)
        assert after_message["emoji-agent"]["last_active"] > first["emoji-agent"]["last_active"]
        assert after_message["emoji-agent"]["last_active"] == d.get(
            f"/api/agents/{ids['emoji-agent']}").json()["last_active"]

        # A key set through the API: the keyless agent becomes ready; removed: missing again.
        assert d.post("/api/providers/groq/key", json={"api_key": "gsk-test"}).status_code == 200
        with_key = _items(d)["keyless"]
        assert (with_key["auth_status"], with_key["ready"]) == ("configured", True)
        assert d.delete("/api/providers/groq/key").status_code == 200
        without = _items(d)["keyless"]
        assert (without["auth_status"], without["ready"]) == ("missing", False)

        # A killed agent leaves the listing; a new one with its name is a new item.
        assert d.delete(f"/api/agents/{ids['plain']}").status_code == 200
        assert "plain" not in _items(d)
        r = d.post("/api/agents", json={"manifest_toml": 'name = "plain"\nprofile = "coding"\n'})
        assert r.status_code == 201, r.text
        again = _items(d)["plain"]
        assert again["id"] == r.json()["agent_id"] != ids["plain"]
        assert (again["profile"], again["mode"]) == ("coding", "Auto")

        # Every item equals the detail view's fields it shares (same source, same moment).
        for name, item in _items(d).items():
            detail = d.get(f"/api/agents/{item['id']}").json()
            assert {k: detail[k] for k in ("id", "name", "state", "mode", "profile", "created_at",
                                           "last_active", "identity")} == \
                {k: item[k] for k in ("id", "name", "state", "mode", "profile", "created_at",
                                      "last_active", "identity")}, name
    finally:
        d.stop()


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
