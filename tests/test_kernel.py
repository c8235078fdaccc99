"""agentd/kernel.py: what the kernel answers the routes (status, health detail, custom events,
the agents a channel answers as, whether a workflow exists, a run's usage), the services it
wires together meeting through the daemon's app, and its stop (the shutdown hook, the
runs stopped, what is released). In process over a real kernel, runs going to the fake LLM."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

from agentd import __version__, malloc_tuning
from agentd.api import create_app
from agentd.cachefill import cache_fill
from agentd.config import parse_config
from agentd.kernel import Kernel
from agentd.store import open_store
from agentd.store.checkpoint import PAGE_CACHE_KIB
from agentd.timestamps import iso
import pgtest
from support import wait_until, with_test_db

# A variable nobody sets: the channel is configured but its adapter cannot start.
UNSET_TOKEN = "TELEGRAM_KERNEL_TEST_TOKEN"
ADMIN = "kernel-admin"


def config_data(fake_llm, **extra: Any) -> dict[str, Any]:
    return {"api_key": ADMIN, "api": {"rate_limit_per_second": 100000, "rate_limit_burst": 100000, "max_streams": 8},
            "llm": {"timeout_secs": 10, "retries": 1},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
            "provider_urls": {"openai": fake_llm.openai_base},
            "memory": {"auto_remember": False}, **extra}


class Site:
    """A kernel and the daemon's app over it (its pool figures a fixed stand-in)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.app = create_app(kernel, lambda: {"threads": 3, "busy": 1})
        self.client = self.app.test_client()

    def call(self, method: str, path: str, token: str = ADMIN, **kwargs: Any) -> tuple[int, Any]:
        r = self.client.open(path, method=method, headers={"Authorization": f"Bearer {token}"}, **kwargs)
        return r.status_code, r.get_json()

    def spawn(self, name: str, extra: str = "") -> Any:
        status, body = self.call("POST", "/api/agents", json={"manifest_toml": f'name = "{name}"\n{extra}'})
        assert status == 201, body
        return self.kernel.agents.get(body["agent_id"])


def kernel_config(home: Path, fake_llm, backend: str | None = None, **extra: Any) -> Any:
    """The kernel's config on the suite's backend, or on `backend` ("sqlite", "postgres")
    whichever pass of the suite runs (mutation runs use the SQLite one)."""
    data = config_data(fake_llm, **extra)
    if backend is None:
        data = with_test_db(data, home)
    elif backend == "postgres":
        data["database_url"] = pgtest.databases().new_url()
    return parse_config(data, home)


def open_kernel(home: Path, fake_llm, backend: str | None = None, **extra: Any) -> Kernel:
    return Kernel.open(kernel_config(home, fake_llm, backend, **extra))


