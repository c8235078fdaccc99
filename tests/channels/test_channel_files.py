"""Files and images in channel conversations, through the real daemon and each platform's
fake: an image reaches a vision model as an image part and any other model as a note, a
file lands in the agent's uploads and workspace where its file tools read it, what the
agent's tools make is posted back, and a file too large, not what it claims to be, or
hosted off the platform's own hosts is refused politely and never fetched."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from channel_contract import ENV
from channel_fixtures import audit, configure, wait_active, wait_for
from fakellm import TINY_PNG
from fakes.discord import FakeDiscord
from fakes.matrix import FakeMatrix
from fakes.mattermost import FakeMattermost
from fakes.slack import FakeSlack
from fakes.telegram import FakeTelegram
from files_support import (IMAGE_PART, LIMIT, draw, elsewhere, read_it, refusal, serving,  # noqa: F401 - fixtures
                           start_files_daemon, tool_results, unique, uploads_named, user_turns)


@pytest.fixture(scope="module")
def files_daemon(tmp_path_factory, fake_llm):
    daemon = start_files_daemon(tmp_path_factory.mktemp("channel-files"), fake_llm)
    for name, provider, model in (("painter", "anthropic", "claude-sonnet-4-6"), ("seer", "gemini", "gemini-2.5-pro")):
        manifest = f'name = "{name}"\n[model]\nprovider = "{provider}"\nmodel = "{model}"\n'
        assert daemon.post("/api/agents", json={"manifest_toml": manifest}).status_code == 201
    yield daemon
    daemon.stop()


# -- Telegram ------------------------------------------------------------------------------

@pytest.fixture
def telegram(files_daemon):
    fake = FakeTelegram(ENV["TELEGRAM_BOT_TOKEN"]).start()
    with serving(files_daemon, "telegram", fake, bot_token_env="TELEGRAM_BOT_TOKEN", api_url=fake.url,
                 long_poll_secs=1):
        yield fake


def test_telegram_photo_reaches_a_vision_model_as_an_image(files_daemon, telegram, fake_llm):
    marker = unique("look")
    telegram.user_sends_file(601, TINY_PNG, kind="photo", caption=f"{marker} what is this")
    wait_for(lambda: telegram.replies_to(601), what="reply to the photo")
    content = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in content, content
    text = next(p["text"] for p in content if p["type"] == "text")
    assert text.startswith(f"{marker} what is this\n[image photo-")
    assert f"(image/png, {len(TINY_PNG)} bytes) attached; saved as inbox/photo-" in text
    stored = [u for u in files_daemon.get(f"/api/agents/{files_daemon.filer}/uploads").json()
              if u["content_type"] == "image/png" and u["filename"].startswith("photo-")]
    assert stored and stored[0]["size"] == len(TINY_PNG)
    assert telegram.downloads and telegram.downloads[-1].startswith("photos/")


def test_telegram_photo_in_the_anthropic_and_gemini_wire_formats(files_daemon, telegram, fake_llm):
    data = base64.b64encode(TINY_PNG).decode()
    for agent, chat, part in (
            ("painter", 621, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}),
            ("seer", 622, {"inlineData": {"mimeType": "image/png", "data": data}})):
        configure(files_daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url,
                  long_poll_secs=1, default_agent=agent)
        wait_active(files_daemon, "telegram")
        marker = unique(agent)
        telegram.user_sends_file(chat, TINY_PNG, kind="photo", caption=marker)
        wait_for(lambda: telegram.replies_to(chat), what=f"{agent}'s reply")
        asked = [r["json"] for r in list(fake_llm.requests) if marker in json.dumps(r["json"])]
        assert asked and part in _parts(asked[-1]), asked


def _parts(body: dict[str, Any]) -> list[Any]:
    """Content blocks (Anthropic) or parts (Gemini) of the last user turn."""
    if "contents" in body:
        return body["contents"][-1]["parts"]
    return body["messages"][-1]["content"]


def test_telegram_photo_is_a_note_for_a_model_without_vision(files_daemon, telegram, fake_llm):
    configure(files_daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url, long_poll_secs=1,
              default_agent="filer", overrides={"model": "gpt-3.5-turbo"})
    wait_active(files_daemon, "telegram")
    marker = unique("blind")
    telegram.user_sends_file(602, TINY_PNG, kind="photo", caption=marker)
    wait_for(lambda: telegram.replies_to(602), what="reply to the photo")
    content = user_turns(fake_llm, marker)[-1]
    assert isinstance(content, str), content  # no image part at all
    name = f"photo-{next(iter(telegram.files))[-6:]}.jpg"
    assert content == (f"{marker}\n[image {name} (image/png, {len(TINY_PNG)} bytes) received; "
                       f"saved as inbox/{name}, file_id {uploads_named(files_daemon, name)[0]['file_id']}; "
                       "this model cannot see images]")


def test_telegram_document_is_an_upload_the_agent_reads(files_daemon, telegram, fake_llm):
    name = unique("notes") + ".txt"
    secret = f"the word is {uuid.uuid4().hex[:8]}"
    caption = read_it(name)
    telegram.user_sends_file(603, secret.encode(), filename=name, mime_type="text/plain", caption=caption)
    wait_for(lambda: telegram.replies_to(603), what="reply after reading the file")
    assert tool_results(fake_llm, secret) == [secret]  # file_read gave the model the file's words
    upload = uploads_named(files_daemon, name)
    assert [(u["content_type"], u["size"]) for u in upload] == [("text/plain", len(secret))]
    body = files_daemon.get(f"/api/agents/{files_daemon.filer}/uploads/{upload[0]['file_id']}")
    assert body.content == secret.encode()


def test_telegram_generated_image_is_posted_back(files_daemon, telegram, fake_llm):
    telegram.user_says(604, draw("a red square"))
    wait_for(lambda: telegram.replies_to(604), what="reply after drawing")
    photo = [u for u in telegram.uploaded if u["chat_id"] == 604]
    assert [(p["method"], p["content_type"], p["data"]) for p in photo] == [("sendPhoto", "image/png", TINY_PNG)]
    assert photo[0]["filename"].startswith("image-") and photo[0]["filename"].endswith("-1.png")
    sent = [e["detail"] for e in audit(files_daemon, "channel.outbound", "telegram") if e["detail"].get("file")]
    assert sent[0]["file"] == photo[0]["filename"]


def test_telegram_oversize_and_false_files_are_refused_politely(files_daemon, telegram, fake_llm):
    big = unique("big") + ".txt"
    telegram.user_sends_file(605, b"x" * (LIMIT + 1), filename=big, mime_type="text/plain")
    wait_for(lambda: telegram.replies_to(605), what="refusal")
    assert telegram.replies_to(605) == [
        f"Sorry, I could not take {big}: it is {LIMIT + 1} bytes; files up to {LIMIT} bytes are accepted here."]
    assert not any(d for d in telegram.downloads if d.endswith(big))
    # The platform does not say the size: the download stops at the cap.
    quiet = unique("quiet") + ".txt"
    telegram.user_sends_file(606, b"y" * (LIMIT * 3), filename=quiet, mime_type="text/plain", file_size=0)
    wait_for(lambda: telegram.replies_to(606), what="refusal")
    assert telegram.replies_to(606) == [
        f"Sorry, I could not take {quiet}: it is {LIMIT * 3} bytes; files up to {LIMIT} bytes are accepted here."]
    # Text that calls itself a PNG is not taken as an image.
    liar = unique("liar") + ".png"
    telegram.user_sends_file(607, b"just words", filename=liar, mime_type="image/png", caption="see")
    wait_for(lambda: len(telegram.replies_to(607)) == 2, what="refusal and answer")
    assert telegram.replies_to(607) == [
        f"Sorry, I could not take {liar}: it is not the image it claims to be (its bytes are text/plain).",
        "echo: see"]
    assert not uploads_named(files_daemon, big) and not uploads_named(files_daemon, liar)
    reasons = [e["detail"]["reason"] for e in audit(files_daemon, "channel.file_refused", "telegram")]
    assert any(big in r for r in reasons) and any(liar in r for r in reasons)
    assert telegram.replies_to(605) == telegram.replies_to(605)[:1]  # no run without anything taken


def test_telegram_redirect_off_the_platform_is_refused(files_daemon, telegram, elsewhere):
    telegram.redirect_files = f"{elsewhere.url}/cat.png"
    name = unique("moved") + ".png"
    telegram.user_sends_file(608, TINY_PNG, filename=name, mime_type="image/png")
    wait_for(lambda: telegram.replies_to(608), what="refusal")
    assert telegram.replies_to(608) == [
        refusal(name, elsewhere)]
    assert elsewhere.hits == []


# -- Slack ---------------------------------------------------------------------------------

@pytest.fixture
def slack(files_daemon):
    fake = FakeSlack(ENV["SLACK_APP_TOKEN"], ENV["SLACK_BOT_TOKEN"], ENV["SLACK_SIGNING_SECRET"]).start()
    with serving(files_daemon, "slack", fake, api_url=fake.url + "/api", app_token_env="SLACK_APP_TOKEN",
                 bot_token_env="SLACK_BOT_TOKEN"):
        yield fake


def test_slack_files_both_ways_and_only_from_slack(files_daemon, slack, fake_llm, elsewhere):
    marker = unique("slack-look")
    chat = slack.user_shares_file("U1ANN", TINY_PNG, "shot.png", "image/png", text=marker)
    wait_for(lambda: slack.replies(chat), what="reply to the shared image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(slack.downloads) == 1  # fetched with the bot token from the file's private URL
    # The agent's generated image goes back with the files upload flow.
    slack.user_says("U1ANN", draw("a blue square"))
    wait_for(lambda: len(slack.replies(chat)) == 2, what="reply after drawing")
    assert [(f["channel"], f["content_type"], f["data"]) for f in slack.shared] == [(chat, "image/png", TINY_PNG)]
    # A file the event says is elsewhere is never fetched.
    name = unique("elsewhere") + ".png"
    slack.user_shares_file("U1ANN", TINY_PNG, name, "image/png", url=f"{elsewhere.url}/{name}")
    wait_for(lambda: len(slack.replies(chat)) == 3, what="refusal")
    assert slack.replies(chat)[2] == refusal(name, elsewhere)
    assert elsewhere.hits == []


# -- Discord -------------------------------------------------------------------------------

@pytest.fixture
def discord(files_daemon):
    fake = FakeDiscord(ENV["DISCORD_BOT_TOKEN"]).start()
    with serving(files_daemon, "discord", fake, api_url=fake.url + "/api/v10", bot_token_env="DISCORD_BOT_TOKEN"):
        yield fake


def test_discord_files_both_ways_and_only_from_the_cdn(files_daemon, discord, fake_llm, elsewhere):
    name = unique("report") + ".txt"
    secret = f"discord says {uuid.uuid4().hex[:8]}"
    chat = discord.user_sends_file("ann", secret.encode(), name, "text/plain",
                                   text=read_it(name))
    wait_for(lambda: discord.replies(chat), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    discord.user_says("ann", draw("a green square"))
    wait_for(lambda: len(discord.replies(chat)) == 2, what="reply after drawing")
    assert [(f["channel"], f["content_type"], f["data"]) for f in discord.uploads] == [(chat, "image/png", TINY_PNG)]
    big = unique("big") + ".png"
    discord.user_sends_file("ann", TINY_PNG, big, "image/png", size=LIMIT * 10)
    wait_for(lambda: len(discord.replies(chat)) == 3, what="refusal")
    assert discord.replies(chat)[2] == \
        f"Sorry, I could not take {big}: it is {LIMIT * 10} bytes; files up to {LIMIT} bytes are accepted here."
    off = unique("off") + ".png"
    discord.user_sends_file("ann", TINY_PNG, off, "image/png", url=f"{elsewhere.url}/{off}")
    wait_for(lambda: len(discord.replies(chat)) == 4, what="refusal")
    assert discord.replies(chat)[3] == refusal(off, elsewhere)
    assert elsewhere.hits == [] and len(discord.downloads) == 1


# -- Matrix --------------------------------------------------------------------------------

ROOM = "!files:test"


@pytest.fixture
def matrix(files_daemon):
    fake = FakeMatrix(ENV["MATRIX_ACCESS_TOKEN"]).start()
    with serving(files_daemon, "matrix", fake, access_token_env="MATRIX_ACCESS_TOKEN", homeserver_url=fake.url,
                 long_poll_secs=1):
        wait_for(lambda: any(s["since"] for s in fake.syncs), what="initial sync done")
        yield fake


def test_matrix_media_both_ways_through_the_homeserver_only(files_daemon, matrix, fake_llm, elsewhere):
    marker = unique("matrix-look")
    matrix.user_sends_file(ROOM, "@ann:test", TINY_PNG, "dot.png", "image/png", msgtype="m.image", caption=marker)
    wait_for(lambda: matrix.bot_messages(ROOM), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(matrix.downloads) == 1  # through the authenticated media API
    matrix.user_sends_file(ROOM, "@ann:test", b"%PDF-1.4 tiny", "plan.pdf", "application/pdf",
                           caption=draw("a plan"))
    wait_for(lambda: len(matrix.bot_messages(ROOM)) == 2, what="reply after drawing")
    turn = user_turns(fake_llm, "a plan")[-1]
    assert "[file plan.pdf (application/pdf, 13 bytes) received; saved as inbox/plan.pdf" in turn
    posted = matrix.bot_files(ROOM)
    assert [(p["msgtype"], p["info"], p["data"]) for p in posted] == \
        [("m.image", {"mimetype": "image/png", "size": len(TINY_PNG)}, TINY_PNG)]
    matrix.user_sends_file(ROOM, "@ann:test", TINY_PNG, "far.png", "image/png", msgtype="m.image",
                           url=f"{elsewhere.url}/far.png")
    wait_for(lambda: len(matrix.bot_messages(ROOM)) == 3, what="refusal")
    assert matrix.bot_messages(ROOM)[2] == refusal("far.png", elsewhere)
    assert elsewhere.hits == []


# -- Mattermost ----------------------------------------------------------------------------

TOWN = "townsquare0000000000000000"


@pytest.fixture
def mattermost(files_daemon):
    fake = FakeMattermost(ENV["MATTERMOST_TOKEN"]).start()
    with serving(files_daemon, "mattermost", fake, server_url=fake.url, token_env="MATTERMOST_TOKEN"):
        wait_for(lambda: [f for f in fake.hub.received if isinstance(f, dict)
                          and f.get("action") == "authentication_challenge"], what="authenticated")
        yield fake


def test_mattermost_files_both_ways(files_daemon, mattermost, fake_llm):
    name = unique("minutes") + ".md"
    secret = f"mattermost says {uuid.uuid4().hex[:8]}"
    mattermost.user_sends_file("user-ann", "ann", TOWN, secret.encode(), name, "text/markdown",
                               message=read_it(name))
    wait_for(lambda: mattermost.bot_posts(TOWN), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert uploads_named(files_daemon, name)[0]["content_type"] == "text/markdown"
    mattermost.user_says("user-ann", "ann", TOWN, '[[tool:image_generate {"prompt": "a tree", "model": "dall-e-2"}]] x')
    wait_for(lambda: len(mattermost.bot_posts(TOWN)) == 3, what="file post and reply")
    with_files = [p for p in mattermost.bot_posts(TOWN) if p.get("file_ids")]
    assert len(with_files) == 1 and with_files[0]["root_id"]  # in the thread of the asking post
    posted = mattermost.files[with_files[0]["file_ids"][0]]
    assert (posted["mime_type"], posted["data"], posted["channel_id"]) == ("image/png", TINY_PNG, TOWN)


# -- Email ---------------------------------------------------------------------------------

@pytest.fixture
def mail(tmp_path_factory, files_daemon):
    from fakes.servers import MailServers

    servers = MailServers(tmp_path_factory.mktemp("mail")).start()
    configure(files_daemon, "email", username="bot@test.example", password_env="EMAIL_PASSWORD",
              imap_host="127.0.0.1", imap_port=servers.imap_port, imap_security="none", smtp_host="127.0.0.1",
              smtp_port=servers.smtp_port, smtp_security="none", poll_interval_secs=0.3, default_agent="filer")
    wait_active(files_daemon, "email")
    yield servers
    files_daemon.delete("/api/channels/email/configure")
    servers.stop()


@pytest.mark.slow
def test_email_attachments_both_ways(files_daemon, mail, fake_llm):
    def replies():
        return [m for m in mail.inbox("alice") if m["From"] == "bot@test.example"]

    marker = unique("mail-look")
    first = mail.send("alice@test.example", "bot@test.example", "A picture", f"{marker}\n",
                      files=(("dot.png", "image/png", TINY_PNG), ("big.txt", "text/plain", b"z" * (LIMIT + 1))))
    wait_for(lambda: len(replies()) == 2, what="refusal and reply")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    said_no, answer = sorted(m.get_body(("plain",)).get_content().replace("\r\n", "\n").strip() for m in replies())
    assert said_no == f"Sorry, I could not take big.txt: it is {LIMIT + 1} bytes; files up to {LIMIT} bytes " \
        "are accepted here."
    assert answer.startswith(f"echo: {marker}\n[image dot.png (image/png, {len(TINY_PNG)} bytes) attached")
    assert all(m["In-Reply-To"] == first for m in replies())
    mail.send("alice@test.example", "bot@test.example", "Draw",
              '[[tool:image_generate {"prompt": "a letter", "model": "dall-e-2"}]] draw\n')
    wait_for(lambda: len(replies()) == 4, what="file mail and reply")
    attached = [part for m in replies() for part in m.iter_attachments()]
    assert [(a.get_content_type(), a.get_content()) for a in attached] == [("image/png", TINY_PNG)]


def test_telegram_channel_send_posts_a_workspace_file(files_daemon, telegram, fake_llm):
    name = unique("forward") + ".txt"
    call = json.dumps({"channel": "telegram", "recipient": "612", "file_path": f"inbox/{name}",
                       "message": "for you"})
    telegram.user_sends_file(611, b"passed along", filename=name, mime_type="text/plain",
                             caption=f"[[tool:channel_send {call}]] pass it on")
    wait_for(lambda: telegram.replies_to(611), what="reply after sending")
    assert [(u["method"], u["filename"], u["content_type"], u["data"]) for u in telegram.uploaded
            if u["chat_id"] == 612] == [("sendDocument", name, "text/plain", b"passed along")]
    assert telegram.replies_to(612) == ["for you"]


def test_telegram_files_of_refused_senders_are_never_fetched(files_daemon, telegram):
    configure(files_daemon, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=telegram.url, long_poll_secs=1,
              default_agent="filer", allowed_users=["613"])
    wait_active(files_daemon, "telegram")
    message = telegram.user_sends_file(614, TINY_PNG, kind="photo", caption="let me in")
    wait_for(lambda: [e for e in audit(files_daemon, "channel.refused", "telegram")
                      if e["detail"]["message_id"] == str(message)], what="refusal audited")
    telegram.user_sends_file(613, b"allowed words", filename="ok.txt", mime_type="text/plain")
    wait_for(lambda: telegram.replies_to(613), what="reply to the allowed sender")
    assert len(telegram.downloads) == 1 and not telegram.replies_to(614)
