"""Config parsing, validation messages and environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.config import DEFAULT_CONFIG_TEXT, load_config, split_listen, unknown_keys, write_default_config
from agentd.errors import ConfigError


def write(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)
    return home


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AGENTD_LISTEN", "AGENTD_API_KEY", "AGENTD_HOME"):
        monkeypatch.delenv(key, raising=False)


def test_defaults_without_a_file(tmp_path: Path) -> None:
    cfg = load_config(tmp_path)
    assert cfg.api_listen == "127.0.0.1:4200"
    assert cfg.api.rate_limit_per_second == 30
    assert cfg.api.threads >= 32
    assert cfg.api_key == ""
    assert cfg.log_level == "info"
    assert (cfg.log_format, cfg.metrics.enabled, cfg.metrics.agent_labels) == ("text", True, False)


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
    assert "line 2" in err.value.message and "config.toml" in err.value.message


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
                    ("channels", "max_file_bytes", 1, 10 * 1024 * 1024)]


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
