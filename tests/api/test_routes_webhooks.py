"""Webhook adapters on the daemon's own port (`/channels/<name>/webhook`), reached through
a real nginx running docs/nginx-agentd.conf: the deployment of docs/deploy.md without an
api_key (nginx trusted), where the platforms are remote clients. The generic webhook, LINE
and Messenger post signed requests through the one webhook location; a bad signature is
refused before the body is parsed; browsers, unsigned adapters and strangers are kept out."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
from pathlib import Path
from typing import Iterator

import pytest
import requests

from channel_fixtures import AGENT_TOML, CHANNEL_ENV, audit, configure, remove, wait_active, wait_for
from conftest import LLM_ENV
from fakes import messenger
from fakes.line import FakeLine, event as line_event, signature as line_signature
from fakes.recorder import Recorder
from nginxproxy import PUBLIC_NAME
from support import free_port
from tests.server.test_proxy import REMOTE, Stack, config_text

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
                                reason="nginx is not installed (.ci/apt-packages installs it)")

HOOK_SECRET = CHANNEL_ENV["WEBHOOK_TEST_SECRET"]
LINE_SECRET = CHANNEL_ENV["LINE_CHANNEL_SECRET"]
FB_SECRET = CHANNEL_ENV["MESSENGER_APP_SECRET"]
JSON = {"Content-Type": "application/json"}
# A platform on the internet: nginx appends the peer to X-Forwarded-For, agentd trusts nginx.
PLATFORM = {"Host": PUBLIC_NAME, "X-Forwarded-For": REMOTE}


def hook_sign(body: bytes, secret: str = HOOK_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Platforms:
    """The stack plus the platforms' fakes, configured as channels without any port key."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.daemon = stack.daemon
        self.callback = Recorder()
        self.line = FakeLine(CHANNEL_ENV["LINE_CHANNEL_ACCESS_TOKEN"]).start()
        self.fb = messenger.FakeMessenger(CHANNEL_ENV["MESSENGER_PAGE_TOKEN"]).start()
        configure(self.daemon, "webhook", callback_url=self.callback.url + "/cb",
                  secret_env="WEBHOOK_TEST_SECRET", default_agent="helper")
        configure(self.daemon, "line", api_url=self.line.url, default_agent="helper")
        configure(self.daemon, "messenger", api_url=self.fb.url, default_agent="helper")
        for name in ("webhook", "line", "messenger"):
            wait_active(self.daemon, name)

    def post(self, name: str, body: bytes, headers: dict[str, str], client: dict[str, str] = PLATFORM
             ) -> requests.Response:
        return self.stack.post(f"/agentd/channels/{name}/webhook", data=body, headers={**JSON, **client, **headers})

    def close(self) -> None:
        self.callback.close()
        self.line.stop()
        self.fb.stop()


@pytest.fixture(scope="module")
def platforms(tmp_path_factory, fake_llm) -> Iterator[Platforms]:
    stack = Stack(tmp_path_factory.mktemp("webhooks"), config_text(fake_llm), env={**LLM_ENV, **CHANNEL_ENV})
    try:
        created = stack.daemon.post("/api/agents", json={"manifest_toml": AGENT_TOML})
        assert created.status_code == 201, created.text
        world = Platforms(stack)
        yield world
        world.close()
    finally:
        stack.stop()


def test_signed_generic_webhook_through_nginx_is_answered(platforms: Platforms) -> None:
    body = json.dumps({"sender_id": "u-7", "sender_name": "Ann", "message": "via nginx"}).encode()
    response = platforms.post("webhook", body, {"X-Webhook-Signature": hook_sign(body)})
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "accepted"
    # The rate limiter counted it (its headers are on the answer).
    assert int(response.headers["X-RateLimit-Limit"]) > 0
    wait_for(lambda: platforms.callback.requests, what="callback")
    sent = platforms.callback.requests[-1]
    assert json.loads(sent["body"]) == {"sender_id": "u-7", "message": "echo: via nginx", "agent": "helper"}
    inbound = audit(platforms.daemon, "channel.inbound", "webhook")[0]["detail"]
    assert inbound["message_id"] == response.json()["message_id"]


def test_signed_line_event_through_nginx_is_answered(platforms: Platforms) -> None:
    body = line_event("hello from line", "Uann")
    response = platforms.post("line", body, {"X-Line-Signature": line_signature(LINE_SECRET, body)})
    assert response.status_code == 200, response.text
    wait_for(lambda: platforms.line.sent, what="LINE reply")
    assert platforms.line.sent[-1]["texts"] == ["echo: hello from line"]
    assert platforms.line.sent[-1]["replyToken"] == json.loads(body)["events"][0]["replyToken"]


