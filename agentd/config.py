"""Typed daemon configuration: `$AGENTD_HOME/config.toml` plus environment overrides.

Reading uses Python's `tomllib` (TOML 1.0). The only file we ever write is the
commented template from `agentd init`, so there is one way to write as well.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentd.errors import ConfigError
from agentd.store.backend import DatabaseUrl, parse_database_url

DEFAULT_LISTEN = "127.0.0.1:4200"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass
class ApiConfig:
    """The `[api]` table."""

    listen_addr: str = DEFAULT_LISTEN
    rate_limit_per_second: float = 30.0
    rate_limit_burst: int = 60
    cors_origins: list[str] = field(default_factory=list)
    # Host names served besides loopback names and the listen address (DNS rebinding
    # guard): exact names, `*.example.com` wildcards, or "*" to turn the check off.
    allowed_hosts: list[str] = field(default_factory=list)
    # Every SSE stream and WebSocket holds a waitress worker for its whole life,
    # so the pool is sized for long-lived connections, not just for HTTP.
    threads: int = 128
    max_streams: int = 96
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
    recall_limit: int = 5
    min_score: float = 0.3
    # Threads one embedding may use (0 = up to 2, as the machine has cores): a query is
    # one small forward pass, and a second core cuts its latency by about a third.
    embed_threads: int = 0


@dataclass
class Config:
    """Everything the daemon reads at start."""

    home: Path
    api: ApiConfig = field(default_factory=ApiConfig)
    api_key: str = ""
    log_level: str = "info"
    network_enabled: bool = False
    default_model: DefaultModel = field(default_factory=DefaultModel)
    provider_urls: dict[str, str] = field(default_factory=dict)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    raw: dict[str, Any] = field(default_factory=dict)
    # PostgreSQL instead of the home's SQLite file (agentd/store/backend.py): from
    # `database_url` (no password allowed) or AGENTD_DATABASE_URL (wins). None = SQLite.
    database: "DatabaseUrl | None" = None

    @property
    def api_listen(self) -> str:
        return self.api.listen_addr

    @property
    def host(self) -> str:
        return split_listen(self.api.listen_addr)[0]

    @property
    def port(self) -> int:
        return split_listen(self.api.listen_addr)[1]

    @property
    def config_path(self) -> Path:
        return self.home / "config.toml"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "agentd.db"

    @property
    def daemon_file(self) -> Path:
        return self.home / "daemon.json"

    @property
    def agents_dir(self) -> Path:
        return self.home / "agents"

    @property
    def workspaces_dir(self) -> Path:
        return self.home / "workspaces"

    @property
    def secrets_path(self) -> Path:
        return self.home / "secrets.env"


def home_dir() -> Path:
    """`$AGENTD_HOME`, else `~/.agentd`."""
    env = os.environ.get("AGENTD_HOME", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".agentd"


def split_listen(addr: str) -> tuple[str, int]:
    """Split `host:port` (IPv6 as `[::1]:4200`) and validate the port."""
    addr = addr.strip()
    if addr.startswith("["):
        host, sep, port_text = addr[1:].partition("]:")
    else:
        host, sep, port_text = addr.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"listen address {addr!r} must look like host:port")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"listen address {addr!r}: port {port_text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"listen address {addr!r}: port {port} is outside 1-65535")
    return host, port


def _expect(value: Any, kinds: type | tuple[type, ...], key: str, what: str) -> Any:
    # bool is an int in Python; a port or a rate given as `true` is still wrong.
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ConfigError(f"config key {key}: expected {what}, got a boolean")
    if not isinstance(value, kinds):
        raise ConfigError(f"config key {key}: expected {what}, got {type(value).__name__}")
    return value


def _api_table(data: dict[str, Any]) -> ApiConfig:
    api = ApiConfig()
    table = data.get("api", {})
    _expect(table, dict, "api", "a table")
    if "api_listen" in data:
        api.listen_addr = _expect(data["api_listen"], str, "api_listen", "a string")
    if "listen_addr" in table:
        api.listen_addr = _expect(table["listen_addr"], str, "api.listen_addr", "a string")
    if "rate_limit_per_second" in table:
        rate = _expect(table["rate_limit_per_second"], (int, float), "api.rate_limit_per_second", "a number")
        if rate <= 0:
            raise ConfigError("config key api.rate_limit_per_second: must be greater than 0")
        api.rate_limit_per_second = float(rate)
        api.rate_limit_burst = max(1, int(rate * 2))
    if "rate_limit_burst" in table:
        burst = _expect(table["rate_limit_burst"], int, "api.rate_limit_burst", "an integer")
        if burst < 1:
            raise ConfigError("config key api.rate_limit_burst: must be at least 1")
        api.rate_limit_burst = burst
    if "cors_origins" in table:
        origins = _expect(table["cors_origins"], list, "api.cors_origins", "an array of strings")
        for origin in origins:
            _expect(origin, str, "api.cors_origins", "an array of strings")
        api.cors_origins = [o.rstrip("/") for o in origins]
    if "allowed_hosts" in table:
        hosts = _expect(table["allowed_hosts"], list, "api.allowed_hosts", "an array of strings")
        for host in hosts:
            _expect(host, str, "api.allowed_hosts", "an array of strings")
            if not host.strip():
                raise ConfigError("config key api.allowed_hosts: entries must not be empty")
        api.allowed_hosts = [h.strip() for h in hosts]
    for key in ("threads", "max_streams"):
        if key in table:
            value = _expect(table[key], int, f"api.{key}", "an integer")
            if not 1 <= value <= 1024:
                raise ConfigError(f"config key api.{key}: must be between 1 and 1024")
            setattr(api, key, value)
    if "shutdown_grace_secs" in table:
        grace = _expect(table["shutdown_grace_secs"], (int, float), "api.shutdown_grace_secs", "a number")
        api.shutdown_grace_secs = float(grace)
    _proxy_keys(table, api)
    return api


def _proxy_keys(table: dict[str, Any], api: ApiConfig) -> None:
    """`[api] trusted_proxies` and `sse_keepalive_secs` (reverse proxy deployments)."""
    if "trusted_proxies" in table:
        entries = _expect(table["trusted_proxies"], list, "api.trusted_proxies", "an array of strings")
        for entry in entries:
            _expect(entry, str, "api.trusted_proxies", "an array of strings")
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ConfigError(f"config key api.trusted_proxies: {entry!r} is not an IP address "
                                  "or CIDR network") from None
        api.trusted_proxies = [e.strip() for e in entries]
    if "sse_keepalive_secs" in table:
        secs = _expect(table["sse_keepalive_secs"], (int, float), "api.sse_keepalive_secs", "a number")
        if not 0.1 <= secs <= 3600:
            raise ConfigError("config key api.sse_keepalive_secs: must be between 0.1 and 3600")
        api.sse_keepalive_secs = float(secs)


def _default_model_table(data: dict[str, Any]) -> DefaultModel:
    model = DefaultModel()
    table = _expect(data.get("default_model", {}), dict, "default_model", "a table")
    for key in ("provider", "model", "api_key_env", "base_url"):
        if key in table:
            setattr(model, key, _expect(table[key], str, f"default_model.{key}", "a string"))
    return model


def _tools_table(data: dict[str, Any]) -> ToolsConfig:
    tools = ToolsConfig()
    table = _expect(data.get("tools", {}), dict, "tools", "a table")
    for key in ("fetch_allow_hosts", "shell_deny"):
        if key in table:
            values = _expect(table[key], list, f"tools.{key}", "an array of strings")
            for value in values:
                _expect(value, str, f"tools.{key}", "an array of strings")
            setattr(tools, key, list(values))
    if "search_url" in table:
        tools.search_url = _expect(table["search_url"], str, "tools.search_url", "a string")
    for key in ("fetch_max_bytes", "shell_max_output_bytes"):
        if key in table:
            value = _expect(table[key], int, f"tools.{key}", "an integer")
            if value < 1:
                raise ConfigError(f"config key tools.{key}: must be at least 1")
            setattr(tools, key, value)
    for key in ("fetch_timeout_secs", "shell_timeout_secs", "approval_timeout_secs"):
        if key in table:
            value = _expect(table[key], (int, float), f"tools.{key}", "a number")
            if value <= 0:
                raise ConfigError(f"config key tools.{key}: must be greater than 0")
            setattr(tools, key, float(value))
    return tools


def _memory_table(data: dict[str, Any]) -> MemoryConfig:
    memory = MemoryConfig()
    table = _expect(data.get("memory", {}), dict, "memory", "a table")
    for key in ("embedding_provider", "embedding_model"):
        if key in table:
            setattr(memory, key, _expect(table[key], str, f"memory.{key}", "a string").strip())
    if memory.embedding_provider and not memory.embedding_model:
        raise ConfigError("config key memory.embedding_model: required when memory.embedding_provider is set")
    if "auto_remember" in table:
        memory.auto_remember = _expect(table["auto_remember"], bool, "memory.auto_remember", "a boolean")
    if "recall_limit" in table:
        limit = _expect(table["recall_limit"], int, "memory.recall_limit", "an integer")
        if not 0 <= limit <= 50:
            raise ConfigError("config key memory.recall_limit: must be between 0 and 50")
        memory.recall_limit = limit
    if "embed_threads" in table:
        threads = _expect(table["embed_threads"], int, "memory.embed_threads", "an integer")
        if not 0 <= threads <= 64:
            raise ConfigError("config key memory.embed_threads: must be between 0 and 64")
        memory.embed_threads = threads
    bounds = {"decay_days": (0.0, None), "consolidate_every_hours": (0.0, None), "min_score": (-1.0, 1.0),
              "decay_factor": (0.0, 1.0), "decay_floor": (0.0, 1.0)}
    for key, (low, high) in bounds.items():
        if key in table:
            value = float(_expect(table[key], (int, float), f"memory.{key}", "a number"))
            if value < low or (high is not None and value > high):
                limits = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
                raise ConfigError(f"config key memory.{key}: must be {limits}")
            setattr(memory, key, value)
    return memory


def parse_config(data: dict[str, Any], home: Path) -> Config:
    """Validate a parsed TOML document into a `Config` (no environment applied)."""
    cfg = Config(home=home, raw=data)
    cfg.api = _api_table(data)
    if "api_key" in data:
        cfg.api_key = _expect(data["api_key"], str, "api_key", "a string").strip()
    if "log_level" in data:
        level = _expect(data["log_level"], str, "log_level", "a string").lower()
        if level not in LOG_LEVELS:
            raise ConfigError(f"config key log_level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
        cfg.log_level = level
    if "network_enabled" in data:
        cfg.network_enabled = _expect(data["network_enabled"], bool, "network_enabled", "a boolean")
    cfg.default_model = _default_model_table(data)
    urls = _expect(data.get("provider_urls", {}), dict, "provider_urls", "a table")
    for name, url in urls.items():
        _expect(url, str, f"provider_urls.{name}", "a string")
    cfg.provider_urls = dict(urls)
    cfg.tools = _tools_table(data)
    llm = _expect(data.get("llm", {}), dict, "llm", "a table")
    if "timeout_secs" in llm:
        timeout = _expect(llm["timeout_secs"], (int, float), "llm.timeout_secs", "a number")
        if timeout <= 0:
            raise ConfigError("config key llm.timeout_secs: must be greater than 0")
        cfg.llm.timeout_secs = float(timeout)
    if "retries" in llm:
        retries = _expect(llm["retries"], int, "llm.retries", "an integer")
        if not 0 <= retries <= 10:
            raise ConfigError("config key llm.retries: must be between 0 and 10")
        cfg.llm.retries = retries
    cfg.memory = _memory_table(data)
    if "stream_idle_secs" in llm:
        idle = _expect(llm["stream_idle_secs"], (int, float), "llm.stream_idle_secs", "a number")
        if idle <= 0:
            raise ConfigError("config key llm.stream_idle_secs: must be greater than 0")
        cfg.llm.stream_idle_secs = float(idle)
    agents = _expect(data.get("agents", {}), dict, "agents", "a table")
    if "max_queue" in agents:
        max_queue = _expect(agents["max_queue"], int, "agents.max_queue", "an integer")
        if not 0 <= max_queue <= 10_000:
            raise ConfigError("config key agents.max_queue: must be between 0 and 10000")
        cfg.agents.max_queue = max_queue
    split_listen(cfg.api.listen_addr)
    if "database_url" in data:
        url = _expect(data["database_url"], str, "database_url", "a string").strip()
        cfg.database = parse_database_url(url, "config key database_url", allow_password=False) if url else None
    return cfg


def load_config(home: Path | None = None) -> Config:
    """Read `config.toml` (absent file = defaults) and apply environment overrides.

    Raises ConfigError naming the file, line or key at fault.
    """
    home = home or home_dir()
    path = home / "config.toml"
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cannot parse {path}: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        cfg = parse_config(data, home)
    except ConfigError as exc:
        raise ConfigError(f"invalid config {path}: {exc.message}") from None
    listen = os.environ.get("AGENTD_LISTEN", "").strip()
    if listen:
        try:
            split_listen(listen)
        except ConfigError as exc:
            raise ConfigError(f"AGENTD_LISTEN: {exc.message}") from None
        cfg.api.listen_addr = listen
    if not cfg.api_key:
        cfg.api_key = os.environ.get("AGENTD_API_KEY", "").strip()
    env_url = os.environ.get("AGENTD_DATABASE_URL", "").strip()
    if env_url:
        # The environment may hold a password: it is not a file anyone reads by accident.
        cfg.database = parse_database_url(env_url, "AGENTD_DATABASE_URL", allow_password=True)
    return cfg


DEFAULT_CONFIG_TEXT = """\
# agentd configuration. Every key is optional; the values shown are the defaults.
# Secrets never go in this file: keys ending in _env name environment variables.

