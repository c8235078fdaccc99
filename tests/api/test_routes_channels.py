"""Channels API: the catalogue of 40, configure validation and atomic config writes
(comments kept), remove, reload, test, QR login through a fake gateway, audit trail."""

from __future__ import annotations

import json
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from agentd.api import schemas_out as out
from channel_fixtures import audit, channel, channel_daemon, configure, wait_for  # noqa: F401
from support import Daemon, FAST_API, free_port, make_home

SPEC_FIELDS = {"name", "display_name", "icon", "description", "category", "difficulty", "setup_time",
               "quick_setup", "setup_type", "configured", "active", "fields", "setup_steps", "config_template"}
FIELD_KEYS = {"key", "label", "type", "env_var", "required", "has_value", "placeholder", "advanced"}


def test_catalogue_lists_the_spec_40(channel_daemon):
    items = channel_daemon.get("/api/channels").json()
    assert len(items) == 40
    names = {c["name"] for c in items}
    assert "wecom" not in names and "dingtalk_stream" not in names
    counts: dict[str, int] = {}
    for item in items:
        assert SPEC_FIELDS <= set(item), item["name"]
        counts[item["category"]] = counts.get(item["category"], 0) + 1
        for field in item["fields"]:
            assert FIELD_KEYS <= set(field)
            assert field["type"] in ("secret", "text", "number", "list")
        assert item["config_template"].startswith(f"[channels.{item['name']}]")
    assert counts == {"messaging": 12, "social": 5, "enterprise": 10, "developer": 9, "notifications": 4}
    assert out.ChannelSchema(many=True).validate(items) == {}, "the list is not what /api/openapi.json documents"
    telegram = next(c for c in items if c["name"] == "telegram")
    token = next(f for f in telegram["fields"] if f["key"] == "bot_token_env")
    # The daemon's environment has TELEGRAM_BOT_TOKEN set (channel_fixtures.CHANNEL_ENV).
    assert (token["env_var"], token["has_value"], token["type"]) == ("TELEGRAM_BOT_TOKEN", True, "secret")
    whatsapp = next(c for c in items if c["name"] == "whatsapp")
    assert whatsapp["setup_type"] == "qr"


def test_configure_validates_types_and_env_names(channel_daemon):
    post = lambda name, body: channel_daemon.post(f"/api/channels/{name}/configure", json=body)  # noqa: E731
    response = post("nosuch", {"default_agent": "x"})
    assert response.status_code == 404 and "nosuch" in response.json()["error"]
    cases = [({"port": "sixty"}, "port"), ({"port": True}, "port"), ({"port": 70000}, "port"),
             ({"channels": 5}, "channels"), ({"bogus_key": 1}, "bogus_key"),
             ({"password_env": "hunter2-not-a-name"}, "password_env"),
             ({"password_env": "sk-ABCDEF1234567890"}, "password_env")]
    for body, key in cases:
        response = post("irc", {"server": "127.0.0.1", **body})
        assert response.status_code == 400, body
        assert response.json()["error"].startswith(f"{key}:"), response.json()
        assert "hunter2" not in response.json()["error"] and "sk-ABC" not in response.json()["error"]
    config = (channel_daemon.home / "config.toml").read_text()
    assert "hunter2" not in config and "sk-ABC" not in config and "channels.irc" not in config


ADMIN = "admin-key-for-channel-env-names"
OUTSIDE = "(other variables only the admin may name)"


