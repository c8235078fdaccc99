"""FakeLLM: a scriptable fake LLM provider (OpenAI, Anthropic, Gemini) on a real local HTTP server.

Stdlib only.  Tests and benchmarks use it to drive agent loops end to end over real sockets::

    from fakellm import FakeLLM

    with FakeLLM(required_key="sk-test") as fake:
        fake.openai_base      # "http://127.0.0.1:PORT/v1"  -> POST {openai_base}/chat/completions
        fake.anthropic_base   # "http://127.0.0.1:PORT"     -> POST {anthropic_base}/v1/messages
        fake.gemini_base      # "http://127.0.0.1:PORT"     -> POST {gemini_base}/v1beta/models/{m}:generateContent
        ...
        fake.requests[-1]["json"]          # what the client sent

Out of process (benchmarks): ``python tests/fakellm.py --port 8999 [--key K] [--host H] [--max-log N]``
prints the base URL as its first stdout line and serves until SIGINT/SIGTERM.

Endpoints
---------
* OpenAI:    ``POST /v1/chat/completions`` (``stream: true`` -> SSE ``data: {chunk}`` ... ``data: [DONE]``),
             ``GET /v1/models``.
* Anthropic: ``POST /v1/messages`` (``stream: true`` -> ``event: X`` / ``data: {...}`` SSE events),
             ``GET /v1/models`` (the list carries both OpenAI and Anthropic fields).
* Gemini:    ``POST /v1beta/models/{model}:generateContent``,
             ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` (SSE ``data: {...}`` separated by
             ``\\r\\n\\r\\n`` exactly like the real API; without ``alt=sse`` a streamed JSON array),
             ``GET /v1beta/models``.  ``/v1/...`` works as an alias of ``/v1beta/...``.  camelCase and
             snake_case request fields are both accepted.
* OpenAI media (as documented by OpenAI): ``POST /v1/audio/transcriptions`` (multipart ``file`` + ``model``
             [+ ``language``] -> ``{"text": "transcript of NAME (N bytes)[ in LANG]"}``), ``POST /v1/audio/speech``
             (JSON ``model``, ``input``, ``voice`` [, ``response_format``] -> the bytes ``FAKEAUDIO:<input>`` as
             ``audio/mpeg`` etc.), ``POST /v1/images/generations`` (JSON ``prompt`` [, ``model``, ``n``, ``size``,
             ``response_format``] -> ``{"created", "data": [{"b64_json" | "url", "revised_prompt"}]}`` with a
             1x1 PNG; base64 for ``response_format: "b64_json"`` and for ``gpt-image-1``).  A multipart
             request's form fields are logged as ``"form"`` (the file part as ``{"filename", "size"}``).
* Control:   ``GET /`` (health), ``GET /_fakellm/stats`` -> ``{"requests": n}``, ``POST /_fakellm/reset``.

Transport: HTTP/1.1 keep-alive, TCP_NODELAY.  Non-streamed responses carry Content-Length and are written
with one ``send``.  Streams use ``Transfer-Encoding: chunked`` (one HTTP chunk per SSE event, written and
sent immediately) so the connection stays reusable; HTTP/1.0 clients get a close-delimited stream.

Auth (only when ``required_key`` is set): OpenAI ``Authorization: Bearer K``; Anthropic ``x-api-key: K``;
Gemini ``x-goog-api-key: K`` header or ``?key=K``.  A missing/wrong key -> 401 in that provider's error
shape.  ``GET /v1/models`` is judged as Anthropic when an ``x-api-key`` or ``anthropic-version`` header is
present, else OpenAI.

Error shapes (used for 401, ``[[fail:...]]``, bad requests, unknown paths)::

    OpenAI     {"error": {"message", "type", "param": null, "code"}}
    Anthropic  {"type": "error", "error": {"type", "message"}, "request_id"}
    Gemini     {"error": {"code": STATUS, "message", "status": "UNAUTHENTICATED" | ...}}

Which message is scripted
-------------------------
Behaviour comes from directives in the text of the LAST USER TEXT message:

* OpenAI: the last message with ``role: "user"``; content is a string or a list of parts (text of all
  ``{"type": "text"}`` parts joined with ``\\n``; ``image_url``/``input_image``/``image`` parts count as images).
* Anthropic: the last ``role: "user"`` message whose content is a string or contains a ``text`` block; user
  messages that only carry ``tool_result`` blocks are skipped.  ``image`` blocks count as images.
* Gemini: the last content with ``role: "user"`` (or no role) that has a ``text`` part; ``inlineData`` /
  ``fileData`` parts count as images.

The *current turn* is every message after that one.  *Tool results* are: OpenAI ``role: "tool"`` (or legacy
``"function"``) messages; Anthropic ``tool_result`` blocks; Gemini ``functionResponse`` parts.  The *content*
of a tool result is its text (string, or text parts joined); for Gemini it is ``response["content"]``,
``["result"]`` or ``["output"]`` when that is a string, else the compact JSON of ``response``.

Directives (several can be combined; unknown or malformed ``[[...]]`` stay literal text)
------------------------------------------------------------------------------------------
=======================================  ===================================================================
``(none)``                               reply ``echo: <user text with directives removed, stripped>``
``[[reply:TEXT]]``                       reply exactly TEXT (may contain spaces, not ``]]``)
``[[tool:NAME ARGS_JSON]]``              current turn has < 1 tool result -> ONE tool call NAME(ARGS_JSON);
                                         otherwise text ``tool said: <last tool result content[:500]>``.
                                         ARGS_JSON is a JSON object (parsed with a real JSON decoder, so it
                                         may contain spaces and brackets); it may be omitted (= ``{}``).
``[[tool:NAME ARGS_JSON xN]]``           same, but keeps calling until the current turn holds N tool results
                                         (x100 = a model that loops "forever")
``[[tools:N1 A1 | N2 A2 ...]]``          several tool calls in ONE response (parallel), once; then text as above
``[[think]]``                            reply ``<think>secret reasoning</think>`` + normal reply
``[[think:unclosed]]``                   reply normal reply + ``<think>never closed...``
``[[think:calls]]``                      tool-call responses also carry the text ``<think>secret reasoning</think>calling
                                         a tool`` (OpenAI wire format only; a model reasoning aloud before a call)
``[[slow:SECONDS]]``                     sleep SECONDS (float) before answering
``[[pace:MS]]``                          sleep MS milliseconds before every stream chunk/event after the first
``[[chunks:N]]``                         reply ``w1 w2 ... wN`` (in streams: one chunk per word)
``[[fail:STATUS]]``                      HTTP STATUS with the provider's error JSON, every time
``[[fail:STATUS times=K]]``              fail only the first K requests whose last user text is exactly this
                                         text (counter cleared by ``reset()``), then behave normally
``[[fail:429 retry_after=S]]``           also send ``Retry-After: S`` (combinable with ``times=K``)
``[[fail:429 retry_after=date:S]]``      ... as an HTTP date S seconds after the answer is sent
``[[garbage]]``                          200, ``Content-Type: application/json``, body ``this is not json{{{``
                                         (also for stream requests)
``[[hang]]``                             sleep 3600 s before answering (client timeout tests); ``stop()``
                                         wakes and aborts it, never waits for it
``[[length]]``                           text reply cut to its first ceil(n/2) words; finish_reason ``length`` /
                                         stop_reason ``max_tokens`` / finishReason ``MAX_TOKENS``
``[[echo_params]]``                      reply is compact JSON ``{"max_tokens", "temperature", "model",
                                         "n_images", "n_tools", "system"}`` read from the request (see below)
=======================================  ===================================================================

Precedence: ``hang`` -> ``slow`` -> ``fail`` -> ``garbage`` -> tool calls.  For the text of a reply:
a tool directive whose calls are done gives ``tool said: ...``; else ``echo_params``; else ``reply``; else
``chunks``; else ``echo: ...``.  ``think`` then wraps that text and ``length`` cuts it (both only affect
text replies, never tool-call responses).

``echo_params`` sources: ``max_tokens`` = OpenAI ``max_tokens`` or ``max_completion_tokens`` / Anthropic
``max_tokens`` / Gemini ``generationConfig.maxOutputTokens``; ``temperature`` likewise (null when absent);
``model`` = requested model (Gemini: from the URL); ``n_images`` = image parts in the last user text message;
``n_tools`` = OpenAI ``len(tools) + len(functions)`` / Anthropic ``len(tools)`` / Gemini total
``functionDeclarations``; ``system`` = OpenAI ``system``/``developer`` messages joined with ``\\n`` / Anthropic
``system`` (string or text blocks) / Gemini ``systemInstruction`` text, null when absent.

Wire details
------------
* Responses report the requested model (default ``fake-model``).
* OpenAI: ``message.tool_calls = [{id: "call_...", type: "function", function: {name, arguments: JSON str}}]``,
  ``content: null``, finish_reason ``tool_calls``.  Streams: a role chunk, one chunk per text piece, for each
  tool call a chunk with ``index/id/type/function.name`` (arguments ``""``) then the arguments in 2-3
  fragments, a chunk with ``finish_reason``, then ALWAYS (``stream_options`` or not) a usage chunk with
  ``choices: []``, then ``data: [DONE]``.
* Anthropic: content blocks ``text`` / ``tool_use {id: "toolu_...", name, input}``; stop_reason ``end_turn`` /
  ``tool_use`` / ``max_tokens``.  Stream: ``message_start`` (usage ``{input_tokens: N, output_tokens: 1}``
  as the real API does), per block ``content_block_start`` / ``content_block_delta`` (``text_delta`` or
  ``input_json_delta`` in 2-3 fragments) / ``content_block_stop``, ``message_delta`` (stop_reason,
  ``usage.output_tokens`` = the full output count), ``message_stop``.  No ``ping`` events.
* Gemini: ``candidates[0].content = {role: "model", parts: [{text} | {functionCall: {name, args}}]}``,
  finishReason ``STOP`` (also for function calls) / ``MAX_TOKENS``.  Streams: one chunk per text piece; the
  last chunk carries ``finishReason`` and ``usageMetadata``; function calls come whole in one chunk.
* Text streams are split at words (each piece = a word with its leading whitespace).  ``<think>`` is always
  split across two chunks as ``<thi`` | ``nk>...`` and ``</think>`` as ``...</thi`` | ``nk>...``.

Token counting (deterministic)
------------------------------
input tokens = number of whitespace-separated words in all message texts (string contents, text
parts/blocks, tool-result contents; the raw text including directives) plus the system prompt; minimum 1.
output tokens = words in the reply text + 1 per tool call; minimum 1.  OpenAI ``{prompt_tokens,
completion_tokens, total_tokens}``; Anthropic ``{input_tokens, output_tokens}``; Gemini
``{promptTokenCount, candidatesTokenCount, totalTokenCount}``.

Request log
-----------
``fake.requests`` is a list of dicts, appended when a request arrives (so in-flight/hung requests show)::

    {"path": "/v1/messages" (no query), "query": {k: v}, "method": "POST",
     "headers": case-insensitive dict (stored lower-case; ``h["Authorization"]`` works),
     "json": parsed body or None, "time": time.time() at arrival,
     "provider": "openai" | "anthropic" | "gemini" | None,
     "status": response status once sent (None before), "done": time.time() just before the last
     bytes of the response (the end of a stream) were written, else None -- so once a client has read
     the whole response, ``done`` is set,
     "peer": "ip:port" of the client socket (same peer = same keep-alive connection)}
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import http.server
import json
import math
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeLLM", "Script", "parse_script", "stream_pieces", "count_words"]

DEFAULT_MODEL = "fake-model"
MODELS = ["fake-model", "fake-model-large", "fake-gemini", "fake-claude"]
THINK_TEXT = "<think>secret reasoning</think>"
UNCLOSED_THINK_TEXT = "<think>never closed..."
GARBAGE_BODY = b"this is not json{{{"


# --------------------------------------------------------------------------------------------------
# Directive parsing
# --------------------------------------------------------------------------------------------------

@dataclass
class Script:
    """The directives found in one prompt (see the module docstring)."""

    text: str = ""                    # the prompt with directives removed, stripped
    reply: str | None = None
    tools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tool_repeat: int = 1
    parallel: bool = False
    think: str | None = None          # "closed" | "unclosed"
    slow: float = 0.0                 # seconds
    pace: float = 0.0                 # seconds between stream chunks
    chunks: int | None = None
    fail_status: int | None = None
    fail_times: int | None = None
    retry_after: str | None = None
    garbage: bool = False
    hang: bool = False
    length: bool = False
    echo_params: bool = False


class _BadDirective(ValueError):
    pass


_HEAD_RE = re.compile(r"\[\[([a-z_]+)(:?)")
_NAME_RE = re.compile(r"[^\s\[\]|{}]+")
_REPEAT_RE = re.compile(r"x(\d+)")
_JSON_DECODER = json.JSONDecoder()
_KNOWN = frozenset({"reply", "tool", "tools", "think", "slow", "pace", "chunks", "fail", "garbage",
                    "hang", "length", "echo_params"})
_FLAGS = frozenset({"garbage", "hang", "length", "echo_params"})


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _expect_close(text: str, pos: int) -> int:
    pos = _skip_ws(text, pos)
    if not text.startswith("]]", pos):
        raise _BadDirective("missing ]]")
    return pos + 2


def _parse_call(text: str, pos: int) -> tuple[str, dict[str, Any], int]:
    pos = _skip_ws(text, pos)
    match = _NAME_RE.match(text, pos)
    if not match:
        raise _BadDirective("tool name expected")
    name, pos = match.group(), _skip_ws(text, match.end())
    args: Any = {}
    if pos < len(text) and text[pos] == "{":
        try:
            args, pos = _JSON_DECODER.raw_decode(text, pos)
        except ValueError as exc:
            raise _BadDirective(str(exc)) from None
        if not isinstance(args, dict):
            raise _BadDirective("tool args must be a JSON object")
    return name, args, _skip_ws(text, pos)


def _apply(script: Script, name: str, text: str, pos: int, has_arg: bool) -> int:
    """Parse the body of directive NAME starting at POS (just after ``:`` or the name); return end index."""
    if name == "tool" and has_arg:
        tool, args, pos = _parse_call(text, pos)
        repeat = 1
        match = _REPEAT_RE.match(text, pos)
        if match:
            repeat, pos = int(match.group(1)), match.end()
        end = _expect_close(text, pos)
        if not script.tools:
            script.tools, script.tool_repeat, script.parallel = [(tool, args)], repeat, False
        return end
    if name == "tools" and has_arg:
        calls = []
        while True:
            tool, args, pos = _parse_call(text, pos)
            calls.append((tool, args))
            if text.startswith("|", pos):
                pos += 1
                continue
            end = _expect_close(text, pos)
            break
        if not script.tools:
            script.tools, script.tool_repeat, script.parallel = calls, 1, True
        return end

    end = text.find("]]", pos)
    if end < 0:
        raise _BadDirective("missing ]]")
    arg = text[pos:end] if has_arg else None
    if not has_arg and end != pos:
        raise _BadDirective("junk after directive name")
    try:
        if name in _FLAGS:
            if arg is not None:
                raise _BadDirective(f"{name} takes no argument")
            setattr(script, name, True)
        elif name == "reply" and arg is not None:
            script.reply = arg
        elif name == "think":
            if arg is None:
                script.think = "closed"
            elif arg.strip() in ("unclosed", "calls"):
                script.think = arg.strip()
            else:
                raise _BadDirective("think:unclosed or think:calls expected")
        elif name == "slow" and arg is not None:
            script.slow = max(0.0, float(arg))
        elif name == "pace" and arg is not None:
            script.pace = max(0.0, float(arg)) / 1000.0
        elif name == "chunks" and arg is not None:
            script.chunks = max(0, int(arg))
        elif name == "fail" and arg is not None:
            words = arg.split()
            if not words:
                raise _BadDirective("fail needs a status")
            status, times, retry_after = int(words[0]), None, None
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key == "times":
                    times = int(value)
                elif key == "retry_after" and value:
                    retry_after = value
                else:
                    raise _BadDirective(f"unknown fail option {word!r}")
            if not 100 <= status <= 599:
                raise _BadDirective("bad status")
            script.fail_status, script.fail_times, script.retry_after = status, times, retry_after
        else:
            raise _BadDirective(f"bad {name} directive")
    except (TypeError, ValueError) as exc:
        raise _BadDirective(str(exc)) from None
    return end + 2


def parse_script(text: str) -> Script:
    """Parse the directives in TEXT; ``Script.text`` is TEXT without them (stripped)."""
    script = Script()
    kept: list[str] = []
    i = 0
    while True:
        j = text.find("[[", i)
        if j < 0:
            kept.append(text[i:])
            break
        match = _HEAD_RE.match(text, j)
        if match and match.group(1) in _KNOWN:
            try:
                end = _apply(script, match.group(1), text, match.end(), bool(match.group(2)))
            except _BadDirective:
                pass
            else:
                kept.append(text[i:j])
                i = end
                continue
        kept.append(text[i:j + 1])
        i = j + 1
    script.text = "".join(kept).strip()
    return script


def count_words(text: str | None) -> int:
    """Whitespace-separated words in TEXT (the fake's token count)."""
    return len(text.split()) if text else 0


_PIECE_RE = re.compile(r"\s*\S+|\s+$")
_TAG_RE = re.compile(r"</?think>")


def stream_pieces(text: str) -> list[str]:
    """Split TEXT into stream chunks: words with their leading whitespace; think tags split in two."""
    out: list[str] = []
    for piece in _PIECE_RE.findall(text):
        while True:
            match = _TAG_RE.search(piece)
            if not match:
                break
            cut = match.start() + (4 if match.group() == "<think>" else 5)
            out.append(piece[:cut])
            piece = piece[cut:]
        if piece:
            out.append(piece)
    return out


def _fragments(text: str) -> list[str]:
    """Split TEXT into 2-3 non-empty fragments (tool-call argument streaming)."""
    n = min(3, len(text))
    if n < 2:
        return [text, ""] if text else ["", ""]
    size = math.ceil(len(text) / n)
    return [text[k:k + size] for k in range(0, len(text), size)]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------------------------------
# Provider-neutral view of a request, and the plan for the answer
# --------------------------------------------------------------------------------------------------

class _BadRequest(Exception):
    pass


@dataclass
class _Conv:
    model: str
    user_text: str = ""
    n_images: int = 0
    tool_results: list[str] = field(default_factory=list)
    input_tokens: int = 1
    system: str | None = None
    n_tools: int = 0
    max_tokens: Any = None
    temperature: Any = None


@dataclass
class _Call:
    uid: str
    name: str
    args: dict[str, Any]

    @property
    def args_json(self) -> str:
        return _dumps(self.args)


@dataclass
class _Plan:
    kind: str                      # "text" | "calls" | "error" | "garbage"
    text: str = ""
    calls: list[_Call] = field(default_factory=list)
    finish: str = "stop"           # "stop" | "length" | "tool"
    status: int = 200
    retry_after: str | None = None
    message: str = ""
    input_tokens: int = 1
    output_tokens: int = 1
    pace: float = 0.0


def _text_of_parts(parts: Any, types: tuple[str, ...] = ("text", "input_text")) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        return "\n".join(p["text"] for p in parts
                         if isinstance(p, dict) and p.get("type") in types and isinstance(p.get("text"), str))
    return ""


def _g(obj: Any, camel: str, snake: str) -> Any:
    if not isinstance(obj, dict):
        return None
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _openai_conv(body: dict[str, Any]) -> _Conv:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _BadRequest("'messages' must be a non-empty array of objects")
    conv = _Conv(model=str(body.get("model") or DEFAULT_MODEL))
    systems, words, last_user = [], 0, -1
    for i, msg in enumerate(messages):
        text = _text_of_parts(msg.get("content"))
        words += count_words(text)
        role = msg.get("role")
        if role in ("system", "developer"):
            systems.append(text)
        elif role == "user":
            last_user = i
    if last_user >= 0:
        content = messages[last_user].get("content")
        conv.user_text = _text_of_parts(content)
        if isinstance(content, list):
            conv.n_images = sum(1 for p in content if isinstance(p, dict)
                                and p.get("type") in ("image_url", "input_image", "image"))
    conv.tool_results = [_text_of_parts(m.get("content")) for m in messages[last_user + 1:]
                         if m.get("role") in ("tool", "function")]
    conv.input_tokens = max(1, words)
    conv.system = "\n".join(systems) if systems else None
    conv.n_tools = len(body.get("tools") or []) + len(body.get("functions") or [])
    max_tokens = body.get("max_tokens")
    conv.max_tokens = body.get("max_completion_tokens") if max_tokens is None else max_tokens
    conv.temperature = body.get("temperature")
    return conv


def _anthropic_tool_result_text(block: dict[str, Any]) -> str:
    return _text_of_parts(block.get("content"), ("text",))


def _anthropic_conv(body: dict[str, Any]) -> _Conv:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _BadRequest("messages: Field required (non-empty list of objects)")
    conv = _Conv(model=str(body.get("model") or DEFAULT_MODEL))
    system = body.get("system")
    conv.system = _text_of_parts(system, ("text",)) if system is not None else None
    words, last_user = count_words(conv.system), -1
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if isinstance(content, str):
            words += count_words(content)
            has_text = True
        elif isinstance(content, list):
            has_text = False
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    words += count_words(block["text"])
                    has_text = True
                elif block.get("type") == "tool_result":
                    words += count_words(_anthropic_tool_result_text(block))
        else:
            has_text = False
        if msg.get("role") == "user" and has_text:
            last_user = i
    if last_user >= 0:
        content = messages[last_user]["content"]
        conv.user_text = _text_of_parts(content, ("text",))
        if isinstance(content, list):
            conv.n_images = sum(1 for b in content if isinstance(b, dict) and b.get("type") == "image")
    for msg in messages[last_user + 1:]:
        content = msg.get("content")
        if msg.get("role") == "user" and isinstance(content, list):
            conv.tool_results += [_anthropic_tool_result_text(b) for b in content
                                  if isinstance(b, dict) and b.get("type") == "tool_result"]
    conv.input_tokens = max(1, words)
    conv.n_tools = len(body.get("tools") or [])
    conv.max_tokens = body.get("max_tokens")
    conv.temperature = body.get("temperature")
    return conv


def _gemini_result_text(part: dict[str, Any]) -> str:
    result = _g(part, "functionResponse", "function_response") or {}
    response = result.get("response") if isinstance(result, dict) else None
    if isinstance(response, dict):
        for key in ("content", "result", "output"):
            if isinstance(response.get(key), str):
                return response[key]
    return _dumps(response)


def _gemini_text(parts: Any) -> tuple[str, bool]:
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(texts), bool(texts)


def _gemini_conv(body: dict[str, Any], model: str) -> _Conv:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents or not all(isinstance(c, dict) for c in contents):
        raise _BadRequest("contents is not specified")
    conv = _Conv(model=model)
    system = _g(body, "systemInstruction", "system_instruction")
    if isinstance(system, str):
        conv.system = system
    elif isinstance(system, dict):
        conv.system = _gemini_text(system.get("parts") or [])[0]
    words, last_user = count_words(conv.system), -1
    for i, content in enumerate(contents):
        parts = content.get("parts") or []
        text, has_text = _gemini_text(parts)
        words += count_words(text)
        words += sum(count_words(_gemini_result_text(p)) for p in parts
                     if isinstance(p, dict) and _g(p, "functionResponse", "function_response"))
        if content.get("role", "user") == "user" and has_text:
            last_user = i
    if last_user >= 0:
        parts = contents[last_user].get("parts") or []
        conv.user_text = _gemini_text(parts)[0]
        conv.n_images = sum(1 for p in parts if isinstance(p, dict)
                            and (_g(p, "inlineData", "inline_data") or _g(p, "fileData", "file_data")))
    for content in contents[last_user + 1:]:
        conv.tool_results += [_gemini_result_text(p) for p in content.get("parts") or []
                              if isinstance(p, dict) and _g(p, "functionResponse", "function_response")]
    conv.input_tokens = max(1, words)
    conv.n_tools = sum(len(_g(t, "functionDeclarations", "function_declarations") or [])
                       for t in body.get("tools") or [] if isinstance(t, dict))
    config = _g(body, "generationConfig", "generation_config") or {}
    conv.max_tokens = _g(config, "maxOutputTokens", "max_output_tokens")
    conv.temperature = config.get("temperature") if isinstance(config, dict) else None
    return conv


# --------------------------------------------------------------------------------------------------
# Error shapes
# --------------------------------------------------------------------------------------------------

_ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                     404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                     500: "api_error", 529: "overloaded_error"}
_GEMINI_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                  404: "NOT_FOUND", 409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
                  500: "INTERNAL", 501: "NOT_IMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def error_body(provider: str | None, status: int, message: str) -> dict[str, Any]:
    """The error JSON a real PROVIDER ("openai", "anthropic", "gemini") sends with STATUS."""
    if provider == "anthropic":
        kind = _ANTHROPIC_ERRORS.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message},
                "request_id": f"req_{uuid.uuid4().hex[:24]}"}
    if provider == "gemini":
        name = _GEMINI_STATUS.get(status) or ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
        return {"error": {"code": status, "message": message, "status": name}}
    if status == 401:
        kind, code = "invalid_request_error", "invalid_api_key"
    elif status == 429:
        kind, code = "requests", "rate_limit_exceeded"
    elif status == 404:
        kind, code = "invalid_request_error", "not_found"
    elif status >= 500:
        kind, code = "server_error", None
    else:
        kind, code = "invalid_request_error", None
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --------------------------------------------------------------------------------------------------
# Renderers: plan -> provider JSON (non-stream) or stream events (bytes)
# --------------------------------------------------------------------------------------------------

