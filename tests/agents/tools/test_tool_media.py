"""Media tools through the real daemon: the fake LLM calls them and serves OpenAI's audio and image endpoints.

A second provider, Groq (speech-to-text only), is a local stand-in that hands chat requests to the
fake LLM and answers /audio/transcriptions as each test sets it: its error answers, a missing
transcript and a refused connection reach the agent as exact tool errors."""

from __future__ import annotations

import base64
import http.server
import json
import re
import struct
import threading
import uuid
from email.parser import BytesParser
from email.policy import HTTP

import pytest
import requests

from agentd.agents.tools import ToolError
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from fakellm import TINY_PNG
from support import Daemon, make_home, stop_shared
from tests.agents.tools.tool_calls import call

ANTHROPIC = '[model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n'
NO_VISION = '[model]\nprovider = "deepseek"\nmodel = "deepseek-chat"\n'
GROQ = '[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n'
NOT_IN_CATALOG = '[model]\nprovider = "openai"\nmodel = "my-own-finetune"\n'
# A transcript longer than this many bytes is cut (the daemon's tools.shell_max_output_bytes).
OUTPUT_CAP = 48


class GroqStandIn:
    """Groq's OpenAI-compatible API: chat goes on to the fake LLM; /audio/transcriptions answers
    `answer` (status, body) and records each request's path, headers and multipart fields."""

    def __init__(self, chat_base: str) -> None:
        self.answer: tuple[int, bytes] | None = (200, b'{"text": "hello"}')
        self.transcriptions: list[dict] = []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/chat/completions"):
                    r = requests.post(chat_base + "/chat/completions", data=raw, timeout=30,
                                      headers={"Content-Type": "application/json",
                                               "Authorization": "Bearer test-openai"})
                    status, body, kind = r.status_code, r.content, r.headers.get("Content-Type", "")
                else:
                    stand_in.transcriptions.append({"path": self.path, "headers": dict(self.headers),
                                                    "form": fields(self.headers["Content-Type"], raw)})
                    if stand_in.answer is None:   # the connection ends without an answer
                        self.close_connection = True
                        return
                    (status, body), kind = stand_in.answer, "application/json"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        # (with a trailing slash, as a configured URL may have)
        self.base = f"http://127.0.0.1:{self.server.server_port}/openai/v1/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fields(content_type: str, raw: bytes) -> dict:
    """A multipart body's fields: text as str, a file as {filename, type, size}."""
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
    out: dict = {}
    for part in message.iter_parts():
        data = part.get_payload(decode=True) or b""
        name = part.get_param("name", header="content-disposition")
        out[name] = data.decode() if part.get_filename() is None else {
            "filename": part.get_filename(), "type": part.get_content_type(), "size": len(data)}
    return out


@pytest.fixture(scope="module")
def groq(fake_llm):
    stand_in = GroqStandIn(fake_llm.openai_base)
    yield stand_in
    stand_in.close()


@pytest.fixture(scope="module")
def md(tmp_path_factory, fake_llm, groq):
    extra = f'groq = "{groq.base}"\n\n[tools]\nshell_max_output_bytes = {OUTPUT_CAP}\n'
    home = make_home(tmp_path_factory.mktemp("media"), llm_config(fake_llm, extra + NO_REMEMBERING))
    daemon = Daemon(home, env_extra={**LLM_ENV, "GROQ_API_KEY": "test-groq"}).start()
    yield daemon
    stop_shared(daemon)


def agent_with_files(d: Daemon, model: str = "", **files: bytes) -> str:
    name = f"m-{uuid.uuid4().hex[:8]}"
    model = model or '[model]\nprovider = "default"\nmodel = "default"\n'
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n{model}'})
    assert r.status_code == 201, r.text
    workspace = d.home / "workspaces" / name
    workspace.mkdir(parents=True, exist_ok=True)
    for filename, data in files.items():
        (workspace / filename.replace("_", ".")).write_bytes(data)
    return r.json()["agent_id"]


def last(fake, path: str) -> dict:
    return [r for r in fake.requests if r["path"] == path][-1]