# Address the HTTP API listens on. AGENTD_LISTEN overrides it.
api_listen = "127.0.0.1:4200"

# Bearer key for the API. Empty: only loopback clients are served.
# AGENTD_API_KEY is used when this is empty.
api_key = ""

# debug, info, warning, error or critical
log_level = "info"

# Whether agents may use network tools by default.
network_enabled = false

[api]
# Requests per second per client IP (GCRA), and the burst allowed on top.
rate_limit_per_second = 30
rate_limit_burst = 60
# Extra browser origins allowed by CORS when api_key is set; state-changing
# requests from any other web origin are refused (with or without api_key).
cors_origins = []
# Host names served besides localhost/127.0.0.1/[::1] and the listen address
# (e.g. the name a reverse proxy forwards): exact, "*.example.com", or "*" (off).
allowed_hosts = []
# waitress worker threads. Every SSE stream and WebSocket holds one for its
# whole life, so keep this well above max_streams.
threads = 128
# Cap on concurrent SSE streams + WebSockets, so plain HTTP never starves.
max_streams = 96
# Seconds in-flight requests get to finish on shutdown.
shutdown_grace_secs = 10
# Reverse proxies (addresses or CIDRs, e.g. ["127.0.0.1"]) whose X-Forwarded-For,
# -Proto, -Host, -Prefix and Forwarded headers are believed. Set api_key too:
# clients behind the proxy are remote and need it. See docs/deploy.md.
trusted_proxies = []
# Seconds between SSE keep-alive comments (keep below the proxy's read timeout).
sse_keepalive_secs = 15

