"""Sessions per person and per thread, through the real daemon and platform fakes: two
senders in one group share neither history nor recalled memory (unless `group_policy` is
`shared`); threads (Telegram forum topics, Slack threads, Discord threads, Matrix threads,
Mattermost threads) are conversations of their own and are answered in the same thread;
`mention-only`, `threading`, slack `thread_ttl_hours`, discord `auto_thread` and telegram
`thread_routes` do what they say."""

from __future__ import annotations

import json
import time

import pytest

import channel_contract as contract
from channel_fixtures import configure, remove, start_channel_daemon, wait_active, wait_for
from fakes.discord import FakeDiscord
from fakes.matrix import FakeMatrix
from fakes.mattermost import FakeMattermost
from fakes.slack import FakeSlack
from fakes.telegram import FakeTelegram

ENV = contract.ENV
GROUP = -1001234
ANN, BOB = 602, 603


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    started = start_channel_daemon(tmp_path_factory.mktemp("conversations"), fake_llm, env=ENV,
                                   remember=True)
    created = started.post("/api/agents", json={"manifest_toml": 'name = "scout"\nprofile = "minimal"\n'
                                                '[model]\nprovider = "default"\nmodel = "default"\n'})
    assert created.status_code == 201, created.text
    yield started
    started.stop()


def inbound(daemon, name: str) -> list[dict]:
    """`channel.inbound` entries of channel `name`, oldest first."""
    rows = daemon.get("/api/audit/recent?limit=500&event=channel.inbound").json()
    return [r["detail"] for r in reversed(rows) if r["subject"] == name]


def refusals(daemon, name: str) -> list[str]:
    rows = daemon.get("/api/audit/recent?limit=500&event=channel.refused").json()
    return [r["detail"]["reason"] for r in rows if r["subject"] == name]


def prompts(fake_llm, text: str) -> list[str]:
    """The text of every model request that carried `text`."""
    out = []
    for r in list(fake_llm.requests):
        messages = (r.get("json") or {}).get("messages") or []
        joined = "\n".join(m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                           for m in messages)
        if text in joined:
            out.append(joined)
    return out


@pytest.fixture
def telegram(daemon):
    fake = FakeTelegram(ENV["TELEGRAM_BOT_TOKEN"]).start()

    def setup(**keys):  # type: ignore[no-untyped-def]
        configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=fake.url, long_poll_secs=1,
                  default_agent="helper", **keys)
        wait_active(daemon, "telegram")

    yield fake, setup
    remove(daemon, "telegram")
    fake.stop()


def test_two_senders_in_a_group_share_neither_history_nor_recalled_memory(daemon, telegram, fake_llm):
    fake, setup = telegram
    setup()
    agent = next(a["id"] for a in daemon.get("/api/agents").json() if a["name"] == "helper")
    before = daemon.get(f"/api/memory/agents/{agent}/memories").json()["total"]
    fake.user_says(ANN, "Please note that my favourite drink is jasmine tea", "ann", GROUP, "supergroup")
    wait_for(lambda: fake.replies_to(GROUP), what="ann's reply")
    wait_for(lambda: daemon.get(f"/api/memory/agents/{agent}/memories").json()["total"] > before,
             what="ann's exchange remembered")
    fake.user_says(BOB, "What beverage do I like?", "bob", GROUP, "supergroup")
    wait_for(lambda: len(fake.replies_to(GROUP)) == 2, what="bob's reply")
    asked = prompts(fake_llm, "What beverage do I like?")
    assert asked and all("jasmine tea" not in p for p in asked)
    keys = [d["conversation"] for d in inbound(daemon, "telegram")]
    assert keys[-2:] == [f"telegram:chat:{GROUP}:user:{ANN}", f"telegram:chat:{GROUP}:user:{BOB}"]
    # Replies go to the group, each replying to its own message.
    assert [m["reply_to_message_id"] for m in fake.sent[-2:]] == [m for m in sorted(fake.messages)
                                                                  if fake.messages[m]["from"]["id"] in (ANN, BOB)][-2:]


