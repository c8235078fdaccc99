"""Approvals in the chat, through the real daemon and fakes of the platforms: a Manual-mode
agent's tool call behind a channel is asked for in the conversation (Telegram inline
keyboard, Slack Block Kit buttons, Discord components; a typed `/approve <id>` on IRC),
only the conversation's allowed users may answer, and the dashboard's API sees the same
approval (deciding it there or in the chat is one decision)."""

from __future__ import annotations

import json
import time

import pytest
import requests

import channel_contract as contract
from agentd.channels.approvals import parse
from channel_fixtures import configure, remove, start_channel_daemon, wait_active, wait_for
from fakes.discord import FakeDiscord
from fakes.mattermost import FakeMattermost
from fakes.servers import IrcUser, Ngircd
from fakes.slack import FakeSlack
from fakes.teams import FakeBotFramework
from fakes.telegram import FakeTelegram
from support import free_port
from test_channel_teams import APP_ID, PASSWORD, keys, post

KEEPER = 'name = "keeper"\nprofile = "coding"\n[model]\nprovider = "default"\nmodel = "default"\n'
WRITE = '[[tool:file_write {"path": "%s", "content": "ok"}]]'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    """A daemon whose agent `keeper` (may write files) is in Manual mode."""
    started = start_channel_daemon(tmp_path_factory.mktemp("approvals"), fake_llm, env=contract.ENV)
    created = started.post("/api/agents", json={"manifest_toml": KEEPER})
    assert created.status_code == 201, created.text
    keeper = created.json()["agent_id"]
    assert started.put(f"/api/agents/{keeper}/mode", json={"mode": "Manual"}).status_code == 200
    started.keeper = keeper
    yield started
    started.stop()


def pending(daemon, tool_path: str) -> dict:
    """The pending approval of keeper's file_write of `tool_path`, once it is asked."""
    return wait_for(lambda: next((a for a in daemon.get("/api/approvals").json()
                                  if a["agent_id"] == daemon.keeper and a["input"].get("path") == tool_path), None),
                    what="the approval in /api/approvals")


def written(daemon, path: str) -> bool:
    return (daemon.home / "workspaces" / "keeper" / path).exists()


# -- Telegram: inline keyboard, callback_query ---------------------------------------------

@pytest.fixture
def telegram(daemon):
    fake = FakeTelegram(contract.ENV["TELEGRAM_BOT_TOKEN"]).start()
    yield fake
    remove(daemon, "telegram")
    fake.stop()


def test_telegram_buttons_approve_and_other_users_are_refused(daemon, telegram):
    configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url, long_poll_secs=1,
              default_agent="keeper", allowed_users=["ann", "701"])
    wait_active(daemon, "telegram")
    group = -1001
    telegram.user_says(701, WRITE % "tg.txt", username="ann", chat_id=group, chat_type="group")
    approval = pending(daemon, "tg.txt")
    asked = wait_for(lambda: [m for m in telegram.sent if m.get("reply_markup")], what="the request")[0]
    assert asked["chat"]["id"] == group
    assert asked["text"].startswith("🔐 Approval needed: agent keeper wants to run file_write with ")
    assert '"path": "tg.txt"' in asked["text"]
    assert asked["reply_markup"] == {"inline_keyboard": [[
        {"text": "✅ Approve", "callback_data": f"approve:{approval['id']}"},
        {"text": "❌ Reject", "callback_data": f"reject:{approval['id']}"}]]}
    # Someone in the group who is not an allowed user presses Approve: told no, still pending.
    refused = telegram.user_presses(702, asked, f"approve:{approval['id']}", username="mallory")
    answer = wait_for(lambda: [a for a in telegram.answers if a["callback_query_id"] == refused], what="refusal")[0]
    assert answer["text"].startswith("Sorry, you cannot answer this approval")
    assert answer["show_alert"] is True
    assert [a["id"] for a in daemon.get("/api/approvals").json()] == [approval["id"]]
    # ann presses Approve: the tool runs, the request turns into its outcome without buttons.
    pressed = telegram.user_presses(701, asked, f"approve:{approval['id']}", username="ann")
    wait_for(lambda: any(a["callback_query_id"] == pressed for a in telegram.answers), what="answer")
    wait_for(lambda: len(telegram.replies_to(group)) >= 2, what="the agent's reply")
    assert telegram.replies_to(group)[0] == f"✅ Approved: file_write runs now (approval {approval['id']}, by ann)."
    assert "reply_markup" not in asked
    assert telegram.replies_to(group)[1].startswith("tool said: ")
    assert written(daemon, "tg.txt")
    assert daemon.get("/api/approvals").json() == []
    assert daemon.post(f"/api/approvals/{approval['id']}/approve").status_code == 404


