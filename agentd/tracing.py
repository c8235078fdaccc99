"""OpenTelemetry traces (the `otel` extra), off and not imported unless configured.

Tracing is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
is set or config.toml says `[telemetry] otel = true`, and `OTEL_SDK_DISABLED` is not `true`.
The exporter is then configured by the standard `OTEL_*` variables alone: endpoint, headers,
protocol (`http/protobuf` unless `grpc`), `OTEL_TRACES_EXPORTER` (`otlp`, `console`, `none`),
`OTEL_SERVICE_NAME`, the batch processor's `OTEL_BSP_*`.

Spans: one per HTTP request (continuing the client's W3C `traceparent`), one per agent run,
one per model call and one per tool call; the model call's context goes to the provider as
`traceparent` on the driver's request. While tracing is off every function here returns at
once (`span` hands back one shared null context), so the hot path pays one global lookup.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Callable, ContextManager, Mapping

from agentd.errors import ConfigError

# A werkzeug rule's variable (`<agent_id>`, `<path:name>`).
_CONVERTER = re.compile(r"<(?:[^<>:]+:)?([^<>]+)>")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_NOOP: ContextManager[Any] = contextlib.nullcontext()
_tracer: Any = None
_provider: Any = None


def wanted(otel: bool) -> bool:
    """Whether traces are asked for: `[telemetry] otel`, or an OTLP endpoint in the environment."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return otel or any(os.environ.get(name) for name in ENDPOINT_VARS)


def configure(otel: bool, exporter: Any = None) -> bool:
    """Start tracing if configured (or with `exporter`, a span exporter of the caller's, every
    span exported as it ends); True when on."""
    global _tracer, _provider
    if exporter is None and not wanted(otel):
        return False
    try:
        import opentelemetry.instrumentation.wsgi  # noqa: F401 - what `wsgi` needs, checked now
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        chosen = exporter or _exporter_from_environment()
    except ImportError as exc:
        raise ConfigError(f"traces are configured (OTEL_EXPORTER_OTLP_ENDPOINT or [telemetry] otel) but "
                          f"{exc.name or 'OpenTelemetry'} is not installed: pip install 'agentd[otel]'") from None
    from agentd import __version__

    provider = TracerProvider(resource=Resource.create({
        "service.name": os.environ.get("OTEL_SERVICE_NAME") or "agentd", "service.version": __version__}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif chosen is not None:
        provider.add_span_processor(BatchSpanProcessor(chosen))
    _provider = provider
    _tracer = provider.get_tracer("agentd", __version__)
    return True


def _exporter_from_environment() -> Any:
    kind = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={kind!r} is not supported (otlp, console or none)")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    else:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported (http/protobuf or grpc)")
    return OTLPSpanExporter()


def enabled() -> bool:
    return _tracer is not None


def shutdown() -> None:
    """Export what is still buffered and stop (the daemon's last step)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def span(name: str, attributes: Mapping[str, Any] | None = None, context: Any = None) -> ContextManager[Any]:
    """A span around a block, current inside it (a failure in the block is recorded on it);
    `context` (from `capture`) parents it when the block runs on another thread. The block
    gets the span, or None while tracing is off."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(name, context=context, attributes=attributes)


def capture() -> Any:
    """This thread's trace context, to parent work done elsewhere (None while off)."""
    if _tracer is None:
        return None
    from opentelemetry import context

    return context.get_current()


def inject(headers: dict[str, str]) -> dict[str, str]:
    """`headers` plus the current span's `traceparent` (the same dict while off)."""
    if _tracer is None:
        return headers
    from opentelemetry import propagate

    carried = dict(headers)
    propagate.inject(carried)
    return carried


def wsgi(app: Callable[..., Any]) -> Callable[..., Any]:
    """`app` with a server span per request, continuing the client's `traceparent`."""
    if _tracer is None:
        return app
    from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware

    return OpenTelemetryMiddleware(app, tracer_provider=_provider)


def name_request(method: str, rule: str | None) -> None:
    """Name the current request's span by its route template, written as in the OpenAPI
    document (`GET /v1/responses/{response_id}`); a request no route matched by its method
    alone, as OpenTelemetry's HTTP conventions ask (never its path: one name per path
    scanned would be without bound)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if rule is None:
        current.update_name(method)
        return
    route = _CONVERTER.sub(r"{\1}", rule)
    current.update_name(f"{method} {route}")
    current.set_attribute("http.route", route)
