"""Provider-neutral request, response and stream-event types.

Drivers translate these to and from one provider's wire format; the agent loop
and the API only ever see these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentd.errors import AgentdError


@dataclass(frozen=True)
class ImagePart:
    """An image attached to a user message, base64-encoded."""

    media_type: str
    data_b64: str


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation requested by the model."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as offered to the model: name, description, JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class Message:
    """One conversation turn. Tool results have role `tool` and carry `tool_call_id`."""

    role: str  # system | user | assistant | tool
    content: str = ""
    images: list[ImagePart] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False


@dataclass(frozen=True)
class Usage:
    """Token counts of one or more model calls."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)


@dataclass
class ChatRequest:
    """One model call."""

    model: str
    messages: list[Message]
    system: str = ""
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None


@dataclass
class ChatResponse:
    """What one model call returned. `finish_reason` is stop, length or tool_calls."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    cost_usd: float | None = None


# -- stream events -------------------------------------------------------------

@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer's text."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """The model began a tool call (name known, arguments still coming)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of a tool call's JSON arguments."""

    index: int
    arguments: str


@dataclass(frozen=True)
class ToolCallEnd:
    """A tool call is complete, with its parsed arguments."""

    index: int
    id: str
    name: str
    arguments: dict[str, Any]


StreamEvent = TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd


@dataclass(frozen=True)
class ProviderEndpoint:
    """Where and how to reach one provider, key already read from the environment."""

    provider: str
    kind: str  # openai | anthropic | gemini
    base_url: str
    api_key: str = ""
    api_key_env: str = ""
    key_required: bool = True
    timeout: float = 120.0  # the whole call: connect, retries, backoff, body or stream
    connect_timeout: float = 10.0
    stream_idle: float = 60.0  # a stream fails after this long without a byte


LLM_ERROR_KINDS = frozenset({"missing_key", "auth", "rate_limit", "server", "timeout", "unreachable",
                             "bad_response", "not_found", "bad_request", "cancelled",
                             "reset", "truncated"})


class LLMError(AgentdError):
    """A model call failed; the message names provider, model and cause."""

    status = 500

    def __init__(self, message: str, *, provider: str = "", model: str = "", kind: str = "server",
                 http_status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.provider = provider
        self.model = model
        self.kind = kind if kind in LLM_ERROR_KINDS else "server"
        self.http_status = http_status

    @property
    def retryable(self) -> bool:
        """Worth another attempt: throttling, server trouble, or a network failure."""
        return self.kind in ("rate_limit", "server", "timeout", "unreachable", "truncated")