def test_telegram_group_command_addressed_to_the_bot_answers_the_approval(daemon, telegram):
    configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url, long_poll_secs=1,
              default_agent="keeper", allowed_users=["ann", "701"], overrides={"group_policy": "mention-only"})
    wait_active(daemon, "telegram")
    group = -1004
    telegram.user_says(701, "@agentd_bot " + WRITE % "tg-at.txt", username="ann", chat_id=group, chat_type="group")
    approval = pending(daemon, "tg-at.txt")
    # What a Telegram client sends when the command is picked from the bot's menu in a group.
    telegram.user_says(701, f"/approve@agentd_bot {approval['id']}", username="ann", chat_id=group,
                       chat_type="group")
    wait_for(lambda: any(r.startswith("tool said: ") for r in telegram.replies_to(group)), what="the agent's reply")
    assert f"✅ Approved: file_write runs now (approval {approval['id']}, by ann)." in telegram.replies_to(group)
    assert written(daemon, "tg-at.txt")


def test_telegram_forum_topic_request_stays_in_the_topic(daemon, telegram):
    configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url, long_poll_secs=1,
              default_agent="keeper")
    wait_active(daemon, "telegram")
    forum = -1003
    telegram.user_says(703, WRITE % "tg-topic.txt", username="cy", chat_id=forum, chat_type="supergroup", topic=5)
    approval = pending(daemon, "tg-topic.txt")
    asked = wait_for(lambda: [m for m in telegram.sent if m.get("reply_markup")], what="the request")[0]
    assert asked["chat"]["id"] == forum and asked["message_thread_id"] == 5
    pressed = telegram.user_presses(703, asked, f"approve:{approval['id']}", username="cy")
    wait_for(lambda: any(a["callback_query_id"] == pressed for a in telegram.answers), what="answer")
    reply = wait_for(lambda: [m for m in telegram.sent if m["chat"]["id"] == forum
                              and m["text"].startswith("tool said: ")], what="the agent's reply")[0]
    assert reply["message_thread_id"] == 5
    assert written(daemon, "tg-topic.txt")


def test_telegram_dashboard_decision_is_the_chat_decision(daemon, telegram):
    configure(daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url, long_poll_secs=1,
              default_agent="keeper")
    wait_active(daemon, "telegram")
    telegram.user_says(711, WRITE % "dash.txt")
    approval = pending(daemon, "dash.txt")
    asked = wait_for(lambda: [m for m in telegram.sent if m.get("reply_markup")], what="the request")[0]
    assert daemon.post(f"/api/approvals/{approval['id']}/reject").status_code == 200
    wait_for(lambda: len(telegram.replies_to(711)) == 2, what="the agent's reply")
    assert not written(daemon, "dash.txt")
    # The request in the chat says so, its buttons gone.
    assert asked["text"] == f"❌ Rejected outside the chat: file_write will not run (approval {approval['id']})."
    assert "reply_markup" not in asked
    # The button pressed afterwards: nothing left to decide, and the presser is told.
    late = telegram.user_presses(711, asked, f"approve:{approval['id']}")
    answer = wait_for(lambda: [a for a in telegram.answers if a["callback_query_id"] == late], what="answer")[0]
    assert answer["text"].startswith(f"There is no pending approval {approval['id']} in this conversation")
    assert not written(daemon, "dash.txt")


# -- Slack: Block Kit buttons, block_actions over Socket Mode -------------------------------

@pytest.fixture
def slack(daemon):
    fake = FakeSlack(contract.ENV["SLACK_APP_TOKEN"], contract.ENV["SLACK_BOT_TOKEN"],
                     contract.ENV["SLACK_SIGNING_SECRET"]).start()
    yield fake
    remove(daemon, "slack")
    fake.stop()