@pytest.fixture
def site(request: pytest.FixtureRequest, tmp_path: Path, fake_llm, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    """A kernel of the test's own (its build is what most of the kernel's code does) with the
    agent `desk`, a telegram channel that answers as `desk` in its own conversations and as
    `route` in one thread (its adapter never starts), a daemon id of its own and metrics per agent.
    Parametrized indirectly with a backend, it is on that backend."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    monkeypatch.delenv(UNSET_TOKEN, raising=False)
    site = Site(open_kernel(tmp_path / "home", fake_llm, getattr(request, "param", None), channels={
        "telegram": {"bot_token_env": UNSET_TOKEN, "default_agent": "desk", "thread_routes": {"42": "route"}},
        "discord": {"bot_token_env": UNSET_TOKEN}}, cluster={"daemon_id": "kernel-daemon"},
        metrics={"agent_labels": True}))
    site.closed, site.fake_llm = False, fake_llm
    site.desk = site.spawn("desk")
    yield site
    if not site.closed:
        site.kernel.close()


# -- status ------------------------------------------------------------------------------------------------------

def test_status_names_the_daemon_and_its_agents(site: Site) -> None:
    kernel = site.kernel
    site.spawn("other")
    status, body = site.call("GET", "/api/status")
    handles = kernel.agents.handles()
    assert status == 200
    assert 0 <= body.pop("uptime_seconds") <= kernel.uptime_seconds
    assert body == {"status": "running", "version": __version__, "agent_count": len(handles),
                    "default_provider": "openai", "default_model": "gpt-4o",
                    "api_listen": kernel.config.api_listen, "home_dir": str(kernel.config.home),
                    "log_level": kernel.config.log_level, "network_enabled": kernel.config.network_enabled,
                    "agents": [kernel.agents.summary(h) for h in handles]}
    assert site.desk in handles and body["agents"]
    # What a caller may reach narrows the agents and their count.
    only_desk = kernel.status(lambda hs: [h for h in hs if h.name == "desk"])
    assert only_desk["agent_count"] == 1 and only_desk["agents"] == [kernel.agents.summary(site.desk)]
    assert kernel.agent_summaries(lambda hs: []) == []
    assert kernel.agent_summaries() == body["agents"]


def test_uptime_counts_whole_seconds_since_the_start(site: Site) -> None:
    site.kernel._started_mono = time.monotonic() - 7.5
    assert site.kernel.uptime_seconds == 7


# -- health detail -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("site", ["sqlite", "postgres"], indirect=True)
def test_health_detail_reports_every_figure(site: Site) -> None:
    kernel = site.kernel
    sqlite = kernel.store.backend == "sqlite"
    status, body = site.call("GET", "/api/health/detail")
    assert status == 200
    threads = body.pop("process_threads")
    assert isinstance(threads, int) and threads >= 2
    heap = body.pop("sqlite_heap_kib")
    assert (isinstance(heap, int) and heap > 0) if sqlite else heap is None
    assert 0 <= body.pop("uptime_seconds") <= kernel.uptime_seconds
    malloc = malloc_tuning.applied()
    assert body == {"status": "ok", "version": __version__, "database": "connected",
                    "agent_count": len(kernel.agents.handles()), "thread_pool": {"threads": 3, "busy": 1},
                    "started_at": iso(kernel.started_at), "model_calls_in_flight": 0,
                    "malloc_arenas": malloc["arenas"], "malloc_mmap_threshold": malloc["mmap_threshold"],
                    "sqlite_page_cache_kib": PAGE_CACHE_KIB if sqlite else None,
                    "caches": cache_fill(kernel.agents.sessions.cached, kernel.memory)}


def test_health_detail_while_the_database_is_out(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = site.kernel
    monkeypatch.setattr(kernel.store, "ping", lambda: False)
    body = kernel.health_detail({})
    assert (body["status"], body["database"]) == ("degraded", "error")
    assert body["agent_count"] == len(kernel.agents.registry.loaded()) >= 1


def test_model_calls_in_flight_are_counted(site: Site) -> None:
    """A model call holding its connection shows while it lasts; none before the drivers load
    or while they load."""
    done: list[tuple[int, Any]] = []
    worker = threading.Thread(target=lambda: done.append(site.call(
        "POST", f"/api/agents/{site.desk.id}/message", json={"message": "[[slow:1.5]] still there?"})))
    worker.start()
    try:
        wait_until(lambda: site.kernel.health_detail({})["model_calls_in_flight"] == 1, 10)
    finally:
        worker.join(15)
    assert done and done[0][0] == 200, done
    assert site.kernel.health_detail({})["model_calls_in_flight"] == 0
    drivers = sys.modules.pop("agentd.llm.drivers")
    try:
        assert site.kernel.health_detail({})["model_calls_in_flight"] == 0
        # While the first model call imports them, the drivers' module has none of its functions yet.
        sys.modules["agentd.llm.drivers"] = types.ModuleType("agentd.llm.drivers")
        assert site.kernel.health_detail({})["model_calls_in_flight"] == 0
    finally:
        sys.modules["agentd.llm.drivers"] = drivers


# -- a run's usage -------------------------------------------------------------------------------------------------

def test_a_runs_usage_is_metered_and_counted_in_the_metrics(site: Site) -> None:
    """What a model call used reaches the month's usage and the metrics, input and output apart."""
    handle = site.spawn("usage")
    status, answer = site.call("POST", f"/api/agents/{handle.id}/message", json={"message": "one two three"})
    assert status == 200 and answer["response"] == "echo: one two three", answer
    assert answer["input_tokens"] != answer["output_tokens"]
    status, rows = site.call("GET", f"/api/budget/agents")
    assert status == 200
    row = next(r for r in rows if r["agent_id"] == handle.id)
    assert (row["input_tokens"], row["output_tokens"]) == (answer["input_tokens"], answer["output_tokens"])
    assert row["spent_usd"] == pytest.approx(answer["cost_usd"]) and answer["cost_usd"] > 0
    metrics = site.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).get_data(as_text=True)
    totals = site.kernel.metering.by_model(*month())
    gpt = next(r for r in totals if r["model"] == "gpt-4o")
    gpt4o = {"model": "gpt-4o", "provider": "openai"}
    assert sample(metrics, "agentd_llm_tokens_total", type="input", **gpt4o) == gpt["input_tokens"]
    assert sample(metrics, "agentd_llm_tokens_total", type="output", **gpt4o) == gpt["output_tokens"]
    assert sample(metrics, "agentd_llm_cost_usd_total", **gpt4o) == pytest.approx(gpt["cost_usd"])
    assert sample(metrics, "agentd_llm_calls_total", outcome="ok", **gpt4o) == gpt["requests"]
    assert sample(metrics, "agentd_runs_total", origin="api", outcome="completed", agent="usage") == 1
    assert sample(metrics, "agentd_budget_spent_usd") == pytest.approx(site.kernel.metering.budget()["spent_usd"])


