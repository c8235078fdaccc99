"""OpenTelemetry traces: the spans of a request (in process, with the SDK's in-memory
exporter), the client's `traceparent` continued to the provider, and spans exported over
OTLP/HTTP by a daemon configured with the standard OTEL_* variables alone."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentd import tracing
from agentd.api import create_app
from agentd.config import parse_config
from agentd.errors import ConfigError
from agentd.kernel import Kernel
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared, wait_until, with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


def test_off_unless_configured(monkeypatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert not tracing.wanted(False) and tracing.wanted(True)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing.wanted(False)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.wanted(True)
    with pytest.raises(ConfigError, match="telemetry.otel: expected a boolean"):
        parse_config({"telemetry": {"otel": "yes"}}, Path("/tmp"))
    assert parse_config({"telemetry": {"otel": True}}, Path("/tmp")).telemetry.otel is True
    assert not tracing.enabled() and not tracing.configure(False)
    # Off: the shared null context, the headers as they were, no context to carry.
    assert tracing.span("x") is tracing.span("y")
    headers = {"a": "b"}
    assert tracing.inject(headers) is headers and tracing.capture() is None


def test_configured_without_the_extra_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.wsgi", None)
    with pytest.raises(ConfigError, match=r"opentelemetry.instrumentation.wsgi is not installed: "
                                          r"pip install 'agentd\[otel\]'"):
        tracing.configure(True)
    assert not tracing.enabled()


@pytest.fixture
def traced(tmp_path, fake_llm, monkeypatch) -> Iterator[tuple[Any, InMemorySpanExporter, Any]]:
    for name, value in LLM_ENV.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    assert tracing.configure(False, exporter=exporter)
    data = {"llm": {"timeout_secs": 5, "retries": 0},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    try:
        yield create_app(kernel).test_client(), exporter, fake_llm
    finally:
        kernel.close()
        tracing.shutdown()


def test_spans_of_a_request_and_the_traceparent_sent_upstream(traced) -> None:
    client, exporter, fake = traced
    r = client.post("/api/agents", json={"manifest_toml": 'name = "traced"\n'}, environ_base=LOCAL)
    assert r.status_code == 201
    r.close()  # (a request's span ends when its answer is closed)
    client.get(f"/api/agents/{r.get_json()['agent_id']}", environ_base=LOCAL).close()
    [detail] = [s for s in exporter.get_finished_spans() if s.name.startswith("GET ")]
    assert detail.name == "GET /api/agents/{agent_id}" and detail.attributes["http.route"] == "/api/agents/{agent_id}"
    exporter.clear()
    r = client.post("/v1/chat/completions", environ_base=LOCAL, headers={"traceparent": TRACEPARENT},
                    json={"model": "agentd:traced", "messages": [{"role": "user", "content": "[[tool:lookup]] go"}]})
    assert r.status_code == 200, r.get_data(as_text=True)
    r.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"POST /v1/chat/completions", "agent.run", "llm.call", "tool.call"}
    calls = [s for s in exporter.get_finished_spans() if s.name == "llm.call"]
    assert len(calls) == 2  # the tool call, then the answer
    request, run, tool = spans["POST /v1/chat/completions"], spans["agent.run"], spans["tool.call"]
    # One trace, the client's; each span a child of the one around it.
    assert {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans()} == {TRACE_ID}
    assert format(request.parent.span_id, "016x") == CLIENT_SPAN
    assert run.parent.span_id == request.context.span_id
    assert all(c.parent.span_id == run.context.span_id for c in calls)
    assert tool.parent.span_id == run.context.span_id
    assert request.attributes["http.route"] == "/v1/chat/completions"
    assert dict(run.attributes) == {"agentd.agent": "traced", "agentd.run.origin": "v1", "agentd.run.finish_reason": "stop",
                                    "gen_ai.usage.input_tokens": 26, "gen_ai.usage.output_tokens": 13}
    assert [sum(c.attributes[f"gen_ai.usage.{kind}_tokens"] for c in calls) for kind in ("input", "output")] == \
        [26, 13], "the run's tokens are its model calls' together"
    assert calls[0].attributes["gen_ai.system"] == "openai" and calls[0].attributes["gen_ai.request.model"] == "gpt-4o"
    assert calls[1].attributes["gen_ai.usage.output_tokens"] > 0
    assert tool.attributes == {"agentd.tool": "lookup", "agentd.tool.is_error": True}
    # The provider got the model call's own span as its parent.
    sent = [entry["headers"]["traceparent"] for entry in fake.requests[-2:]]
    assert sent == [f"00-{TRACE_ID}-{format(c.context.span_id, '016x')}-01" for c in calls]


def test_a_refused_request_is_named_by_its_route_and_an_unknown_path_by_its_method(traced) -> None:
    client, exporter, _ = traced
    refused = client.get("/api/status", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert refused.status_code == 401
    refused.close()
    client.get("/api/nope/4711", environ_base=LOCAL).close()
    named = [(s.name, s.attributes.get("http.route")) for s in exporter.get_finished_spans()]
    assert named == [("GET /api/status", "/api/status"), ("GET", None)]


def test_a_tool_that_runs_another_agent_stays_in_the_trace(traced) -> None:
    client, exporter, _fake = traced
    for name in ("caller", "callee"):
        r = client.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n'}, environ_base=LOCAL)
        assert r.status_code == 201
        r.close()
    exporter.clear()
    send = "[[tool:agent_send " + json.dumps({"agent_id": "callee", "message": "ping"}) + "]]"
    r = client.post("/v1/chat/completions", environ_base=LOCAL, headers={"traceparent": TRACEPARENT},
                    json={"model": "agentd:caller", "messages": [{"role": "user", "content": send}]})
    assert r.status_code == 200 and "echo: ping" in r.get_json()["choices"][0]["message"]["content"]
    r.close()
    spans = exporter.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE_ID}
    [tool] = [s for s in spans if s.name == "tool.call"]
    runs = {s.attributes["agentd.agent"]: s for s in spans if s.name == "agent.run"}
    assert runs["callee"].parent.span_id == tool.context.span_id
    assert runs["callee"].attributes["agentd.run.origin"] == "agent"


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces with protobuf bodies."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    outer.spans += [span for rs in request.resource_spans for ss in rs.scope_spans
                                    for span in ss.spans]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def otel_daemon(tmp_path_factory, fake_llm, collector) -> Iterator[Daemon]:
    env = {**LLM_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_SERVICE_NAME": "agentd-test"}
    d = Daemon(make_home(tmp_path_factory.mktemp("otel"), llm_config(fake_llm)), env_extra=env).start()
    yield d
    stop_shared(d)


def test_daemon_continues_the_clients_trace_to_the_provider(otel_daemon, fake_llm, collector) -> None:
    d = otel_daemon
    assert d.post("/api/agents", json={"manifest_toml": 'name = "otel"\n'}).status_code == 201
    r = d.post("/v1/chat/completions", headers={"traceparent": TRACEPARENT},
               json={"model": "agentd:otel", "messages": [{"role": "user", "content": "traced hello"}]})
    assert r.status_code == 200
    entry = next(e for e in reversed(fake_llm.requests) if "traced hello" in json.dumps(e.get("json") or {}))
    version, trace_id, parent, flags = entry["headers"]["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01") and parent != CLIENT_SPAN
    # The batch processor exports within its 100 ms schedule.
    wait_until(lambda: {"POST /v1/chat/completions", "agent.run", "llm.call"}
               <= {s.name for s in collector.spans if s.trace_id.hex() == TRACE_ID}, "the spans exported")
    call = next(s for s in collector.spans if s.name == "llm.call" and s.trace_id.hex() == TRACE_ID)
    assert call.span_id.hex() == parent
    # A streamed answer is written through the traced app as before.
    r = d.post("/v1/responses", json={"model": "agentd:otel", "input": "streamed", "stream": True})
    assert r.status_code == 200 and "event: response.completed" in r.text


def test_the_configuration_alone_turns_traces_on(tmp_path: Path, fake_llm) -> None:
    """`[telemetry] otel = true` with no OTLP endpoint in the environment (spans exported
    nowhere: `OTEL_TRACES_EXPORTER=none`): the client's trace still reaches the provider."""
    home = make_home(tmp_path, llm_config(fake_llm, "\n[telemetry]\notel = true\n"))
    d = Daemon(home, env_extra={**LLM_ENV, "OTEL_TRACES_EXPORTER": "none"}).start()
    try:
        assert d.post("/api/agents", json={"manifest_toml": 'name = "configured"\n'}).status_code == 201
        r = d.post("/v1/chat/completions", headers={"traceparent": TRACEPARENT},
                   json={"model": "agentd:configured", "messages": [{"role": "user", "content": "configured trace"}]})
        assert r.status_code == 200, r.text
    finally:
        d.stop()
    entry = next(e for e in reversed(fake_llm.requests) if "configured trace" in json.dumps(e.get("json") or {}))
    version, trace_id, parent, flags = entry["headers"]["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01") and parent != CLIENT_SPAN