def test_messenger_verification_handshake_and_event_through_nginx(platforms: Platforms) -> None:
    query = {"hub.mode": "subscribe", "hub.verify_token": CHANNEL_ENV["MESSENGER_VERIFY_TOKEN"],
             "hub.challenge": "1158201444"}
    answer = platforms.stack.get("/agentd/channels/messenger/webhook", params=query, headers=PLATFORM)
    assert (answer.status_code, answer.text) == (200, "1158201444")
    wrong = platforms.stack.get("/agentd/channels/messenger/webhook", headers=PLATFORM,
                                params={**query, "hub.verify_token": "guess"})
    assert wrong.status_code == 401
    body = messenger.event("hi page", "psid-1")
    response = platforms.post("messenger", body, {"X-Hub-Signature-256": messenger.signature(FB_SECRET, body)})
    assert response.status_code == 200, response.text
    wait_for(lambda: platforms.fb.sent, what="Messenger reply")


@pytest.mark.parametrize("name, header, value", [
    ("webhook", "X-Webhook-Signature", hook_sign(b"{not json", "wrong-secret")),
    ("line", "X-Line-Signature", line_signature("wrong-secret", b"{not json")),
    ("messenger", "X-Hub-Signature-256", messenger.signature("wrong-secret", b"{not json")),
])
def test_bad_signature_is_refused_before_the_body_is_parsed(platforms: Platforms, fake_llm, name: str,
                                                            header: str, value: str) -> None:
    before = len(fake_llm.requests)
    # Unparsable JSON: a 400 would mean the body was read as JSON before the signature.
    response = platforms.post(name, b"{not json", {header: value})
    assert (response.status_code, response.json()) == (401, {"error": "invalid signature"})
    unsigned = platforms.post(name, b"{not json", {})
    assert unsigned.status_code == 401
    refused = audit(platforms.daemon, "channel.refused", name)[0]["detail"]
    assert refused["reason"] == "bad signature"
    assert refused["remote"] == REMOTE  # the platform behind nginx, not nginx itself
    assert len(fake_llm.requests) == before


def test_browser_requests_are_refused_even_when_signed(platforms: Platforms) -> None:
    body = json.dumps({"sender_id": "u-8", "message": "from a page"}).encode()
    for extra in ({"Origin": f"https://{PUBLIC_NAME}"}, {"Sec-Fetch-Site": "same-origin"}):
        response = platforms.post("webhook", body, {"X-Webhook-Signature": hook_sign(body), **extra})
        assert response.status_code == 403, extra
        assert response.json() == {"error": "cross-site request refused"}


def test_unknown_channel_and_the_api_stay_closed(platforms: Platforms) -> None:
    response = platforms.post("telegram", b"{}", {})
    assert response.status_code == 404
    assert response.json() == {"error": "no webhook channel 'telegram' is configured"}
    # Keyless: the API itself still serves loopback clients only.
    assert platforms.stack.get("/agentd/api/agents", headers=PLATFORM).status_code == 401


def test_unsigned_webhook_serves_loopback_clients_only(platforms: Platforms) -> None:
    configure(platforms.daemon, "webhook", callback_url=platforms.callback.url + "/cb",
              secret_env="WEBHOOK_UNSET_SECRET", default_agent="helper")
    wait_active(platforms.daemon, "webhook")
    try:
        body = json.dumps({"sender_id": "u-9", "message": "unsigned"}).encode()
        remote = platforms.post("webhook", body, {})
        assert remote.status_code == 401
        assert "loopback clients only" in remote.json()["error"]
        local = platforms.post("webhook", body, {}, client={"Host": PUBLIC_NAME})
        assert local.status_code == 202, local.text
    finally:
        configure(platforms.daemon, "webhook", callback_url=platforms.callback.url + "/cb",
                  secret_env="WEBHOOK_TEST_SECRET", default_agent="helper", listen_port=None)
        wait_active(platforms.daemon, "webhook")


