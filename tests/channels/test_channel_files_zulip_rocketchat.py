"""Files and images on Zulip and Rocket.Chat, through the real daemon and each platform's
fake (tests/channels/test_channel_files.py has the mechanism's own checks): an image reaches
a vision model as an image part, a file becomes an upload the agent reads, what the agent's
tools make is posted with the platform's upload API, and a file linked off the platform's
host is refused politely and never fetched."""

from __future__ import annotations

import json
import uuid

import pytest

from channel_contract import ENV
from channel_fixtures import wait_for
from fakellm import TINY_PNG
from fakes.rocketchat import BOT_ID as ROCKETCHAT_BOT_ID, FakeRocketChat
from fakes.zulip import BOT_EMAIL as ZULIP_BOT_EMAIL, FakeZulip
from files_support import (IMAGE_PART, LIMIT, draw, elsewhere, files_daemon, read_it,  # noqa: F401 - fixtures
                           refusal, serving, tool_results, unique, uploads_named, user_turns)


# -- Zulip ---------------------------------------------------------------------------------

@pytest.fixture
def zulip(files_daemon):
    fake = FakeZulip(ENV["ZULIP_API_KEY"]).start()
    with serving(files_daemon, "zulip", fake, server_url=fake.url, bot_email=ZULIP_BOT_EMAIL,
                 api_key_env="ZULIP_API_KEY", long_poll_secs=2):
        wait_for(lambda: fake.queues, what="event queue registered")
        yield fake


