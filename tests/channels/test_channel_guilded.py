"""Guilded shut down on 19 December 2025: the configuration is validated and saved, the
adapter is never active, and `test` answers 502 saying why."""

from __future__ import annotations

import tomllib

from channel_contract import audit, daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure


def test_guilded_saves_config_and_says_the_service_is_gone(daemon):  # noqa: F811
    bad = daemon.post("/api/channels/guilded/configure", json={"bot_token_env": "gapi_the-token-itself"})
    assert bad.status_code == 400 and "bot_token_env" in bad.json()["error"]
    answer = configure(daemon, "guilded", bot_token_env="GUILDED_BOT_TOKEN", server_ids="srv1, srv2",
                       default_agent="helper")
    assert answer["activated"] is False and "could not start" in answer["note"]
    section = tomllib.loads((daemon.home / "config.toml").read_text())["channels"]["guilded"]
    assert section == {"bot_token_env": "GUILDED_BOT_TOKEN", "server_ids": ["srv1", "srv2"], "default_agent": "helper"}
    item = channel(daemon, "guilded")
    assert (item["configured"], item["active"], item["implemented"]) == (True, False, False)
    assert item["reason"].startswith("Guilded shut down on 19 December 2025")
    assert "shut down on 19 December 2025" in item["description"]
    assert "shut down" in audit(daemon, "channel.start_failed", "guilded")[0]["detail"]["error"]
    test = daemon.post("/api/channels/guilded/test", json={"message": "hi", "chat_id": "some-channel"})
    assert test.status_code == 502
    assert "Guilded shut down on 19 December 2025" in test.json()["error"]
    daemon.delete("/api/channels/guilded/configure")
    assert channel(daemon, "guilded")["configured"] is False
