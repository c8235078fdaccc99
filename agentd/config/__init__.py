"""Typed daemon configuration: `$AGENTD_HOME/config.toml` plus environment overrides.

Reading uses Python's `tomllib` (TOML 1.0). The per-table dataclasses live in
tables.py, their validation in parse.py, the commented template `agentd init` writes
in template.py; every public name is re-exported here, so `from agentd.config import X` is the one import to use.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd import tomlsafe
from agentd.cluster.config import ClusterSettings, cluster_settings
from agentd.config.parse import (LOG_FORMATS, LOG_LEVELS, api_table, channels_table, default_model_table, expect,
                                 memory_table, metrics_table, remote_agents, schedules_table, set_int,
                                 split_listen, tools_table, triggers_table)
from agentd.config.tables import (DEFAULT_LISTEN, AgentsConfig, ApiConfig, ChannelsConfig, DefaultModel, LlmConfig,
                                  MemoryConfig, MetricsConfig, SchedulesConfig, TelemetryConfig, ToolsConfig,
                                  TriggersConfig)
from agentd.config.template import DEFAULT_CONFIG_TEXT, unwritable_home, write_default_config
from agentd.errors import ConfigError
from agentd.mcp.config import McpServerSpec, parse_mcp_servers

if TYPE_CHECKING:
    from agentd.store.backend import DatabaseUrl

__all__ = ["DEFAULT_CONFIG_TEXT", "DEFAULT_LISTEN", "LOG_FORMATS", "LOG_LEVELS", "AgentsConfig", "ApiConfig",
           "ChannelsConfig", "Config", "ConfigError", "DefaultModel", "LlmConfig", "MemoryConfig", "MetricsConfig",
           "SchedulesConfig", "TelemetryConfig", "ToolsConfig", "home_dir",
           "load_config", "parse_config", "remote_agents", "split_listen", "unknown_keys", "unwritable_home",
           "write_default_config"]


@dataclass
class Config:
    """Everything the daemon reads at start."""

    home: Path
    api: ApiConfig = field(default_factory=ApiConfig)
    api_key: str = ""
    log_level: str = "info"
    log_format: str = "text"  # or "json": one JSON object per line (agentd/logs.py)
    network_enabled: bool = False
    default_model: DefaultModel = field(default_factory=DefaultModel)
    provider_urls: dict[str, str] = field(default_factory=dict)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    triggers: TriggersConfig = field(default_factory=TriggersConfig)
    schedules: SchedulesConfig = field(default_factory=SchedulesConfig)
    channels: ChannelsConfig = field(default_factory=ChannelsConfig)
    raw: dict[str, Any] = field(default_factory=dict)
    # PostgreSQL instead of the home's SQLite file (agentd/store/backend.py): from
    # `database_url` (no password allowed) or AGENTD_DATABASE_URL (wins). None = SQLite.
    database: "DatabaseUrl | None" = None
    # `[[mcp_servers]]`: the MCP servers agents may use (agentd/mcp/config.py).
    mcp_servers: list[McpServerSpec] = field(default_factory=list)

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


def parse_config(data: dict[str, Any], home: Path) -> Config:
    """Validate a parsed TOML document into a `Config` (no environment applied)."""
    cfg = Config(home=home, raw=data)
    cfg.api = api_table(data)
    if "api_key" in data:
        cfg.api_key = expect(data["api_key"], str, "api_key", "a string").strip()
    if "log_level" in data:
        level = expect(data["log_level"], str, "log_level", "a string").lower()
        if level not in LOG_LEVELS:
            raise ConfigError(f"config key log_level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
        cfg.log_level = level
    if "log_format" in data:
        fmt = expect(data["log_format"], str, "log_format", "a string").lower()
        if fmt not in LOG_FORMATS:
            raise ConfigError(f"config key log_format: {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
        cfg.log_format = fmt
    if "network_enabled" in data:
        cfg.network_enabled = expect(data["network_enabled"], bool, "network_enabled", "a boolean")
    cfg.default_model = default_model_table(data)
    urls = expect(data.get("provider_urls", {}), dict, "provider_urls", "a table")
    for name, url in urls.items():
        expect(url, str, f"provider_urls.{name}", "a string")
    cfg.provider_urls = dict(urls)
    cfg.tools = tools_table(data)
    cfg.triggers = triggers_table(data)
    llm = expect(data.get("llm", {}), dict, "llm", "a table")
    if "timeout_secs" in llm:
        timeout = expect(llm["timeout_secs"], (int, float), "llm.timeout_secs", "a number")
        if timeout <= 0:
            raise ConfigError("config key llm.timeout_secs: must be greater than 0")
        cfg.llm.timeout_secs = float(timeout)
    set_int(llm, cfg.llm, "llm", "retries", 0, 10)
    cfg.memory = memory_table(data)
    cfg.metrics = metrics_table(data)
    if "stream_idle_secs" in llm:
        idle = expect(llm["stream_idle_secs"], (int, float), "llm.stream_idle_secs", "a number")
        if idle <= 0:
            raise ConfigError("config key llm.stream_idle_secs: must be greater than 0")
        cfg.llm.stream_idle_secs = float(idle)
    agents = expect(data.get("agents", {}), dict, "agents", "a table")
    set_int(agents, cfg.agents, "agents", "max_queue", 0, 10_000)
    set_int(agents, cfg.agents, "agents", "cached_sessions", 1, 1_000_000)
    telemetry = expect(data.get("telemetry", {}), dict, "telemetry", "a table")
    if "otel" in telemetry:
        cfg.telemetry.otel = expect(telemetry["otel"], bool, "telemetry.otel", "a boolean")
    cfg.schedules = schedules_table(data)
    cfg.channels = channels_table(data)
    split_listen(cfg.api.listen_addr)
    # Tables their own packages read when the daemon starts: checked here too, so that
    # `agentd doctor` and a settings reload refuse what the start would.
    cluster_settings(data, cfg.api.listen_addr)
    remote_agents(data)
    if "database_url" in data:
        url = expect(data["database_url"], str, "database_url", "a string").strip()
        # Only with a URL: the store package loads Pony, which reading the config does not need.
        from agentd.store.backend import parse_database_url

        cfg.database = parse_database_url(url, "config key database_url", allow_password=False) if url else None
    cfg.mcp_servers = parse_mcp_servers(data)
    return cfg


def unknown_keys(data: dict[str, Any]) -> list[str]:
    """The keys of a parsed config.toml that agentd does not read (`table.key`), so that a
    misspelt key is named rather than ignored without a word."""
    defaults = Config(home=Path())
    tables = {f.name: {sub.name for sub in fields(table)} for f in fields(Config)
              if is_dataclass(table := getattr(defaults, f.name))}
    tables |= {"cluster": {f.name for f in fields(ClusterSettings)}, "a2a": {"agents"}}
    plain = {f.name for f in fields(Config)} - set(tables) - {"home", "raw", "database"} | {"api_listen", "database_url"}
    unknown = []
    for key, value in data.items():
        if key in tables and isinstance(value, dict):
            # A table under [channels] is an adapter's, checked by the channel catalogue.
            unknown += [f"{key}.{name}" for name, item in value.items()
                        if name not in tables[key] and not (key == "channels" and isinstance(item, dict))]
        elif key not in tables and key not in plain:
            unknown.append(key)
    return unknown


def load_config(home: Path | None = None) -> Config:
    """Read `config.toml` (absent file = defaults) and apply environment overrides.

    Raises ConfigError naming the file, line or key at fault.
    """
    home = home or home_dir()
    path = home / "config.toml"
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomlsafe.loads(path.read_text(encoding="utf-8"))
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
        from agentd.store.backend import parse_database_url  # (only with a URL: see parse_config)

        # The environment may hold a password: it is not a file anyone reads by accident.
        cfg.database = parse_database_url(env_url, "AGENTD_DATABASE_URL", allow_password=True)
    return cfg