def test_shared_group_policy_gives_the_group_one_session(daemon, telegram, fake_llm):
    fake, setup = telegram
    setup(overrides={"group_policy": "shared"})
    fake.user_says(ANN, "the shared plan is tulips", "ann", GROUP - 1, "group")
    wait_for(lambda: fake.replies_to(GROUP - 1), what="first reply")
    fake.user_says(BOB, "what did ann plan?", "bob", GROUP - 1, "group")
    wait_for(lambda: len(fake.replies_to(GROUP - 1)) == 2, what="second reply")
    assert any("the shared plan is tulips" in p for p in prompts(fake_llm, "what did ann plan?"))
    keys = [d["conversation"] for d in inbound(daemon, "telegram")]
    assert keys[-2:] == [f"telegram:chat:{GROUP - 1}"] * 2
    # Direct chats stay one per person under a shared group policy.
    fake.user_says(ANN, "just me", "ann")
    wait_for(lambda: fake.replies_to(ANN), what="direct reply")
    assert inbound(daemon, "telegram")[-1]["conversation"] == f"telegram:dm:{ANN}"


def test_forum_topics_are_conversations_routed_by_thread_routes(daemon, telegram, fake_llm):
    fake, setup = telegram
    setup(thread_routes={"7": "scout"}, overrides={"prefix_agent_name": True})
    forum = GROUP - 2
    fake.user_says(ANN, "topic seven question", "ann", forum, "supergroup", topic=7)
    fake.user_says(ANN, "topic nine question", "ann", forum, "supergroup", topic=9)
    wait_for(lambda: len(fake.replies_to(forum)) == 2, what="two topic replies")
    by_topic = {m["message_thread_id"]: m["text"] for m in fake.sent if m["chat"]["id"] == forum}
    # Topic 7 went to the agent thread_routes names, topic 9 to default_agent.
    assert by_topic == {7: "[scout] echo: topic seven question", 9: "[helper] echo: topic nine question"}
    keys = sorted(d["conversation"] for d in inbound(daemon, "telegram") if f":{forum}:" in d["conversation"])
    assert keys == [f"telegram:chat:{forum}:thread:7:user:{ANN}", f"telegram:chat:{forum}:thread:9:user:{ANN}"]


def test_mention_only_answers_mentions_and_replies_to_the_bot(daemon, telegram):
    fake, setup = telegram
    setup(overrides={"group_policy": "mention-only"})
    room = GROUP - 3
    fake.user_says(ANN, "chatter among people", "ann", room, "supergroup")
    wait_for(lambda: "group_policy is mention-only and the bot was not mentioned" in refusals(daemon, "telegram"),
             what="refusal")
    fake.user_says(ANN, "@agentd_bot are you there?", "ann", room, "supergroup")
    wait_for(lambda: fake.replies_to(room) == ["echo: are you there?"], what="mention answered")
    answer = next(m["message_id"] for m in fake.sent if m["chat"]["id"] == room)
    fake.user_says(BOB, "a reply to the bot", "bob", room, "supergroup", reply_to=answer)
    wait_for(lambda: len(fake.replies_to(room)) == 2, what="reply answered")
    assert fake.replies_to(room)[1] == "echo: a reply to the bot"


def test_dm_and_group_policies_apart(daemon, telegram, fake_llm):
    """dm_policy governs direct chats only and group_policy groups only."""
    fake, setup = telegram
    setup(overrides={"dm_policy": "ignore", "group_policy": "respond"})
    room = GROUP - 5
    fake.user_says(ANN, "a direct word", "ann")
    fake.user_says(ANN, "a group word", "ann", room, "supergroup")
    wait_for(lambda: fake.replies_to(room) == ["echo: a group word"], what="group answered")
    wait_for(lambda: "dm_policy is ignore" in refusals(daemon, "telegram"), what="direct refusal")
    assert fake.replies_to(ANN) == [] and prompts(fake_llm, "a direct word") == []
    setup(overrides={"dm_policy": "mention-only", "group_policy": "ignore"})
    fake.user_says(ANN, "another group word", "ann", room, "supergroup")
    fake.user_says(ANN, "no mention here", "ann")
    fake.user_says(ANN, "@agentd_bot now with one", "ann")
    wait_for(lambda: fake.replies_to(ANN) == ["echo: now with one"], what="mentioned direct message answered")
    reasons = refusals(daemon, "telegram")
    assert "group_policy is ignore" in reasons
    assert "dm_policy is mention-only and the bot was not mentioned" in reasons
    assert fake.replies_to(room) == ["echo: a group word"] and prompts(fake_llm, "no mention here") == []


