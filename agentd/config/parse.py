"""Validation of `config.toml` values: the type check and one parser per table.

Every function raises ConfigError naming the key at fault. `agentd.config.parse_config`
assembles the results into a `Config`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from agentd.config.tables import (ApiConfig, ChannelsConfig, DefaultModel, MemoryConfig, MetricsConfig,
                                  SchedulesConfig, ToolsConfig, TriggersConfig)
from agentd.errors import ConfigError
from agentd.llm.catalog import Catalog

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")


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


def expect(value: Any, kinds: type | tuple[type, ...], key: str, what: str) -> Any:
    """Return `value` if it is one of `kinds`, else raise ConfigError naming `key` and `what`."""
    # bool is an int in Python; a port or a rate given as `true` is still wrong.
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ConfigError(f"config key {key}: expected {what}, got a boolean")
    if not isinstance(value, kinds):
        raise ConfigError(f"config key {key}: expected {what}, got {type(value).__name__}")
    return value


def set_int(table: dict[str, Any], target: Any, section: str, key: str, low: int, high: int) -> None:
    """`target.key` = `table[key]` when given: an integer from `low` to `high`, else ConfigError."""
    if key in table:
        value = expect(table[key], int, f"{section}.{key}", "an integer")
        if not low <= value <= high:
            raise ConfigError(f"config key {section}.{key}: must be between {low} and {high}")
        setattr(target, key, value)


def api_table(data: dict[str, Any]) -> ApiConfig:
    """The `[api]` table (and the top-level `api_listen`), validated."""
    api = ApiConfig()
    table = data.get("api", {})
    expect(table, dict, "api", "a table")
    if "api_listen" in data:
        api.listen_addr = expect(data["api_listen"], str, "api_listen", "a string")
    if "listen_addr" in table:
        addr = expect(table["listen_addr"], str, "api.listen_addr", "a string")
        if "api_listen" in data and addr != api.listen_addr:
            raise ConfigError(f"config key api.listen_addr: {addr!r} and api_listen {api.listen_addr!r} are two "
                              "names of one setting; keep one")
        api.listen_addr = addr
    if "rate_limit_per_second" in table:
        rate = expect(table["rate_limit_per_second"], (int, float), "api.rate_limit_per_second", "a number")
        if rate <= 0:
            raise ConfigError("config key api.rate_limit_per_second: must be greater than 0")
        api.rate_limit_per_second = float(rate)
        api.rate_limit_burst = max(1, int(rate))
    if "rate_limit_burst" in table:
        burst = expect(table["rate_limit_burst"], int, "api.rate_limit_burst", "an integer")
        if burst < 1:
            raise ConfigError("config key api.rate_limit_burst: must be at least 1")
        api.rate_limit_burst = burst
    if "cors_origins" in table:
        origins = expect(table["cors_origins"], list, "api.cors_origins", "an array of strings")
        for origin in origins:
            expect(origin, str, "api.cors_origins", "an array of strings")
        api.cors_origins = [o.rstrip("/") for o in origins]
    if "allowed_hosts" in table:
        hosts = expect(table["allowed_hosts"], list, "api.allowed_hosts", "an array of strings")
        for host in hosts:
            expect(host, str, "api.allowed_hosts", "an array of strings")
            if not host.strip():
                raise ConfigError("config key api.allowed_hosts: entries must not be empty")
        api.allowed_hosts = [h.strip() for h in hosts]
    set_int(table, api, "api", "threads", 1, 1024)
    set_int(table, api, "api", "max_streams", 1, 1024)
    set_int(table, api, "api", "malloc_arenas", 0, 64)
    set_int(table, api, "api", "malloc_mmap_threshold_kb", 0, 32768)  # glibc refuses more than 32 MiB
    if "shutdown_grace_secs" in table:
        grace = expect(table["shutdown_grace_secs"], (int, float), "api.shutdown_grace_secs", "a number")
        api.shutdown_grace_secs = float(grace)
    _proxy_keys(table, api)
    return api


def _proxy_keys(table: dict[str, Any], api: ApiConfig) -> None:
    """`[api] trusted_proxies` and `sse_keepalive_secs` (reverse proxy deployments)."""
    if "trusted_proxies" in table:
        entries = expect(table["trusted_proxies"], list, "api.trusted_proxies", "an array of strings")
        for entry in entries:
            expect(entry, str, "api.trusted_proxies", "an array of strings")
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ConfigError(f"config key api.trusted_proxies: {entry!r} is not an IP address "
                                  "or CIDR network") from None
        api.trusted_proxies = [e.strip() for e in entries]
    if "sse_keepalive_secs" in table:
        secs = expect(table["sse_keepalive_secs"], (int, float), "api.sse_keepalive_secs", "a number")
        if not 0.1 <= secs <= 3600:
            raise ConfigError("config key api.sse_keepalive_secs: must be between 0.1 and 3600")
        api.sse_keepalive_secs = float(secs)


def default_model_table(data: dict[str, Any]) -> DefaultModel:
    """The `[default_model]` table, validated."""
    model = DefaultModel()
    table = expect(data.get("default_model", {}), dict, "default_model", "a table")
    for key in ("provider", "model", "api_key_env", "base_url"):
        if key in table:
            setattr(model, key, expect(table[key], str, f"default_model.{key}", "a string"))
    if "provider" in table and "api_key_env" not in table:
        # The key variable of the provider named, not the default provider's: a local
        # server (Ollama, LM Studio) has none.
        info = Catalog.load().get_provider(model.provider)
        model.api_key_env = info.api_key_env if info is not None else ""
    return model


def tools_table(data: dict[str, Any]) -> ToolsConfig:
    """The `[tools]` table, validated."""
    tools = ToolsConfig()
    table = expect(data.get("tools", {}), dict, "tools", "a table")
    for key in ("fetch_allow_hosts", "shell_deny", "container_allowed_images"):
        if key in table:
            values = expect(table[key], list, f"tools.{key}", "an array of strings")
            for value in values:
                expect(value, str, f"tools.{key}", "an array of strings")
            setattr(tools, key, list(values))
    for key in ("search_url", "chromium_path", "chromedriver_path", "container_runtime", "container_image"):
        if key in table:
            setattr(tools, key, expect(table[key], str, f"tools.{key}", "a string"))
    if "container_network" in table:
        tools.container_network = expect(table["container_network"], bool, "tools.container_network", "a boolean")
    for key in ("fetch_max_bytes", "shell_max_output_bytes", "process_max_per_agent", "process_max_memory_mb",
                "process_buffer_bytes", "browser_max_text_bytes", "container_memory_mb"):
        if key in table:
            value = expect(table[key], int, f"tools.{key}", "an integer")
            if value < 1:
                raise ConfigError(f"config key tools.{key}: must be at least 1")
            setattr(tools, key, value)
    for key in ("fetch_timeout_secs", "shell_timeout_secs", "approval_timeout_secs", "process_max_runtime_secs",
                "browser_idle_secs", "container_cpus", "container_timeout_secs"):
        if key in table:
            value = expect(table[key], (int, float), f"tools.{key}", "a number")
            if value <= 0:
                raise ConfigError(f"config key tools.{key}: must be greater than 0")
            setattr(tools, key, float(value))
    return tools


def memory_table(data: dict[str, Any]) -> MemoryConfig:
    """The `[memory]` table, validated."""
    memory = MemoryConfig()
    table = expect(data.get("memory", {}), dict, "memory", "a table")
    for key in ("embedding_provider", "embedding_model"):
        if key in table:
            setattr(memory, key, expect(table[key], str, f"memory.{key}", "a string").strip())
    if memory.embedding_provider and not memory.embedding_model:
        raise ConfigError("config key memory.embedding_model: required when memory.embedding_provider is set")
    if "auto_remember" in table:
        memory.auto_remember = expect(table["auto_remember"], bool, "memory.auto_remember", "a boolean")
    if "embed_whole_exchange" in table:
        memory.embed_whole_exchange = expect(table["embed_whole_exchange"], bool, "memory.embed_whole_exchange",
                                             "a boolean")
    if "share_episodic" in table:
        memory.share_episodic = expect(table["share_episodic"], bool, "memory.share_episodic", "a boolean")
    set_int(table, memory, "memory", "recall_limit", 0, 50)
    set_int(table, memory, "memory", "embed_threads", 0, 64)
    set_int(table, memory, "memory", "index_cache_fragments", 100, 10_000_000)
    bounds = {"decay_days": (0.0, None), "consolidate_every_hours": (0.0, None), "min_score": (-1.0, 1.0),
              "decay_factor": (0.0, 1.0), "decay_floor": (0.0, 1.0)}
    for key, (low, high) in bounds.items():
        if key in table:
            value = float(expect(table[key], (int, float), f"memory.{key}", "a number"))
            if value < low or (high is not None and value > high):
                limits = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
                raise ConfigError(f"config key memory.{key}: must be {limits}")
            setattr(memory, key, value)
    return memory


def metrics_table(data: dict[str, Any]) -> MetricsConfig:
    """The `[metrics]` table, validated."""
    metrics = MetricsConfig()
    table = expect(data.get("metrics", {}), dict, "metrics", "a table")
    for key in ("enabled", "agent_labels"):
        if key in table:
            setattr(metrics, key, expect(table[key], bool, f"metrics.{key}", "a boolean"))
    return metrics


def triggers_table(data: dict[str, Any]) -> TriggersConfig:
    """The `[triggers]` table, validated."""
    triggers = TriggersConfig()
    table = expect(data.get("triggers", {}), dict, "triggers", "a table")
    set_int(table, triggers, "triggers", "rate_limit_per_minute", 1, 10_000)
    return triggers


def schedules_table(data: dict[str, Any]) -> SchedulesConfig:
    """The `[schedules]` table."""
    table = expect(data.get("schedules", {}), dict, "schedules", "a table")
    cfg = SchedulesConfig()
    if "enabled" in table:
        cfg.enabled = expect(table["enabled"], bool, "schedules.enabled", "a boolean")
    for key, low, high in (("failure_backoff_after", 1, 1000), ("delivery_attempts", 1, 20),
                           ("max_jobs_per_agent", 1, 100_000)):
        set_int(table, cfg, "schedules", key, low, high)
    for key, low, high in (("backoff_max_secs", 1, 7 * 86400), ("misfire_grace_secs", 0, 86400)):
        if key in table:
            value = expect(table[key], (int, float), f"schedules.{key}", "a number")
            if not low <= value <= high:
                raise ConfigError(f"config key schedules.{key}: must be between {low} and {high}")
            setattr(cfg, key, float(value))
    return cfg


def channels_table(data: dict[str, Any]) -> ChannelsConfig:
    """The daemon-wide keys of `[channels]`, validated (the adapters' tables are left alone)."""
    channels = ChannelsConfig()
    table = expect(data.get("channels", {}), dict, "channels", "a table")
    if "listen_host" in table:
        host = expect(table["listen_host"], str, "channels.listen_host", "a string").strip()
        if not host:
            raise ConfigError("config key channels.listen_host: must be an address such as 127.0.0.1")
        channels.listen_host = host
    set_int(table, channels, "channels", "workers", 1, 256)
    set_int(table, channels, "channels", "queue_limit", 0, 10_000)
    set_int(table, channels, "channels", "max_file_bytes", 1, ChannelsConfig.max_file_bytes)
    return channels


@dataclass(frozen=True)
class RemoteAgent:
    """One `[a2a] agents` entry: a remote A2A agent the a2a_* tools may call."""

    name: str
    url: str  # its card, its base URL or its JSON-RPC endpoint
    api_key_env: str = ""


def remote_agents(raw: Any) -> list[RemoteAgent]:
    """The `[a2a] agents` list of config.toml (validated)."""
    table = raw.get("a2a", {}) if isinstance(raw, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError("config key a2a.agents: [a2a] must be a table")
    items = table.get("agents", [])
    if not isinstance(items, list):
        raise ConfigError("config key a2a.agents: must be an array of tables {name, url, api_key_env}")
    agents = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"] \
                or not isinstance(item.get("url"), str) or not item["url"].startswith(("http://", "https://")) \
                or not isinstance(item.get("api_key_env", ""), str):
            raise ConfigError("config key a2a.agents: each entry needs a name and an http(s) url "
                              "(and optionally api_key_env, the name of an environment variable)")
        agents.append(RemoteAgent(item["name"], item["url"], item.get("api_key_env", "")))
    return agents
