"""Reading request bodies: size caps, content type, JSON syntax, schema validation."""

from __future__ import annotations

import io
import json
from typing import Any

from flask import request
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import RequestEntityTooLarge

from agentd import jsonsafe
from agentd.errors import AgentdError, BadRequest, PayloadTooLarge

# Default cap for JSON routes. Large enough for a 1 MB manifest after JSON
# escaping, small enough that a 2 MB body is refused before it is parsed.
JSON_BODY_LIMIT = 1_572_864


class UnsupportedMediaType(AgentdError):
    status = 415


def _declared_body(environ: dict[str, Any], max_bytes: int) -> bytes | None:
    """A body of declared length read straight from the WSGI input (None: not that case).

    werkzeug's `get_data` wraps the input in a stream object and reads it in a loop: about
    8 µs for a small body, most of the cost of reading a message. A body with a plain
    Content-Length and no transfer coding needs none of that. What was read becomes the
    input again (a buffer) for any later reader, werkzeug's form parser included."""
    declared = environ.get("CONTENT_LENGTH")
    if not declared or not declared.isascii() or not declared.isdigit() or "HTTP_TRANSFER_ENCODING" in environ:
        return None
    size = int(declared)
    if size > max_bytes:
        raise PayloadTooLarge(f"request body too large: {size} bytes (limit {max_bytes})")
    data = environ["wsgi.input"].read(size)
    if len(data) < size:  # (as werkzeug reports a body cut short)
        raise BadRequest(f"request body ended after {len(data)} of its {size} bytes")
    environ["wsgi.input"] = io.BytesIO(data)  # (a second read reads it again, from the start)
    return data


def raw_body(max_bytes: int) -> bytes:
    """The request body, refusing more than `max_bytes` (declared or streamed)."""
    req = request._get_current_object()
    if "stream" not in req.__dict__:  # (werkzeug has not begun reading it: its cached stream)
        data = _declared_body(req.environ, max_bytes)
        if data is not None:
            return data
    # A chunked or oddly declared body: werkzeug's reader, its size checks and its cache.
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"request body too large: {request.content_length} bytes (limit {max_bytes})")
    # A body without Content-Length (chunked) is streamed: werkzeug stops reading at the
    # limit and returns what it read, so read one byte more to tell "at" from "past" it.
    request.max_content_length = max_bytes + 1
    too_large = f"request body too large (limit {max_bytes} bytes)"
    try:
        data = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise PayloadTooLarge(too_large) from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(too_large)
    return data


def json_body(max_bytes: int = JSON_BODY_LIMIT, *, allow_empty: bool = False) -> Any:
    """Parse the body as JSON; 413/415/400 with a clear message otherwise."""
    data = raw_body(max_bytes)
    if not data.strip():
        if allow_empty:
            return None
        raise BadRequest("request body is empty; expected JSON")
    if request._get_current_object().environ.get("CONTENT_TYPE") != "application/json":  # (the usual value: no parse)
        mimetype = request.mimetype
        if mimetype != "application/json" and not mimetype.endswith("+json"):
            raise UnsupportedMediaType(
                f"Content-Type must be application/json (got {request.content_type or 'none'})")
    try:
        return portable_json(data)
    except UnicodeDecodeError:
        raise BadRequest("malformed JSON: body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def portable_json(data: bytes | str) -> Any:
    """`jsonsafe.loads`, what it refuses (too deep, NaN, Infinity, a lone surrogate) a 400
    as for a request body; text that is not JSON at all raises json.JSONDecodeError."""
    try:
        return jsonsafe.loads(data)
    except jsonsafe.JsonTooDeep:
        raise BadRequest(jsonsafe.TOO_DEEP_MESSAGE) from None
    except jsonsafe.JsonNotPortable as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


def format_validation(messages: Any, prefix: str = "") -> str:
    """Flatten marshmallow's nested messages into `field: problem; ...`."""
    parts: list[str] = []
    if isinstance(messages, dict):
        for key, value in messages.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "_schema":
                name = prefix or "body"
            parts.append(format_validation(value, name))
    elif isinstance(messages, list):
        texts = [m if isinstance(m, str) else format_validation(m, prefix) for m in messages]
        return f"{prefix}: {' '.join(texts)}" if prefix else " ".join(texts)
    else:
        return f"{prefix}: {messages}" if prefix else str(messages)
    return "; ".join(parts)


def load(schema: Schema, max_bytes: int = JSON_BODY_LIMIT, *, allow_empty: bool = False) -> dict[str, Any]:
    """Parse the JSON body and validate it with a marshmallow schema (an empty body
    counts as `{}` when `allow_empty`)."""
    if allow_empty and not raw_body(max_bytes).strip():
        return validate(schema, {})
    # A JSON `null` body is not an empty one: it fails the object check below.
    return validate(schema, json_body(max_bytes))


def validate(schema: Schema, body: Any) -> dict[str, Any]:
    """Validate an already parsed body with a marshmallow schema (400 naming each field)."""
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    fast_load = getattr(schema, "fast_load", None)
    loaded = fast_load(body) if fast_load is not None else None
    if loaded is not None:
        return loaded
    try:
        return schema.load(body)
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {format_validation(exc.messages)}") from None
