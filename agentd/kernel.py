"""The kernel: composition root that owns every service below the API.

The HTTP layer holds exactly one `Kernel` and calls its methods; nothing here
knows about Flask or HTTP.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from agentd import __version__, malloc_tuning
from agentd.cachefill import cache_fill
from agentd.config import Config, remote_agents
from agentd.timestamps import iso, utcnow
from agentd.a2a.client import A2AClient
from agentd.a2a.server import A2AService
from agentd.agents.approvals import ApprovalQueue
from agentd.agents.listeners import AgentListeners
from agentd.agents.manager import AgentHandle, AgentManager
from agentd.agents.model_call import ModelCalls
from agentd.agents.registry import AgentRegistry
from agentd.agents.runqueue import RunQueues
from agentd.agents.runs import Runs
from agentd.agents.session_store import SessionStore
from agentd.agents.tools.services import ToolServices
from agentd.agents.uploads import Uploads
from agentd.llm.catalog import Catalog
from agentd.llm.custom_models import CustomModels
from agentd.llm.types import ChatResponse
from agentd.mcp.endpoint import McpEndpoint
from agentd.mcp.hub import McpHub
from agentd.mcp.loop import LoopThread
from agentd.mcp.watch import ConfigWatch
from agentd.memory.embedding_models import EmbeddingModels
from agentd.memory.kv import KvMemory
from agentd.memory.service import MemoryService
from agentd.metering import Metering
from agentd.metrics import Metrics
from agentd.providers import ProviderKeys
from agentd.firstrun import FirstRun
from agentd.logtail import LogTail
from agentd.settings import Settings
from agentd.cluster.settings_follow import SettingsFollower
from agentd.skills import Skills
from agentd.store import Store, open_store
from agentd.store.responses import StoredResponses
from agentd.store.checkpoint import PAGE_CACHE_KIB
from agentd.store.outage import unless_unavailable
from agentd.store.sqlite_memory import sqlite_heap_kib
from agentd.workflows import WorkflowEngine
from agentd.audit import AuditLog
from agentd.apikeys import ApiKeys
from agentd.key_budgets import KeyBudgets
from agentd.key_runs import KeyRuns
from agentd.channels.attachments import ChannelFiles
from agentd.channels.qr import QrLogins
from agentd.channels.runtime import ChannelManager
from agentd.cluster.coordinator import Cluster
from agentd.cluster.config import cluster_settings
from agentd.errors import AgentdError
from agentd.schedules.delivery import Delivery
from agentd.schedules.jobs import CronJobs
from agentd.schedules.manifest import ManifestSchedules
from agentd.schedules.scheduler import Scheduler
from agentd.schedules.store import CronStore

log = logging.getLogger("agentd.kernel")


def _model_calls_in_flight() -> int:
    """Model calls holding a connection; the drivers load on the first call (none before, nor
    while another thread is still importing them)."""
    active_calls = getattr(sys.modules.get("agentd.llm.drivers"), "active_calls", None)
    return active_calls() if active_calls is not None else 0


class Kernel:
    """Owns the store, the executor and (later) agents, catalog, metering, workflows."""

    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        store.start_checkpoints()  # SQLite: the WAL is checkpointed off the request path
        self.started_at = utcnow()
        self._started_mono = time.monotonic()
        # Runs never wait here for an agent (each agent queues its own requests), so one
        # worker per long-held request keeps a stuck provider from blocking other agents.
        self.executor = ThreadPoolExecutor(max_workers=config.api.max_streams + 32,
                                           thread_name_prefix="agentd-run")
        self.stopping = threading.Event()
        self._shutdown_hook: Callable[[], None] | None = None
        self.catalog = Catalog.load()
        self.custom_models = CustomModels(store, self.catalog)
        # The event bus (agentd/triggers/bus.py): KV changes, custom events, workflow
        # completions, failed runs and channel messages, heard by the triggers.
        from agentd.triggers import sources
        from agentd.triggers.bus import EventBus

        self.events = EventBus()
        self.kv = KvMemory(store, on_change=sources.kv_changes(self.events))
        # Benchmark-only switch (scripts/bench_catalog.py) to measure what recording costs.
        self.metering = Metering(store, self.catalog, shared=store.shared,
                                 enabled=os.environ.get("AGENTD_BENCH_NO_METERING") != "1")
        self.audit = AuditLog(store)  # the audit trail (agentd/audit.py)
        self.responses = StoredResponses(store)  # what POST /v1/responses keeps (`store: true`)
        from agentd.agents.cooperation import Cooperation
        from agentd.tasks.board import TaskBoard
        from agentd.triggers.service import TriggerLifecycle
        from agentd.triggers.store import TriggerStore

        trigger_store = TriggerStore(store, self.audit.record)
        # Scoped API keys beside the admin key: scopes, agent lists, budgets, rate limits.
        self.key_budgets = KeyBudgets(store, self.audit.record)
        self.keys = ApiKeys(store, config.api_key, self.audit.record, self.key_budgets)
        from agentd.cluster.budget_gate import BudgetGate

        # Several daemons on one database (agentd/cluster/): run leases, run records,
        # approvals in the database, budget admission, channel leaders, memory notifications.
        self.cluster = Cluster(store, cluster_settings(config.raw, config.api_listen), config.api_listen,
                               budget=BudgetGate(self.metering, self.key_budgets), audit=self.audit.record,
                               leaving=self.stopping)
        # Prometheus metrics (GET /metrics); the gauges of state owned below are read at scrape time.
        self.metrics = Metrics(agent_labels=config.metrics.agent_labels,
                               daemon_id=self.cluster.id if store.shared else None,
                               budget=unless_unavailable(self.metering.budget),
                               queues=lambda: [(h.name, len(h.waiting)) for h in self.agents.registry.loaded()
                                               if not h.killed])
        from agentd.agents.shared_approvals import SharedApprovalQueue

        self.approvals: ApprovalQueue = SharedApprovalQueue(store, self.cluster.id)
        # The agent services, each given what it uses (agentd/agents/manager.py lists them).
        models = ModelCalls(config, self.catalog, self._record_usage, metrics=self.metrics)
        # Semantic memory + knowledge graph; numpy and the model load on first use.
        self.memory = MemoryService(config.memory, store, models.endpoint, config.llm.retries,
                                    on_recall=self.metrics.memory_recall.observe)
        # MCP (agentd/mcp/): the servers' tools for agents, on one asyncio loop the daemon owns
        # (started by the first configured server or `/mcp` request); config changes apply live.
        self.mcp_loop = LoopThread()
        self.mcp = McpHub(config.mcp_servers, self.mcp_loop, self.audit.record)
        self.mcp_watch = ConfigWatch(config.config_path, self.mcp.apply)
        # /v1/embeddings: the same embedders memory recalls with.
        self.embeddings = EmbeddingModels(config.memory, self.memory)
        queues = RunQueues(self.executor, lambda: config.agents.max_queue, self.approvals, self.cluster,
                           shared=store.shared)
        uploads = Uploads(store)
        # Programs, browsers and channel sending for tools (agentd/agents/tools/services.py);
        # the channels start below, after the agents they route to.
        self.tool_services = ToolServices(config.tools, self.audit.record, uploads.save_for,
                                          lambda *args, **kw: self.channels.send_to(*args, **kw))
        # Cron jobs (agentd/schedules/): validated and stored here; the ticker below fires them.
        cron_store = CronStore(store)
        cron_wake = threading.Event()
        key_runs = KeyRuns(self.keys, lambda ref: self.agents.find(ref),
                           lambda workflow_id: self.workflows.get(workflow_id)["steps"])
        self.cron = CronJobs(cron_store, config.schedules, resolve_agent=lambda ref: self.agents.find(ref),
                             workflow_exists=self._workflow_exists,
                             channel_agents=self.channel_agents, changed=cron_wake.set,
                             audit=self.audit.record, key_runs=key_runs)
        # The open WebSockets of each agent, which also see the runs cron jobs start.
        self.listeners = AgentListeners()
        registry = AgentRegistry(config, store, self.catalog, queues, self.memory, self.audit.record,
                                 mcp_tools=self.mcp.tools_for,
                                 hooks=[TriggerLifecycle(trigger_store), self.tool_services,
                                        ManifestSchedules(self.cron)])
        self.tasks = TaskBoard(store, registry.find)
        # A run writes its usage rows in the transaction that saves its session.
        sessions = SessionStore(store, registry, models, write_usage=self.metering.write_rows,
                                cached_sessions=config.agents.cached_sessions)
        # Skills in $AGENTD_HOME/skills (agentd/skills); remote A2A agents the a2a_* tools call.
        self.skills = Skills(config.home / "skills", config.tools.fetch_allow_hosts, config.tools.fetch_timeout_secs)
        a2a_client = A2AClient(remote_agents(config.raw), os.environ.get)
        self.runs = Runs(config, self.catalog, registry, sessions, models, uploads, queues, self.approvals,
                         self.kv, self.memory, self.cluster, preflight=lambda _handle: self.metering.check_budget(),
                         metrics=self.metrics, cooperation=Cooperation(self.tasks, self.events, self.audit.record),
                         tool_services=self.tool_services, skills=self.skills, a2a=a2a_client, cron=self.cron,
                         key_budget=self.key_budgets.check_budget, key_runs=key_runs)
        self.agents = AgentManager(registry, sessions, models, uploads, self.runs)
        self.mcp_endpoint = McpEndpoint(self.mcp_loop, self.agents, self.runs, self.memory, self.keys)
        # The A2A JSON-RPC methods over the same agents and runs (agentd/a2a/server.py).
        self.a2a = A2AService(self.agents, self.runs)
        self.providers = ProviderKeys(config, self.catalog, self.agents)
        # The dashboard's first-run setup: is a provider usable yet, which local servers answer.
        self.first_run = FirstRun(config, self.catalog, self.providers)
        self.log_tail = LogTail()
        logging.getLogger().addHandler(self.log_tail)
        # Shared PostgreSQL: follow the settings other daemons change (agentd/cluster/settings_follow.py).
        self.settings_follower: SettingsFollower | None = None
        if store.shared:
            self.settings_follower = SettingsFollower(store, self.custom_models, self.providers, self.metering)
            self.settings_follower.start()
        self.memory.start()
        from agentd.memory.notify import MemoryNotifier

        self.memory_notifier = MemoryNotifier(store, self.cluster.id, self.memory.invalidate)
        self.memory.on_change = self.memory_notifier.publish
        self.memory_notifier.start()
        loaded = self.agents.load()
        if loaded:
            log.info("restored %d agent(s)", loaded)
        self.workflows = WorkflowEngine(store, registry, self.runs, self.executor, daemon_id=self.cluster.id,
                                        shared=self.cluster.shared, on_finish=sources.workflow_runs(self.events))
        from agentd.triggers.service import Triggers

        self.triggers = Triggers(trigger_store, self.events, registry, self.runs,
                                 config.triggers.rate_limit_per_minute, self.audit.record, key_runs,
                                 self.channel_agents)
        # No run survives a restart: runs this daemon left `running` by a crash are marked
        # failed now (other daemons' runs are theirs; the cluster reaper fails a dead one's).
        self.workflows.recover()
        self.audit.record("kernel.start", "agentd", {"version": __version__})
        # Channels (agentd/channels/): adapters whose messages run in their conversations' sessions.
        raw_channels = config.raw.get("channels")
        self.channels = ChannelManager(config.config_path, raw_channels if isinstance(raw_channels, dict) else {},
                                       store, self.agents, self.runs, self.audit.record,
                                       on_message=self.metrics.channel_message,
                                       on_inbound=sources.channel_messages(self.events),
                                       files=ChannelFiles(uploads, self.catalog, config.workspaces_dir),
                                       store_secrets=self.providers.store_secrets,
                                       approvals=self.approvals)
        self.qr_logins = QrLogins()
        from agentd.channels.leaders import ChannelLeaders

        self.channel_leaders = ChannelLeaders(self.cluster, self.channels)
        from agentd.cluster.relay import WebhookRelay

        # A channel's webhook that reaches this daemon while another holds the channel.
        self.webhook_relay = WebhookRelay(self.cluster, self.channel_leaders.holder)
        from agentd.cluster.webhook_intake import WebhookIntake

        # Who answers a channel's webhook request: the adapter here, the holder, or nobody yet.
        self.webhook_intake = WebhookIntake(self.channels, self.webhook_relay)
        delivery = Delivery(self.channels.send_text, cron_store.set_delivery, config.schedules.delivery_attempts,
                            self.stopping)
        self.scheduler = Scheduler(cron_store, config.schedules, self.cluster.id, self.runs, registry.find,
                                   self.workflows.run, delivery, self.listeners, self.audit.record, self.executor,
                                   wake=cron_wake,
                                   live_daemons=(lambda: {d["id"] for d in self.cluster.daemons()})
                                   if self.cluster.shared else None,
                                   on_lag=self.metrics.scheduler_lag.observe, key_runs=key_runs,
                                   workflow_cost=self.workflows.run_cost)
        self.cluster.on_tick.append(self.scheduler.reap)
        # The effective configuration and its hot reload (agentd/settings.py).
        self.settings = Settings(config, self.catalog, self.audit.record,
                                 {"channels": self.channels.reload, "mcp_servers": self.mcp_watch.reload_now,
                                  "skills": self.skills.reload})
        self.cluster.start()
        self.channels.start_all()
        self.mcp_watch.start()
        self.scheduler.start()

    def channel_agents(self, name: str) -> list[Any] | None:
        """The agents channel `name` answers as (its fallback: the daemon's first agent); None
        when it is not configured."""
        if name not in self.channels.sections:
            return None
        return [self.agents.find(ref) if ref else next(iter(self.agents.handles()), None)
                for ref in self.channels.agents_named(name)]

    def _workflow_exists(self, workflow_id: str) -> bool:
        try:
            self.workflows.get(workflow_id)
        except AgentdError:
            return False
        return True

    def _record_usage(self, handle: AgentHandle, provider: str, model: str,
                      response: ChatResponse, defer: list | None = None) -> float | None:
        cost = self.metering.record(handle.id, handle.name, provider, model,
                                    response.usage.input_tokens, response.usage.output_tokens, defer)
        self.metrics.usage(provider, model, response.usage.input_tokens, response.usage.output_tokens, cost)
        return cost

    @classmethod
    def open(cls, config: Config) -> "Kernel":
        """Open the database and build every service."""
        config.home.mkdir(parents=True, exist_ok=True)
        store = open_store(config.db_path, config.database)
        if store.backend != "sqlite":
            log.info("database: %s %s", store.backend, store.where)  # `where` is masked
        return cls(config, store)

    # -- lifecycle -------------------------------------------------------
    def set_shutdown_hook(self, hook: Callable[[], None]) -> None:
        """The daemon registers how to stop the server (used by POST /api/shutdown)."""
        self._shutdown_hook = hook

    def request_shutdown(self) -> None:
        """Ask the daemon to stop gracefully; returns at once."""
        self.stopping.set()
        if self._shutdown_hook is not None:
            self._shutdown_hook()

    def stop_runs(self) -> None:
        """The start of a shutdown: workflow runs end `failed` saying the daemon is stopping
        (before their agents' runs are cancelled, so a step never blames its agent and a
        retry never waits out its backoff), then every agent run stops and every program
        and browser of the tools ends."""
        self.stopping.set()
        self.scheduler.close()
        self.workflows.close()
        self.agents.stop_all()
        # The agents' programs and browsers end now, not after the grace period: a stop
        # that is forced before it ends (`agentd stop` waits 5 s) must leave none behind.
        self.tool_services.close()

    def close(self) -> None:
        """Release everything; called once by the daemon after the server stopped."""
        self.stopping.set()
        self.tool_services.close()
        self.scheduler.close()
        if self.settings_follower is not None:
            self.settings_follower.close()
        self.channels.close()
        self.webhook_relay.close()
        self.mcp_watch.close()
        self.mcp.close()
        self.mcp_endpoint.close()
        self.mcp_loop.close()
        self.events.close()
        self.audit.record("kernel.shutdown", "agentd")
        logging.getLogger().removeHandler(self.log_tail)
        self.workflows.close()
        self.runs.stop_all()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.cluster.close()
        self.memory_notifier.close()
        self.memory.close()
        self.store.close()

    # -- events ----------------------------------------------------------
    def publish_event(self, data: dict[str, Any], key_id: str) -> str:
        """POST /api/events: a custom event on the bus; its id. `key_id`: the scoped API key
        publishing it ("": the admin)."""
        from agentd.triggers.bus import CUSTOM, Event

        event = self.events.publish(Event(CUSTOM, data["event_type"], data["payload"], origin="api", key_id=key_id))
        self.audit.record("event.publish", data["event_type"],
                          {"event_id": event.id, **({"key_id": key_id} if key_id else {})})
        return event.id

    # -- status ----------------------------------------------------------
    @property
    def uptime_seconds(self) -> int:
        return int(time.monotonic() - self._started_mono)

    def agent_summaries(self, visible: Callable[[list[Any]], list[Any]] | None = None) -> list[dict[str, Any]]:
        """Short agent records for status pages (those `visible` keeps, when given)."""
        handles = self.agents.handles()
        return [self.agents.summary(h) for h in (visible(handles) if visible else handles)]

    def status(self, visible: Callable[[list[Any]], list[Any]] | None = None) -> dict[str, Any]:
        """The body of GET /api/status; `visible` narrows its agents to what the caller may reach."""
        agents = self.agent_summaries(visible)
        return {
            "status": "running",
            "version": __version__,
            "agent_count": len(agents),
            "default_provider": self.config.default_model.provider,
            "default_model": self.config.default_model.model,
            "uptime_seconds": self.uptime_seconds,
            "api_listen": self.config.api_listen,
            "home_dir": str(self.config.home),
            "log_level": self.config.log_level,
            "network_enabled": self.config.network_enabled,
            "agents": agents,
        }

    def health_detail(self, pool: dict[str, int],
                      visible: Callable[[list[Any]], list[Any]] | None = None) -> dict[str, Any]:
        """The body of GET /api/health/detail; `pool` is the HTTP server's thread use,
        `visible` narrows the agents counted to what the caller may reach."""
        db_ok = self.store.ping()
        handles = self.agents.handles() if db_ok else self.agents.registry.loaded()
        malloc = malloc_tuning.applied()
        sqlite = self.store.backend == "sqlite"
        return {
            "status": "ok" if db_ok else "degraded",
            "version": __version__,
            "uptime_seconds": self.uptime_seconds,
            "database": "connected" if db_ok else "error",
            # A count needs no summaries; while the database is out, the agents this daemon
            # knows (a shared database's list cannot be read then).
            "agent_count": len(visible(handles) if visible else handles),
            "thread_pool": pool,
            "started_at": iso(self.started_at),
            # Every live thread of the process, and the model calls holding a connection.
            "process_threads": threading.active_count(),
            "model_calls_in_flight": _model_calls_in_flight(),
            # glibc's heap arena cap and fixed mmap threshold in effect; null: glibc's own.
            "malloc_arenas": malloc["arenas"],
            "malloc_mmap_threshold": malloc["mmap_threshold"],
            # SQLite: each connection's page cache bound, and SQLite's heap now (null on PostgreSQL).
            "sqlite_page_cache_kib": PAGE_CACHE_KIB if sqlite else None,
            "sqlite_heap_kib": sqlite_heap_kib() if sqlite else None,
            "caches": cache_fill(self.agents.sessions.cached, self.memory),
        }