def test_slack_buttons_reject_and_refuse(daemon, slack):
    configure(daemon, "slack", api_url=slack.url + "/api", app_token_env="SLACK_APP_TOKEN",
              bot_token_env="SLACK_BOT_TOKEN", default_agent="keeper", allowed_users=["U1ANN"])
    wait_active(daemon, "slack")
    channel = slack.user_says("U1ANN", WRITE % "slack.txt", channel="C1TEAM", mention=True)
    approval = pending(daemon, "slack.txt")
    asked = wait_for(lambda: [m for m in slack.sent if m.get("blocks")], what="the request")[0]
    assert asked["channel"] == channel and asked["thread_ts"]  # in the message's thread
    actions = next(b for b in asked["blocks"] if b["type"] == "actions")
    assert [(e["action_id"], e["value"], e["style"]) for e in actions["elements"]] == [
        ("approve", approval["id"], "primary"), ("reject", approval["id"], "danger")]
    slack.user_clicks("U1MALLORY", asked, "approve")
    ephemeral = wait_for(lambda: slack.ephemeral, what="the refusal")[0]
    assert ephemeral["user"] == "U1MALLORY" and ephemeral["text"].startswith("Sorry, you cannot answer")
    assert [a["id"] for a in daemon.get("/api/approvals").json()] == [approval["id"]]
    slack.user_clicks("U1ANN", asked, "reject")
    wait_for(lambda: slack.updates, what="the request replaced by its outcome")
    assert slack.updates[0]["ts"] == asked["ts"] and slack.updates[0]["blocks"] == []
    assert slack.updates[0]["text"] == \
        f"❌ Rejected: file_write will not run (approval {approval['id']}, by <@U1ANN>)."
    wait_for(lambda: len([m for m in slack.sent if m["channel"] == channel]) == 2, what="the agent's reply")
    assert not written(daemon, "slack.txt")
    assert daemon.get("/api/approvals").json() == []


def test_slack_buttons_at_the_request_url(daemon, slack):
    """Over HTTP the click is a signed form-encoded `payload` at the Events API request URL:
    the daemon's `/channels/slack/webhook` (the adapter's own listener answers the same)."""
    port = free_port()
    configure(daemon, "slack", api_url=slack.url + "/api", bot_token_env="SLACK_BOT_TOKEN", webhook_port=port,
              signing_secret_env="SLACK_SIGNING_SECRET", default_agent="keeper")
    wait_active(daemon, "slack")
    slack.webhook = f"{daemon.url}/channels/slack/webhook"
    channel = slack.user_says("U1BEA", WRITE % "slack-http.txt")
    approval = pending(daemon, "slack-http.txt")
    asked = wait_for(lambda: [m for m in slack.sent if m.get("blocks")], what="the request")[0]
    slack.user_clicks("U1BEA", asked, "approve")
    assert slack.deliveries[-1].status_code == 200
    wait_for(lambda: slack.updates, what="the request replaced by its outcome")
    assert slack.updates[0]["text"].startswith(f"✅ Approved: file_write runs now (approval {approval['id']}")
    wait_for(lambda: len([m for m in slack.sent if m["channel"] == channel]) == 2, what="the agent's reply")
    assert written(daemon, "slack-http.txt")
    # A click whose signature does not match is refused before it is read.
    body = b"payload=%7B%7D"
    for url in (slack.webhook, f"http://127.0.0.1:{port}/slack/events"):
        refused = requests.post(url, data=body, timeout=5, headers={
            "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": str(int(time.time())),
            "X-Slack-Signature": "v0=" + "0" * 64})
        assert refused.status_code == 401, url


# -- Discord: message components, INTERACTION_CREATE ----------------------------------------

@pytest.fixture
def discord(daemon):
    fake = FakeDiscord(contract.ENV["DISCORD_BOT_TOKEN"], heartbeat_ms=400).start()
    yield fake
    remove(daemon, "discord")
    fake.stop()