def test_images_go_to_a_vision_model(md, fake_llm) -> None:
    agent = agent_with_files(md, pic_png=TINY_PNG)
    meta = json.loads(call(md, agent, "image_analyze", path="pic.png"))
    assert (meta["format"], meta["size_bytes"], meta["width"], meta["height"]) == ("png", len(TINY_PNG), 1, 1)
    assert call(md, agent, "media_describe", path="pic.png", prompt="what is on it") == "echo: what is on it"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(TINY_PNG).decode()}}
    asked = [r["json"]["messages"] for r in fake_llm.requests if r["path"] == "/v1/chat/completions"
             and isinstance(r["json"]["messages"][-1]["content"], list)
             and image in r["json"]["messages"][-1]["content"]]
    assert asked and asked[-1][-1]["content"] == [{"type": "text", "text": "what is on it"}, image], \
        "BUG: the image did not reach the agent's model with the prompt"
    analysed = json.loads(call(md, agent, "image_analyze", path="pic.png", prompt="and now"))
    assert analysed["analysis"] == "echo: and now"
    blind = agent_with_files(md, NO_VISION, pic_png=TINY_PNG)
    assert call(md, blind, "media_describe", path="pic.png") == \
        "error: model deepseek-chat does not support images (vision): use a vision-capable model"
    assert call(md, agent, "media_describe", path="notes.txt") == "error: no such file in the workspace: notes.txt"


def test_speech_to_text_and_back(md, fake_llm) -> None:
    agent = agent_with_files(md, talk_wav=b"RIFF0000WAVEfmt fake audio")
    assert call(md, agent, "speech_to_text", path="talk.wav", language="en") == \
        "transcript of talk.wav (26 bytes) in en"
    assert last(fake_llm, "/v1/audio/transcriptions")["form"] == {
        "model": "whisper-1", "response_format": "json", "language": "en",
        "file": {"filename": "talk.wav", "size": 26}}
    assert call(md, agent, "media_transcribe", path="talk.wav") == "transcript of talk.wav (26 bytes)"
    saved = json.loads(call(md, agent, "text_to_speech", text="hello there", voice="nova"))
    assert last(fake_llm, "/v1/audio/speech")["json"] == {"model": "tts-1", "input": "hello there",
                                                          "voice": "nova", "response_format": "mp3"}
    assert saved["content_type"] == "audio/mpeg" and saved["path"].startswith("output/speech-")
    audio = md.get(f"/api/agents/{agent}/uploads/{saved['file_id']}")
    assert audio.content == b"FAKEAUDIO:hello there" and audio.headers["Content-Type"] == "audio/mpeg"
    name = md.get(f"/api/agents/{agent}").json()["name"]
    assert (md.home / "workspaces" / name / saved["path"]).read_bytes() == b"FAKEAUDIO:hello there"
    assert call(md, agent, "text_to_speech", text="x", voice="robot") == \
        "error: voice must be one of alloy, echo, fable, onyx, nova, shimmer"


def test_image_generation_stores_uploads(md, fake_llm) -> None:
    agent = agent_with_files(md)
    made = json.loads(call(md, agent, "image_generate", prompt="a red square", model="gpt-image-1", count=2))
    assert last(fake_llm, "/v1/images/generations")["json"] == {"model": "gpt-image-1", "prompt": "a red square",
                                                                "n": 2, "size": "1024x1024"}
    assert len(made["images"]) == 2
    for image in made["images"]:
        assert image["content_type"] == "image/png"
        assert md.get(f"/api/agents/{agent}/uploads/{image['file_id']}").content == TINY_PNG
    assert call(md, agent, "image_generate", prompt="x", count=2) == "error: count must be 1 to 4 (dall-e-3 makes 1)"
    assert call(md, agent, "image_generate", prompt="x", model="dall-e-2", count=0) == \
        "error: count must be 1 to 4 (dall-e-3 makes 1)"
    assert call(md, agent, "image_generate", prompt="x", size="4096x4096") == \
        "error: size must be one of 1024x1024, 1792x1024, 1024x1792 for dall-e-3, not '4096x4096'"
    assert call(md, agent, "image_generate", prompt="x", model="gpt-image-1", quality="hd") == \
        "error: quality must be one of low, medium, high, auto for gpt-image-1, not 'hd'"
    events = [e for e in md.get("/api/audit/recent?limit=20").json() if e["event"] == "tool.image_generate"]
    assert events[0]["detail"]["file_ids"] == [i["file_id"] for i in made["images"]]