def test_env_keys_set_through_the_api_name_only_the_adapters_own_variables(tmp_path):
    port = free_port()
    by_hand = (f'[channels.webhook]\nlisten_port = {port}\ncallback_url = "http://127.0.0.1:9/"\n'
               'secret_env = "OPERATOR_HOOK_SECRET"\n')
    home = make_home(tmp_path, f'api_key = "{ADMIN}"\n' + FAST_API + by_hand)
    env = {"OPERATOR_HOOK_SECRET": "hand-picked", "OPENAI_API_KEY": "sk-provider-key"}
    daemon = Daemon(home, api_key=ADMIN, env_extra=env).start()
    try:
        # The operator's own file names any variable.
        wait_for(lambda: channel(daemon, "webhook")["active"], what="webhook active")
        created = daemon.post("/api/keys", json={"name": "channel-manager", "scopes": ["manage"]})
        manager = {"Authorization": f"Bearer {created.json()['key']}"}
        before = (home / "config.toml").read_text()
        refused = ("bot_token_env: channel telegram may only read TELEGRAM_BOT_TOKEN or a variable "
                   f"starting with TELEGRAM_ {OUTSIDE}")
        for name in ("OPENAI_API_KEY", "PATH", "AGENTD_API_KEY", "WEBHOOK_SECRET"):
            response = daemon.post("/api/channels/telegram/configure", headers=manager,
                                   json={"bot_token_env": name, "api_url": "http://attacker.example"})
            assert (response.status_code, response.json()) == (400, {"error": refused}), name
        response = daemon.post("/api/channels/irc/configure", headers=manager, json={"password_env": "OPENAI_API_KEY"})
        assert response.json() == {"error": f"password_env: channel irc may only read a variable starting with "
                                            f"IRC_ {OUTSIDE}"}
        assert (home / "config.toml").read_text() == before
        # The admin names any variable, as in config.toml.
        response = daemon.post("/api/channels/irc/configure", json={"server": "127.0.0.1", "password_env": "MY_IRC_PASS"})
        assert response.status_code == 200, response.text
        assert tomllib.loads((home / "config.toml").read_text())["channels"]["irc"]["password_env"] == "MY_IRC_PASS"
        for name in ("TELEGRAM_BOT_TOKEN", "TELEGRAM_OTHER"):
            response = daemon.post("/api/channels/telegram/configure", headers=manager,
                                   json={"bot_token_env": name, "api_url": "http://127.0.0.1:9"})
            assert response.status_code == 200, response.text
            saved = tomllib.loads((home / "config.toml").read_text())["channels"]["telegram"]
            assert saved == {"bot_token_env": name, "api_url": "http://127.0.0.1:9"}
        # Saving the operator's section again keeps the name the file holds, and no other.
        webhook = {"listen_port": port, "callback_url": "http://127.0.0.1:9/", "secret_env": "OPERATOR_HOOK_SECRET"}
        response = daemon.post("/api/channels/webhook/configure", headers=manager,
                               json={**webhook, "default_agent": "helper"})
        assert response.status_code == 200 and response.json()["activated"] is True, response.text
        response = daemon.post("/api/channels/webhook/configure", headers=manager,
                               json={**webhook, "secret_env": "OPERATOR_OTHER_SECRET"})
        assert response.json() == {"error": "secret_env: channel webhook may only read WEBHOOK_SECRET or a variable "
                                            f"starting with WEBHOOK_ {OUTSIDE}"}
        response = daemon.post("/api/channels/webhook/configure", headers=manager,
                               json={**webhook, "secrets": {"secret_env": "overwrite"}})
        assert response.json() == {"error": "secret_env: a secret saved by agentd goes to WEBHOOK_SECRET or a "
                                            "variable starting with WEBHOOK_, not OPERATOR_HOOK_SECRET"}
        assert "overwrite" not in (home / "config.toml").read_text() and not (home / "secrets.env").exists()
        # What the API saved is read back at the next start like the rest of the file.
        daemon.stop()
        daemon.start()
        wait_for(lambda: channel(daemon, "webhook")["active"], what="webhook active after a restart")
        assert tomllib.loads((home / "config.toml").read_text())["channels"]["telegram"]["bot_token_env"] == \
            "TELEGRAM_OTHER"
    finally:
        daemon.stop()


@pytest.mark.parametrize("port", [0, 65536, 6667.5])
def test_configure_refuses_a_port_outside_1_to_65535(channel_daemon, port):
    response = channel_daemon.post("/api/channels/irc/configure", json={"server": "127.0.0.1", "port": port})
    assert (response.status_code, response.json()) == (400, {"error": "port: must be a port number (1-65535)"})
    assert "channels.irc" not in (channel_daemon.home / "config.toml").read_text()


@pytest.mark.parametrize("name, body, error", [
    ("telegram", {"poll_interval_secs": 10 ** 30}, "poll_interval_secs: must be at most 86400 (a day), got 10"),
    ("telegram", {"long_poll_secs": 86401}, "long_poll_secs: must be at most 86400 (a day), got 86401"),
    ("slack", {"thread_ttl_hours": 8761}, "thread_ttl_hours: must be at most 8760 (a year), got 8761"),
    ("discord", {"intents": 1.5}, "intents: must be a whole number, got 1.5"),
    ("telegram", {"long_poll_secs": 0}, "long_poll_secs: must be more than 0 (leave it out for the default, 25)"),
    ("email", {"poll_interval_secs": "0"}, "poll_interval_secs: must be more than 0 (leave it out for the default, 30)"),
    ("irc", {"send_interval_secs": 0.0}, "send_interval_secs: must be more than 0 (leave it out for the default, 0.5)"),
])
def test_configure_refuses_numbers_no_adapter_can_use(channel_daemon, name, body, error):
    response = channel_daemon.post(f"/api/channels/{name}/configure", json=body)
    assert response.status_code == 400 and response.json()["error"].startswith(error), response.text
    assert f"channels.{name}" not in (channel_daemon.home / "config.toml").read_text()


