"""Files and images on WhatsApp (Cloud API), Signal, LINE, Viber and Messenger, through the
real daemon (one for the module) and each platform's fake: an image reaches a vision model
as an image part, a file becomes an upload the agent reads, what the agent makes is posted
back with the platform's upload API (or, where the platform takes only public URLs, the
refusal is audited and the text still goes), and a file off the platform's hosts is never
fetched."""

from __future__ import annotations

import uuid

import pytest
import requests

from channel_contract import ENV
from channel_fixtures import audit, wait_for
from fakellm import TINY_PNG
from fakes import line as line_fake, viber as viber_fake
from fakes.line import FakeLine
from fakes.messenger import FakeMessenger, event as messenger_event, signature as meta_signature
from fakes.signal import BOT as SIGNAL_BOT, NUMBERS as SIGNAL_NUMBERS, FakeSignal
from fakes.viber import FakeViber
from fakes.whatsapp import PHONE_ID, FakeWhatsApp, event as whatsapp_event
from support import free_port
from files_support import (IMAGE_PART, LIMIT, draw, elsewhere, files_daemon, read_it,  # noqa: F401 - fixtures
                           refusal, serving, tool_results, unique, upload_bytes, uploads_named, user_turns)


def hook(daemon, name: str) -> str:
    return f"{daemon.url}/channels/{name}/webhook"


def send_failures(daemon, channel: str) -> list[dict]:  # type: ignore[type-arg]
    return [e["detail"] for e in audit(daemon, "channel.send_failed", channel) if e["detail"].get("file")]


# -- WhatsApp Cloud API --------------------------------------------------------------------

@pytest.fixture
def whatsapp(files_daemon):
    fake = FakeWhatsApp(ENV["WHATSAPP_ACCESS_TOKEN"]).start()
    with serving(files_daemon, "whatsapp", fake, api_url=fake.url, phone_number_id=PHONE_ID):
        yield fake


def whatsapp_post(daemon, body: bytes) -> None:  # type: ignore[no-untyped-def]
    answer = requests.post(hook(daemon, "whatsapp"), data=body, timeout=5, headers={
        "Content-Type": "application/json", "X-Hub-Signature-256": meta_signature(ENV["WHATSAPP_APP_SECRET"], body)})
    assert answer.status_code == 200, answer.text


def whatsapp_texts(fake: FakeWhatsApp, to: str) -> list[str]:
    return [s["text"] for s in fake.sent if s["to"] == to]


