"""The typed tables of `config.toml`: one dataclass per `[table]`, defaults included.

`agentd.config` re-exports every name here; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_LISTEN = "127.0.0.1:4200"


@dataclass
class ApiConfig:
    """The `[api]` table."""

    listen_addr: str = DEFAULT_LISTEN
    rate_limit_per_second: float = 30.0
    # One second's worth: the spec's "30 requests per second" holds within any second.
    rate_limit_burst: int = 30
    cors_origins: list[str] = field(default_factory=list)
    # Host names served besides loopback names and the listen address (DNS rebinding
    # guard): exact names, `*.example.com` wildcards, or "*" to turn the check off.
    allowed_hosts: list[str] = field(default_factory=list)
    # Every SSE stream and WebSocket holds a waitress worker for its whole life,
    # so the pool is sized for long-lived connections, not just for HTTP.
    threads: int = 128
    max_streams: int = 96
    # glibc malloc arenas the threads share and its fixed mmap threshold in KiB
    # (agentd/malloc_tuning.py); 0: glibc's default.
    malloc_arenas: int = 2
    malloc_mmap_threshold_kb: int = 16
    shutdown_grace_secs: float = 10.0
    # Reverse proxies (addresses or CIDRs) whose X-Forwarded-* / Forwarded headers
    # are believed; empty: every peer is the client itself.
    trusted_proxies: list[str] = field(default_factory=list)
    # SSE keep-alive comment interval; below common proxy read timeouts (nginx: 60 s).
    sse_keepalive_secs: float = 15.0


@dataclass
class DefaultModel:
    """The `[default_model]` table: what `provider = "default"` means in a manifest."""

    provider: str = "anthropic"
    model: str = "claude-sonnet-4-20250514"
    api_key_env: str = "ANTHROPIC_API_KEY"
    base_url: str = ""


@dataclass
class LlmConfig:
    """The `[llm]` table: how provider calls behave."""

    # Bounds the whole call: connect, every retry and backoff, the whole body or stream.
    timeout_secs: float = 300.0
    retries: int = 3
    # A stream fails when no byte arrives for this long (reasoning models may pause).
    stream_idle_secs: float = 60.0


@dataclass
class AgentsConfig:
    """The `[agents]` table: how requests to one agent wait for each other."""

    # Requests waiting for a busy agent (beyond the one running); more get 429.
    max_queue: int = 8
    # Conversations whose latest messages stay in memory between runs (least recently used
    # dropped first; a dropped one is read back from the database by its next run).
    cached_sessions: int = 256


@dataclass
class MetricsConfig:
    """The `[metrics]` table: the Prometheus endpoint `GET /metrics`."""

    enabled: bool = True
    # Agent names as a label on the per-agent series (runs, refusals, queue depth).
    agent_labels: bool = False


@dataclass
class TriggersConfig:
    """The `[triggers]` table: how often one trigger may fire (agentd/triggers/)."""

    # Firings per trigger per minute when the trigger sets no rate_limit_per_minute.
    rate_limit_per_minute: int = 6


@dataclass
class ToolsConfig:
    """The `[tools]` table: limits and backends of the built-in tools."""

    # web_fetch refuses loopback/private/link-local targets unless the host is listed here.
    fetch_allow_hosts: list[str] = field(default_factory=list)
    fetch_max_bytes: int = 1_048_576
    fetch_timeout_secs: float = 30.0
    # A search backend answering JSON like SearXNG (`{"results": [{title, url, content}]}`);
    # `{query}` in the URL is replaced by the URL-encoded query.
    search_url: str = ""
    shell_timeout_secs: float = 30.0
    shell_max_output_bytes: int = 102_400
    shell_deny: list[str] = field(default_factory=lambda: ["sudo", "su", "shutdown", "reboot", "mkfs", "dd"])
    approval_timeout_secs: float = 300.0
    # process_* tools: long-running programs per agent, under the shell policy.
    process_max_per_agent: int = 5
    process_max_memory_mb: int = 1024
    process_max_runtime_secs: float = 3600.0
    process_buffer_bytes: int = 65_536
    # browser_* tools: one headless Chromium per agent, closed after this much idleness.
    browser_idle_secs: float = 300.0
    browser_max_text_bytes: int = 50_000
    chromium_path: str = "/usr/bin/chromium"
    chromedriver_path: str = "/usr/bin/chromedriver"
    # docker_exec: a Docker or Podman Engine API socket; empty = no containers.
    container_runtime: str = ""
    container_image: str = "debian:bookworm-slim"
    container_allowed_images: list[str] = field(default_factory=list)
    container_network: bool = False
    container_memory_mb: int = 512
    container_cpus: float = 1.0
    container_timeout_secs: float = 60.0


@dataclass
class MemoryConfig:
    """The `[memory]` table: semantic memory, embeddings, recall in the loop, upkeep."""

    # "" = the bundled local model; else a provider id whose OpenAI-format /embeddings is used.
    embedding_provider: str = ""
    embedding_model: str = ""
    decay_days: float = 30.0
    decay_factor: float = 0.9
    decay_floor: float = 0.1
    consolidate_every_hours: float = 24.0
    auto_remember: bool = True
    # false: an exchange's vector is its user message's, the one recall already made (no
    # model run of its own); true: one more model run over question and answer together.
    embed_whole_exchange: bool = False
    # Exchanges remembered from one person's session are recalled into everyone's (one user).
    share_episodic: bool = False
    recall_limit: int = 5
    min_score: float = 0.3
    # Threads one embedding may use (0 = up to 2, as the daemon may use cores): a query is
    # one small forward pass, and a second core cuts its latency by about a third.
    embed_threads: int = 0
    # Fragments the in-memory search indexes hold in all; beyond it the least recently used
    # agents' indexes are dropped and read back from the database when next searched.
    index_cache_fragments: int = 20_000


@dataclass
class TelemetryConfig:
    """The `[telemetry]` table: OpenTelemetry traces (agentd/tracing.py)."""

    # Traces also start when OTEL_EXPORTER_OTLP_ENDPOINT is set; the OTEL_* variables configure them.
    otel: bool = False


@dataclass
class SchedulesConfig:
    """The `[schedules]` table: cron jobs and manifest schedules (agentd/schedules/)."""

    # false: jobs are kept and can be edited, but none fires on this daemon.
    enabled: bool = True
    # Provider failures in a row after which a job's due times are skipped, backing off.
    failure_backoff_after: int = 3
    backoff_max_secs: float = 3600.0
    # A due time found later than this (the daemon was down) is missed: the job's catch_up applies.
    misfire_grace_secs: float = 60.0
    delivery_attempts: int = 5
    max_jobs_per_agent: int = 50


@dataclass
class ChannelsConfig:
    """The daemon-wide keys of `[channels]`; its sub-tables are the adapters' own
    (agentd/channels/runtime.py reads those)."""

    listen_host: str = "127.0.0.1"
    workers: int = 8
    queue_limit: int = 32
    # A channel file is an upload: it is never larger than the upload limit (10 MiB).
    max_file_bytes: int = 10 * 1024 * 1024