@pytest.mark.parametrize("site", ["sqlite", "postgres"], indirect=True)
def test_metrics_name_the_daemon_only_on_a_shared_database(site: Site) -> None:
    metrics = site.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).get_data(as_text=True)
    labelled = {line.partition(" ")[0] for line in metrics.splitlines() if line.startswith("agentd_open_streams")}
    if site.kernel.store.backend == "sqlite":
        assert labelled == {"agentd_open_streams"}
    else:
        assert labelled == {'agentd_open_streams{daemon_id="kernel-daemon"}'}


def sample(exposition: str, name: str, **labels: str) -> float:
    """The value of the metric `name` with these labels (a shared database's daemon adds its own)."""
    for line in exposition.splitlines():
        metric, _, value = line.rpartition(" ")
        if metric.partition("{")[0] == name and labels.items() <= dict(
                re.findall(r'(\w+)="([^"]*)"', metric)).items():
            return float(value)
    raise AssertionError(f"no {name} {labels}")


def test_a_message_waiting_for_its_busy_agent_counts_in_the_queue_depth(site: Site) -> None:
    path = f"/api/agents/{site.desk.id}/message"
    done: list[tuple[int, Any]] = []
    workers = [threading.Thread(target=lambda text=text: done.append(site.call("POST", path, json={"message": text})))
               for text in ("[[slow:1.5]] first", "second")]

    def depth() -> float:
        metrics = site.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).get_data(as_text=True)
        return sample(metrics, "agentd_agent_queue_depth", agent="desk")   # [metrics] agent_labels

    assert depth() == 0
    workers[0].start()
    try:
        wait_until(lambda: site.desk.busy, 10)
        workers[1].start()
        wait_until(lambda: depth() == 1, 10)
    finally:
        for worker in workers:
            worker.join(15)
    assert sorted(status for status, _ in done) == [200, 200] and depth() == 0


def month():
    from agentd.metering import month_bounds
    from agentd.timestamps import utcnow

    return month_bounds(utcnow())


# -- custom events -------------------------------------------------------------------------------------------------

def test_a_published_event_reaches_the_bus_and_the_audit(site: Site) -> None:
    heard: list[Any] = []
    site.kernel.events.subscribe(heard.append)
    status, body = site.call("POST", "/api/events", json={"event_type": "deploy.done", "payload": {"v": 1}})
    assert (status, body["status"]) == (202, "accepted"), body
    wait_until(lambda: any(e.id == body["event_id"] for e in heard), 5)
    event = next(e for e in heard if e.id == body["event_id"])
    assert (event.kind, event.type, event.payload, event.origin, event.key_id) == (
        "custom", "deploy.done", {"v": 1}, "api", "")
    entry = site.kernel.audit.recent(1, prefix="event.")[0]
    assert (entry["event"], entry["subject"], entry["detail"]) == (
        "event.publish", "deploy.done", {"event_id": body["event_id"]})
    key = site.kernel.keys.create({"name": "publisher", "scopes": ["message"]})
    status, body = site.call("POST", "/api/events", key["key"], json={"event_type": "keyed", "payload": {}})
    assert status == 202, body
    event_id = body["event_id"]
    wait_until(lambda: any(e.id == event_id for e in heard), 5)
    assert next(e for e in heard if e.id == event_id).key_id == key["id"]
    entry = site.kernel.audit.recent(1, prefix="event.")[0]
    assert (entry["subject"], entry["detail"]) == ("keyed", {"event_id": event_id, "key_id": key["id"]})


# -- channels and workflows ------------------------------------------------------------------------------------

def test_the_agents_a_channel_answers_as(site: Site) -> None:
    kernel = site.kernel
    assert kernel.channel_agents("slack") is None   # not configured
    assert kernel.channel_agents("telegram") == [site.desk, None]   # `route` is not spawned
    # No default agent: the daemon's first agent, and none while no agent runs.
    assert kernel.channel_agents("discord") == [site.desk]
    kernel.agents.kill(site.desk)
    assert kernel.channel_agents("discord") == [None]
    route = site.spawn("route")
    assert kernel.channel_agents("telegram") == [None, route]
    assert kernel.channel_agents("discord") == [route]