def test_threading_false_answers_in_the_chat(daemon, telegram):
    fake, setup = telegram
    setup(overrides={"threading": False})
    fake.user_says(ANN, "no quoting please", "ann", GROUP - 4, "supergroup")
    wait_for(lambda: fake.replies_to(GROUP - 4), what="reply")
    assert "reply_to_message_id" not in fake.sent[-1]


@pytest.fixture
def slack(daemon):
    fake = FakeSlack(ENV["SLACK_APP_TOKEN"], ENV["SLACK_BOT_TOKEN"], ENV["SLACK_SIGNING_SECRET"]).start()

    def setup(**keys):  # type: ignore[no-untyped-def]
        configure(daemon, "slack", api_url=fake.url + "/api", app_token_env="SLACK_APP_TOKEN",
                  bot_token_env="SLACK_BOT_TOKEN", default_agent="helper", **keys)
        wait_active(daemon, "slack")

    yield fake, setup
    remove(daemon, "slack")
    fake.stop()


def test_slack_threads_are_separate_and_followed_for_thread_ttl_hours(daemon, slack, fake_llm):
    fake, setup = slack
    # Long enough for the second answer and the follow-up below to arrive within it on a
    # loaded host, short enough to wait out.
    ttl = 0.0015 * 3600
    setup(thread_ttl_hours=0.0015)
    fake.user_says("U1ANN", "first thread secret is plums", channel="C0THREADS", mention=True)
    first = fake.said[-1]["ts"]
    wait_for(lambda: fake.replies("C0THREADS"), what="first answer")
    fake.user_says("U1ANN", "which fruit was it?", channel="C0THREADS", mention=True)
    second = fake.said[-1]["ts"]
    wait_for(lambda: len(fake.replies("C0THREADS")) == 2, what="second answer")
    second_answered = time.monotonic()
    assert [s["thread_ts"] for s in fake.sent if s["channel"] == "C0THREADS"] == [first, second]
    assert all("plums" not in p for p in prompts(fake_llm, "which fruit was it?"))
    # In a thread the bot answered in, a message without a mention is answered (same session).
    fake.user_says("U1ANN", "and without a mention?", channel="C0THREADS", thread_ts=first)
    wait_for(lambda: len(fake.replies("C0THREADS")) == 3, what="follow-up answered")
    assert any("first thread secret is plums" in p for p in prompts(fake_llm, "and without a mention?"))
    keys = [d["conversation"] for d in inbound(daemon, "slack")]
    assert keys[-3:] == [f"slack:chat:C0THREADS:thread:{first}:user:U1ANN",
                         f"slack:chat:C0THREADS:thread:{second}:user:U1ANN",
                         f"slack:chat:C0THREADS:thread:{first}:user:U1ANN"]
    # Past thread_ttl_hours the thread is no longer followed. (The adapter starts following a
    # thread once its answer is posted, a moment after the fake saw it: hence the extra wait.)
    time.sleep(max(0.0, second_answered + ttl + 1.5 - time.monotonic()))
    fake.user_says("U1ANN", "still there?", channel="C0THREADS", thread_ts=second)
    time.sleep(1.0)
    assert len(fake.replies("C0THREADS")) == 3


def test_slack_threading_false_answers_in_the_channel(daemon, slack):
    fake, setup = slack
    setup(overrides={"threading": False})
    fake.user_says("U1ANN", "answer me in the channel", channel="C0FLAT", mention=True)
    wait_for(lambda: fake.replies("C0FLAT"), what="answer")
    assert fake.sent[-1]["thread_ts"] is None
    assert inbound(daemon, "slack")[-1]["conversation"] == "slack:chat:C0FLAT:user:U1ANN"