def test_configure_reads_numbers_as_a_form_types_them(channel_daemon):
    for text, saved in ((" 30 ", 30), ("2.5", 2.5), ("1e3", 1000.0)):
        response = channel_daemon.post("/api/channels/telegram/configure", json={"long_poll_secs": text})
        assert response.status_code == 200, response.json()
        assert tomllib.loads((channel_daemon.home / "config.toml").read_text())["channels"]["telegram"] == \
            {"long_poll_secs": saved}
    for text in ("nan", "-inf", "ten", "1e999"):
        response = channel_daemon.post("/api/channels/telegram/configure", json={"long_poll_secs": text})
        assert (response.status_code, response.json()) == (
            400, {"error": f"long_poll_secs: must be a number, got {text!r}"})
    assert channel_daemon.delete("/api/channels/telegram/configure").status_code == 200


def test_configure_takes_zero_where_the_adapter_honours_it(channel_daemon):
    response = channel_daemon.post("/api/channels/telegram/configure", json={"poll_interval_secs": 0})
    assert response.status_code == 200, response.json()
    section = tomllib.loads((channel_daemon.home / "config.toml").read_text())["channels"]["telegram"]
    assert section["poll_interval_secs"] == 0
    assert channel_daemon.delete("/api/channels/telegram/configure").status_code == 200


def test_configure_says_when_the_agents_it_names_do_not_exist(channel_daemon):
    body = {"api_url": "http://127.0.0.1:9", "default_agent": "nosuch", "thread_routes": {"5": "ghost", "6": "helper"}}
    response = channel_daemon.post("/api/channels/telegram/configure", json=body)
    assert response.status_code == 200 and response.json() == {
        "status": "configured", "channel": "telegram", "activated": True,
        "note": "no agent named nosuch, ghost yet: messages for it get an apology until it is spawned"}
    response = channel_daemon.post("/api/channels/telegram/configure", json={**body, "default_agent": "helper",
                                                                               "thread_routes": {}})
    assert response.json() == {"status": "configured", "channel": "telegram", "activated": True}
    assert channel_daemon.delete("/api/channels/telegram/configure").status_code == 200


def test_configure_says_when_no_agent_runs(tmp_path):
    daemon = Daemon(make_home(tmp_path), env_extra={"TELEGRAM_BOT_TOKEN": "123456:TESTTOKEN"}).start()
    try:
        response = daemon.post("/api/channels/telegram/configure", json={"api_url": "http://127.0.0.1:9"})
        assert response.status_code == 200 and response.json() == {
            "status": "configured", "channel": "telegram", "activated": True,
            "note": "no agent runs yet: messages get an apology until one is spawned"}
    finally:
        daemon.stop()


@pytest.mark.parametrize("key", ["port", "imap_port"])
def test_configure_takes_the_first_and_last_port(channel_daemon, key):
    name = "irc" if key == "port" else "email"
    for port in (1, 65535):
        response = channel_daemon.post(f"/api/channels/{name}/configure", json={key: port})
        assert response.status_code == 200, response.json()
        section = tomllib.loads((channel_daemon.home / "config.toml").read_text())["channels"][name]
        assert section[key] == port
    assert channel_daemon.delete(f"/api/channels/{name}/configure").status_code == 200


