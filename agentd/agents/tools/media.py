"""Images and audio: the agent's own model looks at images; the provider's OpenAI-compatible
`/audio/transcriptions`, `/audio/speech` and `/images/generations` make and read media.

Which provider serves which endpoint is catalog data (`endpoints` in agentd/data/providers.json).
What a tool makes is stored as an upload of the agent (the dashboard lists them) and written
to `output/` in the workspace, where the agent's other tools can use it.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from pathlib import Path
from typing import Any

from agentd.agents.handle import UPLOAD_LIMIT
from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.agents.tools.files import confine, workspace_root
from agentd.filetypes import sniff

AUDIO_LIMIT = 25 * 1024 * 1024  # OpenAI's documented cap for one transcription upload
AUDIO_TYPES = {".mp3": "audio/mpeg", ".wav": "audio/wav", ".ogg": "audio/ogg", ".flac": "audio/flac",
               ".m4a": "audio/mp4", ".webm": "audio/webm", ".mp4": "audio/mp4", ".mpga": "audio/mpeg",
               ".oga": "audio/ogg", ".opus": "audio/ogg"}
SPEECH_FORMATS = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                  "wav": "audio/wav"}
VOICES = ("alloy", "echo", "fable", "onyx", "nova", "shimmer")
IMAGE_MODELS = ("dall-e-3", "dall-e-2", "gpt-image-1")
# What each model's /images/generations accepts, so a wrong value is the model's tool error
# rather than the provider's 400.
IMAGE_SIZES = {"dall-e-3": ("1024x1024", "1792x1024", "1024x1792"), "dall-e-2": ("256x256", "512x512", "1024x1024"),
               "gpt-image-1": ("1024x1024", "1536x1024", "1024x1536", "auto")}
IMAGE_QUALITIES = {"dall-e-3": ("hd", "standard"), "dall-e-2": ("standard",),
                   "gpt-image-1": ("low", "medium", "high", "auto")}
TRANSCRIBE_MODELS = {"groq": "whisper-large-v3"}  # else whisper-1


def _image_type(data: bytes) -> str:
    mime = sniff(data, "")
    if mime in ("image/png", "image/jpeg", "image/gif", "image/webp"):
        return mime
    raise ToolError("not an image this tool reads (PNG, JPEG, GIF or WebP)")


def _dimensions(data: bytes, mime: str) -> tuple[int, int] | None:
    """Width and height from the file header (PNG, GIF, JPEG), None when not found."""
    if mime == "image/png" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if mime == "image/gif" and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if mime == "image/jpeg":
        i = 2
        while i + 9 < len(data) and data[i] == 0xFF:
            marker, length = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                height, width = struct.unpack(">HH", data[i + 5:i + 9])
                return width, height
            i += 2 + length
    return None


def _read(ctx: ToolContext, raw: str, limit: int) -> tuple[Path, bytes]:
    path = confine(ctx, raw)
    if not path.is_file():
        raise ToolError(f"no such file in the workspace: {raw}")
    size = path.stat().st_size
    if size > limit:
        raise ToolError(f"{raw} is {size} bytes; the limit is {limit}")
    return path, path.read_bytes()


def _look(ctx: ToolContext, data: bytes, mime: str, prompt: str) -> str:
    """Ask the agent's own model about the image."""
    from agentd.llm.types import ChatRequest, ImagePart, LLMError, Message

    model = ctx.model
    if model is None:
        raise ToolError("the agent's model is not available here")
    if model.supports_vision is None:
        raise ToolError(f"model {model.model} is not in the catalog, so it is not known to accept images: "
                        "use a vision-capable model")
    if not model.supports_vision:
        raise ToolError(f"model {model.model} does not support images (vision): use a vision-capable model")
    ctx.audit("tool.image_to_model", {"bytes": len(data), "model": model.model})
    request = ChatRequest(model=model.model, max_tokens=1024, messages=[
        Message(role="user", content=prompt, images=[ImagePart(mime, base64.b64encode(data).decode())])])
    try:
        return model.call(request, ctx.cancel).text
    except LLMError as exc:
        raise ToolError(f"the model could not look at the image: {exc}") from None


def _endpoint(ctx: ToolContext, path: str, capability: str) -> Any:
    """The agent's provider's endpoint for `path`, or a ToolError naming what is missing."""
    model = ctx.model
    if model is None:
        raise ToolError("the agent's provider is not available here")
    if path not in model.endpoints:
        raise ToolError(f"{capability} is not available: provider {model.provider} has no "
                        f"OpenAI-compatible /{path} endpoint")
    return model.endpoint()


def _post(ctx: ToolContext, endpoint: Any, path: str, **kwargs: Any) -> Any:
    import requests

    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = f"{endpoint.base_url.rstrip('/')}/{path}"
    try:
        response = requests.post(url, headers=headers, timeout=(endpoint.connect_timeout, endpoint.timeout),
                                 **kwargs)
    except requests.RequestException as exc:
        raise ToolError(f"{endpoint.provider} /{path} failed: {type(exc).__name__}") from None
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise ToolError(f"{endpoint.provider} /{path} answered {response.status_code}: {message}")
    return response