_OPENAI_FINISH = {"stop": "stop", "length": "length", "tool": "tool_calls"}
_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool": "tool_use"}
_GEMINI_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool": "STOP"}


def _openai_usage(plan: _Plan) -> dict[str, int]:
    return {"prompt_tokens": plan.input_tokens, "completion_tokens": plan.output_tokens,
            "total_tokens": plan.input_tokens + plan.output_tokens}


def _openai_json(plan: _Plan, conv: _Conv) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.text if plan.kind == "text" else plan.text or None,
                               "refusal": None}
    if plan.calls:
        message["tool_calls"] = [{"id": f"call_{c.uid}", "type": "function",
                                  "function": {"name": c.name, "arguments": c.args_json}} for c in plan.calls]
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": conv.model, "system_fingerprint": "fp_fakellm",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": _OPENAI_FINISH[plan.finish]}],
            "usage": _openai_usage(plan)}


def _openai_stream(plan: _Plan, conv: _Conv) -> Iterator[bytes]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": conv.model, "system_fingerprint": "fp_fakellm"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return b"data: " + _dumps(data).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": "" if plan.kind == "text" else None})
    for piece in stream_pieces(plan.text) if plan.text else ():
        yield chunk({"content": piece})
    for index, call in enumerate(plan.calls):
        yield chunk({"tool_calls": [{"index": index, "id": f"call_{call.uid}", "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})
        for fragment in _fragments(call.args_json):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    yield chunk({}, _OPENAI_FINISH[plan.finish])
    yield b"data: " + _dumps({**base, "choices": [], "usage": _openai_usage(plan)}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _anthropic_json(plan: _Plan, conv: _Conv) -> dict[str, Any]:
    if plan.kind == "text":
        content: list[dict[str, Any]] = [{"type": "text", "text": plan.text}]
    else:
        content = [{"type": "tool_use", "id": f"toolu_{c.uid}", "name": c.name, "input": c.args}
                   for c in plan.calls]
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": conv.model,
            "content": content, "stop_reason": _ANTHROPIC_STOP[plan.finish], "stop_sequence": None,
            "usage": {"input_tokens": plan.input_tokens, "output_tokens": plan.output_tokens}}


def _anthropic_stream(plan: _Plan, conv: _Conv) -> Iterator[bytes]:
    def event(data: dict[str, Any]) -> bytes:
        return f"event: {data['type']}\ndata: {_dumps(data)}\n\n".encode()

    yield event({"type": "message_start", "message": {
        "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": conv.model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": plan.input_tokens, "output_tokens": 1}}})
    if plan.kind == "text":
        yield event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        for piece in stream_pieces(plan.text):
            yield event({"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": piece}})
        yield event({"type": "content_block_stop", "index": 0})
    for index, call in enumerate(plan.calls):
        yield event({"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": f"toolu_{call.uid}", "name": call.name, "input": {}}})
        for fragment in _fragments(call.args_json):
            yield event({"type": "content_block_delta", "index": index,
                         "delta": {"type": "input_json_delta", "partial_json": fragment}})
        yield event({"type": "content_block_stop", "index": index})
    yield event({"type": "message_delta", "delta": {"stop_reason": _ANTHROPIC_STOP[plan.finish],
                                                    "stop_sequence": None},
                 "usage": {"output_tokens": plan.output_tokens}})
    yield event({"type": "message_stop"})


def _gemini_usage(plan: _Plan) -> dict[str, int]:
    return {"promptTokenCount": plan.input_tokens, "candidatesTokenCount": plan.output_tokens,
            "totalTokenCount": plan.input_tokens + plan.output_tokens}


def _gemini_chunk(parts: list[dict[str, Any]], conv: _Conv, plan: _Plan | None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [candidate]}
    if plan is not None:
        candidate["finishReason"] = _GEMINI_FINISH[plan.finish]
        out["usageMetadata"] = _gemini_usage(plan)
    out["modelVersion"] = conv.model
    return out


def _gemini_parts(plan: _Plan) -> list[dict[str, Any]]:
    if plan.kind == "text":
        return [{"text": plan.text}]
    return [{"functionCall": {"name": c.name, "args": c.args}} for c in plan.calls]


def _gemini_json(plan: _Plan, conv: _Conv) -> dict[str, Any]:
    return _gemini_chunk(_gemini_parts(plan), conv, plan)


def _gemini_objects(plan: _Plan, conv: _Conv) -> Iterator[dict[str, Any]]:
    if plan.kind != "text":
        yield _gemini_chunk(_gemini_parts(plan), conv, plan)
        return
    pieces = stream_pieces(plan.text) or [""]
    for i, piece in enumerate(pieces):
        yield _gemini_chunk([{"text": piece}], conv, plan if i == len(pieces) - 1 else None)


def _gemini_stream(plan: _Plan, conv: _Conv, sse: bool) -> Iterator[bytes]:
    if sse:
        for obj in _gemini_objects(plan, conv):
            yield b"data: " + _dumps(obj).encode() + b"\r\n\r\n"
        return
    first = True
    for obj in _gemini_objects(plan, conv):
        yield (b"[" if first else b"\n,\r\n") + _dumps(obj).encode()
        first = False
    yield b"]"


# --------------------------------------------------------------------------------------------------
# HTTP server
# --------------------------------------------------------------------------------------------------

class _Headers(dict):
    """A dict of request headers with lower-case keys and case-insensitive lookup."""

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


class _Aborted(Exception):
    """The server is stopping: drop the response."""


_GEMINI_PATH = re.compile(r"^/(?:v1beta|v1)/models/([^:]+):(generateContent|streamGenerateContent)$")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 512
    allow_reuse_address = True
    fake: "FakeLLM"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (OSError, _Aborted)):
            return  # client went away / server stopping
        super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakellm/1.0"
    disable_nagle_algorithm = True
    server: _Server

    # -- plumbing -----------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        pass

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, add=False)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = {529: "Overloaded"}.get(status, "Error")
        lines = [f"HTTP/1.1 {status} {reason}", "Server: fakellm/1.0"]
        lines += [f"{k}: {v}" for k, v in headers]
        if self.close_connection:
            lines.append("Connection: close")
        elif self.request_version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              extra: list[tuple[str, str]] | None = None) -> None:
        self.entry["status"] = status
        head = self._head(status, [("Content-Type", content_type), ("Content-Length", str(len(body))),
                                   *(extra or [])])
        self.entry["done"] = time.time()  # set before the last write: a client holding the response sees it
        self.wfile.write(head + body)

    def _send_json(self, status: int, obj: Any, extra: list[tuple[str, str]] | None = None) -> None:
        self._send(status, _dumps(obj).encode(), extra=extra)

    def _error(self, provider: str | None, status: int, message: str,
               extra: list[tuple[str, str]] | None = None) -> None:
        self._send_json(status, error_body(provider, status, message), extra)

    def _stream(self, events: Iterator[bytes], content_type: str, pace: float) -> None:
        self.entry["status"] = 200
        chunked = self.request_version != "HTTP/1.0"
        if not chunked:
            self.close_connection = True
        headers = [("Content-Type", content_type), ("Cache-Control", "no-cache")]
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        pending = self._head(200, headers)
        first = True
        for data in events:
            if not first and pace and self.server.fake._sleep(pace):
                raise _Aborted
            first = False
            frame = b"%x\r\n%s\r\n" % (len(data), data) if chunked else data
            self.wfile.write(pending + frame)
            pending = b""
        self.entry["done"] = time.time()
        self.wfile.write(pending + (b"0\r\n\r\n" if chunked else b""))

    # -- routing ------------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        fake = self.server.fake
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        raw = self._read_body()
        body: Any = None
        bad_json = False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                bad_json = True
        headers = _Headers((k.lower(), v) for k, v in self.headers.items())
        provider = self._provider(path, headers)
        self.raw = raw
        self.entry: dict[str, Any] = {"path": path, "query": query, "method": self.command, "headers": headers,
                                      "json": body, "time": time.time(), "provider": provider,
                                      "status": None, "done": None,
                                      "peer": "%s:%s" % self.client_address[:2]}
        fake._log(self.entry)
        try:
            self._route(path, query, headers, provider, body, bad_json)
        except _Aborted:
            self.close_connection = True
        except OSError:
            self.close_connection = True
        except Exception as exc:  # a bug in the fake: answer 500 and keep serving
            import traceback
            traceback.print_exc()
            if self.entry["status"] is None:
                self._error(provider, 500, f"fakellm internal error: {exc!r}")
            else:
                self.close_connection = True

    @staticmethod
    def _provider(path: str, headers: _Headers) -> str | None:
        if path == "/v1/chat/completions" or path in MEDIA_PATHS:
            return "openai"
        if path == "/v1/messages":
            return "anthropic"
        if path == "/v1/models":
            return "anthropic" if ("x-api-key" in headers or "anthropic-version" in headers) else "openai"
        if _GEMINI_PATH.match(path) or path == "/v1beta/models":
            return "gemini"
        return None

    def _authorized(self, provider: str | None, headers: _Headers, query: dict[str, str]) -> bool:
        key = self.server.fake.required_key
        if key is None:
            return True
        if provider == "anthropic":
            return headers.get("x-api-key") == key
        if provider == "gemini":
            return headers.get("x-goog-api-key") == key or query.get("key") == key
        return headers.get("authorization") == f"Bearer {key}"

    def _route(self, path: str, query: dict[str, str], headers: _Headers, provider: str | None,
               body: Any, bad_json: bool) -> None:
        fake = self.server.fake
        method = self.command
        if provider is None:
            if method == "GET" and path in ("/", "/health"):
                return self._send_json(200, {"ok": True, "server": "fakellm"})
            if method == "GET" and path == "/_fakellm/stats":
                return self._send_json(200, {"requests": len(fake.requests)})
            if method == "POST" and path == "/_fakellm/reset":
                fake.reset()
                return self._send_json(200, {"ok": True})
            return self._error("openai", 404, f"Unknown request URL: {method} {path}")
        if not self._authorized(provider, headers, query):
            if provider == "anthropic":
                message = "invalid x-api-key"
            elif provider == "gemini":
                message = "API key not valid. Please pass a valid API key."
            else:
                message = "Incorrect API key provided."
            return self._error(provider, 401, message)

        gemini = _GEMINI_PATH.match(path)
        if method == "GET":
            if path == "/v1/models":
                return self._send_json(200, _model_list())
            if path == "/v1beta/models":
                return self._send_json(200, {"models": [
                    {"name": f"models/{m}", "displayName": m, "inputTokenLimit": 1_000_000,
                     "outputTokenLimit": 65_536,
                     "supportedGenerationMethods": ["generateContent", "streamGenerateContent"]}
                    for m in MODELS]})
            return self._error(provider, 405, f"Method {method} not allowed for {path}")
        if path == "/v1/models" or path == "/v1beta/models":
            return self._error(provider, 405, f"Method {method} not allowed for {path}")
        if path in MEDIA_PATHS:
            return self._media(path, headers, body)

        if bad_json or not isinstance(body, dict):
            return self._error(provider, 400, "We could not parse the JSON body of your request."
                               if bad_json else "Request body must be a JSON object.")
        try:
            if provider == "openai":
                conv = _openai_conv(body)
            elif provider == "anthropic":
                conv = _anthropic_conv(body)
            else:
                assert gemini is not None
                conv = _gemini_conv(body, unquote(gemini.group(1)).removeprefix("models/"))
        except _BadRequest as exc:
            return self._error(provider, 400, str(exc))

        plan = fake._plan(conv)
        if plan is None:
            raise _Aborted
        if plan.kind == "garbage":
            return self._send(200, GARBAGE_BODY)
        if plan.kind == "error":
            extra = [("Retry-After", _retry_after_value(plan.retry_after))] if plan.retry_after else None
            return self._error(provider, plan.status, plan.message, extra)

        if provider == "gemini":
            assert gemini is not None
            if gemini.group(2) == "generateContent":
                return self._send_json(200, _gemini_json(plan, conv))
            sse = query.get("alt") == "sse"
            return self._stream(_gemini_stream(plan, conv, sse),
                                "text/event-stream" if sse else "application/json", plan.pace)
        stream = bool(body.get("stream"))
        if provider == "openai":
            if stream:
                return self._stream(_openai_stream(plan, conv), "text/event-stream", plan.pace)
            return self._send_json(200, _openai_json(plan, conv))
        if stream:
            return self._stream(_anthropic_stream(plan, conv), "text/event-stream", plan.pace)
        return self._send_json(200, _anthropic_json(plan, conv))


    def _media(self, path: str, headers: _Headers, body: Any) -> None:
        """OpenAI's audio and image endpoints, with their documented request and response shapes."""
        if path == "/v1/audio/transcriptions":
            form = _multipart(headers.get("content-type") or "", self.raw)
            self.entry["form"] = {k: v if isinstance(v, str) else {"filename": v[0], "size": len(v[1])}
                                  for k, v in form.items()}
            if not isinstance(form.get("file"), tuple) or not form.get("model"):
                return self._error("openai", 400, "file and model are required (multipart/form-data)")
            name, data = form["file"]
            text = f"transcript of {name} ({len(data)} bytes)"
            if form.get("language"):
                text += f" in {form['language']}"
            return self._send_json(200, {"text": text})
        if not isinstance(body, dict):
            return self._error("openai", 400, "Request body must be a JSON object.")
        if path == "/v1/audio/speech":
            if not all(isinstance(body.get(k), str) and body[k] for k in ("model", "input", "voice")):
                return self._error("openai", 400, "model, input and voice are required")
            fmt = body.get("response_format") or "mp3"
            return self._send(200, b"FAKEAUDIO:" + body["input"].encode(), SPEECH_TYPES.get(fmt, "audio/mpeg"))
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            return self._error("openai", 400, "prompt is required")
        n = body.get("n") or 1
        b64 = body.get("response_format") == "b64_json" or body.get("model") == "gpt-image-1"
        item = ({"b64_json": base64.b64encode(TINY_PNG).decode()} if b64
                else {"url": f"http://127.0.0.1:{self.server.server_address[1]}/_fakellm/image.png"})
        return self._send_json(200, {"created": int(time.time()),
                                     "data": [{**item, "revised_prompt": body["prompt"]} for _ in range(n)]})


def _multipart(content_type: str, raw: bytes) -> dict[str, Any]:
    """Form fields of a multipart/form-data body: text fields as str, files as (filename, bytes)."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
    fields: dict[str, Any] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        filename = part.get_filename()
        fields[name] = (filename, data) if filename is not None else data.decode()
    return fields


def _png_1x1() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


MEDIA_PATHS = ("/v1/audio/transcriptions", "/v1/audio/speech", "/v1/images/generations")
SPEECH_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                "wav": "audio/wav", "pcm": "audio/pcm"}
TINY_PNG = _png_1x1()


def _model_list() -> dict[str, Any]:
    data = [{"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "fakellm",
             "type": "model", "display_name": m, "created_at": "2024-01-01T00:00:00Z"} for m in MODELS]
    return {"object": "list", "data": data, "has_more": False, "first_id": MODELS[0], "last_id": MODELS[-1]}


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------

class FakeLLM:
    """A scriptable fake OpenAI/Anthropic/Gemini server on a real socket (see the module docstring).

    The port is bound in the constructor (so ``url`` is valid at once); ``start()`` begins serving.
    ``max_log`` (default unlimited) caps ``requests`` to the most recent entries for long benchmarks.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, required_key: str | None = None,
                 max_log: int | None = None) -> None:
        self.required_key = required_key
        self.max_log = max_log
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._logged = threading.Condition(self._lock)
        self._fail_counts: dict[str, int] = {}
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        self._server = _Server((host, port), _Handler)
        self._server.fake = self
        self.host = host
        self.port: int = self._server.server_address[1]
        url_host = f"[{host}]" if ":" in host else host
        self.url = f"http://{url_host}:{self.port}"
        self.openai_base = self.url + "/v1"
        self.anthropic_base = self.url
        self.gemini_base = self.url

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> "FakeLLM":
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"fakellm:{self.port}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake sleeping/hung handlers and close every connection (does not wait for them)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- log ----------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Clear the request log (in place) and the ``[[fail:... times=K]]`` counters."""
        with self._lock:
            self.requests.clear()
            self._fail_counts.clear()

    def wait_requests(self, count: int, timeout: float = 5.0) -> bool:
        """Block until at least COUNT requests have been logged (True) or TIMEOUT passes (False)."""
        with self._logged:
            return self._logged.wait_for(lambda: len(self.requests) >= count, timeout)

    def _log(self, entry: dict[str, Any]) -> None:
        with self._logged:
            self.requests.append(entry)
            if self.max_log and len(self.requests) > 2 * self.max_log:
                del self.requests[:-self.max_log]
            self._logged.notify_all()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _sleep(self, seconds: float) -> bool:
        """Sleep; True when interrupted by stop()."""
        return self._stopping.wait(seconds) if seconds > 0 else self._stopping.is_set()

    # -- behaviour ----------------------------------------------------------------------------------

    def _plan(self, conv: _Conv) -> _Plan | None:
        script = parse_script(conv.user_text)
        plan = _Plan(kind="text", input_tokens=conv.input_tokens, pace=script.pace)
        if script.hang and self._sleep(3600):
            return None
        if script.slow and self._sleep(script.slow):
            return None
        if script.fail_status is not None:
            failing = True
            if script.fail_times is not None:
                with self._lock:
                    seen = self._fail_counts.get(conv.user_text, 0)
                    failing = seen < script.fail_times
                    if failing:
                        self._fail_counts[conv.user_text] = seen + 1
            if failing:
                plan.kind, plan.status, plan.retry_after = "error", script.fail_status, script.retry_after
                plan.message = f"fakellm: scripted failure {script.fail_status}"
                return plan
        if script.garbage:
            plan.kind = "garbage"
            return plan
        results = conv.tool_results
        if script.tools and len(results) < (1 if script.parallel else script.tool_repeat):
            plan.kind, plan.finish = "calls", "tool"
            plan.calls = [_Call(uuid.uuid4().hex[:24], name, args) for name, args in script.tools]
            plan.output_tokens = len(plan.calls)
            if script.think == "calls":  # reasoning text next to the calls (OpenAI format only)
                plan.text = THINK_TEXT + "calling a tool"
                plan.output_tokens += count_words(plan.text)
            return plan
        if script.tools:
            text = "tool said: " + (results[-1] if results else "")[:500]
        elif script.echo_params:
            text = _dumps({"max_tokens": conv.max_tokens, "temperature": conv.temperature, "model": conv.model,
                           "n_images": conv.n_images, "n_tools": conv.n_tools, "system": conv.system})
        elif script.reply is not None:
            text = script.reply
        elif script.chunks is not None:
            text = " ".join(f"w{i}" for i in range(1, script.chunks + 1))
        else:
            text = "echo: " + script.text
        if script.think == "closed":
            text = THINK_TEXT + text
        elif script.think == "unclosed":
            text = text + UNCLOSED_THINK_TEXT
        if script.length:
            words = text.split()
            text = " ".join(words[:math.ceil(len(words) / 2)])
            plan.finish = "length"
        plan.text = text
        plan.output_tokens = max(1, count_words(text))
        return plan


def main(argv: list[str] | None = None) -> None:
    """``python tests/fakellm.py --port N [--key K]``: serve in the foreground, print the URL first."""
    parser = argparse.ArgumentParser(description="Fake OpenAI/Anthropic/Gemini server for tests and benchmarks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key", default=None, help="required API key (default: none)")
    parser.add_argument("--max-log", type=int, default=1000, help="keep only the last N logged requests")
    args = parser.parse_args(argv)
    fake = FakeLLM(args.host, args.port, required_key=args.key, max_log=args.max_log or None)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    fake.start()
    print(fake.url, flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        fake.stop()


def _retry_after_value(given: str) -> str:
    """`date:S` is an HTTP date S seconds from now; anything else is sent as given."""
    if given.startswith("date:"):
        return email.utils.formatdate(time.time() + float(given[5:]), usegmt=True)
    return given


if __name__ == "__main__":
    main()

