"""Config parsing, validation messages and environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.config import (DEFAULT_CONFIG_TEXT, home_dir, load_config, split_listen, unknown_keys,
                           write_default_config)
from agentd.errors import ConfigError
from agentd.store.backend import DatabaseUrl


def write(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)
    return home


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AGENTD_LISTEN", "AGENTD_API_KEY", "AGENTD_HOME", "AGENTD_DATABASE_URL"):
        monkeypatch.delenv(key, raising=False)


def test_defaults_without_a_file(tmp_path: Path) -> None:
    cfg = load_config(tmp_path)
    assert cfg.api_listen == "127.0.0.1:4200"
    assert cfg.api.rate_limit_per_second == 30
    assert cfg.api.threads >= 32
    assert cfg.api_key == ""
    assert cfg.log_level == "info"
    assert (cfg.log_format, cfg.metrics.enabled, cfg.metrics.agent_labels) == ("text", True, False)


def test_the_home_holds_the_daemons_files(tmp_path: Path) -> None:
    cfg = load_config(tmp_path)
    assert (cfg.config_path, cfg.data_dir, cfg.db_path, cfg.daemon_file, cfg.agents_dir, cfg.workspaces_dir,
            cfg.secrets_path) == (tmp_path / "config.toml", tmp_path / "data", tmp_path / "data" / "agentd.db",
                                  tmp_path / "daemon.json", tmp_path / "agents", tmp_path / "workspaces",
                                  tmp_path / "secrets.env")
    assert (cfg.host, cfg.port) == ("127.0.0.1", 4200)
    assert (cfg.network_enabled, cfg.provider_urls, cfg.database, cfg.mcp_servers, cfg.telemetry.otel) == \
        (False, {}, None, [], False)
    assert (cfg.llm.timeout_secs, cfg.llm.retries, cfg.llm.stream_idle_secs) == (300.0, 3, 60.0)
    assert (cfg.agents.max_queue, cfg.agents.cached_sessions) == (8, 256)


def test_the_home_is_agentd_home_else_dot_agentd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert home_dir() == Path.home() / ".agentd"
    monkeypatch.setenv("AGENTD_HOME", "  ")
    assert home_dir() == Path.home() / ".agentd"
    monkeypatch.setenv("AGENTD_HOME", "~/elsewhere")
    assert home_dir() == Path.home() / "elsewhere"
    monkeypatch.setenv("AGENTD_HOME", f" {tmp_path} ")
    write(tmp_path, 'log_level = "debug"\n')
    cfg = load_config()
    assert (cfg.home, cfg.log_level) == (tmp_path, "debug")


def test_values_as_read(tmp_path: Path) -> None:
    write(tmp_path, 'api_key = "  admin  "\nlog_level = "DEBUG"\nnetwork_enabled = true\n'
                    'database_url = " postgresql://agentd@db.example/agentd "\n'
                    '[provider_urls]\nopenai = "http://127.0.0.1:9/v1"\n'
                    '[llm]\ntimeout_secs = 0.5\nstream_idle_secs = 5\n[telemetry]\notel = true\n'
                    '[tools]\nsearch_url = "http://127.0.0.1:9/search?q={query}"\n')
    cfg = load_config(tmp_path)
    assert (cfg.api_key, cfg.log_level, cfg.network_enabled, cfg.provider_urls, cfg.telemetry.otel) == \
        ("admin", "debug", True, {"openai": "http://127.0.0.1:9/v1"}, True)
    assert cfg.database == DatabaseUrl("postgresql://agentd@db.example/agentd")
    assert (cfg.llm.timeout_secs, cfg.llm.stream_idle_secs) == (0.5, 5.0)
    assert type(cfg.llm.stream_idle_secs) is float
    assert (cfg.tools.search_url, cfg.tools.shell_timeout_secs) == ("http://127.0.0.1:9/search?q={query}", 30.0)
    write(tmp_path, 'database_url = ""\n[llm]\ntimeout_secs = 7\nstream_idle_secs = 0.25\n')
    cfg = load_config(tmp_path)
    assert (cfg.database, cfg.llm.timeout_secs, cfg.llm.stream_idle_secs) == (None, 7.0, 0.25)
    assert type(cfg.llm.timeout_secs) is float


def test_a_default_model_without_a_key_variable_takes_its_providers(tmp_path: Path) -> None:
    for table, env in (('provider = "ollama"\nmodel = "llama3.2"', ""),
                       ('provider = "openai"\nmodel = "gpt-4o"', "OPENAI_API_KEY"),
                       ('provider = "ollama"\nmodel = "llama3.2"\napi_key_env = "MY_KEY"', "MY_KEY"),
                       ('provider = "my-proxy"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"', "")):
        write(tmp_path, f"[default_model]\n{table}\n")
        assert load_config(tmp_path).default_model.api_key_env == env, table
    write(tmp_path, '[default_model]\nmodel = "claude-opus-4-6"\n')
    assert load_config(tmp_path).default_model.api_key_env == "ANTHROPIC_API_KEY"


def test_the_environment_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, 'api_listen = "127.0.0.1:5000"\ndatabase_url = "postgresql://agentd@db.example/agentd"\n')
    monkeypatch.setenv("AGENTD_LISTEN", "  ")
    monkeypatch.setenv("AGENTD_API_KEY", "  from-env  ")
    # The environment may hold a password; config.toml may not.
    monkeypatch.setenv("AGENTD_DATABASE_URL", " postgresql://agentd:pw@other.example/agentd ")
    cfg = load_config(tmp_path)
    assert (cfg.api_listen, cfg.api_key, cfg.database) == (
        "127.0.0.1:5000", "from-env", DatabaseUrl("postgresql://agentd:pw@other.example/agentd"))
    monkeypatch.setenv("AGENTD_DATABASE_URL", "  ")
    assert load_config(tmp_path).database == DatabaseUrl("postgresql://agentd@db.example/agentd")
    monkeypatch.setenv("AGENTD_DATABASE_URL", "sqlite:///x.db")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message == ("AGENTD_DATABASE_URL: must be a postgresql:// URL (got scheme 'sqlite'); "
                                 "leave it unset for the embedded SQLite database")


def test_log_format_and_metrics_keys(tmp_path: Path) -> None:
    write(tmp_path, 'log_format = "JSON"\n[metrics]\nenabled = false\nagent_labels = true\n')
    cfg = load_config(tmp_path)
    assert (cfg.log_format, cfg.metrics.enabled, cfg.metrics.agent_labels) == ("json", False, True)


def test_default_template_parses_to_defaults(tmp_path: Path) -> None:
    write_default_config(tmp_path)
    assert (tmp_path / "config.toml").read_text() == DEFAULT_CONFIG_TEXT
    cfg = load_config(tmp_path)
    assert cfg.api_listen == "127.0.0.1:4200"
    assert (tmp_path / "data").is_dir() and (tmp_path / "agents").is_dir()
    # `agentd init`'s file never makes the start warn about a key it does not read.
    assert unknown_keys(cfg.raw) == [] and len(cfg.raw) > 5


def test_listen_addr_alias_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, '[api]\nlisten_addr = "127.0.0.1:5000"\n')
    assert load_config(tmp_path).api_listen == "127.0.0.1:5000"
    write(tmp_path, 'api_listen = "127.0.0.1:5001"\n')
    assert load_config(tmp_path).port == 5001
    monkeypatch.setenv("AGENTD_LISTEN", "127.0.0.1:6000")
    assert load_config(tmp_path).api_listen == "127.0.0.1:6000"


def test_api_key_from_env_only_when_file_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTD_API_KEY", "from-env")
    write(tmp_path, "")
    assert load_config(tmp_path).api_key == "from-env"
    write(tmp_path, 'api_key = "from-file"\n')
    assert load_config(tmp_path).api_key == "from-file"


def test_unparsable_toml_names_the_line(tmp_path: Path) -> None:
    write(tmp_path, 'log_level = "info"\napi_listen = \n')
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message == f"cannot parse {tmp_path / 'config.toml'}: Invalid value (at line 2, column 14)"
    write(tmp_path, 'log_level = "info"\nx = ' + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message == f"cannot parse {tmp_path / 'config.toml'}: nested too deeply (more than 64 levels)"


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_bytes(b'\xfflog_level = "info"\n')
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message == (f"cannot read {tmp_path / 'config.toml'}: 'utf-8' codec can't decode byte 0xff "
                                 "in position 0: invalid start byte")
    (tmp_path / "config.toml").unlink()
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message.startswith(f"cannot read {tmp_path / 'config.toml'}: [Errno 21] Is a directory")


@pytest.mark.parametrize("text, message", [
    ('api_key = 3\n', "config key api_key: expected a string, got int"),
    ('log_level = 3\n', "config key log_level: expected a string, got int"),
    ('log_level = "loud"\n', "config key log_level: 'loud' is not one of debug, info, warning, error, critical"),
    ('log_format = 3\n', "config key log_format: expected a string, got int"),
    ('network_enabled = "yes"\n', "config key network_enabled: expected a boolean, got str"),
    ('provider_urls = 5\n', "config key provider_urls: expected a table, got int"),
    ('[provider_urls]\nopenai = 5\n', "config key provider_urls.openai: expected a string, got int"),
    ('llm = 3\n', "config key llm: expected a table, got int"),
    ('[llm]\ntimeout_secs = 0\n', "config key llm.timeout_secs: must be greater than 0"),
    ('[llm]\ntimeout_secs = -0.5\n', "config key llm.timeout_secs: must be greater than 0"),
    ('[llm]\ntimeout_secs = true\n', "config key llm.timeout_secs: expected a number, got a boolean"),
    ('[llm]\nstream_idle_secs = 0\n', "config key llm.stream_idle_secs: must be greater than 0"),
    ('[llm]\nstream_idle_secs = "1"\n', "config key llm.stream_idle_secs: expected a number, got str"),
    ('agents = []\n', "config key agents: expected a table, got list"),
    ('telemetry = 1\n', "config key telemetry: expected a table, got int"),
    ('[telemetry]\notel = "yes"\n', "config key telemetry.otel: expected a boolean, got str"),
    ('database_url = 5\n', "config key database_url: expected a string, got int"),
    ('database_url = "postgresql://agentd:pw@db.example/agentd"\n',
     "config key database_url: must not contain a password (secrets never go in config.toml); set PGPASSWORD, "
     "use ~/.pgpass, or put the whole URL in AGENTD_DATABASE_URL"),
])
def test_a_refused_value_is_named_with_its_file(tmp_path: Path, text: str, message: str) -> None:
    write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.message == f"invalid config {tmp_path / 'config.toml'}: {message}"


def test_unknown_keys_are_named_as_table_dot_key() -> None:
    """What the start and `agentd doctor` warn about: keys of agentd's tables it does not
    read, and top-level keys that are neither a table nor a setting."""
    assert unknown_keys({"api_listen": "127.0.0.1:1", "database_url": "", "api_key": "", "log_level": "info",
                         "api": {"threads": 4}, "llm": {"retries": 1}, "cluster": {"lease_secs": 5},
                         "a2a": {"agents": []}, "channels": {"workers": 2, "telegram": {"token_env": "T"}},
                         "mcp_servers": []}) == []
    assert unknown_keys({"api": {"threds": 4}, "cluster": {"leases": 5}, "a2a": {"agent": []},
                         "channels": {"telegram": 1}, "home": "/x", "raw": {}, "database": "x", "llm": 5}) == [
        "api.threds", "cluster.leases", "a2a.agent", "channels.telegram", "home", "raw", "database"]


@pytest.mark.parametrize("text, fragment", [
    ('api_listen = 4200\n', "api_listen: expected a string"),
    ('api_listen = "127.0.0.1:70000"\n', "outside 1-65535"),
    ('api_listen = "127.0.0.1:0"\n', "outside 1-65535"),
    ('api_listen = "localhost"\n', "host:port"),
    ('[api]\nrate_limit_per_second = "fast"\n', "api.rate_limit_per_second: expected a number"),
    ('[api]\nrate_limit_per_second = true\n', "got a boolean"),
    ('[api]\nthreads = 0\n', "api.threads"),
    ('[api]\ncors_origins = "http://x"\n', "api.cors_origins"),
    ('log_level = "loud"\n', "log_level"),
    ('log_format = "xml"\n', "config key log_format: 'xml' is not one of text, json"),
    ('[metrics]\nenabled = "yes"\n', "metrics.enabled: expected a boolean"),
    ('[metrics]\nagent_labels = 1\n', "metrics.agent_labels: expected a boolean"),
    ('[default_model]\nprovider = 3\n', "default_model.provider"),
    ('api_listen = "127.0.0.1:4201"\n[api]\nlisten_addr = "127.0.0.1:4202"\n',
     "config key api.listen_addr: '127.0.0.1:4202' and api_listen '127.0.0.1:4201' are two names of one setting; keep one"),
    ('[channels]\nlisten_host = 5\n', "config key channels.listen_host: expected a string, got int"),
    ('[channels]\nlisten_host = " "\n', "config key channels.listen_host: must be an address such as 127.0.0.1"),
    # Tables their own packages read at start are refused by the config as the start would.
    ('[cluster]\nlease_secs = 0\n', "config key cluster.lease_secs: must be a number between 1 and 3600"),
    ('[a2a]\nagents = 5\n', "config key a2a.agents: must be an array of tables {name, url, api_key_env}"),
])
def test_wrong_types_name_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert fragment in err.value.message


def test_bad_env_listen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTD_LISTEN", "127.0.0.1:99999")
    with pytest.raises(ConfigError, match="AGENTD_LISTEN"):
        load_config(tmp_path)


def test_split_listen_ipv6() -> None:
    assert split_listen("[::1]:4200") == ("::1", 4200)


BOUNDED_INTEGERS = [("api", "threads", 1, 1024), ("api", "max_streams", 1, 1024), ("api", "malloc_arenas", 0, 64),
                    ("api", "malloc_mmap_threshold_kb", 0, 32768), ("memory", "recall_limit", 0, 50),
                    ("memory", "embed_threads", 0, 64), ("memory", "index_cache_fragments", 100, 10_000_000),
                    ("triggers", "rate_limit_per_minute", 1, 10_000), ("schedules", "failure_backoff_after", 1, 1000),
                    ("schedules", "delivery_attempts", 1, 20), ("schedules", "max_jobs_per_agent", 1, 100_000),
                    ("channels", "workers", 1, 256), ("channels", "queue_limit", 0, 10_000),
                    ("channels", "max_file_bytes", 1, 10 * 1024 * 1024), ("llm", "retries", 0, 10),
                    ("agents", "max_queue", 0, 10_000), ("agents", "cached_sessions", 1, 1_000_000)]


@pytest.mark.parametrize("section, key, low, high", BOUNDED_INTEGERS)
def test_a_bounded_integer_takes_its_ends_and_nothing_past_them(tmp_path: Path, section: str, key: str,
                                                                  low: int, high: int) -> None:
    for value in (low, high):
        write(tmp_path, f"[{section}]\n{key} = {value}\n")
        assert getattr(getattr(load_config(tmp_path), section), key) == value
    for value in (low - 1, high + 1):
        write(tmp_path, f"[{section}]\n{key} = {value}\n")
        with pytest.raises(ConfigError) as err:
            load_config(tmp_path)
        assert str(err.value).endswith(f"config.toml: config key {section}.{key}: must be between {low} and {high}")
    write(tmp_path, f"[{section}]\n{key} = true\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert str(err.value).endswith(f"config.toml: config key {section}.{key}: expected an integer, got a boolean")


def test_a_channel_file_is_never_larger_than_an_upload() -> None:
    from agentd.agents.handle import UPLOAD_LIMIT
    from agentd.config import ChannelsConfig

    assert ChannelsConfig().max_file_bytes == UPLOAD_LIMIT