def test_a_cron_job_runs_only_a_workflow_that_exists(site: Site) -> None:
    job = {"name": "nightly", "agent_id": "desk", "schedule": {"kind": "cron", "expr": "0 3 * * *"}}
    status, body = site.call("POST", "/api/cron/jobs", json={
        **job, "action": {"kind": "workflow_run", "workflow_id": "nowhere", "input": "go"}})
    assert (status, body["error"]) == (400, "action.workflow_id: no workflow 'nowhere'")
    status, created = site.call("POST", "/api/workflows", json={
        "name": "wf", "steps": [{"name": "one", "agent_name": "desk", "prompt": "{{input}}"}]})
    assert status == 201, created
    status, body = site.call("POST", "/api/cron/jobs", json={
        **job, "action": {"kind": "workflow_run", "workflow_id": created["workflow_id"], "input": "go"}})
    assert status == 201, body
    assert body["action"] == {"kind": "workflow_run", "workflow_id": created["workflow_id"], "input": "go"}
    assert site.call("POST", f"/api/cron/jobs/{body['id']}/run")[0] in (200, 202)
    wait_until(lambda: site.call("GET", f"/api/cron/jobs/{body['id']}/runs")[1][0]["status"] != "running", 10)
    [run] = site.call("GET", f"/api/cron/jobs/{body['id']}/runs")[1]
    assert (run["status"], run["output"]) == ("ok", "echo: go"), run
    assert run["cost_usd"] > 0


# -- the run pool ------------------------------------------------------------------------------------------------

def test_the_run_pool_holds_a_worker_per_stream_and_32_more(site: Site) -> None:
    executor = site.kernel.executor
    assert executor._max_workers == 8 + 32
    assert executor.submit(lambda: threading.current_thread().name).result(5).startswith("agentd-run_")


# -- stopping ------------------------------------------------------------------------------------------------------

def test_the_shutdown_route_asks_the_daemon_to_stop(site: Site) -> None:
    kernel = site.kernel
    asked: list[bool] = []
    assert site.call("POST", "/api/shutdown") == (200, {"status": "shutting_down"})   # no hook yet: only the flag
    assert kernel.stopping.is_set()
    kernel.set_shutdown_hook(lambda: asked.append(True))
    assert site.call("POST", "/api/shutdown") == (200, {"status": "shutting_down"})
    assert asked == [True]


def test_stopping_the_runs_ends_a_run_and_fires_no_more_jobs(site: Site) -> None:
    kernel = site.kernel
    handle = site.spawn("long")
    done: list[tuple[int, Any]] = []
    worker = threading.Thread(target=lambda: done.append(site.call(
        "POST", f"/api/agents/{handle.id}/message", json={"message": "[[hang]]"})))
    worker.start()
    wait_until(lambda: handle.busy, 10)
    kernel.stop_runs()
    worker.join(10)
    assert kernel.stopping.is_set()
    assert done and done[0][0] in (409, 503), done


