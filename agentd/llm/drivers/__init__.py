"""One entry point for every provider call: `complete()`.

It picks the wire format by the endpoint's kind, retries throttling and server
errors with backoff (honouring Retry-After) as long as nothing has been streamed
to the caller yet, and gives up at once when the run is cancelled.

One deadline bounds the whole call (`endpoint.timeout`: connect, every attempt and
backoff, the whole body or stream); a stream also fails after `endpoint.stream_idle`
seconds without a byte. The call runs in the caller's thread; a watchdog shuts its
socket down when the deadline passes or the call is cancelled (see guard.py), so a
stopped call never leaves a thread or a connection behind.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any, Callable

import requests

from agentd.llm.drivers import anthropic, gemini, openai_compat
from agentd.llm.drivers.assemble import Assembler
from agentd.llm.drivers.guard import CallGuard, guarded
from agentd.llm.drivers.reading import Interrupted, release_stream
from agentd.llm.drivers.transport import guard_error, network_error, post, read_json
from agentd.llm.types import ChatRequest, ChatResponse, LLMError, ProviderEndpoint
from agentd.retry import backoff_delay

FORMATS: dict[str, ModuleType] = {"openai": openai_compat, "anthropic": anthropic, "gemini": gemini}
BACKOFF_BASE = 0.25
BACKOFF_MAX = 8.0
RETRY_AFTER_MAX = 30.0
# Don't start another attempt with less time than this left before the deadline.
MIN_ATTEMPT_SECS = 0.05


def complete(endpoint: ProviderEndpoint, request: ChatRequest, on_event: Callable[[Any], None] | None = None,
             cancel: threading.Event | None = None, retries: int = 3,
             deadline: float | None = None) -> ChatResponse:
    """Call the model once (plus retries). Streams when `on_event` is given.

    `deadline` (time.monotonic()) defaults to now + `endpoint.timeout`; callers that try
    several models pass one deadline for all of them.
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
    delivered = [False]  # an event reached the caller: a retry would repeat it
    cancel = cancel or threading.Event()
    if deadline is None:
        deadline = time.monotonic() + endpoint.timeout

    def listener(event: Any) -> None:
        if cancel.is_set():
            raise _Cancelled()
        delivered[0] = True
        on_event(event)  # type: ignore[misc]

    attempt = 0
    while True:
        guard = CallGuard(deadline, endpoint.stream_idle if on_event else None, cancel)
        if cancel.is_set():
            guard.reason = "cancelled"
        elif guard.remaining() <= 0:
            guard.reason = "timeout"
        if guard.reason is not None:
            raise guard_error(endpoint, request.model, guard)
        try:
            return _attempt(fmt, endpoint, request, listener if on_event else None, guard)
        except LLMError as exc:
            if exc.kind == "cancelled" or not exc.retryable or attempt >= retries or delivered[0]:
                raise
            delay = retry_delay(attempt, exc.retry_after)
            if time.monotonic() + delay + MIN_ATTEMPT_SECS >= deadline:
                raise  # no time left for another attempt: report this one (a 429 keeps its Retry-After)
            attempt += 1
            if cancel.wait(delay):
                raise _cancelled_error(endpoint, request.model) from None


def retry_delay(attempt: int, retry_after: float | None) -> float:
    """Seconds before retry number `attempt` (0 for the first) of a model or embeddings call:
    the provider's Retry-After (at most RETRY_AFTER_MAX), else jittered exponential backoff."""
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_MAX)
    return backoff_delay(attempt, BACKOFF_BASE, BACKOFF_MAX)


class _Cancelled(Exception):
    """Raised inside a stream when the caller cancelled; ends the read loop."""


def _cancelled_error(endpoint: ProviderEndpoint, model: str) -> LLMError:
    return LLMError(f"{endpoint.provider} model {model}: call cancelled", provider=endpoint.provider,
                    model=model, kind="cancelled")


def active_calls() -> int:
    """Model calls in flight in this process (for health details and tests)."""
    from agentd.llm.drivers import guard

    return guard.active_calls()


def _replay(result: ChatResponse, on_event: Callable[[Any], None]) -> None:
    """Turn a whole answer into the events a stream would have produced."""
    replay = Assembler(on_event)
    replay.add_text(result.text)
    for call in result.tool_calls:
        replay.whole_call(call.id, call.name, call.arguments)


def _attempt(fmt: ModuleType, endpoint: ProviderEndpoint, request: ChatRequest,
             on_event: Callable[[Any], None] | None, guard: CallGuard) -> ChatResponse:
    """One HTTP exchange under `guard`; every failure comes out as an `LLMError`."""
    model = request.model
    try:
        with guarded(guard):
            result = _exchange(fmt, endpoint, request, on_event, guard)
    except _Cancelled:
        raise _cancelled_error(endpoint, model) from None
    except LLMError:
        if guard.reason is not None:  # e.g. a body cut short by the guard reads as garbage
            raise guard_error(endpoint, model, guard) from None
        raise
    except Interrupted:
        raise guard_error(endpoint, model, guard) from None
    except Exception as exc:  # noqa: BLE001 - requests, urllib3 and socket errors alike
        if not isinstance(exc, (requests.RequestException, OSError)) and type(exc).__module__.split(".")[0] not in (
                "urllib3", "http"):
            raise  # a bug or a failing listener, not the network
        raise network_error(endpoint, model, exc, guard) from None
    if guard.reason == "cancelled":
        raise _cancelled_error(endpoint, model)
    return result


def _exchange(fmt: ModuleType, endpoint: ProviderEndpoint, request: ChatRequest,
              on_event: Callable[[Any], None] | None, guard: CallGuard) -> ChatResponse:
    stream = on_event is not None
    url, headers, body = fmt.prepare(endpoint, request, stream)
    response = post(endpoint, request.model, url, headers, body, guard)
    try:
        if not stream:
            return fmt.parse(endpoint, request.model, read_json(endpoint, request.model, response))
        if "event-stream" not in response.headers.get("Content-Type", "event-stream"):
            # Some servers ignore `stream: true` and answer with one JSON document.
            result = fmt.parse(endpoint, request.model, read_json(endpoint, request.model, response))
            _replay(result, on_event)
            return result
        result = fmt.parse_stream(endpoint, request.model, response, on_event, guard)
        release_stream(response)
        return result
    finally:
        response.close()