def test_configure_writes_section_keeps_comments_and_remove_deletes_it(tmp_path):
    original = ("# my comment at the top\n" + FAST_API + "# a comment before llm\n[llm]\nretries = 1  # inline\n")
    home = make_home(tmp_path, original)
    daemon = Daemon(home).start()
    try:
        # Comma strings become lists, numeric strings numbers.
        response = daemon.post("/api/channels/discord/configure",
                               json={"bot_token_env": "DISCORD_TOKEN", "allowed_guilds": "1, 2",
                                     "intents": "513", "default_agent": "helper"})
        assert response.status_code == 200
        assert response.json()["status"] == "configured" and response.json()["channel"] == "discord"
        assert response.json()["activated"] is False
        assert out.ChannelConfiguredSchema().validate(response.json()) == {}
        text = (home / "config.toml").read_text()
        assert text.startswith(original)  # every byte before the new section is unchanged
        section = tomllib.loads(text)["channels"]["discord"]
        assert section == {"bot_token_env": "DISCORD_TOKEN", "allowed_guilds": ["1", "2"], "intents": 513,
                           "default_agent": "helper"}
        item = channel(daemon, "discord")
        assert (item["configured"], item["active"]) == (True, False)
        assert next(f for f in item["fields"] if f["key"] == "default_agent")["has_value"] is True
        # discord is implemented: its env var is unset (no start) and no target is configured.
        test = daemon.post("/api/channels/discord/test", json={"message": "hi"})
        assert test.status_code == 400 and "no test target" in test.json()["error"]
        # Every adapter of the catalogue is implemented but the two that cannot connect, which say why.
        listed = daemon.get("/api/channels").json()
        assert [c["name"] for c in listed if not c["implemented"]] == ["keybase", "guilded"]
        assert all(c["reason"] for c in listed if not c["implemented"])
        assert [c["name"] for c in listed if "reason" in c] == ["keybase", "guilded"]
        # A configured adapter that could not start: its `error` and `key_id` as documented.
        assert out.ChannelSchema(many=True).validate(listed) == {} and item["key_id"] is None and item["error"]
        removed = daemon.delete("/api/channels/discord/configure")
        assert removed.json() == {"status": "removed", "channel": "discord"}
        assert (home / "config.toml").read_text() == original
        assert channel(daemon, "discord")["configured"] is False
        events = [e["event"] for e in audit(daemon, subject="discord")]
        # Newest first; a reload of the written file may have tried the start once more.
        assert events[0] == "channel.remove" and events[-1] == "channel.configure", events
        assert set(events[1:-1]) == {"channel.start_failed"}, events
    finally:
        daemon.stop()


def test_reload_applies_hand_edits(tmp_path):
    home = make_home(tmp_path)
    daemon = Daemon(home, env_extra={"WEBHOOK_TEST_SECRET": "x"}).start()
    try:
        port = free_port()
        with open(home / "config.toml", "a") as fh:
            fh.write(f'\n[channels.webhook]\nlisten_port = {port}\ncallback_url = "http://127.0.0.1:9/"\n')
        response = daemon.post("/api/channels/reload")
        assert response.json() == {"status": "reloaded", "channels_active": 1}
        wait_for(lambda: channel(daemon, "webhook")["active"], what="webhook active")
        text = (home / "config.toml").read_text()
        # listen_host changed by hand: the listener re-binds on the new address.
        with open(home / "config.toml", "a") as fh:
            fh.write('[channels]\nlisten_host = "127.0.0.2"\n')
        assert daemon.post("/api/channels/reload").json() == {"status": "reloaded", "channels_active": 1}
        wait_for(lambda: channel(daemon, "webhook")["active"], what="webhook active again")
        assert requests.post(f"http://127.0.0.2:{port}/", json={"sender_id": "a", "message": "b"},
                             timeout=5).status_code == 202
        (home / "config.toml").write_text(text[:text.index("[channels.webhook]")])
        assert daemon.post("/api/channels/reload").json() == {"status": "reloaded", "channels_active": 0}
        assert channel(daemon, "webhook")["active"] is False
        (home / "config.toml").write_text("this is = = not toml")
        response = daemon.post("/api/channels/reload")
        assert response.status_code == 400 and "cannot reload" in response.json()["error"]
        (home / "config.toml").write_text("[channels]\nlisten_host = 5\n")
        response = daemon.post("/api/channels/reload")
        assert (response.status_code, response.json()) == (400, {
            "error": "cannot reload channels: config key channels.listen_host: expected a string, got int"})
    finally:
        daemon.stop()


def test_test_endpoint_errors(channel_daemon):
    assert channel_daemon.post("/api/channels/nosuch/test", json={"message": "x"}).status_code == 404
    response = channel_daemon.post("/api/channels/telegram/test", json={"message": "x"})
    assert response.status_code == 400 and "not configured" in response.json()["error"]
    assert channel_daemon.post("/api/channels/irc/test", json={"message": 5}).status_code == 400
    # Configured but with no target to send to: the client must say where (400, not a fake success).
    configure(channel_daemon, "ntfy", topic="t1", server_url="http://127.0.0.1:9")
    configure(channel_daemon, "matrix", access_token_env="MATRIX_ACCESS_TOKEN", homeserver_url="http://127.0.0.1:9")
    response = channel_daemon.post("/api/channels/matrix/test", json={"message": "x"})
    assert response.status_code == 400 and "no test target" in response.json()["error"]
    response = channel_daemon.post("/api/channels/ntfy/test", json={"message": "x"})  # nothing listens on :9
    assert response.status_code == 502 and "not delivered" in response.json()["error"]
    channel_daemon.delete("/api/channels/matrix/configure")
    channel_daemon.delete("/api/channels/ntfy/configure")


