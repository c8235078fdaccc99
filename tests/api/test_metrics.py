"""GET /metrics scraped from the real daemon: exact series after known traffic, the auth
every API route has, and the daemon's id on a shared database."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
import websocket
from prometheus_client.parser import text_string_to_metric_families

import pgtest
from conftest import LLM_ENV, llm_config
from fakes.recorder import Recorder
from support import Daemon, free_port, make_home, stop_shared, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs"
REMOTE = "203.0.113.7"
SECRET = "hook-secret"
MESSAGE_ROUTE = "/api/agents/<agent_id>/message"
SOCKET_ROUTE = "/api/agents/<agent_id>/ws"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    # The proxy on loopback is trusted, so a forwarded remote client is remote.
    config = llm_config(fake_llm, "\n[agents]\nmax_queue = 1\n").replace(
        "[api]\n", "[api]\ntrusted_proxies = [\"127.0.0.1\"]\n", 1)
    assert "trusted_proxies" in config
    d = Daemon(make_home(tmp_path_factory.mktemp("metrics"), config),
               env_extra={**LLM_ENV, "WEBHOOK_TEST_SECRET": SECRET}).start()
    yield d
    stop_shared(d)


def scrape(d: Daemon, **kwargs) -> dict[tuple[str, frozenset], float]:
    """Every sample of the scrape: (name, labels without daemon_id) -> value."""
    r = d.get("/metrics", **kwargs)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    samples = {}
    daemon_ids = set()
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = dict(s.labels)
            daemon_ids.add(labels.pop("daemon_id", None))
            samples[(s.name, frozenset(labels.items()))] = s.value
    # Several daemons on one database: every series names the daemon that served it.
    assert daemon_ids == ({r.headers["X-Agentd-Daemon"]} if pgtest.ENABLED else {None})
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def spawn(d: Daemon, name: str, extra: str = "") -> str:
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n' + extra})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def test_a_message_is_counted_by_route_run_model_call_and_tokens(daemon: Daemon) -> None:
    agent_id = spawn(daemon, "metered")
    before = scrape(daemon)
    # Every origin of the run path has its series from the start.
    assert value(before, "agentd_runs_total", origin="schedule", outcome="completed") == 0
    r = daemon.post(f"/api/agents/{agent_id}/message", json={"message": "count these words"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["response"] == "echo: count these words"

    after = scrape(daemon)

    def grew(name: str, **labels: str) -> float:
        # (Other tests of the module may share this daemon: what this message added.)
        return value(after, name, **labels) - (value(before, name, **labels) or 0)

    assert grew("agentd_http_requests_total", method="POST", route=MESSAGE_ROUTE, status="200") == 1
    assert grew("agentd_http_request_duration_seconds_count", method="POST", route=MESSAGE_ROUTE) == 1
    # The raw path, with the agent's id in it, is never a label value.
    assert not [key for key in after if any(agent_id in v for _, v in key[1])]
    assert grew("agentd_runs_total", origin="api", outcome="completed") == 1
    assert grew("agentd_run_duration_seconds_count", origin="api") == 1
    model = {"provider": "openai", "model": "gpt-4o"}
    assert grew("agentd_llm_calls_total", outcome="ok", **model) == 1
    assert grew("agentd_llm_call_duration_seconds_count", **model) == 1
    # The fake LLM's usage: four reply words out, and what it counted in.
    assert body["output_tokens"] == 4
    assert grew("agentd_llm_tokens_total", type="output", **model) == 4
    assert grew("agentd_llm_tokens_total", type="input", **model) == body["input_tokens"] > 0
    assert grew("agentd_llm_cost_usd_total", **model) == pytest.approx(body["cost_usd"])
    assert value(after, "agentd_budget_limit_usd") == 0
    assert grew("agentd_budget_spent_usd") == pytest.approx(body["cost_usd"])
    assert value(after, "agentd_agent_queue_depth") == 0
    assert value(after, "agentd_open_streams") == 0
    assert value(after, "agentd_scheduler_lag_seconds_count") == 0
    assert value(after, "agentd_memory_recall_seconds_count") is not None
    # The scrapes themselves are requests of the route template /metrics.
    assert value(after, "agentd_http_requests_total", method="GET", route="/metrics", status="200") >= 1


def test_runs_from_a2a_and_mcp_are_counted_by_their_origin(daemon: Daemon) -> None:
    spawn(daemon, "remote-asked")
    before = scrape(daemon)
    message = {"kind": "message", "role": "user", "messageId": "m-1", "parts": [{"kind": "text", "text": "hi"}]}
    r = daemon.post("/a2a/agents/remote-asked", json={"jsonrpc": "2.0", "id": 1, "method": "message/send",
                                                      "params": {"message": message}})
    assert r.status_code == 200 and r.json()["result"]["status"]["state"] == "completed", r.text
    after = scrape(daemon)
    assert value(after, "agentd_runs_total", origin="a2a", outcome="completed") == \
        value(before, "agentd_runs_total", origin="a2a", outcome="completed") + 1
    assert value(after, "agentd_runs_total", origin="mcp", outcome="completed") == 0
    assert value(after, "agentd_runs_total", origin="other", outcome="completed") is None


def test_a_streamed_run_a_failed_model_call_and_refusals(daemon: Daemon) -> None:
    agent_id = spawn(daemon, "streamed")
    before = scrape(daemon)
    with daemon.post(f"/api/agents/{agent_id}/message/stream", json={"message": "[[chunks:4]] [[pace:300]]"},
                     stream=True) as r:
        assert r.status_code == 200
        lines = r.iter_lines(decode_unicode=True)
        next(line for line in lines if line.startswith("data:"))
        assert value(scrape(daemon), "agentd_open_streams") == 1
        events = "\n".join(lines)
    assert "event: done" in events
    failing = spawn(daemon, "failing")
    r = daemon.post(f"/api/agents/{failing}/message", json={"message": "[[fail:400]]"})
    assert r.status_code >= 400
    big = daemon.post(f"/api/agents/{agent_id}/message", json={"message": "x" * (64 * 1024 + 1)})
    assert big.status_code == 413

    samples = scrape(daemon)
    assert value(samples, "agentd_runs_total", origin="sse", outcome="completed") == 1
    assert value(samples, "agentd_http_requests_total", method="POST", route=MESSAGE_ROUTE + "/stream",
                 status="200") == 1
    ttft = "agentd_llm_time_to_first_token_seconds_count"
    model = {"provider": "openai", "model": "gpt-4o"}
    assert value(samples, ttft, **model) - (value(before, ttft, **model) or 0) == 1
    # The stream counts as open until the server has closed its body.
    wait_until(lambda: value(scrape(daemon), "agentd_open_streams") == 0, "the stream to be counted closed")
    assert value(samples, "agentd_llm_calls_total", provider="openai", model="gpt-4o", outcome="bad_request") == 1
    assert value(samples, "agentd_runs_total", origin="api", outcome="failed") == 1
    assert value(samples, "agentd_requests_refused_total", reason="size") == 1
    assert value(samples, "agentd_http_requests_total", method="POST", route=MESSAGE_ROUTE, status="413") == 1


def test_a_queued_run_is_counted_and_a_full_queue_refused(daemon: Daemon, fake_llm) -> None:
    agent_id = spawn(daemon, "busy")
    sent = len(fake_llm.requests)
    url = f"{daemon.url}/api/agents/{agent_id}/message"
    answers: list[int] = []
    threads = [threading.Thread(target=lambda text=text: answers.append(
        requests.post(url, json={"message": text}, timeout=30).status_code)) for text in ("[[slow:1.5]]", "next")]
    threads[0].start()
    wait_until(lambda: any("[[slow:1.5]]" in json.dumps(r.get("json")) for r in fake_llm.requests[sent:]),
               "the first run to reach the model")
    threads[1].start()
    wait_until(lambda: value(scrape(daemon), "agentd_agent_queue_depth") == 1, "the second run to queue")
    refused = daemon.post(f"/api/agents/{agent_id}/message", json={"message": "one too many"})
    assert refused.status_code == 429
    for thread in threads:
        thread.join(30)
    assert answers == [200, 200]
    samples = scrape(daemon)
    assert value(samples, "agentd_requests_refused_total", reason="queue_full") == 1
    assert value(samples, "agentd_agent_queue_depth") == 0


def test_a_spent_token_quota_is_a_refusal(daemon: Daemon) -> None:
    agent_id = spawn(daemon, "rationed", "[resources]\nmax_llm_tokens_per_hour = 1\n")
    assert daemon.post(f"/api/agents/{agent_id}/message", json={"message": "spend it"}).status_code == 200
    refused = daemon.post(f"/api/agents/{agent_id}/message", json={"message": "once more"})
    assert refused.status_code == 429 and "quota exceeded" in refused.json()["error"]
    samples = scrape(daemon)
    assert value(samples, "agentd_requests_refused_total", reason="quota") == 1
    assert value(samples, "agentd_requests_refused_total", reason="budget") == 0


def test_unknown_paths_share_one_label(daemon: Daemon) -> None:
    for n in range(3):
        assert daemon.get(f"/api/nothing-here-{n}").status_code == 404
    samples = scrape(daemon)
    assert value(samples, "agentd_http_requests_total", method="GET", route="unmatched", status="404") == 3


def test_a_route_variable_is_labelled_without_its_converter(daemon: Daemon) -> None:
    agent_id = spawn(daemon, "keyed")
    assert daemon.put(f"/api/memory/agents/{agent_id}/kv/a/b", json={"value": 1}).status_code == 200
    samples = scrape(daemon)
    assert value(samples, "agentd_http_requests_total", method="PUT",
                 route="/api/memory/agents/<agent_id>/kv/<key>", status="200") == 1
    assert not [key for key in samples if any(":" in v for name, v in key[1] if name == "route")]


def test_a_remote_client_of_a_keyless_daemon_is_refused(daemon: Daemon) -> None:
    r = daemon.get("/metrics", headers={"X-Forwarded-For": REMOTE})
    assert r.status_code == 401
    assert "API key required" in r.json()["error"]
    assert "agentd_" not in r.text
    r = daemon.get("/metrics", headers={"Host": "evil.example"})
    assert r.status_code == 400 and "agentd_" not in r.text


def test_metrics_need_the_key_when_one_is_set_and_agent_names_label_per_agent_series(tmp_path: Path) -> None:
    d = Daemon(make_home(tmp_path, 'api_key = "k-metrics"\n[metrics]\nagent_labels = true\n'),
               api_key="k-metrics").start()
    anonymous = requests.get(f"{d.url}/metrics", timeout=10)
    assert anonymous.status_code == 401
    assert anonymous.json() == {"error": "missing API key: send Authorization: Bearer <api_key>"}
    wrong = requests.get(f"{d.url}/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert (wrong.status_code, wrong.json()) == (401, {"error": "invalid API key"})
    agent_id = spawn(d, "labelled")
    # A body refused for its size is the agent's when the path names one.
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "x" * (64 * 1024 + 1)}).status_code == 413
    assert d.post("/api/agents", data=b"x" * (4 * 1024 * 1024),
                  headers={"Content-Type": "application/json"}).status_code == 413
    samples = scrape(d)
    assert value(samples, "agentd_http_requests_total", method="GET", route="/metrics", status="401") == 2
    assert value(samples, "agentd_agent_queue_depth", agent="labelled") == 0
    assert value(samples, "agentd_agent_queue_depth") is None
    assert value(samples, "agentd_requests_refused_total", reason="size", agent="labelled") == 1
    assert value(samples, "agentd_requests_refused_total", reason="size", agent="") == 1


def test_disabled_metrics_are_not_served(tmp_path: Path) -> None:
    off = Daemon(make_home(tmp_path, "[metrics]\nenabled = false\n")).start()
    r = off.get("/metrics")
    assert r.status_code == 404 and "error" in r.json()
    assert "/metrics" not in off.get("/api/openapi.json").json()["paths"]


def test_the_route_is_in_the_openapi_document(daemon: Daemon) -> None:
    operation = daemon.get("/api/openapi.json").json()["paths"]["/metrics"]["get"]
    assert "text/plain" in operation["responses"]["200"]["content"]
    assert "401" in operation["responses"]


def test_an_open_websocket_is_counted_while_it_is_open_and_its_opening_as_a_101(daemon: Daemon) -> None:
    agent_id = spawn(daemon, "socketed")
    ws = websocket.create_connection(daemon.url.replace("http://", "ws://") + f"/api/agents/{agent_id}/ws",
                                     timeout=15)
    try:
        assert json.loads(ws.recv())["type"] == "connected"
        samples = scrape(daemon)
        assert value(samples, "agentd_open_websockets") == 1
        # The request is its opening: counted once answered, with the status the wire said.
        assert value(samples, "agentd_http_requests_total", method="GET", route=SOCKET_ROUTE, status="101") == 1
        time.sleep(1.5)
    finally:
        ws.close()
    wait_until(lambda: value(scrape(daemon), "agentd_open_websockets") == 0, "the socket to be counted closed")
    samples = scrape(daemon)
    assert value(samples, "agentd_http_requests_total", method="GET", route=SOCKET_ROUTE, status="101") == 1
    assert value(samples, "agentd_http_requests_total", method="GET", route=SOCKET_ROUTE, status="200") is None
    assert value(samples, "agentd_http_request_duration_seconds_count", method="GET", route=SOCKET_ROUTE) == 1
    assert value(samples, "agentd_http_request_duration_seconds_sum", method="GET", route=SOCKET_ROUTE) < 1


def test_docs_and_dashboard_name_exactly_the_served_metrics(daemon: Daemon) -> None:
    r = daemon.get("/metrics")
    served = {family.name for family in text_string_to_metric_families(r.text)}
    assert all(name.startswith("agentd_") for name in served)
    table = set(re.findall(r"^\| `(agentd_\w+)` \|", (DOCS / "metrics.md").read_text(), re.M))
    # The table names counters with their _total sample, as queries use them.
    assert {name.removesuffix("_total") for name in table} == served
    dashboard = json.loads((DOCS / "grafana-agentd.json").read_text())
    used = {re.sub(r"_(bucket|count|sum)$", "", name).removesuffix("_total")
            for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"agentd_\w+", target["expr"])}
    assert used <= served and len(used) >= len(served) - 1  # all but the build info


def test_channel_messages_in_out_and_refused_by_adapter(daemon: Daemon) -> None:
    spawn(daemon, "hooked")
    callback = Recorder()
    port = free_port()
    r = daemon.post("/api/channels/webhook/configure", json={
        "listen_port": port, "callback_url": callback.url + "/cb", "secret_env": "WEBHOOK_TEST_SECRET",
        "default_agent": "hooked", "allowed_users": ["u-ok"]})
    assert r.status_code == 200, r.text
    try:
        wait_until(lambda: next(c for c in daemon.get("/api/channels").json() if c["name"] == "webhook")["active"],
                   "the webhook channel to start")
        for sender in ("u-ok", "u-stranger"):
            body = json.dumps({"sender_id": sender, "message": "hello hook"}).encode()
            signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            sent = requests.post(f"http://127.0.0.1:{port}/", data=body, timeout=10,
                                 headers={"X-Webhook-Signature": signature, "Content-Type": "application/json"})
            assert sent.status_code == 202, sent.text
        wait_until(lambda: callback.requests, "the reply")
        samples = scrape(daemon)
        assert value(samples, "agentd_channel_messages_total", adapter="webhook", direction="in") == 1
        assert value(samples, "agentd_channel_messages_total", adapter="webhook", direction="refused") == 1
        wait_until(lambda: value(scrape(daemon), "agentd_channel_messages_total", adapter="webhook",
                                 direction="out") == 1, "the reply to be counted")
        assert value(scrape(daemon), "agentd_runs_total", origin="channel", outcome="completed") == 1
    finally:
        daemon.delete("/api/channels/webhook/configure")
        callback.close()


@pytest.mark.skipif(not pgtest.ENABLED, reason="several daemons share a database only on PostgreSQL (--db=postgres)")
def test_daemons_on_one_database_each_label_their_own_series(tmp_path: Path) -> None:
    url = pgtest.databases().new_url()
    daemons = [Daemon(make_home(tmp_path / name, f'[cluster]\ndaemon_id = "{name}"\n'),
                      env_extra={"AGENTD_DATABASE_URL": url}).start() for name in ("metrics-a", "metrics-b")]
    for d, name in zip(daemons, ("metrics-a", "metrics-b")):
        text = d.get("/metrics").text
        ids = {s.labels.get("daemon_id") for f in text_string_to_metric_families(text) for s in f.samples}
        assert ids == {name}


def test_rate_limited_requests_are_refusals(tmp_path: Path) -> None:
    from agentd.api import create_app
    from agentd.config import parse_config
    from agentd.kernel import Kernel
    from support import with_test_db

    data = {"api": {"rate_limit_per_second": 1, "rate_limit_burst": 2}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp_path), tmp_path))
    try:
        client = create_app(kernel).test_client()
        statuses = [client.get("/api/status", environ_base={"REMOTE_ADDR": "127.0.0.1"}).status_code
                    for _ in range(4)]
        assert statuses.count(429) >= 1
        text = kernel.metrics.exposition().decode()
        samples = {(s.name, frozenset((k, v) for k, v in s.labels.items() if k != "daemon_id")): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        assert value(samples, "agentd_requests_refused_total", reason="rate_limit") == statuses.count(429)
        assert value(samples, "agentd_http_requests_total", method="GET", route="/api/status",
                     status="429") == statuses.count(429)
    finally:
        kernel.close()
