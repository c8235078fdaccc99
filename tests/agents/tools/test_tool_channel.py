"""channel_send through the real daemon: the fake LLM calls it, the webhook adapter's sender delivers;
in a scoped API key's run, only with the scope the key needs to send a channel's test message."""

from __future__ import annotations

import json
import uuid

import pytest

from channel_fixtures import audit, configure, wait_active, wait_for
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from fakes.recorder import Recorder
from support import Daemon, free_port, make_home, stop_shared
from tests.agents.tools.tool_calls import call, spawn
from tests.api.test_keys import as_key, new_key

ADMIN = "admin-secret-for-channel-send"


@pytest.fixture(scope="module")
def sent(tmp_path_factory, fake_llm):
    home = make_home(tmp_path_factory.mktemp("chan"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm, NO_REMEMBERING))
    daemon = Daemon(home, api_key=ADMIN, env_extra=LLM_ENV).start()
    callback = Recorder()
    configure(daemon, "webhook", listen_port=free_port(), callback_url=callback.url + "/cb",
              allowed_users=["alice", "team-room", "@example.com"])
    wait_active(daemon, "webhook")
    yield daemon, callback
    callback.close()
    stop_shared(daemon)


def test_send_to_an_allowed_recipient_goes_through_the_adapter(sent) -> None:
    daemon, callback = sent
    agent = spawn(daemon, extra="", name="poster")
    result = json.loads(call(daemon, agent, "channel_send", channel="webhook", recipient="alice",
                             message="build is green", file_url="https://example.com/report.html",
                             filename="report.html"))
    assert result["status"] == "sent" and result["channel"] == "webhook" and result["recipient"] == "alice"
    wait_for(lambda: callback.requests, what="the webhook callback")
    assert json.loads(callback.requests[-1]["body"]) == {
        "sender_id": "alice", "message": "build is green\nreport.html: https://example.com/report.html",
        "agent": "poster"}
    outbound = audit(daemon, "channel.outbound", "webhook")[0]["detail"]
    assert outbound["agent"] == "poster" and outbound["message_id"] == result["message_id"]


def test_recipients_outside_the_allow_lists_are_refused(sent) -> None:
    daemon, callback = sent
    agent = spawn(daemon, extra="")
    before = len(callback.requests)
    assert call(daemon, agent, "channel_send", channel="webhook", recipient="mallory", message="hi") == \
        "error: recipient 'mallory' is not in channel webhook's allow-lists (@example.com, alice, team-room)"
    assert call(daemon, agent, "channel_send", channel="telegram", recipient="alice", message="hi") == \
        "error: channel 'telegram' is not running here (running: webhook)"
    assert call(daemon, agent, "channel_send", channel="webhook", recipient="alice") == \
        "error: nothing to send: give a message, image_url, file_url or file_path"
    assert call(daemon, agent, "channel_send", channel="webhook", recipient="alice", message="x",
                file_path="a.txt") == "error: no such file in the workspace: a.txt"
    assert call(daemon, agent, "channel_send", channel="webhook", recipient="alice", message="x",
                file_path="../../secrets.env").startswith("error: path escapes the agent workspace")
    assert len(callback.requests) == before
    assert audit(daemon, "channel.refused", "webhook")[0]["detail"]["recipient"] == "mallory"


def test_a_domain_entry_admits_every_address_at_that_domain(sent) -> None:
    daemon, callback = sent
    agent = spawn(daemon, extra="")
    result = json.loads(call(daemon, agent, "channel_send", channel="webhook", recipient="bob@example.com",
                             message="hi"))
    assert result["status"] == "sent" and result["recipient"] == "bob@example.com"
    wait_for(lambda: any(json.loads(r["body"])["sender_id"] == "bob@example.com" for r in callback.requests),
             what="the webhook callback")
    assert call(daemon, agent, "channel_send", channel="webhook", recipient="bob@example.org",
                message="hi").startswith("error: recipient 'bob@example.org' is not in channel webhook's allow-lists")


def test_observe_mode_never_sends(sent) -> None:
    daemon, callback = sent
    agent = spawn(daemon, extra="")
    assert daemon.put(f"/api/agents/{agent}/mode", json={"mode": "Observe"}).status_code == 200
    r = daemon.post(f"/api/agents/{agent}/message", json={
        "message": '[[tool:channel_send {"channel": "webhook", "recipient": "alice", "message": "x"}]]'})
    assert "permission denied: tool 'channel_send' is not available" in r.json()["response"]


def test_a_keys_run_sends_only_with_the_scope_a_channel_test_needs(sent) -> None:
    daemon, callback = sent
    name = f"p-{uuid.uuid4().hex[:8]}"
    agent = spawn(daemon, extra="", name=name)
    send = f"[[tool:channel_send {json.dumps({'channel': 'webhook', 'recipient': 'alice', 'message': 'from a key'})}]]"
    before = len(callback.requests)
    talker = new_key(daemon, scopes=["read", "message"], agents=[name])
    refused = as_key(daemon, talker, "POST", "/api/channels/webhook/test", json={"message": "hi", "chat_id": "alice"})
    assert refused.status_code == 403
    said = as_key(daemon, talker, "POST", f"/api/agents/{agent}/message", json={"message": send}).json()["response"]
    assert said == f"tool said: error: {refused.json()['error']}" == (
        f"tool said: error: forbidden: API key '{talker['name']}' is missing scope 'manage'")
    assert len(callback.requests) == before
    manager = new_key(daemon, scopes=["message", "manage"], agents=[name])
    said = as_key(daemon, manager, "POST", f"/api/agents/{agent}/message", json={"message": send}).json()["response"]
    assert json.loads(said.removeprefix("tool said: "))["status"] == "sent"
    wait_for(lambda: len(callback.requests) > before, what="the webhook callback")
    assert json.loads(callback.requests[-1]["body"])["message"] == "from a key"
