"""Mastodon adapter against a fake Mastodon server: mentions on the SSE user stream reach
the agent (HTML stripped, the bot's handle dropped) and are answered with statuses in
reply, with the mention's visibility and the author's handle; long answers become a thread
of 500-character statuses; mentions missed while the stream was down fetched; the test
message. The shared checks (round trip, allow-list, 429, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import wait_for

CASE = contract.CASES["mastodon"]


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_mention_round_trip(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    reply = fake.sent[0]
    mention = next(s for s in fake.statuses.values() if s["account"]["acct"] == "ann@other.test")
    assert reply["status"] == "@ann@other.test echo: hello mastodon"
    assert reply["in_reply_to_id"] == mention["id"] and reply["visibility"] == "public"


def test_direct_mention_keeps_its_visibility_and_long_answers_thread(daemon, fake, fake_llm):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    long = " ".join(f"word{i:03d}" for i in range(120))  # ~960 characters echoed back
    fake.user_says("bob@other.test", "psst &amp; <b>" + long, visibility="direct")
    wait_for(lambda: len(fake.replies("bob@other.test")) >= 2, what="threaded reply")
    wait_for(lambda: "".join(fake.replies("bob@other.test")).endswith("word119"), what="whole answer")
    sent = [s for s in fake.sent if s["to"] == "bob@other.test"]
    assert all(len(s["status"]) <= 500 and s["status"].startswith("@bob@other.test ") for s in sent)
    assert all(s["visibility"] == "direct" for s in sent)
    assert [s["in_reply_to_id"] for s in sent[1:]] == [s["id"] for s in sent[:-1]]  # a thread
    # The HTML was turned into text: entities decoded once, the bot's own handle dropped
    # (the reply is the agent's Markdown as plain text, which reads "&amp;" as "&").
    asked = next(r["json"]["messages"][-1]["content"] for r in reversed(fake_llm.requests)
                 if "word119" in str(r["json"]))
    assert asked.startswith("psst &amp; <b>word000")
    assert " ".join(fake.replies("bob@other.test")).startswith("echo: psst & <b>word000")


def test_mentions_missed_while_the_stream_was_down_are_answered(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    fake.stop()
    fake.user_says("carol@other.test", "while you were away")  # no stream is open to tell
    fake.start()
    wait_for(lambda: fake.replies("carol@other.test"), timeout=40, what="catch-up reply")
    assert fake.replies("carol@other.test") == ["echo: while you were away"]


def test_test_message_is_a_direct_status(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    answer = daemon.post("/api/channels/mastodon/test", json={"message": "ping", "chat_id": "@ann@other.test"})
    assert answer.status_code == 200, answer.text
    assert [(s["status"], s["visibility"], s["in_reply_to_id"]) for s in fake.sent] == \
        [("@ann@other.test ping", "direct", None)]
    assert daemon.post("/api/channels/mastodon/test", json={"message": "ping"}).status_code == 400