def test_close_releases_everything_and_records_the_shutdown(site: Site) -> None:
    kernel = site.kernel
    path = kernel.config.db_path
    release = threading.Event()
    running = [kernel.executor.submit(release.wait, 10) for _ in range(kernel.executor._max_workers)]
    queued = kernel.executor.submit(print, "never")
    site.closed = True
    kernel.close()
    assert kernel.stopping.is_set()
    assert kernel.log_tail not in logging.getLogger().handlers
    with pytest.raises(RuntimeError):
        kernel.executor.submit(print)
    assert queued.cancelled(), "a run queued for a worker never starts after the close"
    assert not any(f.done() for f in running), "the close waited for the runs in progress"
    release.set()
    if kernel.store.backend == "sqlite":
        store = open_store(path, kernel.config.database)
        try:
            from agentd.audit import AuditLog

            events = [(e["event"], e["subject"], e["detail"]) for e in AuditLog(store).recent(2, prefix="kernel.")]
        finally:
            store.close()
        assert events == [("kernel.shutdown", "agentd", {}), ("kernel.start", "agentd", {"version": __version__})]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_open_makes_the_home_and_names_a_database_that_is_not_sqlite(tmp_path: Path, fake_llm, backend: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "a" / "b"
    config = kernel_config(home, fake_llm, backend)
    with caplog.at_level(logging.INFO, logger="agentd.kernel"):
        kernel = Kernel.open(config)
    try:
        assert home.is_dir() and kernel.store.backend == backend
        named = [r.getMessage() for r in caplog.records if r.getMessage().startswith("database:")]
        if backend == "sqlite":
            assert named == [] and config.db_path.exists()
        else:
            assert named == [f"database: postgres {config.database.masked}"] and not config.db_path.exists()
    finally:
        kernel.close()


# -- the services meeting through the kernel --------------------------------------------------------------------

def test_events_of_memory_and_workflows_reach_the_bus_and_fire_triggers(site: Site) -> None:
    listener = site.spawn("listener")
    heard: list[Any] = []
    site.kernel.events.subscribe(heard.append)
    status, trigger = site.call("POST", "/api/triggers", json={
        "agent_id": "listener", "pattern": {"content_match": "kernel-ping"}, "prompt_template": "[[reply:heard]]",
        "max_runs_per_day": 1})
    assert status == 201, trigger
    status, body = site.call("PUT", f"/api/memory/agents/{listener.id}/kv/flag", json={"n": 7})
    assert status == 200, body
    status, workflow = site.call("POST", "/api/workflows", json={
        "name": "echoes", "steps": [{"name": "one", "agent_name": "listener", "prompt": "say {{input}}"}]})
    status, run = site.call("POST", f"/api/workflows/{workflow['workflow_id']}/run", json={"input": "hi"})
    assert status == 200, run
    status, _ = site.call("POST", "/api/events", json={"event_type": "kernel-ping", "payload": {}})
    assert status == 202
    wait_until(lambda: site.call("GET", f"/api/triggers/{trigger['id']}")[1]["fire_count"] == 1, 10)
    wait_until(lambda: "heard" in json.dumps(site.call("GET", f"/api/agents/{listener.id}/session")[1]), 10)
    fired = site.kernel.audit.recent(1, prefix="trigger.fire")
    assert [(e["subject"], e["detail"]["trigger_id"]) for e in fired] == [("listener", trigger["id"])], fired
    paused = site.kernel.audit.recent(1, prefix="trigger.paused")
    assert [(e["subject"], e["detail"]["agent_id"]) for e in paused] == [(trigger["id"], listener.id)]
    kinds = [(e.type, e.payload) for e in heard if e.type in ("memory_key_changed", "workflow_completed")]
    assert kinds == [("memory_key_changed", {"agent_id": listener.id, "key": "flag", "value": {"n": 7}, "operation": "set"}),
                     ("workflow_completed", {"workflow_id": workflow["workflow_id"], "workflow_name": "echoes",
                                             "run_id": run["run_id"], "status": "completed",
                                             "output": "echo: say hi"})]


def test_a_cron_job_run_now_runs_its_agent(site: Site) -> None:
    handle = site.spawn("cron")
    status, job = site.call("POST", "/api/cron/jobs", json={
        "name": "now", "agent_id": handle.name, "schedule": {"kind": "cron", "expr": "0 3 * * *"},
        "action": {"kind": "agent_turn", "message": "[[reply:on time]]"}})
    assert status == 201, job
    status, body = site.call("POST", f"/api/cron/jobs/{job['id']}/run")
    assert status in (200, 202), body
    wait_until(lambda: site.call("GET", f"/api/cron/jobs/{job['id']}/runs")[1][0]["status"] != "running", 10)
    runs = site.call("GET", f"/api/cron/jobs/{job['id']}/runs")[1]
    assert (runs[0]["status"], runs[0]["output"], runs[0]["daemon_id"]) == ("ok", "on time", "kernel-daemon")
    assert runs[0]["cost_usd"] > 0
    assert any(e["event"] == "cron.create" for e in site.kernel.audit.recent(20, prefix="cron."))


def test_a_cron_job_delivers_only_to_a_configured_channel(site: Site) -> None:
    job = {"name": "report", "agent_id": "desk", "schedule": {"kind": "cron", "expr": "0 3 * * *"},
           "action": {"kind": "agent_turn", "message": "report"}}
    status, made = site.call("POST", "/api/cron/jobs", json={
        **job, "delivery": {"kind": "channel", "channel": "telegram", "chat_id": "42"}})
    assert status == 201 and made["delivery"] == {"kind": "channel", "channel": "telegram", "chat_id": "42"}, made
    status, refused = site.call("POST", "/api/cron/jobs", json={
        **job, "name": "elsewhere", "delivery": {"kind": "channel", "channel": "slack"}})
    assert (status, refused["error"]) == (400, "delivery.channel: channel 'slack' is not configured")


def test_a_reload_applies_the_channels_mcp_servers_and_skills(site: Site) -> None:
    assert site.kernel.settings.reload() == {
        "status": "reloaded", "applied": ["default_model", "provider_urls", "llm", "log_level", "channels",
                                          "mcp_servers", "skills"], "failed": []}
    entry = site.kernel.audit.recent(1, prefix="config.")[0]
    assert (entry["event"], entry["subject"]) == ("config.reload", "agentd")


def test_the_routes_reach_the_services_the_kernel_built(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    status, added = site.call("POST", "/api/models/custom", json={
        "id": "kernel-model", "display_name": "Kernel model", "provider": "openai", "tier": "custom"})
    assert status == 201, added
    status, model = site.call("GET", "/api/models/kernel-model")
    assert (status, model["display_name"]) == (200, "Kernel model"), model
    status, task = site.call("POST", "/api/tasks", json={"title": "Review", "description": "the notes",
                                                         "assigned_to": "desk"})
    assert status == 201, task
    assert site.call("GET", f"/api/tasks/{task['id']}")[1]["assigned_to"] == site.desk.id
    # No WhatsApp gateway is configured: the QR login says so.
    monkeypatch.delenv("WHATSAPP_WEB_GATEWAY_URL", raising=False)
    assert site.call("POST", "/api/channels/whatsapp/qr/start") == (503, {
        "error": "WhatsApp Web gateway not configured: set WHATSAPP_WEB_GATEWAY_URL to the URL of a running "
                 "gateway (e.g. http://127.0.0.1:3009)"})
    status, providers = site.call("GET", "/api/providers")
    openai = next(p for p in providers if p["id"] == "openai")
    assert (status, openai["base_url"], openai["auth_status"]) == (200, site.fake_llm.openai_base, "configured")
    assert site.call("GET", f"/api/agents/{site.desk.id}/uploads") == (200, [])
    # The dashboard's first-run setup: the default model's provider has its key, and the
    # catalogue's local providers are the ones it offers to probe.
    assert site.kernel.first_run.needed() is False
    assert [p.id for p in site.kernel.first_run.local_providers()] == ["ollama", "vllm", "lmstudio"]
    # What the setup page saves: a model of a catalogue provider becomes the default.
    assert site.kernel.settings.set_default_model("openai", "gpt-4o-mini") == {
        "status": "updated", "provider": "openai", "model": "gpt-4o-mini"}
    assert site.call("GET", "/api/status")[1]["default_model"] == "gpt-4o-mini"


def test_a_recall_is_timed_in_the_metrics_and_embeddings_use_the_memory_model(site: Site) -> None:
    base = f"/api/memory/agents/{site.desk.id}"
    assert site.call("POST", f"{base}/memories", json={"content": "The office opens at nine."})[0] == 201
    status, found = site.call("POST", f"{base}/recall", json={"query": "When does the office open?"})
    assert status == 200 and [f["content"] for f in found["memories"]] == ["The office opens at nine."], found
    metrics = site.client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).get_data(as_text=True)
    assert sample(metrics, "agentd_memory_recall_seconds_count") == 1
    status, body = site.call("POST", "/v1/embeddings", json={"model": "all-MiniLM-L6-v2-onnx-int8",
                                                            "input": "The office opens at nine."})
    assert status == 200, body
    vector = body["data"][0]["embedding"]
    assert len(vector) == 384 and sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-3)


