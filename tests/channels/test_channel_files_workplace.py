"""Files and images on Microsoft Teams, Webex, Google Chat, Feishu and DingTalk, through the real
daemon and each platform's fake: an inbound image reaches a vision model as an image part,
an inbound file is an upload the agent reads, what the agent's tools make is posted back
with the platform's own upload API (where it has one), and a file hosted off the
platform's hosts is refused and never fetched."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
import requests

from channel_contract import ENV
from channel_fixtures import audit, wait_for
from fakellm import TINY_PNG
from fakes.dingtalk import FakeDingTalk
from fakes.feishu import FakeFeishu, callback, message_event
from fakes.google_chat import FakeGoogleChat, new_key, service_account
from fakes.teams import FakeBotFramework
from fakes.webex import FakeWebex
from support import free_port
from files_support import (IMAGE_PART, LIMIT, draw, elsewhere, read_it, refusal, serving,  # noqa: F401 - fixtures
                           start_files_daemon, tool_results, unique, uploads_named, user_turns)


GCHAT_PROJECT, GCHAT_KEY = "210987654321", new_key()
GCHAT_ACCOUNT = service_account(GCHAT_KEY)
DING_APP, DING_SECRET = "dingfilesrobot", "dingtalk-app-secret"
@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    env = {**ENV, "GOOGLE_CHAT_SERVICE_ACCOUNT": json.dumps(GCHAT_ACCOUNT), "DINGTALK_APP_SECRET": DING_SECRET}
    daemon = start_files_daemon(tmp_path_factory.mktemp("channel-files-workplace"), fake_llm, env=env)
    yield daemon
    daemon.stop()


# -- Teams ---------------------------------------------------------------------------------

TEAMS_APP = "a1b2c3d4-0000-4000-8000-0000000000f1"


@pytest.fixture(scope="module")
def teams(daemon):
    fake, port = FakeBotFramework(TEAMS_APP, ENV["TEAMS_APP_PASSWORD"]).start(), free_port()
    with serving(daemon, "teams", fake, app_id=TEAMS_APP, webhook_port=port,
                 service_url=fake.service_url, openid_url=f"{fake.url}/v1/.well-known/openidconfiguration",
                 token_url=f"{fake.url}/botframework.com/oauth2/v2.0/token", overrides={"typing_mode": "never"}):
        fake.listen = f"http://127.0.0.1:{port}/api/messages"
        yield fake


def teams_says(fake: FakeBotFramework, text: str, user: str, attachments: list, **kwargs) -> str:
    activity = fake.activity(text, user, **kwargs)
    activity["attachments"] = attachments
    answer = requests.post(fake.listen, data=json.dumps(activity), timeout=5, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {fake.token()}"})
    assert answer.status_code == 200, answer.text
    return activity["conversation"]["id"]


def teams_texts(fake: FakeBotFramework, chat: str) -> list[str]:
    return [s["activity"].get("text") for s in fake.sent if s["conversation"] == chat]


def test_teams_inline_image_reaches_a_vision_model(daemon, teams, fake_llm):
    marker = unique("teams-look")
    image = teams.inline_image(TINY_PNG)
    chat = teams_says(teams, f"<at>HelperBot</at> {marker}", "ann", [image],
                      conversation_type="groupChat", conversation="19:files@thread.v2")
    wait_for(lambda: teams_texts(teams, chat), what="reply to the image")
    content = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in content, content
    text = next(p["text"] for p in content if p["type"] == "text")
    assert text.startswith(f"{marker}\n[image image-1.png (image/png, {len(TINY_PNG)} bytes) attached; saved as inbox/")
    # With the bot's token, from the Connector's attachment store.
    assert teams.downloads.count(image["contentUrl"].split("/")[-3]) == 1


def test_teams_personal_file_is_an_upload_the_agent_reads(daemon, teams, fake_llm):
    name = unique("notes") + ".txt"
    secret = f"teams says {uuid.uuid4().hex[:8]}"
    chat = teams_says(teams, read_it(name), "bob", [teams.personal_file(secret.encode(), name, "txt")])
    wait_for(lambda: teams_texts(teams, chat), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(daemon, name)] == [("text/plain", len(secret))]


def test_teams_generated_image_is_posted_inline(daemon, teams):
    chat = teams_says(teams, draw(), "cat", [])
    wait_for(lambda: len(teams_texts(teams, chat)) == 2, what="image and reply")
    first = [s for s in teams.sent if s["conversation"] == chat][0]
    attachment = first["activity"]["attachments"][0]
    assert attachment["contentType"] == "image/png" and attachment["name"].endswith(".png")
    assert attachment["contentUrl"] == "data:image/png;base64," + base64.b64encode(TINY_PNG).decode()
    assert first["reply_to"] and first["activity"]["replyToId"] == first["reply_to"]


def test_teams_personal_chat_file_goes_through_file_consent(daemon, teams):
    write = json.dumps({"path": "output/report.txt", "content": "quarterly words"})
    chat = teams_says(teams, f"[[tool:file_write {write}]] write it", "eve", [])
    wait_for(lambda: len(teams_texts(teams, chat)) == 2, what="consent card and reply")
    card = next(s for s in teams.sent if s["conversation"] == chat and s["activity"].get("attachments"))
    consent = card["activity"]["attachments"][0]
    assert (consent["contentType"], consent["name"]) == ("application/vnd.microsoft.teams.card.file.consent",
                                                        "report.txt")
    assert consent["content"]["sizeInBytes"] == len(b"quarterly words")
    post = requests.post(teams.listen, data=json.dumps(teams.consent(card)), timeout=5, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {teams.token()}"})
    assert post.status_code == 200
    wait_for(lambda: len(teams_texts(teams, chat)) == 3, what="file card")
    assert teams.uploaded["report.txt"] == b"quarterly words"
    info = [s for s in teams.sent if s["conversation"] == chat][-1]["activity"]["attachments"][0]
    assert (info["contentType"], info["name"], info["content"]["fileType"]) == \
        ("application/vnd.microsoft.teams.card.file.info", "report.txt", "txt")
    # Answered once: the same consent again uploads nothing more.
    again = requests.post(teams.listen, data=json.dumps(teams.consent(card)), timeout=5, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {teams.token()}"})
    assert again.status_code == 200
    time.sleep(0.3)
    assert len(teams_texts(teams, chat)) == 3 and len(teams.sessions) == 1  # its session never used


def test_teams_files_off_its_hosts_are_not_fetched(daemon, teams, elsewhere):
    chat = teams_says(teams, "look", "dan", [teams.inline_image(TINY_PNG, url=f"{elsewhere.url}/x.png"),
                                             teams.personal_file(b"words", "w.txt", "txt",
                                                                 url=f"{elsewhere.url}/w.txt")])
    wait_for(lambda: len(teams_texts(teams, chat)) == 3, what="refusals and reply")
    where = f"it is not hosted by the platform (127.0.0.1:{elsewhere.port})."
    assert teams_texts(teams, chat) == [f"Sorry, I could not take image-1.png: {where}",
                                        f"Sorry, I could not take w.txt: {where}", "echo: look"]
    assert elsewhere.hits == []
    refused = [e["detail"]["reason"] for e in audit(daemon, "channel.file_refused", "teams")]
    assert len(refused) >= 2


# -- Webex ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def webex(daemon):
    fake = FakeWebex(ENV["WEBEX_BOT_TOKEN"])
    port = free_port()
    fake.start()
    with serving(daemon, "webex", fake, bot_token_env="WEBEX_BOT_TOKEN", api_url=fake.url,
                 webhook_port=port, webhook_url=f"http://127.0.0.1:{port}/webex"):
        wait_for(lambda: fake.webhooks, what="webhook registered")
        yield fake


def test_webex_image_reaches_a_vision_model(daemon, webex, fake_llm):
    marker, before = unique("webex-look"), len(webex.downloads)
    room = webex.user_sends_file("ann", TINY_PNG, "dot.png", "image/png", text=marker)
    wait_for(lambda: webex.replies(room), what="reply to the image")
    content = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in content, content
    text = next(p["text"] for p in content if p["type"] == "text")
    assert text.startswith(f"{marker}\n[image dot.png (image/png, {len(TINY_PNG)} bytes) attached; saved as inbox/dot")
    assert len(webex.downloads) == before + 1


def test_webex_file_is_an_upload_the_agent_reads(daemon, webex, fake_llm):
    name = unique("minutes") + ".txt"
    secret = f"webex says {uuid.uuid4().hex[:8]}"
    room = webex.user_sends_file("bob", secret.encode(), name, "text/plain", text=read_it(name))
    wait_for(lambda: webex.replies(room), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(daemon, name)] == [("text/plain", len(secret))]


def test_webex_generated_image_is_posted_as_a_file(daemon, webex):
    room = webex.user_says("cat", draw())
    wait_for(lambda: webex.replies(room), what="reply after drawing")
    posted = [u for u in webex.uploaded if u["room"] == room]
    assert [(u["content_type"], u["data"]) for u in posted] == [("image/png", TINY_PNG)]
    assert posted[0]["filename"].endswith(".png")


def test_webex_files_off_its_hosts_are_not_fetched(daemon, webex, elsewhere):
    room = webex.user_sends_file("dan", b"", "", "", text="look", url=f"{elsewhere.url}/x.png")
    wait_for(lambda: len(webex.replies(room)) == 2, what="refusal and reply")
    assert webex.replies(room) == [
        refusal("file-1", elsewhere), "echo: look"]
    assert elsewhere.hits == []
    # The size a HEAD declares over the cap: the file itself is never downloaded.
    before, big = len(webex.downloads), unique("big") + ".txt"
    room = webex.user_sends_file("eve", b"x" * (LIMIT + 1), big, "text/plain", text="big one")
    wait_for(lambda: len(webex.replies(room)) == 2, what="refusal and reply")
    assert webex.replies(room)[0] == \
        f"Sorry, I could not take {big}: it is {LIMIT + 1} bytes; files up to {LIMIT} bytes are accepted here."
    assert len(webex.downloads) == before


# -- Google Chat ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gchat(daemon):
    fake, port = FakeGoogleChat(GCHAT_PROJECT, GCHAT_ACCOUNT, GCHAT_KEY).start(), free_port()
    with serving(daemon, "google_chat", fake, project_number=GCHAT_PROJECT, webhook_port=port,
                 certs_url=fake.certs_url, token_url=f"{fake.url}/token", api_url=fake.url,
                 service_account_env="GOOGLE_CHAT_SERVICE_ACCOUNT"):
        fake.listen = f"http://127.0.0.1:{port}/chat-events"
        yield fake


def gchat_says(fake: FakeGoogleChat, text: str, user: str, attachments: list) -> str:
    event = fake.event(text, user, space=f"spaces/{user}dm")
    event["message"]["attachment"] = attachments
    answer = requests.post(fake.listen, data=json.dumps(event), timeout=5, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {fake.token()}"})
    assert answer.status_code == 200, answer.text
    return event["space"]["name"]


def gchat_texts(fake: FakeGoogleChat, space: str) -> list[str]:
    return [s["text"] for s in fake.sent if s["space"] == space]


def test_google_chat_image_reaches_a_vision_model(daemon, gchat, fake_llm):
    marker, before = unique("gchat-look"), len(gchat.downloads)
    space = gchat_says(gchat, marker, "ann", [gchat.attachment(TINY_PNG, "dot.png", "image/png")])
    wait_for(lambda: gchat_texts(gchat, space), what="reply to the image")
    content = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in content, content
    assert len(gchat.downloads) == before + 1  # media.download with the app's token


def test_google_chat_file_is_an_upload_the_agent_reads(daemon, gchat, fake_llm):
    name = unique("plan") + ".txt"
    secret = f"chat says {uuid.uuid4().hex[:8]}"
    space = gchat_says(gchat, read_it(name), "bob", [gchat.attachment(secret.encode(), name, "text/plain")])
    wait_for(lambda: gchat_texts(gchat, space), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(daemon, name)] == [("text/plain", len(secret))]


def test_google_chat_reads_files_from_its_api_only_and_sends_none(daemon, gchat, elsewhere):
    item = gchat.attachment(b"words", "w.txt", "text/plain")
    item["downloadUri"] = item["thumbnailUri"] = f"{elsewhere.url}/w.txt"
    drive = {"name": "spaces/x/messages/y/attachments/z", "contentName": "doc", "source": "DRIVE_FILE",
             "driveDataRef": {"driveFileId": "1abc"}, "downloadUri": f"{elsewhere.url}/doc"}
    before = len(gchat.downloads)
    space = gchat_says(gchat, draw(), "cat", [item, drive])
    wait_for(lambda: gchat_texts(gchat, space), what="reply after drawing")
    assert elsewhere.hits == [] and len(gchat.downloads) == before + 1  # from the API, by resourceName
    failed = [e["detail"] for e in audit(daemon, "channel.send_failed", "google_chat")]
    assert failed and failed[0]["file"].endswith(".png")
    assert "media.upload requires user authentication" in failed[0]["error"]


# -- Feishu --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def feishu(daemon):
    fake, port = FakeFeishu("cli_files", ENV["FEISHU_APP_SECRET"]).start(), free_port()
    with serving(daemon, "feishu", fake, webhook_port=port, api_url=fake.url, app_id="cli_files",
                 encrypt_key_env="FEISHU_ENCRYPT_KEY", verification_token_env="FEISHU_VERIFICATION_TOKEN"):
        fake.listen = f"http://127.0.0.1:{port}/feishu/webhook"
        yield fake


def feishu_sends(fake: FakeFeishu, user: str, kind: str, content: dict, message_id: str) -> str:
    event = message_event("", user, ENV["FEISHU_VERIFICATION_TOKEN"], message_type=kind, content=content,
                          message_id=message_id)
    body, headers = callback(event, ENV["FEISHU_ENCRYPT_KEY"])
    assert requests.post(fake.listen, data=body, headers=headers, timeout=5).status_code == 200
    return message_id


def feishu_replies(fake: FakeFeishu, message_id: str) -> list:
    return [s for s in fake.sent if s["to"] == message_id]


def test_feishu_image_reaches_a_vision_model(daemon, feishu, fake_llm):
    message = "om_" + uuid.uuid4().hex
    key = feishu.resource(message, "image", TINY_PNG)
    feishu_sends(feishu, "ou_ann", "image", {"image_key": key}, message)
    wait_for(lambda: feishu_replies(feishu, message), what="reply to the image")
    content = user_turns(fake_llm, key)[-1]
    assert IMAGE_PART in content, content
    assert content[0]["text"].startswith(f"[image {key} (image/png, {len(TINY_PNG)} bytes) attached;")
    assert feishu.downloads.count(key) == 1


def test_feishu_file_and_post_images(daemon, feishu, fake_llm, elsewhere):
    name, message = unique("report") + ".txt", "om_" + uuid.uuid4().hex
    secret = f"feishu says {uuid.uuid4().hex[:8]}"
    key = feishu.resource(message, "file", secret.encode())
    feishu_sends(feishu, "ou_bob", "file", {"file_key": key, "file_name": name}, message)
    wait_for(lambda: feishu_replies(feishu, message), what="reply to the file")
    assert [(u["content_type"], u["size"]) for u in uploads_named(daemon, name)] == [("text/plain", len(secret))]
    # A rich-text post: its words are the text, its images are attached.
    post_id, marker = "om_" + uuid.uuid4().hex, unique("feishu-post")
    image = feishu.resource(post_id, "image", TINY_PNG)
    # A key that is a URL elsewhere is not a resource of the message: nothing is fetched for it.
    post = {"title": "", "content": [[{"tag": "text", "text": marker}], [{"tag": "img", "image_key": image}],
                                     [{"tag": "img", "image_key": f"{elsewhere.url}/x.png"}]]}
    feishu_sends(feishu, "ou_bob", "post", post, post_id)
    wait_for(lambda: feishu_replies(feishu, post_id), what="reply to the post")
    content = user_turns(fake_llm, marker)[-1]
    assert content.count(IMAGE_PART) == 1 and content[0]["text"].startswith(f"{marker}\n[image {image} (image/png")
    assert elsewhere.hits == []


def test_feishu_generated_image_and_output_file_are_uploaded_and_sent(daemon, feishu):
    message = "om_" + uuid.uuid4().hex
    write = json.dumps({"path": "output/summary.pdf", "content": "%PDF-1.4 tiny"})
    picture = '{"prompt": "a red square", "model": "dall-e-2"}'
    feishu_sends(feishu, "ou_cat", "text", {"text": f"[[tools:image_generate {picture} | file_write {write}]] go"},
                 message)
    wait_for(lambda: len(feishu_replies(feishu, message)) == 3, what="image, file and reply")
    image, document, text = feishu_replies(feishu, message)
    assert (image["msg_type"], feishu.uploads[image["key"]]["data"]) == ("image", TINY_PNG)
    assert feishu.uploads[image["key"]]["image_type"] == "message"
    uploaded = feishu.uploads[document["key"]]
    assert (document["msg_type"], uploaded["file_type"], uploaded["file_name"], uploaded["data"]) == \
        ("file", "pdf", "summary.pdf", b"%PDF-1.4 tiny")
    assert text["text"].startswith("tool said: ")  # the text reply comes after the files


# -- DingTalk ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dingtalk(daemon):
    fake = FakeDingTalk(ENV["DINGTALK_ACCESS_TOKEN"], ENV["DINGTALK_SECRET"], DING_APP, DING_SECRET).start()
    port = free_port()
    with serving(daemon, "dingtalk", fake, webhook_port=port, api_url=fake.url, openapi_url=fake.url,
                 app_key=DING_APP, app_secret_env="DINGTALK_APP_SECRET"):
        fake.listen = f"http://127.0.0.1:{port}/dingtalk"
        yield fake


def ding_sends(fake: FakeDingTalk, staff: str, msgtype: str, content: dict | None, text: str = "",
               group: bool = False) -> str:
    body, headers = fake.callback(text, staff, group=group, msgtype=msgtype, content=content)
    assert requests.post(fake.listen, data=body, headers=headers, timeout=5).status_code == 200
    return json.loads(body)["sessionWebhook"].rpartition("session=")[2]


def ding_replies(fake: FakeDingTalk, session: str) -> list[str]:
    return [s["content"] for s in fake.sent if s["session"] == session]


def test_dingtalk_picture_reaches_a_vision_model(daemon, dingtalk, fake_llm):
    before = len(dingtalk.downloads)
    code = dingtalk.file_code(TINY_PNG)
    body, headers = dingtalk.callback("", "staff-ann", group=False, msgtype="picture",
                                      content={"downloadCode": code, "pictureDownloadCode": code})
    assert requests.post(dingtalk.listen, data=body, headers=headers, timeout=5).status_code == 200
    session, message = json.loads(body)["sessionWebhook"].rpartition("session=")[2], json.loads(body)["msgId"]
    wait_for(lambda: ding_replies(dingtalk, session), what="reply to the picture")
    content = user_turns(fake_llm, f"picture-{message}-1")[-1]
    assert IMAGE_PART in content, content
    assert content[0]["text"].startswith(f"[image picture-{message}-1 (image/png, {len(TINY_PNG)} bytes) attached")
    assert len(dingtalk.downloads) == before + 1  # the temporary URL messageFiles/download gave


def test_dingtalk_file_and_rich_text(daemon, dingtalk, fake_llm):
    name = unique("memo") + ".txt"
    secret = f"dingtalk says {uuid.uuid4().hex[:8]}"
    session = ding_sends(dingtalk, "staff-bob", "file", {"downloadCode": dingtalk.file_code(secret.encode()),
                                                         "fileName": name})
    wait_for(lambda: ding_replies(dingtalk, session), what="reply to the file")
    assert [(u["content_type"], u["size"]) for u in uploads_named(daemon, name)] == [("text/plain", len(secret))]
    marker = unique("ding-rich")
    rich = {"richText": [{"text": marker}, {"type": "picture", "downloadCode": dingtalk.file_code(TINY_PNG)}]}
    session = ding_sends(dingtalk, "staff-bob", "richText", rich)
    wait_for(lambda: ding_replies(dingtalk, session), what="reply to the rich text")
    content = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in content and content[0]["text"].startswith(f"{marker}\n[image picture-")


def test_dingtalk_generated_image_goes_out_through_the_robot_api(daemon, dingtalk):
    session = ding_sends(dingtalk, "staff-cat", "text", None, text=draw(), group=True)
    wait_for(lambda: ding_replies(dingtalk, session), what="reply after drawing")
    sent = [f for f in dingtalk.robot_files if f["kind"] == "group"]
    assert [(f["to"], f["msg_key"], f["type"], f["data"]) for f in sent] == \
        [("cidGroup123==", "sampleImageMsg", "image", TINY_PNG)]


def test_dingtalk_redirect_off_its_hosts_is_refused(daemon, dingtalk, elsewhere):
    dingtalk.redirect_downloads = f"{elsewhere.url}/x.txt"
    try:
        session = ding_sends(dingtalk, "staff-dan", "file", {"downloadCode": dingtalk.file_code(b"words"),
                                                             "fileName": "w.txt"})
        wait_for(lambda: ding_replies(dingtalk, session), what="refusal")
    finally:
        dingtalk.redirect_downloads = ""
    assert ding_replies(dingtalk, session) == [
        refusal("w.txt", elsewhere)]
    assert elsewhere.hits == []
