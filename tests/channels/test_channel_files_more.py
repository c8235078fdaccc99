"""Files and images both ways on Gitter (a Matrix homeserver), ntfy, Pumble, Nextcloud Talk and Mumble (images
inline in a message, against a real murmurd), and Threema (end-to-end), through the real daemon and each platform's
fake: an image reaches a vision model as an image part, a file becomes an upload the agent
reads, what the agent makes goes back through the platform's upload API, and a file hosted
off the platform's own hosts is never fetched."""

from __future__ import annotations

import base64
import hashlib
import uuid

import pytest
import requests

from channel_contract import ENV
from channel_fixtures import configure, wait_active, wait_for
from fakellm import TINY_PNG
from fakes.gitter import ROOM as GITTER_ROOM, FakeGitter, FakeGitterFront
from fakes.mumble import MumbleUser, Murmur
from fakes.nextcloud import FakeNextcloud
from fakes.ntfy import FakeNtfy
from fakes.threema import FakeThreema
from nacl.public import PrivateKey
from fakes.pumble import FakePumble, event as pumble_event, headers as pumble_headers
from support import free_port
from files_support import (IMAGE_PART, LIMIT, draw, elsewhere, files_daemon, read_it,  # noqa: F401 - fixtures
                           refusal, serving, tool_results, unique, uploads_named, user_turns)


# -- Gitter --------------------------------------------------------------------------------

@pytest.fixture
def gitter(files_daemon):  # noqa: F811
    fake = FakeGitter(ENV["GITTER_TOKEN"]).start()
    front = FakeGitterFront(fake).start()  # gitter.im: only the discovery of the homeserver
    configure(files_daemon, "gitter", token_env="GITTER_TOKEN", homeserver_url=front.url, room_id=GITTER_ROOM,
              long_poll_secs=1, default_agent="filer")
    wait_active(files_daemon, "gitter")
    wait_for(lambda: any(s["since"] for s in fake.syncs), what="initial sync done")
    yield fake
    files_daemon.delete("/api/channels/gitter/configure")
    front.stop()
    fake.stop()


def test_gitter_media_both_ways_through_the_homeserver_only(files_daemon, gitter, fake_llm, elsewhere):  # noqa: F811
    marker = unique("gitter-look")
    gitter.user_sends_file(GITTER_ROOM, "@ann:gitter.im", TINY_PNG, "dot.png", "image/png", msgtype="m.image",
                           caption=marker)
    wait_for(lambda: gitter.bot_messages(GITTER_ROOM), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(gitter.downloads) == 1  # the authenticated media API of the homeserver
    name = unique("notes") + ".txt"
    secret = f"gitter says {uuid.uuid4().hex[:8]}"
    gitter.user_sends_file(GITTER_ROOM, "@ann:gitter.im", secret.encode(), name, "text/plain",
                           caption=read_it(name))
    wait_for(lambda: len(gitter.bot_messages(GITTER_ROOM)) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    gitter.user_says(GITTER_ROOM, "@ann:gitter.im", draw())
    wait_for(lambda: len(gitter.bot_messages(GITTER_ROOM)) == 3 and gitter.bot_files(GITTER_ROOM),
             what="reply after drawing")
    assert [(p["msgtype"], p["info"], p["data"]) for p in gitter.bot_files(GITTER_ROOM)] == \
        [("m.image", {"mimetype": "image/png", "size": len(TINY_PNG)}, TINY_PNG)]
    gitter.user_sends_file(GITTER_ROOM, "@ann:gitter.im", TINY_PNG, "far.png", "image/png", msgtype="m.image",
                           url=f"{elsewhere.url}/far.png")
    wait_for(lambda: len(gitter.bot_messages(GITTER_ROOM)) == 4, what="refusal")
    assert gitter.bot_messages(GITTER_ROOM)[3] == refusal("far.png", elsewhere)
    assert elsewhere.hits == []


# -- ntfy ----------------------------------------------------------------------------------

TOPIC = "agentd-files"


@pytest.fixture
def ntfy(files_daemon):  # noqa: F811
    fake = FakeNtfy(ENV["NTFY_TOKEN"]).start()
    with serving(files_daemon, "ntfy", fake, topic=TOPIC, server_url=fake.url, token_env="NTFY_TOKEN"):
        wait_for(lambda: fake.subscriptions, what="subscribed")
        yield fake


def test_ntfy_attachments_both_ways_from_the_server_only(files_daemon, ntfy, fake_llm, elsewhere):  # noqa: F811
    marker = unique("ntfy-look")
    ntfy.publish_file(TOPIC, TINY_PNG, "dot.png", text=marker)
    wait_for(lambda: ntfy.bot_messages(TOPIC), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(ntfy.downloads) == 1
    name = unique("notes") + ".txt"
    secret = f"ntfy says {uuid.uuid4().hex[:8]}"
    ntfy.publish_file(TOPIC, secret.encode(), name, text=read_it(name))
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    ntfy.publish(TOPIC, draw())
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 3 and ntfy.bot_files(TOPIC), what="reply after drawing")
    [(posted, kind, data)] = ntfy.bot_files(TOPIC)
    assert (kind, data) == ("image/png", TINY_PNG) and posted.endswith(".png")
    big = unique("big") + ".txt"
    ntfy.publish_file(TOPIC, b"z", big, size=LIMIT * 10)
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 4, what="refusal of the big file")
    assert ntfy.bot_messages(TOPIC)[3] == \
        f"Sorry, I could not take {big}: it is {LIMIT * 10} bytes; files up to {LIMIT} bytes are accepted here."
    ntfy.publish_file(TOPIC, TINY_PNG, "far.png", url=f"{elsewhere.url}/far.png")
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 5, what="refusal of the file elsewhere")
    assert ntfy.bot_messages(TOPIC)[4] == refusal("far.png", elsewhere)
    ntfy.redirect_files = f"{elsewhere.url}/cat.png"
    ntfy.publish_file(TOPIC, TINY_PNG, "moved.png")
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) == 6, what="refusal of the redirect")
    assert ntfy.bot_messages(TOPIC)[5] == refusal("moved.png", elsewhere)
    assert elsewhere.hits == [] and len(ntfy.downloads) == 3