class FakeGateway:
    """A WhatsApp Web gateway speaking the original system's /login protocol."""

    def __init__(self, qr: str) -> None:
        self.qr, self.connected = qr, False
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
                pass

            def _json(self, body) -> None:  # type: ignore[no-untyped-def]
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                assert self.path == "/login/start"
                self._json({"qr_data_url": gateway.qr, "session_id": "sess-1", "connected": False})

            def do_GET(self) -> None:  # noqa: N802
                if self.path != "/login/status?session_id=sess-1":
                    self._json({"connected": False, "message": "Unknown session", "expired": False})
                elif gateway.connected:
                    self._json({"connected": True, "message": "ok", "expired": False, "phone_number": "+15550001"})
                else:
                    self._json({"connected": False, "message": "Waiting for scan...", "expired": False})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("qr", ["2@raw-qr-string,abc,def", "data:image/png;base64,iVBORw0KGgoAAAA"])
def test_qr_login_through_gateway(tmp_path, qr):
    gateway = FakeGateway(qr)
    daemon = Daemon(make_home(tmp_path), env_extra={"WHATSAPP_WEB_GATEWAY_URL": gateway.url}).start()
    try:
        start = daemon.post("/api/channels/whatsapp/qr/start")
        assert start.json() == {"session_id": "sess-1", "status": "waiting_for_scan"}
        status = daemon.get("/api/channels/whatsapp/qr/status?session_id=sess-1").json()
        assert status["status"] == "waiting_for_scan" and set(status) == {"status", "qr_code", "expires_at"}
        assert status["qr_code"].startswith("data:image/png;base64,")
        if qr.startswith("data:"):
            assert status["qr_code"] == qr
        else:  # rendered by agentd: a real PNG
            import base64
            assert base64.b64decode(status["qr_code"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
        gateway.connected = True
        assert daemon.get("/api/channels/whatsapp/qr/status?session_id=sess-1").json() == \
            {"status": "connected", "phone_number": "+15550001"}
        assert daemon.get("/api/channels/whatsapp/qr/status?session_id=nope").status_code == 404
        assert daemon.post("/api/channels/telegram/qr/start").status_code == 400
        assert daemon.post("/api/channels/nosuch/qr/start").status_code == 404
        gateway.server.shutdown()
        gateway.server.server_close()
        response = daemon.post("/api/channels/whatsapp/qr/start")
        assert response.status_code == 502 and "unreachable" in response.json()["error"]
    finally:
        daemon.stop()
        gateway.server.shutdown()


def test_qr_without_gateway_is_503(channel_daemon):
    response = channel_daemon.post("/api/channels/whatsapp/qr/start")
    assert response.status_code == 503
    assert "WHATSAPP_WEB_GATEWAY_URL" in response.json()["error"]
    response = channel_daemon.get("/api/channels/whatsapp/qr/status?session_id=x")
    assert response.status_code == 503 and "WHATSAPP_WEB_GATEWAY_URL" in response.json()["error"]


def test_audit_records_agent_lifecycle_newest_first(channel_daemon):
    created = channel_daemon.post("/api/agents", json={"manifest_toml": 'name = "temp-agent"\n'}).json()
    channel_daemon.delete(f"/api/agents/{created['agent_id']}")
    rows = channel_daemon.get("/api/audit/recent?limit=2").json()
    assert [(r["event"], r["subject"]) for r in rows] == [("agent.kill", "temp-agent"), ("agent.spawn", "temp-agent")]
    assert rows[0]["detail"] == {"agent_id": created["agent_id"]} and rows[0]["id"] > rows[1]["id"]
    assert any(r["event"] == "kernel.start" for r in audit(channel_daemon))
    forged = json.dumps({"manifest": 'name = "x"\n', "content_hash": "00", "signature": [0] * 64,
                         "signer_public_key": [0] * 32, "signer_id": "me"})
    assert channel_daemon.post("/api/agents", json={"signed_manifest": forged}).status_code == 403
    rejected = audit(channel_daemon, "agent.signature_rejected")[0]
    assert "signature" in rejected["detail"]["error"] or "hash" in rejected["detail"]["error"]
    assert channel_daemon.get("/api/audit/recent?limit=abc").status_code == 400


def test_dashboard_channels_page_shows_recent_events(channel_daemon):
    channel_daemon.post("/api/channels/gitter/configure", json={"default_agent": "helper"})
    page = channel_daemon.get("/channels")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert 'data-channel="gitter"' in page.text and "channel.configure" in page.text
    channel_daemon.delete("/api/channels/gitter/configure")