def test_discord_buttons_approve_and_refuse(daemon, discord):
    configure(daemon, "discord", api_url=discord.url + "/api/v10", bot_token_env="DISCORD_BOT_TOKEN",
              default_agent="keeper", allowed_users=["ann"])
    wait_active(daemon, "discord")
    channel = discord.user_says("ann", WRITE % "dc.txt", channel="c-team", mention=True)
    approval = pending(daemon, "dc.txt")
    asked = wait_for(lambda: [m for m in discord.sent if m.get("components")], what="the request")[0]
    assert asked["channel"] == channel
    row = asked["components"][0]
    assert row["type"] == 1 and [(b["type"], b["style"], b["custom_id"]) for b in row["components"]] == [
        (2, 3, f"approve:{approval['id']}"), (2, 4, f"reject:{approval['id']}")]
    refused = discord.user_clicks("mallory", asked, f"approve:{approval['id']}")
    answer = wait_for(lambda: discord.callbacks.get(refused), what="the refusal")
    assert answer["type"] == 4 and answer["data"]["flags"] == 64  # ephemeral: only mallory sees it
    assert answer["data"]["content"].startswith("Sorry, you cannot answer")
    accepted = discord.user_clicks("ann", asked, f"approve:{approval['id']}")
    answer = wait_for(lambda: discord.callbacks.get(accepted), what="the answer")
    assert answer == {"type": 7, "data": {"content": f"✅ Approved: file_write runs now (approval {approval['id']}, "
                                                     "by ann).", "components": []}}
    wait_for(lambda: len(discord.replies(channel)) == 2, what="the agent's reply")
    assert discord.replies(channel)[1].startswith("tool said: ")
    assert written(daemon, "dc.txt")


def test_discord_request_settled_when_the_api_decides(daemon, discord):
    configure(daemon, "discord", api_url=discord.url + "/api/v10", bot_token_env="DISCORD_BOT_TOKEN",
              default_agent="keeper")
    wait_active(daemon, "discord")
    channel = discord.user_says("bea", WRITE % "dc-api.txt")
    approval = pending(daemon, "dc-api.txt")
    asked = wait_for(lambda: [m for m in discord.sent if m.get("components")], what="the request")[0]
    assert daemon.post(f"/api/approvals/{approval['id']}/approve").status_code == 200
    wait_for(lambda: discord.edits, what="the request settled")
    assert discord.edits[0] == {"channel": channel, "id": asked["id"], "components": [],
                                "content": f"✅ Approved outside the chat: file_write runs now "
                                           f"(approval {approval['id']})."}
    wait_for(lambda: any(r.startswith("tool said: ") for r in discord.replies(channel)), what="the agent's reply")
    assert written(daemon, "dc-api.txt")


def test_discord_approvals_and_reactions_with_auto_thread(daemon, discord):
    """The request goes where the conversation is: the channel while its thread is not yet
    started, the thread after; reactions land on the user's message where it is."""
    configure(daemon, "discord", api_url=discord.url + "/api/v10", bot_token_env="DISCORD_BOT_TOKEN",
              default_agent="keeper", auto_thread="true", overrides={"lifecycle_reactions": True})
    wait_active(daemon, "discord")
    discord.user_says("cat", WRITE % "dc-t1.txt", channel="c-threads", mention=True)
    first = discord.last_message_id()
    approval = pending(daemon, "dc-t1.txt")
    asked = wait_for(lambda: [m for m in discord.sent if m.get("components")], what="the request")[0]
    assert asked["channel"] == "c-threads"
    clicked = discord.user_clicks("cat", asked, f"approve:{approval['id']}")
    answer = wait_for(lambda: discord.callbacks.get(clicked), what="the answer")
    assert answer["type"] == 7
    wait_for(lambda: any(r.startswith("tool said: ") for r in discord.replies(first)), what="the reply in the thread")
    assert discord.threads[first]["parent_id"] == "c-threads"
    wait_for(lambda: discord.reactions.get(first) == ["✅"], what="✅ on the first message",
             explain=lambda: discord.reactions)
    # In the thread now: the request, the click and the reactions stay there.
    discord.user_says("cat", WRITE % "dc-t2.txt", channel=first)
    second = discord.last_message_id()
    approval = pending(daemon, "dc-t2.txt")
    asked = wait_for(lambda: [m for m in discord.sent if m.get("components") and m["channel"] == first],
                     what="the request in the thread")[0]
    clicked = discord.user_clicks("cat", asked, f"approve:{approval['id']}")
    answer = wait_for(lambda: discord.callbacks.get(clicked), what="the answer")
    assert answer["type"] == 7 and answer["data"]["content"].startswith("✅ Approved: file_write runs now")
    wait_for(lambda: discord.reactions.get(second) == ["✅"], what="✅ on the message in the thread",
             explain=lambda: discord.reactions)
    assert written(daemon, "dc-t1.txt") and written(daemon, "dc-t2.txt")


# -- Teams: an Adaptive Card with Action.Submit buttons --------------------------------------