def test_own_listener_stays_available_with_a_port_key(platforms: Platforms) -> None:
    port = free_port()
    configure(platforms.daemon, "line", api_url=platforms.line.url, default_agent="helper", webhook_port=port)
    wait_active(platforms.daemon, "line")
    try:
        for url in (f"http://127.0.0.1:{port}/callback", f"{platforms.stack.nginx.url}/agentd/channels/line/webhook"):
            body = line_event(f"to {url}", "Ubob")
            response = requests.post(url, data=body, timeout=10, verify=platforms.stack.verify,
                                     headers={**JSON, **PLATFORM, "X-Line-Signature": line_signature(LINE_SECRET, body)})
            assert response.status_code == 200, (url, response.text)
            wait_for(lambda: any(s["texts"] == [f"echo: to {url}"] for s in platforms.line.sent), what=url)
    finally:
        configure(platforms.daemon, "line", api_url=platforms.line.url, default_agent="helper")
        wait_active(platforms.daemon, "line")
    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{port}/callback", data=b"{}", timeout=5)


def test_stopped_channel_is_no_longer_served(platforms: Platforms) -> None:
    remove(platforms.daemon, "messenger")
    try:
        body = messenger.event("after removal", "psid-2")
        response = platforms.post("messenger", body, {"X-Hub-Signature-256": messenger.signature(FB_SECRET, body)})
        assert response.status_code == 404
    finally:
        configure(platforms.daemon, "messenger", api_url=platforms.fb.url, default_agent="helper")
        wait_active(platforms.daemon, "messenger")


def test_webhooks_are_under_the_rate_limit(tmp_path: Path) -> None:
    from agentd.api import create_app
    from agentd.config import parse_config
    from agentd.kernel import Kernel
    from support import with_test_db

    data = {"api": {"rate_limit_per_second": 0.5, "rate_limit_burst": 2}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    try:
        client = create_app(kernel).test_client()
        answers = [client.post("/channels/line/webhook", data=b"{}", environ_base={"REMOTE_ADDR": REMOTE})
                   for _ in range(3)]
        assert [a.status_code for a in answers] == [404, 404, 429]
        assert answers[2].get_json()["error"].startswith("rate limit exceeded")
        assert int(answers[2].headers["Retry-After"]) >= 1
    finally:
        kernel.close()


def test_configured_but_not_running_answers_503_so_the_platform_retries(platforms: Platforms) -> None:
    configure(platforms.daemon, "line", api_url=platforms.line.url, default_agent="helper",
              channel_secret_env="LINE_UNSET_SECRET")  # cannot start: the variable is not set
    try:
        body = line_event("while down", "Uann")
        response = platforms.post("line", body, {"X-Line-Signature": line_signature(LINE_SECRET, body)})
        assert response.status_code == 503
        assert response.json() == {"error": "channel line is not running on this daemon"}
        assert response.headers["Retry-After"] == "5"
    finally:
        configure(platforms.daemon, "line", api_url=platforms.line.url, default_agent="helper")
        wait_active(platforms.daemon, "line")


def test_a_polling_channel_running_here_has_no_webhook(platforms: Platforms) -> None:
    from fakes.telegram import FakeTelegram

    fake = FakeTelegram(CHANNEL_ENV["TELEGRAM_BOT_TOKEN"]).start()
    try:
        configure(platforms.daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=fake.url,
                  long_poll_secs=1, default_agent="helper")
        wait_active(platforms.daemon, "telegram")
        response = platforms.post("telegram", b'{"update_id": 1}', {})
        assert response.status_code == 404 and "Retry-After" not in response.headers
        assert response.json() == {"error": "channel telegram receives messages by polling or a socket, "
                                            "not by webhook"}
    finally:
        remove(platforms.daemon, "telegram")
        fake.stop()


def test_feishu_webhook_path_is_the_daemon_route_itself(platforms: Platforms) -> None:
    # Feishu's `webhook_path` names its own listener's path; on the daemon, the route is it.
    from fakes.feishu import FakeFeishu, callback

    fake = FakeFeishu("cli_test", CHANNEL_ENV["FEISHU_APP_SECRET"]).start()
    try:
        configure(platforms.daemon, "feishu", api_url=fake.url, default_agent="helper", app_id="cli_test",
                  encrypt_key_env="FEISHU_ENCRYPT_KEY", verification_token_env="FEISHU_VERIFICATION_TOKEN")
        wait_active(platforms.daemon, "feishu")
        challenge = {"challenge": "ajls384kdjx98XX", "token": CHANNEL_ENV["FEISHU_VERIFICATION_TOKEN"],
                     "type": "url_verification"}
        body, headers = callback(challenge, CHANNEL_ENV["FEISHU_ENCRYPT_KEY"], signed=False)
        response = platforms.post("feishu", body, headers)
        assert (response.status_code, response.json()) == (200, {"challenge": "ajls384kdjx98XX"})
    finally:
        remove(platforms.daemon, "feishu")
        fake.stop()
