"""Webex adapter against a fake Webex REST API: the adapter registers its webhook, signed
message events are read back (`GET /v1/messages/{id}`) and answered with `POST
/v1/messages`; forged or missing signatures are 401 before parsing; own messages,
allow-lists by person id, stop() deleting the webhook and closing the listener. The shared
checks (round trip, allow-list, 429, threads) run in tests/channels/test_channel_contract.py."""

from __future__ import annotations

import json
import time

import pytest
import requests

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import channel, configure, remove, wait_for
from fakes.webex import spark_signature

CASE = contract.CASES["webex"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_direct_message_round_trip(daemon, fake):  # noqa: F811
    room = contract.round_trip(daemon, CASE, fake)
    hooks = list(fake.webhooks.values())
    assert [(h["targetUrl"], h["resource"], h["event"]) for h in hooks] == \
        [(f"http://127.0.0.1:{fake.listen_port}/webex", "messages", "created")]
    assert len(hooks[0]["secret"]) >= 32
    assert fake.sent[0]["room"] == room and fake.sent[0]["text"] is None  # markdown, in the user's room
    # The bot's own reply came back through the webhook and was not read nor answered.
    assert all(d.status_code == 200 for d in fake.deliveries) and len(fake.deliveries) == 2
    assert len(fake.polls) == 1


def test_group_mention_is_answered_in_the_space(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    room = fake.user_says("bob", "what is up", room="SPACE-1", group=True)
    wait_for(lambda: fake.replies(room), what="reply in the space")
    assert fake.replies(room) == ["echo: what is up"]  # the mention ("Helper") was stripped


def test_forged_and_missing_signatures_are_refused(daemon, fake, fake_llm):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    url = f"http://127.0.0.1:{fake.listen_port}/webex"
    body = json.dumps({"resource": "messages", "event": "created",
                       "data": {"id": "MSG-forged", "roomId": "R", "personId": "P"}}).encode()
    before = len(fake_llm.requests)
    for headers in ({}, {"X-Spark-Signature": spark_signature("guessed-secret", body)},
                    {"X-Spark-Signature": "0" * 40}):
        answer = requests.post(url, data=body, headers=headers, timeout=5)
        assert answer.status_code == 401 and answer.json() == {"error": "invalid signature"}
    # Not even JSON: the signature check runs first, so this is 401 too (never a parse error).
    assert requests.post(url, data=b"{not json", timeout=5).status_code == 401
    time.sleep(0.3)
    assert fake.polls == [] and fake.sent == [] and len(fake_llm.requests) == before
    refused = contract.audit(daemon, "channel.refused", "webex")
    assert refused[0]["detail"]["reason"] == "bad signature"


def test_allow_list_by_person_id(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_users=["PERSON-ann"])
    room = fake.user_says("ann", "by id")
    wait_for(lambda: fake.replies(room), what="reply")
    assert fake.replies(room) == ["echo: by id"]


def test_stop_deletes_the_webhook_and_closes_the_listener(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    first = set(fake.webhooks)
    # Reconfiguring restarts the adapter: the old webhook goes, a new one (new secret) comes.
    configure(daemon, "webex", allowed_users=["ann"], **CASE.config(fake))
    wait_for(lambda: fake.webhooks and set(fake.webhooks) != first, what="new webhook")
    assert len(fake.webhooks) == 1
    remove(daemon, "webex")
    assert channel(daemon, "webex")["active"] is False and fake.webhooks == {}
    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{fake.listen_port}/webex", data=b"{}", timeout=5)


def test_bad_token_fails_the_start(daemon, fake):  # noqa: F811
    fake.token = "another-token"
    configure(daemon, "webex", default_agent="helper", **CASE.config(fake))
    wait_for(lambda: contract.audit(daemon, "channel.start_failed", "webex"), what="start failure")
    assert "HTTP 401" in contract.audit(daemon, "channel.start_failed", "webex")[0]["detail"]["error"]
    assert channel(daemon, "webex")["active"] is False
    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{fake.listen_port}/webex", data=b"{}", timeout=5)


def test_stop_in_process_deletes_its_webhook(fake):
    for adapter, _ in contract.in_process(CASE, fake):
        adapter.start()
        wait_for(lambda: fake.webhooks, what="webhook registered")
        adapter.stop()
        assert fake.webhooks == {}


def test_test_message_goes_to_the_room(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake, allowed_rooms=["SPACE-7"])
    fake.rooms["SPACE-7"] = "group"
    answer = daemon.post("/api/channels/webex/test", json={"message": "ping"})
    assert answer.status_code == 200, answer.text
    assert fake.replies("SPACE-7") == ["ping"]
    missing = daemon.post("/api/channels/webex/test", json={"message": "ping", "chat_id": "NO-SUCH-ROOM"})
    assert missing.status_code == 502 and "HTTP 404" in missing.json()["error"]