def test_teams_card_reject_and_refuse(daemon):
    """The press of a card's button is an activity at the messaging endpoint: the adapter's
    own listener or the daemon's `/channels/teams/webhook`."""
    fake, port = FakeBotFramework(APP_ID, PASSWORD).start(), free_port()
    try:
        configure(daemon, "teams", default_agent="keeper", **keys(fake, port))
        wait_active(daemon, "teams")
        url = f"http://127.0.0.1:{port}/api/messages"
        group = "19:team-thread"
        asked_by = fake.activity(WRITE % "teams.txt", "ann", conversation_type="channel", conversation=group)
        assert post(url, asked_by, fake.token()).status_code == 200
        approval = pending(daemon, "teams.txt")
        card = wait_for(lambda: [s for s in fake.sent if s["activity"].get("attachments")], what="the card")[0]
        content = card["activity"]["attachments"][0]
        assert content["contentType"] == "application/vnd.microsoft.card.adaptive"
        assert [(a["type"], a["title"], a["data"]) for a in content["content"]["actions"]] == [
            ("Action.Submit", "Approve", {"agentd_approval": "approve", "approval_id": approval["id"]}),
            ("Action.Submit", "Reject", {"agentd_approval": "reject", "approval_id": approval["id"]})]
        # bob, in the same team channel, did not ask: he is told so and nothing is decided.
        pressed = fake.submit(card["id"], content["content"]["actions"][0]["data"], "bob", "channel", group)
        assert post(url, pressed, fake.token()).status_code == 200
        wait_for(lambda: [s for s in fake.sent if s["activity"]["text"].startswith("Sorry, you cannot answer")],
                 what="the refusal")
        assert [a["id"] for a in daemon.get("/api/approvals").json()] == [approval["id"]]
        # The same press reaches the daemon's own route for the adapter.
        pressed = fake.submit(card["id"], content["content"]["actions"][1]["data"], "ann", "channel", group)
        assert post(f"{daemon.url}/channels/teams/webhook", pressed, fake.token()).status_code == 200
        update = wait_for(lambda: fake.updates, what="the card replaced by its outcome")[0]
        assert update["id"] == card["id"] and update["activity"]["attachments"] == []
        assert update["activity"]["text"] == \
            f"❌ Rejected: file_write will not run (approval {approval['id']}, by Ann)."
        wait_for(lambda: daemon.get("/api/approvals").json() == [], what="decided")
        assert not written(daemon, "teams.txt")
    finally:
        remove(daemon, "teams")
        fake.stop()


# -- Mattermost: typed `!approve` (`/approve` is a Mattermost slash command) ------------------

def test_mattermost_typed_approve(daemon):
    fake = FakeMattermost(contract.ENV["MATTERMOST_TOKEN"]).start()
    town = "town0000000000000000000000"
    try:
        configure(daemon, "mattermost", server_url=fake.url, token_env="MATTERMOST_TOKEN", default_agent="keeper")
        wait_active(daemon, "mattermost")
        wait_for(lambda: [f for f in fake.hub.received if isinstance(f, dict)
                          and f.get("action") == "authentication_challenge"], what="authenticated")
        root = fake.user_says("user-ann", "ann", town, WRITE % "mm.txt")
        approval = pending(daemon, "mm.txt")
        asked = wait_for(lambda: fake.bot_posts(town), what="the request")[0]
        assert asked["root_id"] == root  # in the message's thread
        assert asked["message"].endswith(f"Reply /approve {approval['id']} or /reject {approval['id']}.")
        fake.user_says("user-eve", "eve", town, f"!approve {approval['id']}")
        wait_for(lambda: any(p["message"].startswith("Sorry, you cannot answer") for p in fake.bot_posts(town)),
                 what="the refusal")
        fake.user_says("user-ann", "ann", town, f"!approve {approval['id']}")
        wait_for(lambda: any(p["message"].startswith("tool said: ") for p in fake.bot_posts(town)),
                 what="the agent's reply")
        assert written(daemon, "mm.txt")
    finally:
        remove(daemon, "mattermost")
        fake.stop()


# -- Mattermost: interactive message buttons pressed at the daemon's own route ---------------

@pytest.fixture
def mattermost(daemon):
    fake = FakeMattermost(contract.ENV["MATTERMOST_TOKEN"]).start()
    configure(daemon, "mattermost", server_url=fake.url, token_env="MATTERMOST_TOKEN", default_agent="keeper",
              webhook_url=f"{daemon.url}/channels/mattermost/webhook")
    wait_active(daemon, "mattermost")
    wait_for(lambda: [f for f in fake.hub.received if isinstance(f, dict)
                      and f.get("action") == "authentication_challenge"], what="authenticated")
    yield fake
    remove(daemon, "mattermost")
    fake.stop()