[tools]
# Hosts web_fetch may reach even though they are loopback or private addresses.
fetch_allow_hosts = []
# JSON search backend for web_search (SearXNG style); {query} is replaced.
search_url = ""
# Seconds a tool call in Manual mode waits for approval before it is rejected.
approval_timeout_secs = 300

[llm]
# Seconds one model call may take in all (connect, retries, backoff, the whole answer),
# retries on 429/5xx/timeouts, and seconds a stream may go without a byte.
timeout_secs = 300
retries = 3
stream_idle_secs = 60

[agents]
# Requests that may wait for a busy agent; more are refused with 429 and Retry-After.
max_queue = 8

[memory]
# Embeddings: "" = the bundled all-MiniLM-L6-v2 model (offline); or a provider id whose
# OpenAI-format /embeddings endpoint is used, with embedding_model naming its model.
embedding_provider = ""
# Remember every exchange as an episodic fragment, and recall this many fragments
# (scoring at least min_score) into the system prompt before each model call (0 = off).
auto_remember = true
recall_limit = 5
min_score = 0.3
# Threads one local embedding may use (0 = up to 2, as the machine has cores).
embed_threads = 0
# Consolidation: merge near-duplicates; fragments not accessed for decay_days lose
# confidence (x decay_factor per run) and are dropped below decay_floor. 0 = no schedule.
consolidate_every_hours = 24
decay_days = 30

[default_model]
# What provider = "default" and model = "default" mean in an agent manifest.
provider = "anthropic"
model = "claude-sonnet-4-20250514"
api_key_env = "ANTHROPIC_API_KEY"
"""


def write_default_config(home: Path) -> Path:
    """Create the home layout and a commented config.toml unless one exists."""
    home.mkdir(parents=True, exist_ok=True)
    for sub in ("data", "agents", "workspaces"):
        (home / sub).mkdir(exist_ok=True)
    path = home / "config.toml"
    if not path.exists():
        path.write_text(DEFAULT_CONFIG_TEXT, encoding="utf-8")
    return path