def test_zulip_files_both_ways_and_only_from_the_realm(files_daemon, zulip, fake_llm, elsewhere):  # noqa: F811
    # An image linked in a private message reaches the vision model, fetched with the bot's auth.
    marker = unique("zulip-look")
    chat = zulip.user_sends_file("ann", TINY_PNG, "dot.png", "image/png", text=marker)
    wait_for(lambda: zulip.replies(chat), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(zulip.downloads) == 1 and zulip.downloads[0].endswith("/dot.png")
    # A file the agent reads with its file tools.
    name = unique("agenda") + ".txt"
    secret = f"zulip says {uuid.uuid4().hex[:8]}"
    zulip.user_sends_file("ann", secret.encode(), name, "text/plain",
                          text=read_it(name))
    wait_for(lambda: len(zulip.replies(chat)) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    # A generated image goes up with POST /api/v1/user_uploads, then a message links it.
    zulip.user_says("ann", draw("a violet square"))
    wait_for(lambda: len(zulip.replies(chat)) == 4, what="file message and reply")
    assert [(u["content_type"], u["data"]) for u in zulip.uploads] == [("image/png", TINY_PNG)]
    upload = zulip.uploads[0]
    assert upload["filename"].startswith("image-") and upload["filename"].endswith(".png")
    assert zulip.replies(chat)[2] == f"[{upload['filename']}]({upload['url']})"
    # A link to an upload on another host is never fetched.
    far = unique("far") + ".png"
    zulip.user_sends_file("ann", TINY_PNG, far, "image/png", url=f"{elsewhere.url}/user_uploads/2/ab/{far}")
    wait_for(lambda: refusal(far, elsewhere) in zulip.replies(chat), what="refusal")
    assert elsewhere.hits == [] and len(zulip.downloads) == 2


def test_zulip_stream_file_is_posted_back_in_its_topic(files_daemon, zulip):
    name = unique("plan") + ".txt"
    zulip.user_sends_file("bob", b"the plan", name, "text/plain", text="@**Agent Bot** "
                          '[[tool:file_write {"path": "output/plan-copy.txt", "content": "copied"}]] copy',
                          stream="general", topic="plans")
    wait_for(lambda: len(zulip.replies(("general", "plans"))) == 2, what="file message and reply")
    assert [(u["filename"], u["data"]) for u in zulip.uploads] == [("plan-copy.txt", b"copied")]
    assert zulip.replies(("general", "plans"))[0] == f"[plan-copy.txt]({zulip.uploads[0]['url']})"


# -- Rocket.Chat ---------------------------------------------------------------------------

@pytest.fixture
def rocketchat(files_daemon):
    fake = FakeRocketChat(ENV["ROCKETCHAT_TOKEN"]).start()
    with serving(files_daemon, "rocketchat", fake, server_url=fake.url, user_id=ROCKETCHAT_BOT_ID,
                 token_env="ROCKETCHAT_TOKEN", poll_interval_secs=0.2):
        polled = len(fake.polls)
        wait_for(lambda: len(fake.polls) >= polled + 2, what="the rooms' cursors set")
        yield fake


def test_rocketchat_files_both_ways_and_only_from_the_server(files_daemon, rocketchat, fake_llm,
                                                             elsewhere):  # noqa: F811
    marker = unique("rc-look")
    room = rocketchat.user_sends_file("ann", TINY_PNG, "dot.png", "image/png", text=marker)
    wait_for(lambda: rocketchat.replies(room), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(rocketchat.downloads) == 1
    name = unique("minutes") + ".txt"
    secret = f"rocket says {uuid.uuid4().hex[:8]}"
    rocketchat.user_sends_file("ann", secret.encode(), name, "text/plain",
                               text=read_it(name))
    wait_for(lambda: len(rocketchat.replies(room)) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert uploads_named(files_daemon, name)[0]["size"] == len(secret)
    # The generated image: rooms.media, then rooms.mediaConfirm posts it into the room.
    rocketchat.user_says("ann", draw("an orange square"))
    wait_for(lambda: len(rocketchat.replies(room)) == 4, what="file message and reply")
    assert [(u["rid"], u["content_type"], u["data"]) for u in rocketchat.uploads] == [(room, "image/png", TINY_PNG)]
    posted = next(m for m in rocketchat.messages if m["_id"] == rocketchat.uploads[0]["message"])
    assert posted["u"]["username"] == "agentbot" and posted["attachments"][0]["image_type"] == "image/png"
    assert not rocketchat.pending
    # A file whose link points off the server is never fetched.
    far = unique("far") + ".png"
    rocketchat.user_sends_file("ann", TINY_PNG, far, "image/png", text="look",
                               url=f"{elsewhere.url}/file-upload/x/{far}")
    wait_for(lambda: refusal(far, elsewhere) in rocketchat.replies(room), what="refusal")
    assert elsewhere.hits == [] and len(rocketchat.downloads) == 2
    # The size the message declares is over the cap: not fetched at all.
    big = unique("big") + ".txt"
    rocketchat.user_sends_file("ann", b"z" * (LIMIT + 1), big, "text/plain", text="big one")
    too_big = f"Sorry, I could not take {big}: it is {LIMIT + 1} bytes; files up to {LIMIT} bytes are accepted here."
    wait_for(lambda: too_big in rocketchat.replies(room), what="refusal")
    assert len(rocketchat.downloads) == 2


def test_rocketchat_file_goes_back_into_the_thread(files_daemon, rocketchat):
    root = rocketchat._add("GENERALROOM", "id-bob", "bob", "kick-off")["_id"]
    rocketchat.user_says("bob", '@agentbot [[tool:file_write {"path": "output/notes.md", "content": "# notes"}]] x',
                         room="GENERALROOM", tmid=root)
    wait_for(lambda: rocketchat.uploads, what="the file confirmed")
    assert [(u["filename"], u["data"], u["tmid"]) for u in rocketchat.uploads] == [("notes.md", b"# notes", root)]


def test_rocketchat_channel_send_posts_a_workspace_file_to_a_named_channel(files_daemon, rocketchat):
    name = unique("forward") + ".txt"
    call = json.dumps({"channel": "rocketchat", "recipient": "#general", "file_path": f"inbox/{name}",
                       "message": "for the channel"})
    room = rocketchat.user_sends_file("ann", b"passed along", name, "text/plain",
                                      text=f"[[tool:channel_send {call}]] pass it on")
    wait_for(lambda: rocketchat.replies(room), what="reply after sending")
    assert [(u["rid"], u["filename"], u["content_type"], u["data"]) for u in rocketchat.uploads] == \
        [("GENERALROOM", name, "text/plain", b"passed along")]
    assert "for the channel" in rocketchat.replies("GENERALROOM")