def _store(ctx: ToolContext, name: str, mime: str, data: bytes) -> dict[str, Any]:
    """An upload of the agent, and a file in the workspace's output/."""
    out = workspace_root(ctx) / "output"
    out.mkdir(exist_ok=True)
    (out / name).write_bytes(data)
    saved = ctx.require_services().save_upload(ctx.agent_id, name, mime, data)
    return {**saved, "path": f"output/{name}"}


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"


@tool("image_analyze", "Analyze an image file — returns format, dimensions, file size, and a base64 preview. For "
      "vision-model analysis, include a prompt.",
      {"path": {"type": "string", "description": "Path to the image file"},
       "prompt": {"type": "string", "description": "Optional prompt for vision analysis (e.g., 'Describe what you "
                                                   "see')"}},
      ("path",), read_only=True, family="media")
def image_analyze(ctx: ToolContext, args: dict[str, Any]) -> str:
    _, data = _read(ctx, args["path"], UPLOAD_LIMIT)
    mime = _image_type(data)
    size = _dimensions(data, mime)
    result: dict[str, Any] = {"format": mime.split("/")[1], "size_bytes": len(data),
                              "width": size[0] if size else None, "height": size[1] if size else None}
    if args.get("prompt"):
        result["analysis"] = _look(ctx, data, mime, args["prompt"])
    else:
        result["preview_base64"] = base64.b64encode(data[:512]).decode()
    return json.dumps(result, ensure_ascii=False)


@tool("media_describe", "Describe an image using a vision-capable LLM. Auto-selects the best available provider "
      "(Anthropic, OpenAI, or Gemini). Returns a text description of the image content.",
      {"path": {"type": "string", "description": "Path to the image file (relative to workspace)"},
       "prompt": {"type": "string", "description": "Optional prompt to guide the description (e.g., 'Extract all "
                                                   "text from this image')"}},
      ("path",), read_only=True, family="media")
def media_describe(ctx: ToolContext, args: dict[str, Any]) -> str:
    _, data = _read(ctx, args["path"], UPLOAD_LIMIT)
    return _look(ctx, data, _image_type(data), args.get("prompt") or "Describe this image.")


def _transcribe(ctx: ToolContext, args: dict[str, Any]) -> str:
    path, data = _read(ctx, args["path"], AUDIO_LIMIT)
    mime = AUDIO_TYPES.get(path.suffix.lower())
    if mime is None:
        raise ToolError(f"unsupported audio format {path.suffix or '(none)'}: mp3, wav, ogg, flac, m4a or webm")
    endpoint = _endpoint(ctx, "audio/transcriptions", "speech-to-text")
    fields = {"model": TRANSCRIBE_MODELS.get(endpoint.provider, "whisper-1"), "response_format": "json"}
    if args.get("language"):
        fields["language"] = args["language"]
    ctx.audit("tool.speech_to_text", {"file": path.name, "bytes": len(data), "provider": endpoint.provider})
    response = _post(ctx, endpoint, "audio/transcriptions", data=fields, files={"file": (path.name, data, mime)})
    try:
        text = response.json()["text"]
    except (ValueError, KeyError, TypeError):
        raise ToolError(f"{endpoint.provider} /audio/transcriptions answered without a transcript") from None
    limit = ctx.tools_config.shell_max_output_bytes
    data = str(text).encode()
    if len(data) <= limit:
        return str(text)
    return data[:limit].decode(errors="ignore") + f"\n[transcript truncated at {limit} bytes of {len(data)}]"


_AUDIO_IN = {"path": {"type": "string", "description": "Path to the audio file (relative to workspace). Supported: "
                                                       "mp3, wav, ogg, flac, m4a, webm."},
             "language": {"type": "string", "description": "Optional ISO-639-1 language code (e.g., 'en', 'es', "
                                                           "'ja')"}}


@tool("media_transcribe", "Transcribe audio to text using speech-to-text. Auto-selects the best available provider "
      "(Groq Whisper or OpenAI Whisper). Returns the transcript.", _AUDIO_IN, ("path",), read_only=True,
      family="media")
def media_transcribe(ctx: ToolContext, args: dict[str, Any]) -> str:
    return _transcribe(ctx, args)


@tool("speech_to_text", "Transcribe audio to text using speech-to-text. Auto-selects Groq Whisper or OpenAI "
      "Whisper. Supported formats: mp3, wav, ogg, flac, m4a, webm.",
      {**_AUDIO_IN, "path": {"type": "string", "description": "Path to the audio file (relative to workspace)"}},
      ("path",), read_only=True, family="media")
def speech_to_text(ctx: ToolContext, args: dict[str, Any]) -> str:
    return _transcribe(ctx, args)


