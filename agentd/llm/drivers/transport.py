"""HTTP plumbing shared by every driver: sessions, error mapping, SSE parsing."""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable

import requests

from agentd import tracing
from agentd.llm.drivers.guard import CallGuard, GuardedAdapter
from agentd.llm.drivers.reading import Interrupted, read_body
from agentd.llm.types import LLMError, Message, ProviderEndpoint, Usage
from agentd.retry import retry_after

_local = threading.local()
# The request body encoder (json.dumps with options builds a new one per call).
_encode_strict = json.JSONEncoder(allow_nan=False, check_circular=False).encode  # (bodies are trees)
ERROR_TEXT_LIMIT = 300


_PROXY_SETTINGS = ("http_proxy", "https_proxy", "all_proxy")


def session() -> requests.Session:
    """One keep-alive session per thread: connection reuse without sharing pools across threads."""
    s = getattr(_local, "session", None)
    if s is None:
        s = requests.Session()
        # Connections register with the calling thread's CallGuard so a hung or cancelled
        # call can be interrupted from the watchdog (see guard.py).
        adapter = GuardedAdapter()
        s.mount("http://", adapter)
        s.mount("https://", adapter)
        # With trust_env, requests rescans os.environ for proxies on every call: the largest
        # CPU cost of a model call in profiles. Keep it only when a proxy is configured
        # (no_proxy matching needs it); a CA bundle variable is read once here instead.
        s.trust_env = any(k.lower() in _PROXY_SETTINGS for k in os.environ)
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if bundle:
            s.verify = bundle
        _local.session = s
        _local.base_headers = {name.lower(): (name, value) for name, value in s.headers.items()}
    return s


_urls: dict[str, str] = {}  # a URL -> requests' normalised form of it (parsed once)
URL_CACHE_SIZE = 512


def send_json(url: str, headers: dict[str, str], body: dict[str, Any],
              timeout: tuple[float, float]) -> requests.Response:
    """POST `body` as JSON and return the streamed response, as `session().post(url, json=...,
    stream=True)` does, for a fraction of its CPU.

    `Session.request` re-parses the URL, merges cookies, hooks and settings and runs the
    redirect and cookie machinery on every call: about a third of a model call's CPU in
    profiles. Provider calls need none of it (no cookies, no redirects followed), so the
    request is prepared here once per URL and handed to the session's adapter. With a proxy
    configured in the environment the full `Session.post` runs (its proxy matching needs it).
    """
    s = session()
    if s.trust_env:
        return s.post(url, json=body, headers=headers, stream=True, timeout=timeout)
    prepared_url = _urls.get(url)
    if prepared_url is None:
        probe = requests.PreparedRequest()
        probe.prepare_url(url, None)
        if len(_urls) >= URL_CACHE_SIZE:  # URLs that carry per-call values: keep the cache small
            _urls.clear()
        prepared_url = _urls[url] = probe.url
    try:
        data = _encode_strict(body).encode("utf-8")
    except ValueError as exc:  # as requests reports it for `json=`
        raise requests.exceptions.InvalidJSONError(exc) from None
    prep = requests.PreparedRequest()
    prep.method = "POST"
    prep.url = prepared_url
    # The session's headers, then the call's, by name in any case (as requests merges them),
    # into the plain dict urllib3 sends from: requests' case-insensitive dict costs a method
    # call per header, twice.
    merged = dict(_local.base_headers)
    for name, value in headers.items():
        merged[name.lower()] = (name, value)
    if "content-type" not in merged:
        merged["content-type"] = ("Content-Type", "application/json")
    merged["content-length"] = ("Content-Length", str(len(data)))
    prep.headers = dict(merged.values())
    prep.body = data
    prep.hooks = {"response": []}
    # Certificate settings only matter for https; requests would stat a CA bundle path on
    # every call to a plain-http (local) provider.
    verify = s.verify if prepared_url.startswith("https:") else True
    return s.get_adapter(prepared_url).send(prep, stream=True, timeout=timeout, verify=verify,
                                            cert=s.cert, proxies={})


def where(endpoint: ProviderEndpoint, model: str) -> str:
    """The prefix of every error message: which provider and model failed."""
    return f"{endpoint.provider} model {model}"


def post(endpoint: ProviderEndpoint, model: str, url: str, headers: dict[str, str],
         body: dict[str, Any], guard: CallGuard) -> requests.Response:
    """POST JSON under `guard`; non-2xx answers become `LLMError`s, network failures raise as is."""
    remaining = guard.remaining()
    if remaining <= 0:
        raise Interrupted("timeout")
    # The guard enforces the deadline; the read timeout is only a backstop.
    response = send_json(url, tracing.inject(headers), body,
                         timeout=(max(0.05, min(endpoint.connect_timeout, remaining)), remaining + 1))
    guard.received = True
    if response.status_code >= 400:
        try:
            raise http_error(endpoint, model, response)
        finally:
            response.close()
    return response


def guard_error(endpoint: ProviderEndpoint, model: str, guard: CallGuard) -> LLMError:
    """The error of an attempt the guard interrupted."""
    if guard.reason == "cancelled":
        return LLMError(f"{endpoint.provider} model {model}: call cancelled", provider=endpoint.provider,
                        model=model, kind="cancelled")
    if guard.reason == "idle":
        return LLMError(f"{where(endpoint, model)}: timed out: the stream stalled, no data for "
                        f"{guard.idle:g}s from {endpoint.base_url} (stream_idle_secs)",
                        provider=endpoint.provider, model=model, kind="timeout")
    return LLMError(f"{where(endpoint, model)}: timed out after {endpoint.timeout:g}s waiting for "
                    f"{endpoint.base_url} (timeout_secs)", provider=endpoint.provider, model=model,
                    kind="timeout")


