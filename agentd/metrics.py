"""The daemon's Prometheus metrics (`GET /metrics`), one registry per kernel.

Every series lives in this kernel's own `CollectorRegistry` (never the process-wide
default), so several daemons in one process never share counters. Labels stay few and
bounded: route templates (never raw paths), origins, outcomes, providers and models from
the catalog, adapter names. Agent names are a label only when `[metrics] agent_labels`
asks for them; agent ids never are. Gauges that mirror state owned elsewhere (budget,
queue depth) are read when Prometheus scrapes, so nothing is kept in step on the hot path.

On a shared database every sample also carries the `daemon_id` of the daemon that
served it, added at scrape time.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from agentd import __version__

log = logging.getLogger("agentd.metrics")

# The run path's origins; anything else is counted as `other` so a typo cannot add series.
ORIGINS = ("api", "sse", "ws", "v1", "channel", "workflow", "agent", "schedule", "trigger", "a2a", "mcp")
RUN_OUTCOMES = ("completed", "failed", "cancelled")
REFUSAL_REASONS = ("queue_full", "budget", "quota", "rate_limit", "size")
CHANNEL_DIRECTIONS = ("in", "out", "refused")
UNMATCHED = "unmatched"  # the route label of a request no route matched

# Seconds: from a fast JSON answer to a long agent run.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LAG_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    """The kernel's metrics: counters and histograms the services observe, and gauges read
    at scrape time from `budget()` (Metering.budget's dict) and `queues()` ((agent name,
    queued runs) pairs)."""

    def __init__(self, *, agent_labels: bool = False, daemon_id: str | None = None,
                 budget: Callable[[], dict[str, Any]] | None = None,
                 queues: Callable[[], Iterable[tuple[str, int]]] | None = None) -> None:
        self.agent_labels = agent_labels
        self.daemon_id = daemon_id
        self._budget = budget
        self._queues = queues
        # No `_created` series: in the text format each would be one more gauge per series
        # (the switch is the library's, process-wide; a daemon's process is its own).
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        per_agent = ("agent",) if agent_labels else ()

        Gauge("agentd_build_info", "The daemon's version (always 1).", ("version",),
              registry=r).labels(__version__).set(1)
        self.http_requests = Counter("agentd_http_requests", "HTTP requests answered, by route template and status.",
                                     ("method", "route", "status"), registry=r)
        self.http_latency = Histogram("agentd_http_request_duration_seconds",
                                      "Time from a request's arrival to its response headers.",
                                      ("method", "route"), buckets=LATENCY_BUCKETS, registry=r)
        self.runs = Counter("agentd_runs", "Agent runs finished, by origin and outcome.",
                            ("origin", "outcome", *per_agent), registry=r)
        self.run_latency = Histogram("agentd_run_duration_seconds", "Duration of agent runs, by origin.",
                                     ("origin",), buckets=LATENCY_BUCKETS, registry=r)
        self.refused = Counter("agentd_requests_refused", "Requests refused before a run started, by reason.",
                               ("reason", *per_agent), registry=r)
        self.llm_calls = Counter("agentd_llm_calls", "Model calls, by provider, model and outcome.",
                                 ("provider", "model", "outcome"), registry=r)
        self.llm_latency = Histogram("agentd_llm_call_duration_seconds", "Duration of model calls.",
                                     ("provider", "model"), buckets=LATENCY_BUCKETS, registry=r)
        self.llm_ttft = Histogram("agentd_llm_time_to_first_token_seconds",
                                  "Time from a streamed model call's start to its first event.",
                                  ("provider", "model"), buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("agentd_llm_tokens", "Tokens used, by provider, model and type (input, output).",
                              ("provider", "model", "type"), registry=r)
        self.cost = Counter("agentd_llm_cost_usd", "Cost of model calls in US dollars.", ("provider", "model"),
                            registry=r)
        self.open_streams = Gauge("agentd_open_streams", "Server-Sent Event streams open now.", registry=r)
        self.open_websockets = Gauge("agentd_open_websockets", "WebSocket connections open now.", registry=r)
        self.channel_messages = Counter("agentd_channel_messages", "Channel messages by adapter and direction "
                                        "(in: accepted, out: replies sent, refused).",
                                        ("adapter", "direction"), registry=r)
        self.memory_recall = Histogram("agentd_memory_recall_seconds", "Duration of semantic memory recalls.",
                                       buckets=FAST_BUCKETS, registry=r)
        # Observed by the scheduler: how late a scheduled job started after its due time.
        self.scheduler_lag = Histogram("agentd_scheduler_lag_seconds",
                                       "Delay between a scheduled job's due time and its start.",
                                       buckets=LAG_BUCKETS, registry=r)
        r.register(_StateCollector(self))
        # Label children looked up once: a dict read per observation instead of `labels()`
        # (which takes the metric's lock); a race only makes `labels()` return the same child twice.
        # A counter and the histogram observed with it are one entry (`_pair`).
        self._children: dict[tuple[Any, ...], Any] = {}
        if not agent_labels:
            for origin in ORIGINS:
                for outcome in RUN_OUTCOMES:
                    self.runs.labels(origin, outcome)
            for reason in REFUSAL_REASONS:
                self.refused.labels(reason)

    # -- observations --------------------------------------------------------------------
    def _child(self, metric: Any, *labels: str) -> Any:
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[(metric, labels)] = metric.labels(*labels)
        return child

    def _pair(self, key: tuple[str, ...], count: Any, count_labels: tuple[str, ...], latency: Any,
              latency_labels: tuple[str, ...]) -> tuple[Any, Any]:
        """The children of two metrics observed together, kept under one `key`."""
        pair = self._children[key] = (self._child(count, *count_labels), self._child(latency, *latency_labels))
        return pair

    def http_request(self, method: str, route: str, status: str, seconds: float) -> None:
        key = ("http", method, route, status)
        pair = self._children.get(key) or self._pair(key, self.http_requests, (method, route, status),
                                                     self.http_latency, (method, route))
        pair[0].inc()
        pair[1].observe(seconds)

    def run_finished(self, origin: str, outcome: str, seconds: float, agent: str = "") -> None:
        origin = origin if origin in ORIGINS else "other"
        if self.agent_labels:
            key = ("run", origin, outcome, agent)
            pair = self._children.get(key) or self._pair(key, self.runs, (origin, outcome, agent),
                                                         self.run_latency, (origin,))
        else:
            key = ("run", origin, outcome)
            pair = self._children.get(key) or self._pair(key, self.runs, key[1:], self.run_latency, (origin,))
        pair[0].inc()
        pair[1].observe(seconds)

    def refusal(self, reason: str, agent: str = "") -> None:
        self.refused.labels(*((reason, agent) if self.agent_labels else (reason,))).inc()

    def llm_call(self, provider: str, model: str, outcome: str, seconds: float,
                 first_event: float | None = None) -> None:
        key = ("llm", provider, model, outcome)
        pair = self._children.get(key) or self._pair(key, self.llm_calls, (provider, model, outcome),
                                                     self.llm_latency, (provider, model))
        pair[0].inc()
        pair[1].observe(seconds)
        if first_event is not None:
            self._child(self.llm_ttft, provider, model).observe(first_event)

    def usage(self, provider: str, model: str, input_tokens: int, output_tokens: int, cost: float | None) -> None:
        key = ("tokens", provider, model)
        pair = self._children.get(key) or self._pair(key, self.tokens, (provider, model, "input"),
                                                     self.tokens, (provider, model, "output"))
        pair[0].inc(input_tokens)
        pair[1].inc(output_tokens)
        if cost:
            self._child(self.cost, provider, model).inc(cost)

    def channel_message(self, adapter: str, direction: str) -> None:
        self._child(self.channel_messages, adapter, direction).inc()

    # -- exposition ----------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        if not self.daemon_id:
            return generate_latest(self.registry)
        return generate_latest(_WithDaemon(self.registry, self.daemon_id))  # type: ignore[arg-type]


class _StateCollector:
    """Gauges of state other services own, read at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        m = self.metrics
        budget = None
        if m._budget is not None:
            try:
                budget = m._budget()
            except Exception:  # noqa: BLE001 - a database hiccup must not fail the whole scrape
                log.warning("metrics: the budget could not be read", exc_info=True)
        if budget is not None:
            spent = GaugeMetricFamily("agentd_budget_spent_usd", "Spend of the current budget period in US dollars.")
            spent.add_metric([], float(budget["spent_usd"]))
            limit = GaugeMetricFamily("agentd_budget_limit_usd", "The budget limit in US dollars (0: none).")
            limit.add_metric([], float(budget["limit_usd"]))
            yield spent
            yield limit
        if m._queues is not None:
            depth = GaugeMetricFamily("agentd_agent_queue_depth", "Runs waiting in agents' queues.",
                                      labels=["agent"] if m.agent_labels else [])
            pairs = list(m._queues())
            if m.agent_labels:
                for name, queued in pairs:
                    depth.add_metric([name], queued)
            else:
                depth.add_metric([], sum(queued for _, queued in pairs))
            yield depth


class _WithDaemon:
    """`registry`'s samples with a `daemon_id` label added (several daemons, one database)."""

    def __init__(self, registry: CollectorRegistry, daemon_id: str) -> None:
        self.registry = registry
        self.daemon_id = daemon_id

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [s._replace(labels={**s.labels, "daemon_id": self.daemon_id})
                                for s in family.samples]
            yield labelled
