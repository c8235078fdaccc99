"""The model call of a run: provider endpoints, the agent's model then its fallbacks, usage."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from agentd import tracing
from agentd.agents.handle import AgentHandle
from agentd.config import Config
from agentd.llm.catalog import Catalog
from agentd.llm.types import ChatRequest, ChatResponse, LLMError, ProviderEndpoint
from agentd.metrics import Metrics

# Metering.record for one answered call: (handle, provider, model, response[, rows]) -> its
# cost; with `rows` the usage row is collected there instead of written.
RecordUsage = Callable[..., "float | None"]

log = logging.getLogger("agentd.agents")



class ModelCalls:
    """Turns an agent's model chain into one callable per run.

    `record_usage` prices and records each answered call."""

    def __init__(self, config: Config, catalog: Catalog, record_usage: RecordUsage,
                 metrics: Metrics | None = None) -> None:
        self.config = config
        self.catalog = catalog
        self.record_usage = record_usage
        self.metrics = metrics
        # Provider base URLs set at runtime (PUT /api/providers/{name}/url) win over config.
        self.url_overrides: dict[str, str] = {}

    # -- provider endpoints ---------------------------------------------------
    def endpoint(self, provider_id: str, api_key_env: str = "", base_url: str = "") -> ProviderEndpoint:
        """Where and how to call `provider_id`, with the key read from the environment now."""
        info = self.catalog.get_provider(provider_id)
        if info is None and not base_url:
            raise LLMError(f"{provider_id}: unknown provider", provider=provider_id, model="",
                           kind="bad_request")
        url = (base_url or self.url_overrides.get(provider_id)
               or self.config.provider_urls.get(provider_id) or (info.base_url if info else ""))
        env = api_key_env or (info.api_key_env if info else "")
        return ProviderEndpoint(provider=provider_id, kind=info.kind if info else "openai",
                                base_url=url, api_key=os.environ.get(env, "") if env else "",
                                api_key_env=env, timeout=self.config.llm.timeout_secs,
                                stream_idle=self.config.llm.stream_idle_secs,
                                key_required=(info.key_required if info else bool(env)) or bool(api_key_env))

    def llm_call(self, handle: AgentHandle, usage: list[dict[str, Any]] | None = None,
                 model: str = "") -> Callable[..., ChatResponse]:
        """The model call of a run: the agent's model (or `model` of its provider), then its
        fallbacks. With `usage`, usage rows are collected there for the run's final
        transaction (SessionStore.save)."""
        defer = usage is not None
        chain = [(handle.provider, self.catalog.resolve(model) if model else handle.model,
                  handle.api_key_env, handle.base_url)]
        for fb in handle.manifest.data["fallback_models"]:
            chain.append((fb["provider"], self.catalog.resolve(fb["model"]), fb["api_key_env"], fb["base_url"]))

        # The drivers (and requests, ~6 MB) load on the first model call, not at start.
        from agentd.llm import drivers

        metrics = self.metrics

        def call(request: ChatRequest, on_event: Callable[[Any], None] | None,
                 cancel: threading.Event) -> ChatResponse:
            errors: list[LLMError] = []
            # One deadline for the call, fallbacks included.
            deadline = time.monotonic() + self.config.llm.timeout_secs
            for provider, model, env, base in chain:
                delivered = [False]
                first: list[float | None] = [None]  # seconds to the first streamed event
                started = time.monotonic()

                def forward(event: Any) -> None:
                    if not delivered[0]:
                        delivered[0] = True
                        first[0] = time.monotonic() - started
                    on_event(event)  # type: ignore[misc]

                try:
                    endpoint = self.endpoint(provider, env, base)
                    sent = request if request.model == model else replace(request, model=model)
                    attributes = {"gen_ai.system": provider, "gen_ai.request.model": model}
                    with tracing.span("llm.call", attributes) as current:
                        response = drivers.complete(endpoint, sent,
                                                    on_event=forward if on_event else None, cancel=cancel,
                                                    retries=self.config.llm.retries, deadline=deadline)
                        if current is not None:
                            current.set_attributes({"gen_ai.usage.input_tokens": response.usage.input_tokens,
                                                    "gen_ai.usage.output_tokens": response.usage.output_tokens})
                except LLMError as exc:
                    if metrics is not None:
                        metrics.llm_call(provider, model, exc.kind, time.monotonic() - started, first[0])
                    if exc.kind in ("cancelled", "timeout") or delivered[0]:
                        raise
                    errors.append(exc)
                    log.warning("model call failed: %s", exc.message)
                    continue
                if metrics is not None:
                    metrics.llm_call(provider, model, "ok", time.monotonic() - started, first[0])
                response.model = model
                cost = (self.record_usage(handle, provider, model, response, usage) if defer
                        else self.record_usage(handle, provider, model, response))
                response.cost_usd = cost  # type: ignore[attr-defined]
                return response
            if len(errors) == 1:
                raise errors[0]
            raise LLMError("all models failed: " + "; ".join(e.message for e in errors),
                           provider=errors[0].provider, model=errors[0].model, kind=errors[-1].kind,
                           http_status=errors[-1].http_status, retry_after=errors[-1].retry_after)

        return call