def mm_request(fake, channel: str) -> dict:
    return wait_for(lambda: [p for p in fake.bot_posts(channel) if p["props"].get("attachments")],
                    what="the request with buttons")[-1]


def test_mattermost_buttons_approve_and_refuse(daemon, mattermost):
    town = "townbuttons000000000000000"
    root = mattermost.user_says("user-ann", "ann", town, WRITE % "mm-buttons.txt")
    approval = pending(daemon, "mm-buttons.txt")
    asked = mm_request(mattermost, town)
    assert asked["root_id"] == root and asked["message"].startswith("🔐 Approval needed: agent keeper wants to run")
    actions = asked["props"]["attachments"][0]["actions"]
    assert [(a["id"], a["name"], a["style"], a["integration"]["url"]) for a in actions] == [
        ("approve", "Approve", "success", f"{daemon.url}/channels/mattermost/webhook"),
        ("reject", "Reject", "danger", f"{daemon.url}/channels/mattermost/webhook")]
    assert {k: v for k, v in actions[0]["integration"]["context"].items() if k != "token"} == \
        {"action": "approve", "approval_id": approval["id"], "root_id": root}
    # Clients never see where a button goes nor its context.
    shown = [json.loads(e["data"]["post"]) for e in mattermost.events if asked["id"] in e["data"]["post"]]
    assert shown and all("integration" not in a for a in shown[0]["props"]["attachments"][0]["actions"])
    # Someone else in the channel presses Approve: told so, alone; still pending.
    refused = mattermost.press(asked["id"], "approve", "user-eve", "eve")
    assert refused.status_code == 200 and refused.json() == {
        "ephemeral_text": "Sorry, you cannot answer this approval: only the people allowed to use this "
                          "conversation with the agent can."}
    assert [a["id"] for a in daemon.get("/api/approvals").json()] == [approval["id"]]
    # A context the daemon did not make (another approval's id with this token) is refused unread.
    forged = {**actions[0]["integration"]["context"], "approval_id": "0" * 32}
    assert mattermost.press(asked["id"], "approve", "user-ann", "ann", context=forged).status_code == 401
    no_token = {k: v for k, v in actions[0]["integration"]["context"].items() if k != "token"}
    assert mattermost.press(asked["id"], "approve", "user-ann", "ann", context=no_token).status_code == 401
    assert [a["id"] for a in daemon.get("/api/approvals").json()] == [approval["id"]]
    # ann presses Approve: the request becomes its outcome, its buttons gone; the tool runs.
    accepted = mattermost.press(asked["id"], "approve", "user-ann", "ann")
    outcome = f"✅ Approved: file_write runs now (approval {approval['id']}, by ann)."
    assert accepted.status_code == 200 and accepted.json() == {"update": {"message": outcome, "props": {}}}
    assert (asked["message"], asked["props"]) == (outcome, {})
    wait_for(lambda: any(p["message"].startswith("tool said: ") for p in mattermost.bot_posts(town)),
             what="the agent's reply")
    assert written(daemon, "mm-buttons.txt") and daemon.get("/api/approvals").json() == []


def test_mattermost_buttons_reject(daemon, mattermost):
    town = "townreject0000000000000000"
    mattermost.user_says("user-bo", "bo", town, WRITE % "mm-reject.txt")
    approval = pending(daemon, "mm-reject.txt")
    asked = mm_request(mattermost, town)
    answer = mattermost.press(asked["id"], "reject", "user-bo", "bo")
    assert answer.json()["update"]["message"] == \
        f"❌ Rejected: file_write will not run (approval {approval['id']}, by bo)."
    wait_for(lambda: len(mattermost.bot_posts(town)) == 2, what="the agent's reply")
    assert not written(daemon, "mm-reject.txt") and daemon.get("/api/approvals").json() == []


