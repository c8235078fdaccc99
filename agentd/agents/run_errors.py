"""How a failed run is reported: AgentRunError and the mapping from a failed model call."""

from __future__ import annotations

from agentd.errors import AgentdError
from agentd.llm.types import LLMError


class AgentRunError(AgentdError):
    """A run failed; the message says which provider/model/tool and why.

    `kind` is the LLMError kind that ended it (missing_key, auth, rate_limit, server,
    timeout, unreachable, bad_request, reset, truncated, ...) or `loop_guard`;
    `http_status` the provider's own status when it answered one; `provider`/`model`
    the call that failed; `retryable` whether sending the same request again may
    succeed. The API layers map them to their conventions; `status` is the native one.
    """

    status = 500

    def __init__(self, message: str, *, retry_after: float | None = None, kind: str = "server",
                 http_status: int | None = None, status: int | None = None, provider: str = "",
                 model: str = "", retryable: bool = False) -> None:
        super().__init__(message, status=status, retry_after=retry_after)
        self.kind = kind
        self.http_status = http_status
        self.provider = provider
        self.model = model
        self.retryable = retryable


# What the client gets for a model call that failed this way (everything else: 500).
# A provider without a key is 424 Failed Dependency: the request was fine, the daemon lacks
# a setting the message names, and sending it again unchanged cannot succeed.
_RUN_STATUS = {"timeout": 504, "rate_limit": 429, "reset": 502, "truncated": 502, "missing_key": 424}


def run_error(exc: LLMError, prefix: str = "message delivery failed") -> AgentRunError:
    """The client-facing error of a failed model call: 504 timeout, upstream 429/503 kept
    (with Retry-After), 502 for a reset connection or a cut-off stream."""
    status = _RUN_STATUS.get(exc.kind)  # None: AgentRunError's own 500
    if exc.kind == "server" and exc.http_status == 503:
        status = 503
    return AgentRunError(f"{prefix}: {exc.message}", status=status, retry_after=exc.retry_after,
                         kind=exc.kind, http_status=exc.http_status, provider=exc.provider,
                         model=exc.model, retryable=exc.retryable)