def test_a_provider_without_the_endpoint_is_named(md) -> None:
    agent = agent_with_files(md, ANTHROPIC, talk_wav=b"RIFF")
    assert call(md, agent, "text_to_speech", text="hi") == \
        "error: text-to-speech is not available: provider anthropic has no OpenAI-compatible /audio/speech endpoint"
    assert call(md, agent, "speech_to_text", path="talk.wav") == ("error: speech-to-text is not available: provider "
                                                                  "anthropic has no OpenAI-compatible "
                                                                  "/audio/transcriptions endpoint")
    assert call(md, agent, "image_generate", prompt="x") == ("error: image generation is not available: provider "
                                                             "anthropic has no OpenAI-compatible /images/generations "
                                                             "endpoint")


def test_observe_mode_offers_no_generation(md) -> None:
    agent = agent_with_files(md)
    assert md.put(f"/api/agents/{agent}/mode", json={"mode": "Observe"}).status_code == 200
    r = md.post(f"/api/agents/{agent}/message", json={"message": '[[tool:text_to_speech {"text": "hi"}]]'})
    assert "permission denied: tool 'text_to_speech' is not available" in r.json()["response"]


def audited(d: Daemon, event: str) -> list[dict]:
    return [e["detail"] for e in d.get(f"/api/audit/recent?limit=200&event={event}").json()]


def workspace(d: Daemon, agent: str):
    return d.home / "workspaces" / d.get(f"/api/agents/{agent}").json()["name"]


