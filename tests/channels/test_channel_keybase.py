"""Keybase cannot work without the proprietary Keybase client: the configuration is
validated and saved, the adapter is never active, and `test` says what is missing."""

from __future__ import annotations

import tomllib

from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure


def test_keybase_saves_config_and_explains_what_is_missing(daemon):  # noqa: F811
    bad = daemon.post("/api/channels/keybase/configure", json={"paperkey_env": "my secret paper key words"})
    assert bad.status_code == 400 and "paperkey_env" in bad.json()["error"]
    answer = configure(daemon, "keybase", username="agentbot", paperkey_env="KEYBASE_PAPERKEY",
                       allowed_teams="team1, team2", default_agent="helper")
    assert answer["activated"] is False and "could not start" in answer["note"]
    section = tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["keybase"]
    assert section["allowed_teams"] == ["team1", "team2"] and section["paperkey_env"] == "KEYBASE_PAPERKEY"
    item = channel(daemon, "keybase")
    assert (item["configured"], item["active"], item["implemented"]) == (True, False, False)
    assert item["reason"].startswith("keybase needs the Keybase client") and "cannot connect" in item["reason"]
    assert "Keybase client" in item["description"]
    assert "keybase" in audit(daemon, "channel.start_failed", "keybase")[0]["detail"]["error"]
    test = daemon.post("/api/channels/keybase/test", json={"message": "hi", "chat_id": "someone"})
    assert test.status_code == 502
    assert "Keybase client" in test.json()["error"] and "binary" in test.json()["error"]
    daemon.delete("/api/channels/keybase/configure")