def test_mattermost_dashboard_decision_updates_the_post(daemon, mattermost):
    town = "towndashboard0000000000000"
    mattermost.user_says("user-cy", "cy", town, WRITE % "mm-dash.txt")
    approval = pending(daemon, "mm-dash.txt")
    asked = mm_request(mattermost, town)
    assert daemon.post(f"/api/approvals/{approval['id']}/reject").status_code == 200
    wait_for(lambda: mattermost.patches, what="the request patched")
    assert mattermost.patches == [{"id": asked["id"], "props": {},
                                   "message": f"❌ Rejected outside the chat: file_write will not run "
                                              f"(approval {approval['id']})."}]
    assert asked["props"] == {}
    wait_for(lambda: len(mattermost.bot_posts(town)) == 2, what="the agent's reply")
    assert not written(daemon, "mm-dash.txt")


# -- IRC: no buttons, `/approve <id>` typed -------------------------------------------------

@pytest.fixture(scope="module")
def ircd(tmp_path_factory):
    server = Ngircd(tmp_path_factory.mktemp("ircd-approvals")).start()
    yield server
    server.stop()


def test_irc_typed_approve_and_refusal(daemon, ircd):
    configure(daemon, "irc", server="127.0.0.1", port=ircd.port, nick="keeperbot", send_interval_secs=0.05,
              channels=["#ops"], default_agent="keeper", allowed_users=["frank"])
    wait_active(daemon, "irc")
    frank, eve = IrcUser(ircd.port, "frank"), IrcUser(ircd.port, "eve")

    def from_bot(text: str):  # type: ignore[no-untyped-def]
        return lambda line: line.startswith(":keeperbot!") and f"PRIVMSG #ops :{text}" in line

    try:
        for user in (frank, eve):
            user.send("JOIN #ops")
            user.wait(lambda line: " 366 " in line)  # end of NAMES: joined
        # The bot joined on connecting, maybe after frank: his names list or a JOIN shows it.
        def bot_in_ops(line: str) -> bool:
            if " 353 " in line and "#ops" in line:
                return "keeperbot" in [n.lstrip("@+") for n in line.rsplit(":", 1)[-1].split()]
            return line.startswith(":keeperbot!") and " JOIN " in line and "#ops" in line

        if not any(bot_in_ops(line) for line in frank.lines):
            frank.wait(bot_in_ops)
        frank.send("PRIVMSG #ops :keeperbot: " + WRITE % "irc.txt")
        approval = pending(daemon, "irc.txt")
        frank.wait(from_bot("frank: 🔐 Approval needed: agent keeper wants to run file_write with "))
        frank.wait(from_bot(f"frank: Reply /approve {approval['id']} or /reject {approval['id']}."))
        # eve is in the channel but not an allowed user: told so, politely; nothing decided.
        eve.send(f"PRIVMSG #ops :keeperbot: /approve {approval['id']}")
        eve.wait(from_bot("eve: Sorry, you cannot answer this approval"))
        assert [a["id"] for a in daemon.get("/api/approvals").json()] == [approval["id"]]
        frank.send(f"PRIVMSG #ops :keeperbot: /approve {approval['id']}")
        frank.wait(from_bot(f"frank: ✅ Approved: file_write runs now (approval {approval['id']}, by frank)."))
        frank.wait(from_bot("frank: tool said: "))
        assert written(daemon, "irc.txt")
    finally:
        frank.close()
        eve.close()
        remove(daemon, "irc")


@pytest.mark.parametrize("text,command", [
    ("/approve 3f0c9a1b2c3d4e5f", ("approve", "3f0c9a1b2c3d4e5f")),
    ("  !REJECT 3F0C9A1B2C3D  ", None),  # the verb is lower case, as typed from the request
    ("!reject 3F0C9A1B2C3D", ("reject", "3f0c9a1b2c3d")),
    ("/deny 3f0c9a1b2c3d", ("reject", "3f0c9a1b2c3d")),
    ("!deny 3f0c9a1b2c3d", ("reject", "3f0c9a1b2c3d")),
    ("/approve 3f0c9a1b2c3d\n\n> Reply /approve 3f0c9a1b2c3d or /reject ...", ("approve", "3f0c9a1b2c3d")),
    ("please /approve 3f0c9a1b2c3d", None),
    ("/approve", None),
    ("/approve not-an-id!", None),
    ("/approve@agentd_bot 3f0c9a1b2c3d", ("approve", "3f0c9a1b2c3d")),  # Telegram, in a group
    ("/reject@agentd_bot 3f0c9a1b2c3d", ("reject", "3f0c9a1b2c3d")),
    ("/approve@ 3f0c9a1b2c3d", None),
])
def test_approval_commands(text, command):
    """What counts as an answer: the first line only (an email reply quotes the request)."""
    assert parse(text) == command