def test_discord_auto_thread_answers_in_a_new_thread_that_continues_without_mentions(daemon):
    fake = FakeDiscord(ENV["DISCORD_BOT_TOKEN"], heartbeat_ms=400).start()
    try:
        configure(daemon, "discord", api_url=fake.url + "/api/v10", bot_token_env="DISCORD_BOT_TOKEN",
                  default_agent="helper", auto_thread="true")
        wait_active(daemon, "discord")
        fake.user_says("ann", "start a thread about otters", channel="C1", mention=True)
        asked = fake.last_message_id()
        wait_for(lambda: fake.replies(asked), what="answer in the thread")
        assert fake.threads[asked]["parent_id"] == "C1" and fake.replies("C1") == []
        fake.user_says("ann", "what animal?", channel=asked)  # in the thread: no mention needed
        wait_for(lambda: len(fake.replies(asked)) == 2, what="follow-up answered")
        keys = [d["conversation"] for d in inbound(daemon, "discord")]
        assert keys[-2:] == [f"discord:chat:C1:thread:{asked}:user:id-ann"] * 2
    finally:
        remove(daemon, "discord")
        fake.stop()


def test_matrix_threads_and_mention_only(daemon):
    fake = FakeMatrix(ENV["MATRIX_ACCESS_TOKEN"]).start()
    room = "!threads:test"
    try:
        configure(daemon, "matrix", access_token_env="MATRIX_ACCESS_TOKEN", homeserver_url=fake.url,
                  long_poll_secs=1, default_agent="helper", overrides={"group_policy": "mention-only"})
        wait_active(daemon, "matrix")
        contract._initial_sync(fake)
        fake.user_says(room, "@ann:test", "nobody asked the bot")
        wait_for(lambda: refusals(daemon, "matrix"), what="refusal")
        root_a = fake.user_says(room, "@ann:test", "thread a", mention=fake.bot)
        root_b = fake.user_says(room, "@ann:test", "thread b", mention=fake.bot)
        wait_for(lambda: len(fake.bot_messages(room)) == 2, what="two answers")
        fake.user_says(room, "@ann:test", "in thread a", thread=root_a, mention=fake.bot)
        wait_for(lambda: len(fake.bot_messages(room)) == 3, what="thread answer")
        last = fake.sent[-1]
        assert last["relates_to"]["rel_type"] == "m.thread" and last["relates_to"]["event_id"] == root_a
        keys = [d["conversation"] for d in inbound(daemon, "matrix")]
        assert keys[-3:] == [f"matrix:chat:{room}:user:@ann:test", f"matrix:chat:{room}:user:@ann:test",
                             f"matrix:chat:{room}:thread:{root_a}:user:@ann:test"]
        assert root_b  # (a main-timeline message is answered in the timeline: threading is off by default)
        assert fake.sent[0]["relates_to"] is None
    finally:
        remove(daemon, "matrix")
        fake.stop()


def test_mattermost_threads_mentions_and_threading_false(daemon):
    fake = FakeMattermost(ENV["MATTERMOST_TOKEN"]).start()
    try:
        configure(daemon, "mattermost", server_url=fake.url, token_env="MATTERMOST_TOKEN", default_agent="helper",
                  overrides={"group_policy": "mention-only"})
        wait_active(daemon, "mattermost")
        wait_for(fake.hub.connected, what="socket")
        fake.user_says("u-ann", "ann", "town", "people talking")
        wait_for(lambda: refusals(daemon, "mattermost"), what="refusal")
        asked = fake.user_says("u-ann", "ann", "town", "@agentbot in a thread please")
        wait_for(lambda: fake.bot_posts("town"), what="threaded answer")
        assert fake.bot_posts("town")[0]["root_id"] == asked
        assert fake.bot_posts("town")[0]["message"] == "echo: in a thread please"
        configure(daemon, "mattermost", server_url=fake.url, token_env="MATTERMOST_TOKEN", default_agent="helper",
                  overrides={"threading": False})
        wait_active(daemon, "mattermost")
        wait_for(fake.hub.connected, what="socket again")
        time.sleep(0.3)
        fake.user_says("u-ann", "ann", "town", "flat answer")
        wait_for(lambda: len(fake.bot_posts("town")) == 2, what="flat answer")
        assert fake.bot_posts("town")[1]["root_id"] == ""
    finally:
        remove(daemon, "mattermost")
        fake.stop()