def test_a_message_is_sent_to_the_model_with_what_its_agent_remembers(site: Site) -> None:
    fact = "The office opens at nine."
    assert site.call("POST", f"/api/memory/agents/{site.desk.id}/memories", json={"content": fact})[0] == 201
    status, answer = site.call("POST", f"/api/agents/{site.desk.id}/message",
                               json={"message": "When does the office open?"})
    assert status == 200, answer
    sent = next(r["json"] for r in reversed(list(site.fake_llm.requests))
                if "When does the office open?" in json.dumps(r.get("json")))
    system = "\n".join(m["content"] for m in sent["messages"] if m["role"] == "system")
    assert f"- {fact}" in system, system


def test_a_restart_restores_the_agents_and_says_how_many(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    config = site.kernel.config
    site.closed = True
    site.kernel.close()
    with caplog.at_level(logging.INFO, logger="agentd.kernel"):
        kernel = Kernel.open(config)
    try:
        assert [h.name for h in kernel.agents.handles()] == ["desk"]
        assert "restored 1 agent(s)" in [r.getMessage() for r in caplog.records]
    finally:
        kernel.close()


def test_a_stored_response_is_read_back(site: Site) -> None:
    status, made = site.call("POST", "/v1/responses", json={"model": "agentd:desk", "input": "[[reply:kept]]"})
    assert status == 200, made
    status, read = site.call("GET", f"/v1/responses/{made['id']}")
    assert (status, read) == (200, made)
    assert made["status"] == "completed" and made["output"][0]["content"][0]["text"] == "kept", made


def test_metering_can_be_switched_off_for_benchmarks(tmp_path: Path, fake_llm,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENTD_BENCH_NO_METERING=1 (scripts/bench_catalog.py) measures a run without its usage records."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    monkeypatch.setenv("AGENTD_BENCH_NO_METERING", "1")
    site = Site(open_kernel(tmp_path / "home", fake_llm))
    try:
        handle = site.spawn("bench")
        status, answer = site.call("POST", f"/api/agents/{handle.id}/message", json={"message": "hello"})
        assert status == 200 and answer["input_tokens"] > 0, answer
        assert site.kernel.metering.by_model(*month()) == []
    finally:
        site.kernel.close()


def test_a_key_over_its_budget_is_refused_and_audited(site: Site) -> None:
    key = site.kernel.keys.create({"name": "thrifty", "scopes": ["message"], "budget_usd_per_day": 0.0000001})
    path = f"/api/agents/{site.desk.id}/message"
    assert site.call("POST", path, key["key"], json={"message": "one"})[0] == 200
    status, body = site.call("POST", path, key["key"], json={"message": "two"})
    assert status == 429 and "API key 'thrifty' is over its budget" in body["error"], body
    refused = site.kernel.audit.recent(1, prefix="key.")[0]
    assert (refused["event"], refused["subject"], refused["detail"]) == (
        "key.refused", "thrifty", {"key_id": key["id"], "reason": "budget", "period": "today"})


def waiting_for_approval(site: Site, name: str) -> tuple[Any, threading.Thread, list[tuple[int, Any]]]:
    """An agent in manual mode whose message (in `worker`, its answer in `done`) waits for the
    approval of a file write."""
    handle = site.spawn(name, 'profile = "coding"\n')
    assert site.call("PUT", f"/api/agents/{handle.id}/mode", json={"mode": "Manual"})[0] == 200
    done: list[tuple[int, Any]] = []
    worker = threading.Thread(target=lambda: done.append(site.call(
        "POST", f"/api/agents/{handle.id}/message",
        json={"message": '[[tool:file_write {"path": "m.txt", "content": "ok"}]]'})))
    worker.start()
    try:
        wait_until(lambda: site.call("GET", "/api/approvals")[1], 10)
    except BaseException:
        worker.join(15)
        raise
    return handle, worker, done


def test_a_tool_call_of_an_agent_in_manual_mode_waits_for_its_approval(site: Site) -> None:
    handle, worker, done = waiting_for_approval(site, "careful")
    try:
        approval = site.call("GET", "/api/approvals")[1][0]
        assert (approval["agent_id"], approval["tool"]) == (handle.id, "file_write"), approval
        assert site.call("POST", f"/api/approvals/{approval['id']}/approve")[0] == 200
    finally:
        worker.join(15)
    assert done[0][0] == 200 and "wrote 2 bytes" in done[0][1]["response"], done


def test_an_agents_schedule_and_trigger_live_and_go_with_it(site: Site) -> None:
    handle = site.spawn("reporter", 'schedule = {periodic = {cron = "0 9 * * 1-5", tz = "Asia/Tokyo"}}\n')
    [job] = site.call("GET", f"/api/cron/jobs?agent_id={handle.id}")[1]
    assert (job["name"], job["origin"]) == ("reporter:periodic", "manifest")
    status, trigger = site.call("POST", "/api/triggers", json={
        "agent_id": handle.id, "pattern": {"content_match": "x"}, "prompt_template": "y"})
    assert status == 201, trigger
    assert site.call("DELETE", f"/api/agents/{handle.id}")[0] == 200
    assert site.call("GET", f"/api/cron/jobs/{job['id']}")[0] == 404
    assert site.call("GET", f"/api/triggers/{trigger['id']}")[0] == 404


def test_the_monthly_budget_refuses_a_run_once_spent(site: Site) -> None:
    path = f"/api/agents/{site.desk.id}/message"
    assert site.call("POST", path, json={"message": "spend"})[0] == 200
    assert site.call("PUT", "/api/budget", json={"limit_usd": 0.0000001})[0] == 200
    status, body = site.call("POST", path, json={"message": "more"})
    assert status == 429 and "budget" in body["error"], body


def test_an_upload_is_kept_for_its_agent(site: Site) -> None:
    r = site.client.post(f"/api/agents/{site.desk.id}/upload", headers={"Authorization": f"Bearer {ADMIN}"},
                         data={"file": (io.BytesIO(b"hello"), "note.txt", "text/plain")})
    assert r.status_code == 201, r.get_json()
    [kept] = site.call("GET", f"/api/agents/{site.desk.id}/uploads")[1]
    assert (kept["file_id"], kept["filename"], kept["size"]) == (r.get_json()["file_id"], "note.txt", 5), kept


def test_the_log_tail_holds_what_the_daemon_logged(site: Site) -> None:
    logging.getLogger("agentd.kernel").warning("a line for the log page")
    assert any("a line for the log page" in str(line) for line in site.kernel.log_tail.last(10))


def test_the_skills_of_the_home_are_listed(tmp_path: Path, fake_llm, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "home" / "skills" / "greet"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: greet\ndescription: Say hello\n---\nSay hello.\n")
    monkeypatch.setenv("OPENAI_API_KEY", "test-openai")
    site = Site(open_kernel(tmp_path / "home", fake_llm))
    try:
        status, skills = site.call("GET", "/api/skills")
        assert status == 200 and [(s["name"], s["description"]) for s in skills] == [("greet", "Say hello")], skills
    finally:
        site.kernel.close()


def test_the_mcp_endpoint_runs_the_agents(site: Site) -> None:
    def call(method: str, **params: Any) -> dict:
        r = site.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                             headers={"Authorization": f"Bearer {ADMIN}",
                                      "Accept": "application/json, text/event-stream"})
        assert r.status_code == 200, r.get_data(as_text=True)
        data = [line[6:] for line in r.get_data(as_text=True).splitlines() if line.startswith("data: ")]
        return json.loads(data[-1])["result"]

    assert "message_agent" in [tool["name"] for tool in call("tools/list")["tools"]]
    listed = call("tools/call", name="list_agents", arguments={})
    assert "desk" in listed["content"][0]["text"], listed
    answer = call("tools/call", name="message_agent", arguments={"agent": "desk", "message": "[[reply:via mcp]]"})
    assert answer["content"][0]["text"] == "via mcp", answer


def test_an_a2a_message_runs_the_agent(site: Site) -> None:
    message = {"kind": "message", "role": "user", "messageId": "m-1", "parts": [{"kind": "text", "text": "[[reply:via a2a]]"}]}
    status, body = site.call("POST", "/a2a/agents/desk", json={
        "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}})
    assert status == 200 and body["result"]["status"]["state"] == "completed", body
    assert "via a2a" in json.dumps(body["result"]["artifacts"])


def test_a_key_limited_to_some_agents_cannot_schedule_a_workflow_reaching_others(site: Site) -> None:
    site.spawn("outside")
    status, workflow = site.call("POST", "/api/workflows", json={
        "name": "both", "steps": [{"name": "one", "agent_name": "desk", "prompt": "{{input}}"},
                                  {"name": "two", "agent_name": "outside", "prompt": "{{input}}"}]})
    assert status == 201, workflow
    key = site.kernel.keys.create({"name": "desk-only", "scopes": ["read", "manage", "message"], "agents": ["desk"]})
    status, body = site.call("POST", "/api/cron/jobs", key["key"], json={
        "name": "w", "agent_id": "desk", "schedule": {"kind": "cron", "expr": "0 3 * * *"},
        "action": {"kind": "workflow_run", "workflow_id": workflow["workflow_id"], "input": "go"}})
    assert (status, body["error"]) == (400, f"action.workflow_id: no workflow {workflow['workflow_id']!r}"), body


def test_a_channel_configured_through_the_api_is_written_to_config_toml(site: Site) -> None:
    status, body = site.call("POST", "/api/channels/telegram/configure",
                             json={"bot_token_env": UNSET_TOKEN, "default_agent": "desk"})
    assert status == 200 and body["activated"] is False, body
    assert "[channels.telegram]" in site.kernel.config.config_path.read_text()
    assert site.kernel.audit.recent(1, prefix="channel.")[0]["subject"] == "telegram"


def test_stopping_an_agent_waiting_for_an_approval_withdraws_it(site: Site) -> None:
    handle, worker, done = waiting_for_approval(site, "halted")
    try:
        assert site.call("POST", f"/api/agents/{handle.id}/stop")[0] == 200
        assert site.call("GET", "/api/approvals") == (200, [])
    finally:
        worker.join(15)
    assert done[0][0] == 409, done


def test_an_agents_tools_reach_the_kernels_memory_tasks_and_schedules(site: Site) -> None:
    handle = site.spawn("worker", 'profile = "full"\n')
    calls = ('memory_store {"key": "k", "value": 1} | task_post {"title": "T", "description": "D"} | '
             'schedule_create {"description": "check", "schedule": "daily at 9am"}')
    status, answer = site.call("POST", f"/api/agents/{handle.id}/message", json={"message": f"[[tools:{calls}]]"})
    assert status == 200, answer
    assert site.call("GET", f"/api/memory/agents/{handle.id}/kv/k") == (200, 1)
    assert [t["title"] for t in site.call("GET", "/api/tasks")[1]] == ["T"]
    assert [j["name"] for j in site.call("GET", f"/api/cron/jobs?agent_id={handle.id}")[1]] == ["check"]
