"""A channel's `overrides` through the real daemon and the webhook channel: model and
system prompt per channel, dm_policy, rate_limit_per_user with a polite refusal,
usage_footer, prefix_agent_name; keys agentd does not implement are refused with 400
naming them, at configure time and when config.toml names them at (re)load."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from channel_fixtures import audit, channel_daemon, configure, remove, wait_active, wait_for  # noqa: F401
from fakes.recorder import Recorder
from support import free_port
from test_channel_webhook import sign


@pytest.fixture
def hook(channel_daemon):
    callback = Recorder()
    port = free_port()

    def setup(**overrides):  # type: ignore[no-untyped-def]
        configure(channel_daemon, "webhook", listen_port=port, callback_url=callback.url + "/cb",
                  secret_env="WEBHOOK_TEST_SECRET", default_agent="helper", overrides=overrides)
        wait_active(channel_daemon, "webhook")

    def say(sender: str, text: str) -> None:
        body = json.dumps({"sender_id": sender, "message": text}).encode()
        response = requests.post(f"http://127.0.0.1:{port}/", data=body, timeout=5,
                                 headers={"X-Webhook-Signature": sign(body), "Content-Type": "application/json"})
        assert response.status_code == 202, response.text

    def replies() -> list[str]:
        return [json.loads(r["body"])["message"] for r in callback.requests]

    yield setup, say, replies
    remove(channel_daemon, "webhook")
    callback.close()


def model_requests(fake_llm, text: str) -> list[dict]:
    return [r["json"] for r in list(fake_llm.requests)
            if isinstance(r.get("json"), dict) and text in json.dumps(r["json"])]


def test_model_and_system_prompt_per_channel(channel_daemon, hook, fake_llm):
    setup, say, replies = hook
    setup(model="gpt-4o-mini", system_prompt="Answer like a ship's captain.")
    say("u-1", "overridden hello")
    wait_for(lambda: replies(), what="reply")
    sent = model_requests(fake_llm, "overridden hello")[-1]
    assert sent["model"] == "gpt-4o-mini"
    system = next(m["content"] for m in sent["messages"] if m["role"] == "system")
    assert "Answer like a ship's captain." in system
    # Without the overrides the agent's own model and prompt come back.
    setup()
    say("u-1", "plain hello")
    wait_for(lambda: len(replies()) == 2, what="second reply")
    sent = model_requests(fake_llm, "plain hello")[-1]
    assert sent["model"] == "gpt-4o" and "ship's captain" not in json.dumps(sent)


def test_dm_policy_ignore_refuses_before_the_agent(channel_daemon, hook, fake_llm):
    setup, say, replies = hook
    setup(dm_policy="ignore")
    say("u-2", "ignored direct message")
    wait_for(lambda: any(r["detail"]["reason"] == "dm_policy is ignore"
                         for r in audit(channel_daemon, "channel.refused", "webhook")), what="refusal")
    time.sleep(0.3)
    assert replies() == [] and model_requests(fake_llm, "ignored direct message") == []
    setup(dm_policy="respond")
    say("u-2", "answered direct message")
    wait_for(lambda: replies() == ["echo: answered direct message"], what="reply")


def test_rate_limit_per_user_answers_politely(channel_daemon, hook, fake_llm):
    setup, say, replies = hook
    setup(rate_limit_per_user=2)
    for n in range(3):
        say("u-fast", f"burst {n}")
    say("u-other", "someone else")  # another sender has a budget of their own
    wait_for(lambda: len(replies()) == 4, what="four replies")
    answers = replies()
    assert "echo: burst 0" in answers and "echo: burst 1" in answers and "echo: someone else" in answers
    assert ("You are sending messages faster than this channel allows (2 per minute). "
            "Please wait a moment and try again.") in answers
    assert model_requests(fake_llm, "burst 2") == []
    assert audit(channel_daemon, "channel.rate_limited", "webhook")[0]["detail"]["sender"] == "u-fast"


def test_usage_footer_and_prefix_agent_name(channel_daemon, hook):
    setup, say, replies = hook
    setup(usage_footer="tokens", prefix_agent_name=True)
    say("u-3", "with footer")
    wait_for(lambda: replies(), what="reply")
    assert re.fullmatch(r"\[helper\] echo: with footer\n\n\d+ in / \d+ out tokens", replies()[0]), replies()
    setup(usage_footer="off", prefix_agent_name=False)
    say("u-3", "without footer")
    wait_for(lambda: len(replies()) == 2, what="second reply")
    assert replies()[1] == "echo: without footer"
    # A cheap model's few millionths of a dollar show, to two significant digits.
    setup(usage_footer="full", model="gpt-4o-mini")
    say("u-3", "cheap")
    wait_for(lambda: len(replies()) == 3, what="third reply")
    assert re.fullmatch(r"echo: cheap\n\n\d+ in / \d+ out tokens · \$0\.0000(0[1-9]\d|[1-9]\d)", replies()[2]), replies()


@pytest.mark.parametrize("channel,body,named", [
    ("webhook", {"overrides": {"threading": True}}, "overrides.threading"),
    ("webhook", {"overrides": {"output_format": "rtf"}}, "overrides.output_format"),
    ("webhook", {"overrides": {"typing_mode": "never"}}, "overrides.typing_mode"),
    ("webhook", {"overrides": {"lifecycle_reactions": True}}, "overrides.lifecycle_reactions"),
    ("webhook", {"overrides": {"group_policy": "mention-only"}}, "overrides.group_policy"),
    ("webhook", {"overrides": {"dm_policy": "sometimes"}}, "overrides.dm_policy"),
    ("webhook", {"overrides": {"rate_limit_per_user": "lots"}}, "overrides.rate_limit_per_user"),
    ("webhook", {"overrides": {"usage_footer": "loud"}}, "overrides.usage_footer"),
    ("webhook", {"overrides": {"colour": "blue"}}, "overrides.colour"),
    ("email", {"overrides": {"group_policy": "mention-only"}}, "overrides.group_policy"),
    ("mastodon", {"overrides": {"group_policy": "respond"}}, "overrides.group_policy"),
    ("webex", {"overrides": {"group_policy": "shared"}}, "overrides.group_policy"),
    ("slack", {"overrides": {"dm_policy": "shared"}}, "overrides.dm_policy"),
    ("slack", {"overrides": {"threading": "yes"}}, "overrides.threading"),
    ("discord", {"auto_thread": "sometimes"}, "auto_thread"),
    ("telegram", {"thread_routes": {"general": "helper"}}, "thread_routes"),
    ("matrix", {"refresh_token_env": "not a variable name"}, "refresh_token_env"),
])
def test_keys_not_implemented_or_bad_are_refused_naming_them(channel_daemon, channel, body, named):
    before = (channel_daemon.home / "config.toml").read_text()
    response = channel_daemon.post(f"/api/channels/{channel}/configure", json=body)
    assert response.status_code == 400
    assert response.json()["error"].startswith(named + ":"), response.json()
    assert (channel_daemon.home / "config.toml").read_text() == before  # nothing saved


def test_config_file_naming_an_unimplemented_key_does_not_start_the_channel(channel_daemon):
    path = channel_daemon.home / "config.toml"
    original = path.read_text()
    path.write_text(original + '\n[channels.webhook]\nlisten_port = %d\ncallback_url = "http://127.0.0.1:9/cb"\n'
                    '[channels.webhook.overrides]\ntyping_mode = "never"\n' % free_port())
    try:
        assert channel_daemon.post("/api/channels/reload").status_code == 200
        failed = audit(channel_daemon, "channel.start_failed", "webhook")
        # The file and the section are named: the API never saves such a section.
        assert failed and failed[0]["detail"]["error"].startswith(
            f"{path} [channels.webhook]: overrides.typing_mode: not implemented")
        assert "overrides.typing_mode: not implemented" in channel_daemon.log()
    finally:
        path.write_text(original)
        channel_daemon.post("/api/channels/reload")