def jpeg(marker: int, height: int = 480, width: int = 640) -> bytes:
    """A JPEG header: SOI, an APP0 and a DHT segment to skip, then the frame segment `marker`."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
    dht = b"\xff\xc4" + struct.pack(">H", 5) + bytes(3)
    frame = bytes([0xFF, marker]) + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + dht + frame


FRAMES = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)


def test_dimensions_are_read_from_each_kind_of_header(md) -> None:
    gif = b"GIF89a" + struct.pack("<HH", 3, 2)
    files = {"full_gif": gif + bytes(600), "edge_gif": gif, "short_gif": gif[:9],
             "edge_png": TINY_PNG[:24], "short_png": TINY_PNG[:23],
             **{f"f{m:x}_jpg": jpeg(m) for m in FRAMES}}
    cut = jpeg(0xC0)
    frame_at = cut.index(b"\xff\xc0")
    files.update(edge_jpg=cut[:frame_at + 10], short_jpg=cut[:frame_at + 9])
    # Header fields are unsigned: past 32767 (GIF) or 2**31 - 1 (PNG) they stay positive.
    files.update(wide_gif=b"GIF89a" + struct.pack("<HH", 40000, 65535),
                 wide_png=TINY_PNG[:16] + struct.pack(">II", 2**31, 2**32 - 1) + TINY_PNG[24:],
                 wide_jpg=b"\xff\xd8\xff\xe1" + struct.pack(">H", 40000) + bytes(39998)
                 + jpeg(0xC0, height=40000, width=50000)[2:],
                 pic_webp=b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + bytes(22))
    agent = agent_with_files(md, **files)

    def analyze(name: str) -> dict:
        call(md, agent, "image_analyze", path=name)   # (the fake LLM repeats 500 characters of it)
        tools = [t for m in md.get(f"/api/agents/{agent}/session").json()["messages"] for t in m.get("tools", [])]
        return json.loads(tools[-1]["result"])

    call(md, agent, "image_analyze", path="full.gif")   # (the fake LLM repeats 500 characters of it)
    tools = [t for m in md.get(f"/api/agents/{agent}/session").json()["messages"] for t in m.get("tools", [])]
    assert json.loads(tools[-1]["result"]) == {"format": "gif", "size_bytes": 610, "width": 3, "height": 2,
                                               "preview_base64": base64.b64encode(files["full_gif"][:512]).decode()}
    assert [(m["width"], m["height"]) for m in map(analyze, ("edge.gif", "short.gif", "edge.png", "short.png"))] == [
        (3, 2), (None, None), (1, 1), (None, None)]
    for marker in FRAMES:
        got = analyze(f"f{marker:x}.jpg")
        assert (got["format"], got["width"], got["height"]) == ("jpeg", 640, 480), hex(marker)
    assert (analyze("edge.jpg")["width"], analyze("short.jpg")["width"]) == (640, None)
    assert [(m["width"], m["height"]) for m in map(analyze, ("wide.gif", "wide.png", "wide.jpg"))] == [
        (40000, 65535), (2**31, 2**32 - 1), (50000, 40000)]
    webp = analyze("pic.webp")   # read, without dimensions
    assert (webp["format"], webp["width"], webp["height"]) == ("webp", None, None)


def test_files_past_the_limits_are_refused_by_size(md) -> None:
    agent = agent_with_files(md, GROQ)
    root = workspace(md, agent)
    for name, size in (("big.png", 10 * 1024 * 1024 + 1), ("edge.png", 10 * 1024 * 1024),
                       ("big.wav", 25 * 1024 * 1024 + 1)):
        with open(root / name, "wb") as f:
            f.truncate(size)   # sparse: nothing is written
    assert call(md, agent, "image_analyze", path="big.png") == "error: big.png is 10485761 bytes; the limit is 10485760"
    assert call(md, agent, "image_analyze", path="edge.png") == \
        "error: not an image this tool reads (PNG, JPEG, GIF or WebP)"
    assert call(md, agent, "speech_to_text", path="big.wav") == "error: big.wav is 26214401 bytes; the limit is 26214400"


def test_groq_transcribes_with_its_whisper_model_and_the_transcript_is_capped(md, groq) -> None:
    agent = agent_with_files(md, GROQ, talk_WAV=b"RIFF")
    groq.answer = (200, b'{"text": "hello there"}')
    before = len(groq.transcriptions)
    assert call(md, agent, "speech_to_text", path="talk.WAV") == "hello there"
    sent = groq.transcriptions[before]
    assert sent["path"] == "/openai/v1/audio/transcriptions"
    assert sent["headers"]["Authorization"] == "Bearer test-groq"
    assert sent["form"] == {"model": "whisper-large-v3", "response_format": "json",
                            "file": {"filename": "talk.WAV", "type": "audio/wav", "size": 4}}
    detail = audited(md, "tool.speech_to_text")[0]
    assert detail == {"agent_id": agent, "file": "talk.WAV", "bytes": 4, "provider": "groq"}
    groq.answer = (200, json.dumps({"text": "x" * OUTPUT_CAP}).encode())
    assert call(md, agent, "media_transcribe", path="talk.WAV") == "x" * OUTPUT_CAP
    # 49 bytes, the cut falling inside the last character: what is kept is whole characters.
    groq.answer = (200, json.dumps({"text": "x" * (OUTPUT_CAP - 1) + "\u00e9"}).encode())
    assert call(md, agent, "media_transcribe", path="talk.WAV") == (
        "x" * (OUTPUT_CAP - 1) + f"\n[transcript truncated at {OUTPUT_CAP} bytes of {OUTPUT_CAP + 1}]")


@pytest.mark.parametrize("answer, error", [
    ((401, b'{"error": {"message": "Invalid API Key", "type": "invalid_request_error"}}'),
     "groq /audio/transcriptions answered 401: Invalid API Key"),
    ((400, b'{"error": "bad file"}'), 'groq /audio/transcriptions answered 400: {"error": "bad file"}'),
    ((404, b'{"detail": "no route"}'), 'groq /audio/transcriptions answered 404: {"detail": "no route"}'),
    ((503, b"overloaded " * 40), "groq /audio/transcriptions answered 503: " + ("overloaded " * 40)[:300]),
    ((200, b'{"transcript": "hi"}'), "groq /audio/transcriptions answered without a transcript"),
    ((200, b"hi"), "groq /audio/transcriptions answered without a transcript"),
    ((200, b'["hi"]'), "groq /audio/transcriptions answered without a transcript"),
    (None, "groq /audio/transcriptions failed: ConnectionError"),
])
def test_a_failing_speech_to_text_provider_is_a_tool_error(md, groq, answer, error) -> None:
    agent = agent_with_files(md, GROQ, talk_mp3=b"ID3")
    groq.answer = answer
    try:
        assert call(md, agent, "speech_to_text", path="talk.mp3") == "error: " + error
    finally:
        groq.answer = (200, b'{"text": "hello"}')


def test_only_audio_files_are_transcribed(md, groq) -> None:
    agent = agent_with_files(md, GROQ, notes_txt=b"text", noext=b"RIFF")
    before = len(groq.transcriptions)
    assert call(md, agent, "speech_to_text", path="notes.txt") == (
        "error: unsupported audio format .txt: mp3, wav, ogg, flac, m4a or webm")
    assert call(md, agent, "speech_to_text", path="noext") == (
        "error: unsupported audio format (none): mp3, wav, ogg, flac, m4a or webm")
    assert len(groq.transcriptions) == before


def test_the_model_looking_at_an_image(md, fake_llm) -> None:
    agent = agent_with_files(md, pic_png=TINY_PNG)
    assert call(md, agent, "media_describe", path="pic.png") == "echo: Describe this image."
    asked = [r["json"] for r in fake_llm.requests if r["path"] == "/v1/chat/completions"
             and r["json"]["messages"][-1]["content"] == [
                 {"type": "text", "text": "Describe this image."},
                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                            + base64.b64encode(TINY_PNG).decode()}}]]
    assert asked and asked[-1]["model"] == "gpt-4o" and asked[-1]["max_tokens"] == 1024
    assert asked[-1]["messages"][:-1] == [], "the image is asked about on its own, not in the agent's conversation"
    assert {"agent_id": agent, "bytes": len(TINY_PNG), "model": "gpt-4o"} in audited(md, "tool.image_to_model")
    failed = call(md, agent, "media_describe", path="pic.png", prompt="[[fail:400]] no")
    assert failed.startswith("error: the model could not look at the image: "), failed
    unknown = agent_with_files(md, NOT_IN_CATALOG, pic_png=TINY_PNG)
    assert call(md, unknown, "media_describe", path="pic.png") == (
        "error: model my-own-finetune is not in the catalog, so it is not known to accept images: "
        "use a vision-capable model")


def test_what_a_tool_makes_is_named_by_the_time_and_audited(md, fake_llm) -> None:
    agent = agent_with_files(md)
    saved = json.loads(call(md, agent, "text_to_speech", text="hello", format="opus"))
    assert re.fullmatch(r"output/speech-\d{8}-\d{6}-\d{3}\.opus", saved["path"]), saved["path"]
    assert saved["content_type"] == "audio/ogg" and saved["filename"] == saved["path"].removeprefix("output/")
    assert saved["size"] == len(b"FAKEAUDIO:hello")
    assert last(fake_llm, "/v1/audio/speech")["headers"]["Authorization"] == "Bearer test-openai"
    assert {"agent_id": agent, "file_id": saved["file_id"], "bytes": len(b"FAKEAUDIO:hello")} in \
        audited(md, "tool.text_to_speech")
    made = json.loads(call(md, agent, "image_generate", prompt="a dot", model="dall-e-2", count=2))
    paths = [i["path"] for i in made["images"]]
    assert [re.fullmatch(r"output/image-\d{8}-\d{6}-\d{3}-(\d)\.png", p).group(1) for p in paths] == ["1", "2"]
    assert last(fake_llm, "/v1/images/generations")["json"] == {
        "model": "dall-e-2", "prompt": "a dot", "n": 2, "size": "1024x1024", "response_format": "b64_json"}
    assert [(workspace(md, agent) / p).read_bytes() for p in paths] == [TINY_PNG, TINY_PNG]


def test_outside_a_run_there_is_no_model_to_ask(tmp_path) -> None:
    """Called without a run's model (a tool context of its own), the tools say so."""
    from tests.agents.tools.test_tools import make_ctx, run

    ctx = make_ctx(tmp_path)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "pic.png").write_bytes(TINY_PNG)
    (tmp_path / "ws" / "talk.wav").write_bytes(b"RIFF")
    for name, args, message in (("media_describe", {"path": "pic.png"}, "the agent's model is not available here"),
                                ("speech_to_text", {"path": "talk.wav"}, "the agent's provider is not available here")):
        with pytest.raises(ToolError) as err:
            run(ctx, name, **args)
        assert str(err.value) == message
