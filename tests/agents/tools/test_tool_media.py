"""Media tools through the real daemon: the fake LLM calls them and serves OpenAI's audio and image endpoints."""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from conftest import LLM_ENV, llm_config
from fakellm import TINY_PNG
from support import Daemon, make_home, stop_shared
from tests.agents.tools.tool_calls import call

ANTHROPIC = '[model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n'
NO_VISION = '[model]\nprovider = "deepseek"\nmodel = "deepseek-chat"\n'


@pytest.fixture(scope="module")
def md(tmp_path_factory, fake_llm):
    home = make_home(tmp_path_factory.mktemp("media"), llm_config(fake_llm))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
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