@tool("text_to_speech", "Convert text to speech audio. Auto-selects OpenAI or ElevenLabs. Saves audio to workspace "
      "output/ directory.",
      {"text": {"type": "string", "description": "The text to convert to speech (max 4096 chars)"},
       "voice": {"type": "string", "description": "Voice name: 'alloy', 'echo', 'fable', 'onyx', 'nova', 'shimmer' "
                                                  "(default: 'alloy')"},
       "format": {"type": "string", "description": "Output format: 'mp3', 'opus', 'aac', 'flac' (default: 'mp3')"}},
      ("text",), family="media")
def text_to_speech(ctx: ToolContext, args: dict[str, Any]) -> str:
    text, voice, fmt = args["text"], args.get("voice") or "alloy", args.get("format") or "mp3"
    if not text.strip() or len(text) > 4096:
        raise ToolError("text must have 1 to 4096 characters")
    if voice not in VOICES:
        raise ToolError(f"voice must be one of {', '.join(VOICES)}")
    if fmt not in SPEECH_FORMATS:
        raise ToolError(f"format must be one of {', '.join(SPEECH_FORMATS)}")
    endpoint = _endpoint(ctx, "audio/speech", "text-to-speech")
    response = _post(ctx, endpoint, "audio/speech",
                     json={"model": "tts-1", "input": text, "voice": voice, "response_format": fmt})
    audio = response.content
    if not audio or len(audio) > UPLOAD_LIMIT:
        raise ToolError(f"{endpoint.provider} /audio/speech returned {len(audio)} bytes of audio")
    saved = _store(ctx, f"speech-{_stamp()}.{fmt}", SPEECH_FORMATS[fmt], audio)
    ctx.audit("tool.text_to_speech", {"file_id": saved["file_id"], "bytes": len(audio)})
    return json.dumps(saved)


@tool("image_generate", "Generate images from a text prompt using DALL-E 3, DALL-E 2, or GPT-Image-1. Requires "
      "OPENAI_API_KEY. Generated images are saved to the workspace output/ directory.",
      {"prompt": {"type": "string", "description": "Text description of the image to generate (max 4000 chars)"},
       "model": {"type": "string", "description": "Model to use: 'dall-e-3' (default), 'dall-e-2', or 'gpt-image-1'"},
       "size": {"type": "string", "description": "Image size: '1024x1024' (default), '1024x1792', '1792x1024', "
                                                 "'256x256', '512x512' (gpt-image-1: '1536x1024', '1024x1536', "
                                                 "'auto')"},
       "quality": {"type": "string", "description": "Quality: 'hd' (default for dall-e-3) or 'standard' "
                                                    "(gpt-image-1: 'low', 'medium', 'high', 'auto')"},
       "count": {"type": "integer", "description": "Number of images to generate (1-4, default: 1). DALL-E 3 only "
                                                   "supports 1."}},
      ("prompt",), family="media")
def image_generate(ctx: ToolContext, args: dict[str, Any]) -> str:
    prompt, model = args["prompt"], args.get("model") or "dall-e-3"
    count = args.get("count", 1)
    if not prompt.strip() or len(prompt) > 4000:
        raise ToolError("prompt must have 1 to 4000 characters")
    if model not in IMAGE_MODELS:
        raise ToolError(f"model must be one of {', '.join(IMAGE_MODELS)}")
    if not 1 <= count <= 4 or (model == "dall-e-3" and count != 1):
        raise ToolError("count must be 1 to 4 (dall-e-3 makes 1)")
    size, quality = args.get("size") or "1024x1024", args.get("quality")
    if size not in IMAGE_SIZES[model]:
        raise ToolError(f"size must be one of {', '.join(IMAGE_SIZES[model])} for {model}, not {size!r}")
    if quality and quality not in IMAGE_QUALITIES[model]:
        raise ToolError(f"quality must be one of {', '.join(IMAGE_QUALITIES[model])} for {model}, not {quality!r}")
    body: dict[str, Any] = {"model": model, "prompt": prompt, "n": count, "size": size}
    if model != "gpt-image-1":  # gpt-image-1 always answers base64 and refuses the field
        body["response_format"] = "b64_json"
    if quality or model == "dall-e-3":
        body["quality"] = quality or "hd"
    endpoint = _endpoint(ctx, "images/generations", "image generation")
    response = _post(ctx, endpoint, "images/generations", json=body)
    try:
        items = response.json()["data"]
        images = [base64.b64decode(item["b64_json"]) for item in items]
    except (ValueError, KeyError, TypeError):
        raise ToolError(f"{endpoint.provider} /images/generations answered without base64 images") from None
    saved = []
    for n, data in enumerate(images):
        mime = _image_type(data)
        saved.append(_store(ctx, f"image-{_stamp()}-{n + 1}.{mime.split('/')[1]}", mime, data))
    ctx.audit("tool.image_generate", {"file_ids": [s["file_id"] for s in saved], "model": model})
    return json.dumps({"images": saved})