def network_error(endpoint: ProviderEndpoint, model: str, exc: Exception,
                  guard: CallGuard | None = None) -> LLMError:
    """Map a network failure (before or during the body) to what happened, as far as is known."""
    if guard is not None and guard.reason is not None:
        return guard_error(endpoint, model, guard)
    text = str(exc)
    if isinstance(exc, requests.Timeout) or "timed out" in text.lower():
        return LLMError(f"{where(endpoint, model)}: timed out after {endpoint.timeout:g}s waiting for "
                        f"{endpoint.base_url}", provider=endpoint.provider, model=model, kind="timeout")
    if guard is not None and guard.last_byte is not None:
        return truncated(endpoint, model, f"end of stream: the connection broke ({type(exc).__name__})")
    if guard is not None and guard.received:
        return LLMError(f"{where(endpoint, model)}: the connection broke while reading the answer: "
                        f"{type(exc).__name__}", provider=endpoint.provider, model=model, kind="server")
    if guard is not None and guard.sent:
        if guard.reused:
            # A kept-alive connection the server had already closed: nothing was processed.
            return LLMError(f"{where(endpoint, model)}: the kept-alive connection to {endpoint.base_url} "
                            "was closed", provider=endpoint.provider, model=model, kind="unreachable")
        return LLMError(f"{where(endpoint, model)}: connection reset by {endpoint.base_url} after the "
                        "request was sent (the provider may have received it; not retried)",
                        provider=endpoint.provider, model=model, kind="reset")
    if isinstance(exc, (requests.ConnectionError, OSError)) and not isinstance(
            exc, requests.exceptions.ChunkedEncodingError):
        return LLMError(f"{where(endpoint, model)}: cannot reach {endpoint.base_url}: connection failed",
                        provider=endpoint.provider, model=model, kind="unreachable")
    return LLMError(f"{where(endpoint, model)}: the connection broke: {type(exc).__name__}",
                    provider=endpoint.provider, model=model, kind="server")


_KIND_BY_STATUS = {400: "bad_request", 401: "auth", 403: "auth", 404: "not_found", 408: "server",
                   409: "server", 413: "bad_request", 422: "bad_request", 429: "rate_limit"}


def http_error(endpoint: ProviderEndpoint, model: str, response: requests.Response) -> LLMError:
    """An error answer from the provider, with its own message when it gave one."""
    status = response.status_code
    kind = _KIND_BY_STATUS.get(status, "server" if status >= 500 else "bad_request")
    detail = provider_message(response)
    if kind == "auth":
        detail = f"the provider rejected the API key ({detail})" if detail else "the provider rejected the API key"
    message = f"{where(endpoint, model)}: HTTP {status}" + (f": {detail}" if detail else "")
    return LLMError(message, provider=endpoint.provider, model=model, kind=kind, http_status=status,
                    retry_after=retry_after(response.headers.get("Retry-After")))


def provider_message(response: requests.Response) -> str:
    """The human message inside an OpenAI-, Anthropic- or Gemini-shaped error body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:ERROR_TEXT_LIMIT].strip()
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "")[:ERROR_TEXT_LIMIT]
    if isinstance(error, str):
        return error[:ERROR_TEXT_LIMIT]
    return ""


def read_json(endpoint: ProviderEndpoint, model: str, response: requests.Response) -> dict[str, Any]:
    """Decode a non-streamed answer; anything but a JSON object is a bad response."""
    body = read_body(response)
    try:
        try:
            data = json.loads(body)  # UTF-8, -16 or -32, as RFC 8259 has it
        except UnicodeDecodeError:  # as `response.json()` reads it: the declared charset
            data = json.loads(body.decode(response.encoding or "utf-8", errors="replace"))
    except (ValueError, LookupError):  # (LookupError: an unknown charset)
        raise bad_response(endpoint, model, "the answer is not valid JSON") from None
    if not isinstance(data, dict):
        raise bad_response(endpoint, model, "the answer is not a JSON object")
    return data


def truncated(endpoint: ProviderEndpoint, model: str, missing: str) -> LLMError:
    """A stream that ended without its end marker: an error, never a complete answer."""
    return LLMError(f"{where(endpoint, model)}: the stream was cut off before the answer was complete "
                    f"(no {missing})", provider=endpoint.provider, model=model, kind="truncated")


def parse_event_json(endpoint: ProviderEndpoint, model: str, data: str) -> dict[str, Any]:
    """Decode one stream event's data."""
    try:
        obj = json.loads(data)
    except ValueError:
        raise bad_response(endpoint, model, "a stream event is not valid JSON") from None
    if not isinstance(obj, dict):
        raise bad_response(endpoint, model, "a stream event is not a JSON object")
    return obj


def bad_response(endpoint: ProviderEndpoint, model: str, why: str) -> LLMError:
    return LLMError(f"{where(endpoint, model)}: unusable response: {why}", provider=endpoint.provider,
                    model=model, kind="bad_response")


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict; malformed JSON from the model becomes {} (the tool then says what is missing)."""
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def usage_from(data: Any, input_key: str, output_key: str) -> Usage | None:
    """Token counts from a provider's usage object; None when there is none."""
    if not isinstance(data, dict):
        return None
    return Usage(int(data.get(input_key) or 0), int(data.get(output_key) or 0))


def merge_turns(messages: list[Message], assistant_role: str, key: str,
                convert: Callable[[Message], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Anthropic and Gemini want user/assistant turns to alternate, and tool results travel
    as user turns: consecutive messages of one side become one turn with their parts joined."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = assistant_role if m.role == "assistant" else "user"
        parts = convert(m)
        if not parts:
            continue
        if out and out[-1]["role"] == role:
            out[-1][key].extend(parts)
        else:
            out.append({"role": role, key: parts})
    return out
