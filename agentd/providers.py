"""Providers at runtime: keys (environment + mode-0600 secrets.env), base URLs and live tests.

Keys never touch config.toml or the database. `secrets.env` holds `NAME=value`
lines; it is loaded at start without overriding variables already set.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.config import Config
from agentd.errors import AgentdError, BadRequest, ConfigError, NotFound
from agentd.http_urls import usable_http_url
from agentd.llm.catalog import Catalog, ProviderInfo

if TYPE_CHECKING:  # `agentd doctor` reads secrets.env through this module without the agents
    from agentd.agents.manager import AgentManager

log = logging.getLogger("agentd.providers")

TEST_TIMEOUT = 5.0


class ProviderTestFailed(AgentdError):
    status = 502


def read_secrets(path: Path) -> dict[str, str]:
    """Parse secrets.env (`NAME=value`, `#` comments); missing file = empty, one that is not
    UTF-8 a ConfigError naming it."""
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return values
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return values


def load_secrets(path: Path) -> int:
    """Put secrets.env into the environment without overriding what is already set."""
    loaded = 0
    for name, value in read_secrets(path).items():
        if name not in os.environ:
            os.environ[name] = value
            loaded += 1
    return loaded


def write_secrets(path: Path, values: dict[str, str]) -> None:
    """Rewrite secrets.env atomically with mode 0600."""
    tmp = path.with_suffix(".env.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("# Provider keys and channel secrets set through agentd. Keep this file private (mode 0600).\n")
        for name in sorted(values):
            fh.write(f"{name}={values[name]}\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def validate_url(url: Any) -> str:
    """An http(s) URL with a host, without a trailing slash."""
    if not isinstance(url, str) or not url.strip():
        raise BadRequest("base_url must be a non-empty string")
    # What requests cannot send to would fail every later call to this provider.
    if not usable_http_url(url.strip()):
        raise BadRequest(f"base_url must be an http:// or https:// URL with a host, got {url!r}")
    return url.strip().rstrip("/")


class ProviderKeys:
    """Provider listing, keys, URLs and connectivity tests."""

    def __init__(self, config: Config, catalog: Catalog, agents: AgentManager) -> None:
        self.config = config
        self.catalog = catalog
        self.agents = agents
        self._lock = threading.Lock()
        stored = agents.store.get_setting("provider_urls", {}) or {}
        agents.url_overrides.update(stored)

    def get(self, name: str) -> ProviderInfo:
        info = self.catalog.get_provider(name)
        if info is None:
            raise NotFound(f"provider not found: {name}")
        return info

    def base_url(self, info: ProviderInfo) -> str:
        return (self.agents.url_overrides.get(info.id) or self.config.provider_urls.get(info.id)
                or info.base_url)

    def auth_status(self, info: ProviderInfo) -> str:
        if not info.key_required and not info.api_key_env:
            return "not_required"
        if info.api_key_env and os.environ.get(info.api_key_env):
            return "configured"
        return "missing" if info.key_required else "not_required"

    def listing(self) -> list[dict[str, Any]]:
        """GET /api/providers."""
        return [{"id": p.id, "display_name": p.display_name, "api_key_env": p.api_key_env,
                 "base_url": self.base_url(p), "key_required": p.key_required,
                 "auth_status": self.auth_status(p), "model_count": self.catalog.model_count(p.id)}
                for p in self.catalog.providers()]

    def set_key(self, name: str, key: Any) -> dict[str, Any]:
        info = self.get(name)
        if not info.api_key_env:
            raise BadRequest(f"provider {name} runs locally and takes no API key")
        if not isinstance(key, str) or not key.strip():
            raise BadRequest("api_key must be a non-empty string")
        if any(c in key for c in "\r\n\0") or len(key) > 4096:
            raise BadRequest("api_key must be a single line of at most 4096 characters")
        key = key.strip()
        if not (key.isascii() and key.isprintable()):
            # Keys travel in HTTP headers, which carry Latin-1 at most; no provider issues others.
            raise BadRequest("api_key must be printable ASCII (it is sent in an HTTP header)")
        self.store_secrets({info.api_key_env: key})
        log.info("API key for %s stored in %s (%s)", name, self.config.secrets_path.name, info.api_key_env)
        return {"status": "configured", "provider": name, "env_var": info.api_key_env}

    def store_secrets(self, values: dict[str, str]) -> None:
        """Put `NAME=value` pairs into `secrets.env` (mode 0600) and the daemon's environment:
        provider keys, and channel secrets saved by POST /api/channels/{name}/configure."""
        with self._lock:
            secrets = read_secrets(self.config.secrets_path)
            secrets.update(values)
            self.config.home.mkdir(parents=True, exist_ok=True)
            write_secrets(self.config.secrets_path, secrets)
            os.environ.update(values)

    def delete_key(self, name: str) -> dict[str, Any]:
        info = self.get(name)
        if not info.api_key_env:
            raise BadRequest(f"provider {name} runs locally and takes no API key")
        with self._lock:
            secrets = read_secrets(self.config.secrets_path)
            if secrets.pop(info.api_key_env, None) is not None:
                write_secrets(self.config.secrets_path, secrets)
            os.environ.pop(info.api_key_env, None)
        return {"status": "removed", "provider": name}

    def set_url(self, name: str, url: Any) -> dict[str, Any]:
        info = self.get(name)
        url = validate_url(url)
        with self._lock:
            self.agents.url_overrides[info.id] = url
            self.agents.store.set_setting("provider_urls", dict(self.agents.url_overrides))
        return {"status": "updated", "provider": name, "base_url": url}

    def follow_urls(self) -> None:
        """Take over the URL overrides another daemon on a shared database set (see
        agentd/cluster/settings_follow.py); read under the lock `set_url` writes under, so a
        stale read cannot undo a URL set here a moment ago."""
        with self._lock:
            urls = self.agents.store.get_setting("provider_urls", {}) or {}
            overrides = self.agents.url_overrides
            # Replace in place: the model layer holds this very dict.
            for name in [n for n in overrides if n not in urls]:
                del overrides[name]
            overrides.update(urls)

    def test(self, name: str) -> dict[str, Any]:
        """A real, minimal call: list the provider's models with a short timeout."""
        info = self.get(name)
        key = os.environ.get(info.api_key_env, "") if info.api_key_env else ""
        if info.key_required and not key:
            raise BadRequest(f"no API key for {name}: set {info.api_key_env} or POST /api/providers/{name}/key")
        base = self.base_url(info)
        headers: dict[str, str] = {}
        params: dict[str, str] = {}
        if info.kind == "anthropic":
            url = f"{base}/v1/models"
            headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        elif info.kind == "gemini":
            url = f"{base}/v1beta/models"
            headers = {"x-goog-api-key": key}
        else:
            url = f"{base}/models"
            if key:
                headers = {"Authorization": f"Bearer {key}"}
        import requests

        started = time.perf_counter()
        try:
            response = requests.get(url, headers=headers, params=params, timeout=TEST_TIMEOUT)
        except requests.Timeout:
            raise ProviderTestFailed(f"{name}: no answer from {base} within {TEST_TIMEOUT:g}s",
                                     status=504) from None
        except requests.RequestException as exc:
            raise ProviderTestFailed(f"{name}: cannot reach {base}: {type(exc).__name__}") from None
        elapsed = int((time.perf_counter() - started) * 1000)
        if response.status_code in (401, 403):
            raise ProviderTestFailed(f"{name}: the provider rejected the API key (HTTP {response.status_code})")
        if response.status_code >= 400:
            raise ProviderTestFailed(f"{name}: the provider answered HTTP {response.status_code}")
        return {"status": "success", "provider": name, "response_time_ms": elapsed}
