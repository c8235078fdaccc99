"""How a failed run is reported (agentd/agents/run_errors.py): every kind's status, exact fields."""

from __future__ import annotations

import pytest

from agentd.agents.run_errors import AgentRunError, run_error
from agentd.llm.types import LLMError


def test_agent_run_error_defaults() -> None:
    exc = AgentRunError("boom")
    assert (exc.message, str(exc), exc.status, exc.retry_after, exc.kind, exc.http_status, exc.provider, exc.model,
            exc.retryable) == ("boom", "boom", 500, None, "server", None, "", "", False)
    exc = AgentRunError("m", retry_after=2.5, kind="auth", http_status=401, status=502, provider="p", model="x",
                        retryable=True)
    assert (exc.status, exc.retry_after, exc.kind, exc.http_status, exc.provider, exc.model, exc.retryable) == \
        (502, 2.5, "auth", 401, "p", "x", True)


@pytest.mark.parametrize("kind, http_status, status", [
    ("timeout", None, 504), ("rate_limit", 429, 429), ("rate_limit", 503, 429), ("reset", None, 502),
    ("truncated", None, 502), ("server", 503, 503), ("server", 500, 500), ("server", 502, 500),
    ("server", None, 500), ("auth", 503, 500), ("unreachable", None, 500), ("bad_request", 400, 500),
    ("missing_key", None, 424), ("bad_response", 200, 500), ("not_found", 404, 500), ("cancelled", None, 500),
])
def test_status_of_each_kind(kind, http_status, status) -> None:
    exc = LLMError("openai/gpt-4o: it broke", provider="openai", model="gpt-4o", kind=kind, http_status=http_status,
                   retry_after=7)
    out = run_error(exc)
    assert out.status == status, f"BUG: a {kind} ({http_status}) failure is answered {out.status}"
    assert (out.message, out.retry_after, out.kind, out.http_status, out.provider, out.model, out.retryable) == \
        ("message delivery failed: openai/gpt-4o: it broke", 7, kind, http_status, "openai", "gpt-4o", exc.retryable)
    assert out.code is None


def test_retryable_is_carried_and_the_prefix_is_the_callers() -> None:
    assert run_error(LLMError("x", kind="server")).retryable is True
    assert run_error(LLMError("x", kind="auth")).retryable is False
    out = run_error(LLMError("why", kind="timeout"), prefix="step failed")
    assert out.message == "step failed: why" and out.retry_after is None
