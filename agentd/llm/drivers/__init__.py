"""One entry point for every provider call: `complete()`.

It picks the wire format by the endpoint's kind, retries throttling and server
errors with backoff (honouring Retry-After) as long as nothing has been streamed
to the caller yet, and gives up at once when the run is cancelled.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any, Callable

import requests

from agentd.llm.drivers import anthropic, gemini, openai_compat
from agentd.llm.drivers.assemble import Assembler
from agentd.llm.drivers.transport import network_error, post, read_json
from agentd.llm.types import ChatRequest, ChatResponse, LLMError, ProviderEndpoint

FORMATS: dict[str, ModuleType] = {"openai": openai_compat, "anthropic": anthropic, "gemini": gemini}
BACKOFF_BASE = 0.25
BACKOFF_MAX = 8.0
RETRY_AFTER_MAX = 30.0
# Calls that may be cancelled run here so the caller can walk away from a hung socket.
_CALLS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="agentd-llm")
_CANCEL_POLL = 0.05


def complete(endpoint: ProviderEndpoint, request: ChatRequest, on_event: Callable[[Any], None] | None = None,
             cancel: threading.Event | None = None, retries: int = 3) -> ChatResponse:
    """Call the model once (plus retries). Streams when `on_event` is given.

    Raises `LLMError`; kind `cancelled` when `cancel` was set during the call.
    """
    fmt = FORMATS.get(endpoint.kind)
    if fmt is None:
        raise LLMError(f"{endpoint.provider}: unsupported API format {endpoint.kind!r}",
                       provider=endpoint.provider, model=request.model, kind="bad_request")
    if endpoint.key_required and not endpoint.api_key:
        env = endpoint.api_key_env or "its API key variable"
        raise LLMError(f"{endpoint.provider} model {request.model}: no API key: set {env} in the daemon's "
                       f"environment or POST /api/providers/{endpoint.provider}/key",
                       provider=endpoint.provider, model=request.model, kind="missing_key")
    if not endpoint.base_url:
        raise LLMError(f"{endpoint.provider}: no base URL configured", provider=endpoint.provider,
                       model=request.model, kind="bad_request")
    delivered = threading.Event()
    cancel = cancel or threading.Event()

    def listener(event: Any) -> None:
        if cancel.is_set():
            raise _Cancelled()
        delivered.set()
        on_event(event)  # type: ignore[misc]

    attempt = 0
    while True:
        try:
            return _cancellable(lambda: _attempt(fmt, endpoint, request, listener if on_event else None),
                                cancel, endpoint, request.model)
        except LLMError as exc:
            if not exc.retryable or attempt >= retries or delivered.is_set():
                raise
            delay = _delay(attempt, exc.retry_after)
            attempt += 1
            if cancel.wait(delay):
                raise _cancelled_error(endpoint, request.model) from None


def _delay(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_MAX)
    return min(BACKOFF_BASE * (2 ** attempt), BACKOFF_MAX)


class _Cancelled(Exception):
    """Raised inside a stream when the caller cancelled; ends the read loop."""


def _cancelled_error(endpoint: ProviderEndpoint, model: str) -> LLMError:
    return LLMError(f"{endpoint.provider} model {model}: call cancelled", provider=endpoint.provider,
                    model=model, kind="cancelled")


def _cancellable(fn: Callable[[], ChatResponse], cancel: threading.Event, endpoint: ProviderEndpoint,
                 model: str) -> ChatResponse:
    """Run `fn` on the call pool; stop waiting (and let it die on its timeout) when cancelled."""
    if cancel.is_set():
        raise _cancelled_error(endpoint, model)
    future = _CALLS.submit(fn)
    while True:
        try:
            return future.result(timeout=_CANCEL_POLL)
        except TimeoutError:
            if cancel.is_set():
                raise _cancelled_error(endpoint, model) from None
        except _Cancelled:
            raise _cancelled_error(endpoint, model) from None


def _replay(result: ChatResponse, on_event: Callable[[Any], None]) -> None:
    """Turn a whole answer into the events a stream would have produced."""
    replay = Assembler(on_event)
    replay.add_text(result.text)
    for call in result.tool_calls:
        replay.whole_call(call.id, call.name, call.arguments)


def _attempt(fmt: ModuleType, endpoint: ProviderEndpoint, request: ChatRequest,
             on_event: Callable[[Any], None] | None) -> ChatResponse:
    stream = on_event is not None
    url, headers, body = fmt.prepare(endpoint, request, stream)
    response = post(endpoint, request.model, url, headers, body, stream)
    try:
        if not stream:
            return fmt.parse(endpoint, request.model, read_json(endpoint, request.model, response))
        if "event-stream" not in response.headers.get("Content-Type", "event-stream"):
            # Some servers ignore `stream: true` and answer with one JSON document.
            result = fmt.parse(endpoint, request.model, read_json(endpoint, request.model, response))
            _replay(result, on_event)
            return result
        try:
            return fmt.parse_stream(endpoint, request.model, response, on_event)
        except requests.RequestException as exc:
            raise network_error(endpoint, request.model, exc) from None
    finally:
        response.close()