# -- Mumble --------------------------------------------------------------------------------

@pytest.fixture
def mumble(files_daemon):  # noqa: F811
    server = Murmur().start()
    configure(files_daemon, "mumble", host="127.0.0.1", port=server.port, username="filebot", default_agent="filer")
    wait_active(files_daemon, "mumble")
    ann = MumbleUser(server.port, "ann")
    wait_for(lambda: "filebot" in ann.users.values(), what="bot visible")
    yield ann
    ann.close()
    files_daemon.delete("/api/channels/mumble/configure")
    server.cleanup()


def test_mumble_images_inline_both_ways(files_daemon, mumble, fake_llm, elsewhere):  # noqa: F811
    inline = f'<img src="data:image/png;base64,{base64.b64encode(TINY_PNG).decode()}"/>'
    marker = unique("mumble-look")
    mumble.tell("filebot", f"{marker}<br>{inline}")
    wait_for(lambda: mumble.from_user("filebot"), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    name = f"image-{hashlib.sha256(TINY_PNG).hexdigest()[:8]}.png"
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("image/png", len(TINY_PNG))]
    mumble.tell("filebot", draw())
    wait_for(lambda: len(mumble.from_user("filebot")) == 3, what="image and reply after drawing")
    drawn = mumble.from_user("filebot", private=True)[1]
    assert drawn.startswith(inline[:-2]) and drawn.endswith('.png"/>')  # the image, then the text
    mumble.tell("filebot", f'<img src="{elsewhere.url}/far.png"/> look')
    wait_for(lambda: len(mumble.from_user("filebot")) == 4, what="reply to the linked picture")
    assert elsewhere.hits == []  # a picture named by URL is not fetched


# -- Pumble --------------------------------------------------------------------------------

@pytest.fixture
def pumble(files_daemon):  # noqa: F811
    fake = FakePumble(ENV["PUMBLE_BOT_TOKEN"], ENV["PUMBLE_APP_KEY"], ENV["PUMBLE_SIGNING_SECRET"]).start()
    port = free_port()
    fake.channels["dm-ann"] = "DIRECT"
    configure(files_daemon, "pumble", webhook_port=port, api_url=fake.url, files_url=fake.url, default_agent="filer")
    wait_active(files_daemon, "pumble")
    url = f"http://127.0.0.1:{port}/pumble/events"

    def deliver(body: bytes) -> None:
        response = requests.post(url, data=body, headers=pumble_headers(ENV["PUMBLE_SIGNING_SECRET"], body), timeout=5)
        assert response.status_code == 200, response.text

    fake.deliver = deliver
    yield fake
    files_daemon.delete("/api/channels/pumble/configure")
    fake.stop()


