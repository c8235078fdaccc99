"""Files and images both ways on XMPP, Revolt, Mastodon, Discourse, Bluesky, Twist and the generic webhook,
through the real daemon and each platform's fake (or real server): an image reaches a
vision model as an image part, a file becomes an upload the agent reads, what the agent
makes goes back through the platform's upload API, and a file hosted off the platform's
own hosts is never fetched."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid

import pytest
import requests

from channel_contract import ENV
from channel_fixtures import configure, wait_active, wait_for
from fakellm import TINY_PNG
from fakes.bluesky import BOT_HANDLE, FakeBluesky
from fakes.discourse import BOT as DISCOURSE_BOT, FakeDiscourse
from fakes.mastodon import FakeMastodon
from fakes.recorder import Recorder
from fakes.revolt import FakeRevolt
from fakes.twist import BOT_ID as TWIST_BOT_ID, WORKSPACE as TWIST_WORKSPACE, FakeTwist
from fakes.xmpp import DOMAIN as XMPP_DOMAIN, Prosody, XmppUser
from support import free_port
from files_support import (IMAGE_PART, LIMIT, draw, elsewhere, files_daemon, read_it,  # noqa: F401 - fixtures
                           refusal, serving, tool_results, unique, uploads_named, user_turns)


# -- Revolt --------------------------------------------------------------------------------

@pytest.fixture
def revolt(files_daemon):  # noqa: F811
    fake = FakeRevolt(ENV["REVOLT_BOT_TOKEN"]).start()
    with serving(files_daemon, "revolt", fake, api_url=fake.url, ws_url=fake.url.replace("http", "ws", 1),
                 bot_token_env="REVOLT_BOT_TOKEN", ping_secs=1):
        yield fake


def test_revolt_files_both_ways_through_autumn(files_daemon, revolt, fake_llm, elsewhere):  # noqa: F811
    marker = unique("revolt-look")
    chat = revolt.user_sends_file("ann", TINY_PNG, "dot.png", "image/png", text=marker)
    wait_for(lambda: revolt.replies(chat), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(revolt.downloads) == 1
    name = unique("notes") + ".txt"
    secret = f"revolt says {uuid.uuid4().hex[:8]}"
    revolt.user_sends_file("ann", secret.encode(), name, "text/plain", text=read_it(name))
    wait_for(lambda: len(revolt.replies(chat)) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    revolt.user_says("ann", draw())
    wait_for(lambda: len(revolt.replies(chat)) == 3 and revolt.file_messages, what="reply after drawing")
    posted = revolt.file_messages
    assert [(p["channel"], p["files"][0]["content_type"], p["files"][0]["data"]) for p in posted] == \
        [(chat, "image/png", TINY_PNG)]
    assert posted[0]["files"][0]["filename"].endswith(".png")
    big = unique("big") + ".txt"
    revolt.user_sends_file("ann", b"z", big, "text/plain", size=LIMIT * 10)
    wait_for(lambda: len(revolt.replies(chat)) == 4, what="refusal")
    assert revolt.replies(chat)[3] == \
        f"Sorry, I could not take {big}: it is {LIMIT * 10} bytes; files up to {LIMIT} bytes are accepted here."
    revolt.redirect_files = f"{elsewhere.url}/cat.png"
    moved = unique("moved") + ".png"
    revolt.user_sends_file("ann", TINY_PNG, moved, "image/png")
    wait_for(lambda: len(revolt.replies(chat)) == 5, what="refusal")
    assert revolt.replies(chat)[4] == refusal(moved, elsewhere)
    assert elsewhere.hits == [] and len(revolt.downloads) == 3  # the oversize file was never fetched


# -- Mastodon ------------------------------------------------------------------------------

@pytest.fixture
def mastodon(files_daemon):  # noqa: F811
    fake = FakeMastodon(ENV["MASTODON_ACCESS_TOKEN"]).start()
    with serving(files_daemon, "mastodon", fake, instance_url=fake.url, access_token_env="MASTODON_ACCESS_TOKEN"):
        fake.wait_streaming()
        yield fake


def test_mastodon_media_both_ways_from_the_media_host_only(files_daemon, mastodon, fake_llm, elsewhere):  # noqa: F811
    marker = unique("masto-look")
    user = mastodon.user_sends_file("ann@other.test", TINY_PNG, "dot.png", "image/png", text=marker)
    wait_for(lambda: mastodon.replies(user), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert mastodon.downloads == ["dot.png"]  # from the media host, localhost:<port>
    assert uploads_named(files_daemon, "dot.png")[-1]["size"] == len(TINY_PNG)
    mastodon.async_media = True  # the upload is still processing: the status waits for it
    mastodon.user_says("ann@other.test", draw())
    wait_for(lambda: len(mastodon.replies(user)) == 2 and mastodon.media_posts, what="reply after drawing")
    [post] = mastodon.media_posts
    asked = [s for s in mastodon.statuses.values() if s["account"]["acct"] == "ann@other.test"][-1]
    assert (post["status"], post["in_reply_to_id"], post["visibility"]) == ("@ann@other.test", asked["id"], "public")
    assert [(m["content_type"], m["data"], m["description"]) for m in post["media"]] == \
        [("image/png", TINY_PNG, post["media"][0]["filename"])]
    far = unique("far") + ".png"
    mastodon.user_sends_file("ann@other.test", TINY_PNG, far, "image/png", url=f"{elsewhere.url}/{far}")
    wait_for(lambda: len(mastodon.replies(user)) == 3, what="refusal")
    assert mastodon.replies(user)[2] == refusal(far, elsewhere)
    assert elsewhere.hits == []


# -- Discourse -----------------------------------------------------------------------------

@pytest.fixture
def discourse(files_daemon):  # noqa: F811
    fake = FakeDiscourse(ENV["DISCOURSE_API_KEY"]).start()
    with serving(files_daemon, "discourse", fake, base_url=fake.url, api_key_env="DISCOURSE_API_KEY",
                 api_username=DISCOURSE_BOT, poll_interval_secs=0.2):
        wait_for(lambda: fake.polls, what="first poll")
        yield fake


def test_discourse_uploads_both_ways_from_the_forum_only(files_daemon, discourse, fake_llm, elsewhere):  # noqa: F811
    marker = unique("forum-look")
    topic = discourse.user_sends_file("ann", TINY_PNG, "dot.png", "image/png", f"@{DISCOURSE_BOT} {marker}")
    wait_for(lambda: discourse.replies(topic), what="reply to the image")
    turn = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in turn and "upload://" not in str(turn)
    name = unique("minutes") + ".txt"
    secret = f"forum says {uuid.uuid4().hex[:8]}"
    discourse.user_sends_file("ann", secret.encode(), name, "text/plain", f"@{DISCOURSE_BOT} {read_it(name)}",
                              topic=topic)
    wait_for(lambda: len(discourse.replies(topic)) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert discourse.downloads == ["dot.png", name]
    discourse.user_says("ann", f"@{DISCOURSE_BOT} {draw()}", topic=topic)
    wait_for(lambda: len(discourse.replies(topic)) == 4, what="file post and reply")
    image = discourse.replies(topic)[2]
    [upload] = [u for u in discourse.uploads.values() if u["original_filename"] != "dot.png"
                and u["original_filename"] != name]
    assert image == f"![{upload['original_filename']}|1x1]({upload['short_url']})"
    assert (upload["content_type"], upload["data"]) == ("image/png", TINY_PNG)
    far = unique("far") + ".png"
    discourse.user_sends_file("ann", b"", far, "image/png", f"@{DISCOURSE_BOT} see",
                              topic=topic, url=f"{elsewhere.url}/uploads/default/original/1X/{far}")
    wait_for(lambda: len(discourse.replies(topic)) == 6, what="refusal and answer")
    assert discourse.replies(topic)[4] == refusal(far, elsewhere)
    assert elsewhere.hits == []


# -- Generic webhook -----------------------------------------------------------------------

@pytest.fixture
def hook(files_daemon):  # noqa: F811
    callback = Recorder()
    port = free_port()
    configure(files_daemon, "webhook", listen_port=port, callback_url=callback.url + "/cb",
              secret_env="WEBHOOK_TEST_SECRET", default_agent="filer")
    wait_active(files_daemon, "webhook")
    yield f"http://127.0.0.1:{port}/webhook", callback
    files_daemon.delete("/api/channels/webhook/configure")
    callback.close()


def post_hook(url: str, payload: dict) -> requests.Response:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(ENV["WEBHOOK_TEST_SECRET"].encode(), body, hashlib.sha256).hexdigest()
    return requests.post(url, data=body, headers={"X-Webhook-Signature": signature,
                                                  "Content-Type": "application/json"}, timeout=5)


def callbacks(callback, sender: str) -> list[dict]:
    return [json.loads(r["body"]) for r in list(callback.requests) if json.loads(r["body"])["sender_id"] == sender]


def test_webhook_attachments_both_ways_in_the_json(files_daemon, hook, fake_llm):  # noqa: F811
    url, callback = hook
    marker = unique("hook-look")
    png = {"filename": "dot.png", "content_type": "image/png", "data": base64.b64encode(TINY_PNG).decode()}
    assert post_hook(url, {"sender_id": "w-1", "message": marker, "attachments": [png]}).status_code == 202
    wait_for(lambda: callbacks(callback, "w-1"), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    name = unique("notes") + ".txt"
    secret = f"hook says {uuid.uuid4().hex[:8]}"
    text = {"filename": name, "content_type": "text/plain", "data": base64.b64encode(secret.encode()).decode()}
    assert post_hook(url, {"sender_id": "w-2", "message": read_it(name), "attachments": [text]}).status_code == 202
    wait_for(lambda: callbacks(callback, "w-2"), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert post_hook(url, {"sender_id": "w-3", "message": draw()}).status_code == 202
    wait_for(lambda: len(callbacks(callback, "w-3")) == 2, what="file and reply")
    sent, reply = callbacks(callback, "w-3")
    [item] = sent["attachments"]
    assert (sent["message"], sent["agent"], item["content_type"], base64.b64decode(item["data"])) == \
        ("", "filer", "image/png", TINY_PNG)
    assert item["filename"].endswith(".png") and reply["message"].startswith("tool said: ")
    signed = [r for r in callback.requests if json.loads(r["body"]).get("attachments")][0]
    assert signed["headers"]["X-Webhook-Signature"] == \
        "sha256=" + hmac.new(ENV["WEBHOOK_TEST_SECRET"].encode(), signed["body"], hashlib.sha256).hexdigest()
    # Files alone are a message; a bad attachment is a 400 that names it.
    only = post_hook(url, {"sender_id": "w-4", "attachments": [text]})
    assert only.status_code == 202
    wait_for(lambda: callbacks(callback, "w-4"), what="reply to a file alone")
    for bad, error in (({"filename": "x.txt", "data": "not base64!"}, "attachments[0].data is not valid base64"),
                       ({"data": "eA=="}, "attachments[0].filename must be a non-empty string"),
                       ("x", "attachments[0] must be an object")):
        answer = post_hook(url, {"sender_id": "w-5", "message": "hi", "attachments": [bad]})
        assert (answer.status_code, answer.json()) == (400, {"error": f"bad request: {error}"})
    too_big = {"filename": "big.txt", "content_type": "text/plain", "data": base64.b64encode(b"z" * (LIMIT + 1)).decode()}
    assert post_hook(url, {"sender_id": "w-6", "attachments": [too_big]}).status_code == 202
    wait_for(lambda: callbacks(callback, "w-6"), what="refusal")
    assert [c["message"] for c in callbacks(callback, "w-6")] == \
        [f"Sorry, I could not take big.txt: it is {LIMIT + 1} bytes; files up to {LIMIT} bytes are accepted here."]


# -- XMPP (a real prosody with mod_http_file_share) ----------------------------------------

XMPP_BOT = f"agentbot@{XMPP_DOMAIN}"


@pytest.fixture(scope="module")
def prosody():
    server = Prosody(file_share=True)
    server.register("agentbot", ENV["XMPP_PASSWORD"])
    server.register("ann", "pw")
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def xmpp(files_daemon, prosody):  # noqa: F811
    configure(files_daemon, "xmpp", jid=XMPP_BOT, password_env="XMPP_PASSWORD", server="127.0.0.1",
              port=prosody.port, tls_verify=False, default_agent="filer", file_hosts=[f"127.0.0.1:{prosody.http_port}"])
    wait_active(files_daemon, "xmpp")
    ann = XmppUser(prosody, "ann", "pw")
    yield ann
    ann.close()
    files_daemon.delete("/api/channels/xmpp/configure")


def test_xmpp_files_through_http_upload_both_ways(files_daemon, xmpp, prosody, fake_llm, elsewhere):  # noqa: F811
    def answers() -> list[str]:
        return xmpp.bodies(XMPP_BOT)

    marker = unique("xmpp-look")
    xmpp.send_file(XMPP_BOT, xmpp.upload(TINY_PNG, "dot.png", "image/png"), text=marker)
    wait_for(answers, what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    name = unique("notes") + ".txt"
    secret = f"xmpp says {uuid.uuid4().hex[:8]}"
    xmpp.send_file(XMPP_BOT, xmpp.upload(secret.encode(), name, "text/plain"), text=read_it(name))
    wait_for(lambda: len(answers()) == 2, what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    xmpp.say(XMPP_BOT, draw())
    wait_for(lambda: len(answers()) == 4, what="file message and reply")
    [(sender, body, url)] = xmpp.oob
    assert sender == XMPP_BOT and body == url and url.startswith(f"http://127.0.0.1:{prosody.http_port}/file_share/")
    fetched = requests.get(url, timeout=5)
    assert (fetched.status_code, fetched.content, fetched.headers["Content-Type"]) == (200, TINY_PNG, "image/png")
    far = unique("far") + ".png"
    xmpp.send_file(XMPP_BOT, f"{elsewhere.url}/{far}")
    wait_for(lambda: len(answers()) == 5, what="refusal")
    assert answers()[4] == refusal(far, elsewhere)
    assert elsewhere.hits == []


# -- Bluesky -------------------------------------------------------------------------------

@pytest.fixture
def bluesky(files_daemon):  # noqa: F811
    fake = FakeBluesky(ENV["BLUESKY_APP_PASSWORD"]).start()
    with serving(files_daemon, "bluesky", fake, service_url=fake.url, identifier=BOT_HANDLE,
                 cdn_url=f"http://{fake.cdn_host}", app_password_env="BLUESKY_APP_PASSWORD",
                 poll_interval_secs=0.2):
        wait_for(lambda: fake.polls, what="first poll")
        yield fake


def test_bluesky_images_both_ways_through_the_cdn(files_daemon, bluesky, fake_llm):  # noqa: F811
    marker = unique("sky-look")
    post = bluesky.user_sends_image("ann.bsky.test", TINY_PNG, "image/png", f"@{BOT_HANDLE} {marker}")
    wait_for(lambda: bluesky.replies(post), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert len(bluesky.downloads) == 1  # from the CDN host, localhost:<port>
    asked = bluesky.user_says("ann.bsky.test", f"@{BOT_HANDLE} {draw()}")
    wait_for(lambda: bluesky.replies(asked) and bluesky.image_posts, what="image post and reply")
    [made] = bluesky.image_posts
    assert made["reply"]["parent"]["uri"] == asked and made["text"] == ""
    assert [(i["mimeType"], i["data"]) for i in made["images"]] == [("image/png", TINY_PNG)]
    assert made["images"][0]["alt"].endswith(".png")


# -- Twist ---------------------------------------------------------------------------------

@pytest.fixture
def twist(files_daemon):  # noqa: F811
    fake = FakeTwist(ENV["TWIST_TOKEN"]).start()
    with serving(files_daemon, "twist", fake, api_url=fake.url, token_env="TWIST_TOKEN",
                 workspace_id=str(TWIST_WORKSPACE), poll_interval_secs=0.2):
        wait_for(lambda: fake.polls, what="first poll")
        yield fake


def test_twist_attachments_both_ways(files_daemon, twist, fake_llm, elsewhere):  # noqa: F811
    mention = f"[Agent Bot](twist-mention://{TWIST_BOT_ID})"
    name = unique("notes") + ".txt"
    secret = f"twist says {uuid.uuid4().hex[:8]}"
    thread = twist.user_sends_file("ann", secret.encode(), name, "text/plain", f"{mention} {read_it(name)}")
    wait_for(lambda: twist.replies(thread), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret] and twist.downloads == [name]
    twist.user_says("ann", f"{mention} {draw()}")
    wait_for(lambda: len(twist.replies(thread)) == 2 and twist.file_comments, what="file comment and reply")
    [made] = twist.file_comments
    assert [(f["underlying_type"], f["data"], f["file_size"]) for f in made["files"]] == \
        [("image/png", TINY_PNG, len(TINY_PNG))]
    assert made["thread_id"] == thread and made["content"] == made["files"][0]["file_name"]
    far = unique("far") + ".png"
    twist.user_sends_file("ann", TINY_PNG, far, "image/png", f"{mention} see", url=f"{elsewhere.url}/{far}")
    wait_for(lambda: len(twist.replies(thread)) == 4, what="refusal and answer")
    assert twist.replies(thread)[2] == refusal(far, elsewhere)
    assert elsewhere.hits == []


def test_xmpp_finds_the_upload_service_and_its_hosts(prosody):
    from agentd.channels.adapter import ChannelContext, ChannelError, Conversation
    from agentd.channels.adapters.xmpp import XmppAdapter

    ctx = ChannelContext("xmpp", "127.0.0.1", deliver=lambda m: None, audit=lambda *a, **k: None,
                         load_state=dict, save_state=lambda s: None)
    adapter = XmppAdapter(ctx, {"jid": XMPP_BOT, "password_env": "XMPP_PASSWORD", "server": "127.0.0.1",
                                "port": prosody.port, "tls_verify": False})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XMPP_PASSWORD", ENV["XMPP_PASSWORD"])
        adapter.start()
    try:
        wait_for(adapter.health, what="logged in")
        assert (adapter.upload_service, adapter.upload_limit) == ("upload.localhost", 1024 * 1024)
        assert adapter.file_hosts() == {f"{host}{port}" for host in ("localhost", "upload.localhost")
                                        for port in ("", ":5280", ":5281", ":5443")}
        with pytest.raises(ChannelError, match="the server takes 1048576"):
            adapter.send_file(Conversation("xmpp", "ann@localhost", "ann@localhost", direct=True), "big.bin",
                              "application/octet-stream", b"x" * (1024 * 1024 + 1))
    finally:
        adapter.stop()
