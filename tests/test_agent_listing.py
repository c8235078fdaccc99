"""GET /api/agents reuses each agent's item text between listings (agents/listing.py): the
bytes are what jsonify sent, and every change an item shows appears in the next listing."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home


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