def test_pumble_files_both_ways_through_the_file_server(files_daemon, pumble, fake_llm, elsewhere):  # noqa: F811
    def replies():
        return [s for s in pumble.sent if s["channel"] == "dm-ann"]

    marker = unique("pumble-look")
    pumble.deliver(pumble.user_sends_file("dm-ann", "user-ann", TINY_PNG, "dot.png", "image/png", text=marker))
    wait_for(lambda: replies(), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(pumble.downloads) == 1
    name = unique("notes") + ".txt"
    secret = f"pumble says {uuid.uuid4().hex[:8]}"
    pumble.deliver(pumble.user_sends_file("dm-ann", "user-ann", secret.encode(), name, "text/plain",
                                          text=read_it(name)))
    wait_for(lambda: len(replies()) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    pumble.deliver(pumble_event("dm-ann", "user-ann", draw()))
    wait_for(lambda: len(replies()) == 4, what="image and reply after drawing")
    drawn = replies()[2]
    assert drawn["text"] == "" and [(kind, data) for _, kind, data in drawn["files"]] == [("image/png", TINY_PNG)]
    assert drawn["files"][0][0].endswith(".png") and replies()[3]["files"] == []
    big = unique("big") + ".txt"
    pumble.deliver(pumble.user_sends_file("dm-ann", "user-ann", b"z", big, "text/plain", size=LIMIT * 10))
    wait_for(lambda: len(replies()) == 5, what="refusal of the big file")
    assert replies()[4]["text"] == \
        f"Sorry, I could not take {big}: it is {LIMIT * 10} bytes; files up to {LIMIT} bytes are accepted here."
    pumble.deliver(pumble.user_sends_file("dm-ann", "user-ann", TINY_PNG, "far.png", "image/png",
                                          path=f"{elsewhere.url}/far.png"))
    wait_for(lambda: len(replies()) == 6, what="refusal of the file elsewhere")
    assert replies()[5]["text"] == refusal("far.png", elsewhere)
    assert elsewhere.hits == [] and len(pumble.downloads) == 2


# -- Nextcloud Talk ------------------------------------------------------------------------

@pytest.fixture
def nextcloud(files_daemon):  # noqa: F811
    fake = FakeNextcloud(ENV["NEXTCLOUD_TOKEN"]).start()
    with serving(files_daemon, "nextcloud", fake, server_url=fake.url, token_env="NEXTCLOUD_TOKEN",
                 poll_interval_secs=0.2, long_poll_secs=1, allowed_rooms=["dmann"]):
        wait_for(lambda: fake.polls, what="polling")
        yield fake


def test_nextcloud_shared_files_both_ways_over_webdav(files_daemon, nextcloud, fake_llm, elsewhere):  # noqa: F811
    dot = unique("dot") + ".png"
    room = nextcloud.user_shares_file("ann", TINY_PNG, dot)
    wait_for(lambda: nextcloud.replies(room), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, dot)[-1]  # the file's note names it
    assert len(nextcloud.downloads) == 1 and nextcloud.downloads[0].startswith("Talk/dot-")
    name = unique("notes") + ".txt"
    secret = f"nextcloud says {uuid.uuid4().hex[:8]}"
    nextcloud.user_shares_file("ann", secret.encode(), name)
    wait_for(lambda: len(nextcloud.replies(room)) == 2, what="reply to the file")
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    nextcloud.user_says("ann", read_it(name))
    wait_for(lambda: len(nextcloud.replies(room)) == 3, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    nextcloud.user_says("ann", draw())
    wait_for(lambda: len(nextcloud.replies(room)) == 4 and nextcloud.bot_files(room), what="reply after drawing")
    [(posted, data)] = nextcloud.bot_files(room)
    assert data == TINY_PNG and posted.endswith(".png")
    nextcloud.redirect_files = f"{elsewhere.url}/cat.png"
    moved = unique("moved") + ".png"
    nextcloud.user_shares_file("ann", TINY_PNG, moved)
    wait_for(lambda: len(nextcloud.replies(room)) == 5, what="refusal of the redirect")
    assert nextcloud.replies(room)[4] == refusal(moved, elsewhere)
    assert elsewhere.hits == []


# -- Threema -------------------------------------------------------------------------------

def test_threema_end_to_end_file_messages_both_ways(files_daemon, fake_llm):  # noqa: F811
    gateway_key = PrivateKey(bytes.fromhex(ENV["THREEMA_PRIVATE_KEY"].split(":")[1]))
    fake = FakeThreema("*AGENTD1", ENV["THREEMA_SECRET"], gateway_key.public_key.encode()).start()
    port = free_port()
    try:
        configure(files_daemon, "threema", threema_id="*AGENTD1", webhook_port=port, api_url=fake.url,
                  secret_env="THREEMA_SECRET", private_key_env="THREEMA_PRIVATE_KEY", default_agent="filer")
        wait_active(files_daemon, "threema")
        def deliver(body: bytes) -> None:
            response = requests.post(f"http://127.0.0.1:{port}/threema", data=body, timeout=5,
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert response.status_code == 200, response.text

        marker = unique("threema-look")
        deliver(fake.file_callback("FILEANN1", TINY_PNG, "dot.png", "image/png", caption=marker))
        wait_for(lambda: fake.replies("FILEANN1"), what="reply to the image")
        assert IMAGE_PART in user_turns(fake_llm, marker)[-1] and len(fake.downloads) == 1
        name = unique("notes") + ".txt"
        secret = f"threema says {uuid.uuid4().hex[:8]}"
        deliver(fake.file_callback("FILEANN1", secret.encode(), name, "text/plain", caption=read_it(name)))
        wait_for(lambda: len(fake.replies("FILEANN1")) == 2, what="reply after reading")
        assert tool_results(fake_llm, secret) == [secret]
        deliver(fake.callback("FILEANN1", draw()))
        wait_for(lambda: len(fake.replies("FILEANN1")) == 3 and fake.files("FILEANN1"), what="image and reply")
        [sent] = fake.files("FILEANN1")
        assert (sent["m"], sent["j"], sent["data"]) == ("image/png", 1, TINY_PNG) and sent["n"].endswith(".png")
        assert len(fake.blobs) == 3 and not any(TINY_PNG in blob for blob in fake.blobs.values())  # sealed only
    finally:
        files_daemon.delete("/api/channels/threema/configure")
        fake.stop()