def test_whatsapp_media_in_through_the_media_url_lookup(files_daemon, whatsapp, fake_llm, elsewhere):  # noqa: F811
    marker = unique("wa-look")
    whatsapp_post(files_daemon, whatsapp.user_sends_file("15550001001", TINY_PNG, "image/png", caption=marker))
    wait_for(lambda: whatsapp_texts(whatsapp, "15550001001"), what="reply to the image")
    turn = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in turn
    media_id = next(iter(whatsapp.media))
    name = f"image-{media_id[-6:]}.png"
    assert f"[image {name} (image/png, {len(TINY_PNG)} bytes) attached; saved as inbox/{name}" in turn[0]["text"]
    assert whatsapp.lookups == whatsapp.downloads == [media_id]  # looked up, then fetched with the token
    # A document: its own file name, read by the agent's file tools.
    name, secret = unique("minutes") + ".txt", f"whatsapp says {uuid.uuid4().hex[:8]}"
    whatsapp_post(files_daemon, whatsapp.user_sends_file("15550001002", secret.encode(), "text/plain", "document",
                                                         filename=name, caption=read_it(name)))
    wait_for(lambda: whatsapp_texts(whatsapp, "15550001002"), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert [(u["content_type"], u["size"]) for u in uploads_named(files_daemon, name)] == [("text/plain", len(secret))]
    # The media URL the platform names is elsewhere: never fetched.
    whatsapp.media_host = elsewhere.url
    whatsapp_post(files_daemon, whatsapp.user_sends_file("15550001003", TINY_PNG, "image/jpeg"))
    wait_for(lambda: whatsapp_texts(whatsapp, "15550001003"), what="refusal")
    far = f"image-{list(whatsapp.media)[-1][-6:]}.jpg"
    assert whatsapp_texts(whatsapp, "15550001003") == [refusal(far, elsewhere)]
    assert elsewhere.hits == []


def test_whatsapp_generated_image_and_output_file_are_uploaded_and_sent(files_daemon, whatsapp):
    both = ('[[tools:image_generate {"prompt": "a red square", "model": "dall-e-2"} | '
            'file_write {"path": "output/summary.txt", "content": "all done"}]] make them')
    whatsapp_post(files_daemon, whatsapp_event(both, "15550001004"))
    wait_for(lambda: whatsapp_texts(whatsapp, "15550001004"), what="reply after making files")
    sent = [(m["type"], m["mime_type"], m["filename"], m["data"]) for m in whatsapp.sent_media]
    assert sent == [("image", "image/png", None, TINY_PNG), ("document", "text/plain", "summary.txt", b"all done")]
    uploaded = [m for m in whatsapp.media.values() if m["by"] == "bot"]
    assert [(m["filename"], m["mime_type"]) for m in uploaded][1] == ("summary.txt", "text/plain")


# -- Signal (signal-cli REST API) ----------------------------------------------------------

@pytest.fixture
def signal(files_daemon):
    fake = FakeSignal().start()
    with serving(files_daemon, "signal", fake, api_url=fake.url, phone_number=SIGNAL_BOT, poll_interval_secs=0.1):
        yield fake


def test_signal_attachments_both_ways(files_daemon, signal, fake_llm):
    ann, bob = SIGNAL_NUMBERS["ann"], SIGNAL_NUMBERS["bob"]
    marker = unique("signal-look")
    first = signal.user_sends_file("ann", TINY_PNG, None, "image/png", text=marker)
    wait_for(lambda: signal.replies(ann), what="reply to the image")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    assert f"[image {first} (image/png" in user_turns(fake_llm, marker)[-1][0]["text"]  # no name: its id
    name, secret = unique("plan") + ".md", f"signal says {uuid.uuid4().hex[:8]}"
    signal.user_sends_file("bob", secret.encode(), name, "text/markdown", text=read_it(name))
    wait_for(lambda: signal.replies(bob), what="reply after reading")
    assert tool_results(fake_llm, secret) == [secret]
    assert uploads_named(files_daemon, name)[0]["content_type"] == "text/markdown"
    big = unique("big") + ".txt"
    signal.user_sends_file("ann", b"x" * 10, big, "text/plain", size=LIMIT + 1)
    wait_for(lambda: len(signal.replies(ann)) == 2, what="refusal")
    assert signal.replies(ann)[1] == \
        f"Sorry, I could not take {big}: it is {LIMIT + 1} bytes; files up to {LIMIT} bytes are accepted here."
    assert len(signal.downloads) == 2  # the big one was never fetched
    signal.user_says("ann", draw())
    wait_for(lambda: len(signal.replies(ann)) == 3, what="reply after drawing")
    assert [(f["recipients"], f["content_type"], f["data"]) for f in signal.files] == [([ann], "image/png", TINY_PNG)]
    assert signal.files[0]["filename"].endswith(".png")


# -- LINE ----------------------------------------------------------------------------------

@pytest.fixture
def line(files_daemon):
    fake = FakeLine(ENV["LINE_CHANNEL_ACCESS_TOKEN"]).start()
    with serving(files_daemon, "line", fake, api_url=fake.url):
        yield fake


def line_post(daemon, body: bytes) -> None:  # type: ignore[no-untyped-def]
    answer = requests.post(hook(daemon, "line"), data=body, timeout=5, headers={
        "Content-Type": "application/json",
        "X-Line-Signature": line_fake.signature(ENV["LINE_CHANNEL_SECRET"], body)})
    assert answer.status_code == 200, answer.text


def test_line_content_in_from_the_data_api_and_no_upload_out(files_daemon, line, fake_llm, elsewhere):  # noqa: F811
    body, message_id = line.user_sends_file("Uann01", TINY_PNG, "image/png")
    line_post(files_daemon, body)
    wait_for(lambda: len(line.sent) == 1, what="reply to the image")
    assert line.downloads == [message_id]
    name = f"image-{message_id[-6:]}.jpg"
    turn = user_turns(fake_llm, name)[-1]
    assert IMAGE_PART in turn
    # A file message: its own name, read by the agent.
    name, secret = unique("notes") + ".txt", f"line says {uuid.uuid4().hex[:8]}"
    body, _ = line.user_sends_file("Uann02", secret.encode(), "text/plain", "file", filename=name)
    line_post(files_daemon, body)
    wait_for(lambda: len(line.sent) == 2, what="reply to the file")
    assert upload_bytes(files_daemon, name) == secret.encode()
    assert f"[file {name} (text/plain, {len(secret)} bytes) received" in line.sent[1]["texts"][0]
    # An image the sender's app hosts itself is not LINE's: never fetched.
    body, message_id = line.user_sends_file("Uann03", TINY_PNG, "image/png", external=f"{elsewhere.url}/x.png")
    line_post(files_daemon, body)
    wait_for(lambda: len(line.sent) == 3, what="refusal")
    assert line.sent[2]["texts"] == [refusal(f"image-{message_id[-6:]}.jpg", elsewhere)]
    assert elsewhere.hits == []
    # What the agent makes cannot go out (LINE takes files only by public URL): said in the audit.
    line_post(files_daemon, line_fake.event(draw(), "Uann04"))
    wait_for(lambda: len(line.sent) == 4, what="text reply after drawing")
    assert line.sent[3]["texts"][0].startswith("tool said: ")
    failed = send_failures(files_daemon, "line")[0]
    assert failed["error"] == "line: LINE sends only files hosted at a public HTTPS URL (no upload API for bots)"


# -- Viber ---------------------------------------------------------------------------------

@pytest.fixture
def viber(files_daemon):
    fake, port = FakeViber(ENV["VIBER_AUTH_TOKEN"]).start(), free_port()
    # Its own listener: Viber calls the URL back while set_webhook is answered, during start.
    fake.hook = f"http://127.0.0.1:{port}/viber"
    with serving(files_daemon, "viber", fake, api_url=fake.url, webhook_port=port, webhook_url=fake.hook):
        yield fake


def viber_post(fake: FakeViber, body: bytes) -> None:
    answer = requests.post(fake.hook, data=body, timeout=5, headers={
        "X-Viber-Content-Signature": viber_fake.signature(ENV["VIBER_AUTH_TOKEN"], body)})
    assert answer.status_code == 200, answer.text


def viber_texts(fake: FakeViber, to: str) -> list[str]:
    return [s["text"] for s in fake.sent if s["to"] == to]


def test_viber_media_in_from_its_media_url_and_no_upload_out(files_daemon, viber, fake_llm, elsewhere):  # noqa: F811
    marker = unique("viber-look")
    viber_post(viber, viber.user_sends_file("vann01==", TINY_PNG, "image/jpeg", text=marker))
    wait_for(lambda: viber_texts(viber, "vann01=="), what="reply to the picture")
    assert IMAGE_PART in user_turns(fake_llm, marker)[-1]
    name, secret = unique("list") + ".txt", f"viber says {uuid.uuid4().hex[:8]}"
    viber_post(viber, viber.user_sends_file("vann02==", secret.encode(), "text/plain", "file", filename=name))
    wait_for(lambda: viber_texts(viber, "vann02=="), what="reply to the file")
    assert upload_bytes(files_daemon, name) == secret.encode()
    assert len(viber.downloads) == 2
    off = unique("off") + ".png"
    viber_post(viber, viber.user_sends_file("vann03==", TINY_PNG, "image/png", "file", filename=off,
                                                   url=f"{elsewhere.url}/{off}"))
    wait_for(lambda: viber_texts(viber, "vann03=="), what="refusal")
    assert viber_texts(viber, "vann03==") == [refusal(off, elsewhere)]
    assert elsewhere.hits == []
    viber_post(viber, viber_fake.event(draw(), "vann04=="))
    wait_for(lambda: viber_texts(viber, "vann04=="), what="text reply after drawing")
    assert send_failures(files_daemon, "viber")[0]["error"] == \
        "viber: Viber sends only files hosted at a public URL (no upload API for bots)"


# -- Messenger -----------------------------------------------------------------------------

@pytest.fixture
def messenger(files_daemon):
    fake = FakeMessenger(ENV["MESSENGER_PAGE_TOKEN"]).start()
    with serving(files_daemon, "messenger", fake, api_url=fake.url):
        yield fake


def messenger_post(daemon, body: bytes) -> None:  # type: ignore[no-untyped-def]
    answer = requests.post(hook(daemon, "messenger"), data=body, timeout=5, headers={
        "Content-Type": "application/json",
        "X-Hub-Signature-256": meta_signature(ENV["MESSENGER_APP_SECRET"], body)})
    assert answer.status_code == 200, answer.text


def messenger_texts(fake: FakeMessenger, to: str) -> list[str]:
    return [s["text"] for s in fake.sent if s["to"] == to]


def test_messenger_attachments_both_ways(files_daemon, messenger, fake_llm, elsewhere):  # noqa: F811
    marker = unique("fb-look")
    messenger_post(files_daemon, messenger.user_sends_file("psid-f1", TINY_PNG, "image/png", "pic.png", text=marker))
    wait_for(lambda: messenger_texts(messenger, "psid-f1"), what="reply to the image")
    turn = user_turns(fake_llm, marker)[-1]
    assert IMAGE_PART in turn and "_pic.png (image/png" in turn[0]["text"]  # named after the CDN path
    name, secret = unique("memo") + ".txt", f"messenger says {uuid.uuid4().hex[:8]}"
    messenger_post(files_daemon, messenger.user_sends_file("psid-f2", secret.encode(), "text/plain", name, "file"))
    wait_for(lambda: messenger_texts(messenger, "psid-f2"), what="reply to the file")
    stored = [u["filename"] for u in files_daemon.get(f"/api/agents/{files_daemon.filer}/uploads").json()
              if u["filename"].endswith("_" + name)]
    assert upload_bytes(files_daemon, stored[0]) == secret.encode()
    off = unique("off") + ".png"
    messenger_post(files_daemon, messenger.user_sends_file("psid-f3", TINY_PNG, "image/png", off,
                                                           url=f"{elsewhere.url}/{off}"))
    wait_for(lambda: messenger_texts(messenger, "psid-f3"), what="refusal")
    assert messenger_texts(messenger, "psid-f3") == [refusal(off, elsewhere)]
    assert elsewhere.hits == [] and len(messenger.downloads) == 2
    messenger_post(files_daemon, messenger_event(draw(), "psid-f4"))
    wait_for(lambda: messenger_texts(messenger, "psid-f4"), what="reply after drawing")
    assert [(f["to"], f["type"], f["content_type"], f["data"]) for f in messenger.files] == \
        [("psid-f4", "image", "image/png", TINY_PNG)]
