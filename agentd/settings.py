"""The effective configuration (secrets masked), its hot reload, and `[default_model]` writes.

`effective()` is what the dashboard's settings page shows. `reload()` reads config.toml
again and applies what can change without a restart: the default model, provider URLs,
model-call limits, the log level, channels, MCP servers and skills (the listen address,
the database and the API key need a restart). `set_default_model()` rewrites only the
`[default_model]` table of config.toml (tomlkit keeps the rest of the file as written).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable

from agentd.channels.tomledit import edit_file
from agentd.config import Config, ConfigError, load_config
from agentd.errors import BadRequest
from agentd.llm.catalog import Catalog

log = logging.getLogger("agentd.settings")

MASK = "••••••"
# Key names whose values are secrets; `*_env` keys name a variable, which is not one.
SECRET_KEY = re.compile(r"(api_key|token|secret|password|passwd|credential)s?$", re.IGNORECASE)
# Read once at start only; a reload leaves them as they are (the page says so).
RESTART_ONLY = ("api", "api_key", "database", "database_url", "log_format", "network_enabled")


def mask(value: Any, key: str = "") -> Any:
    """`value` with every secret replaced by MASK (nested tables and lists too)."""
    if isinstance(value, dict):
        return {k: mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask(v, key) for v in value]
    if key and not key.lower().endswith("_env") and SECRET_KEY.search(key) and value not in ("", None):
        return MASK
    if isinstance(value, str) and "://" in value and "@" in value.split("://", 1)[1].split("/", 1)[0]:
        from agentd.store.backend import mask_url

        return mask_url(value)
    return value


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) rows of nested tables; lists stay values."""
    if isinstance(value, dict) and value:
        rows: list[tuple[str, Any]] = []
        for key in value:
            rows.extend(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return rows
    return [(prefix, value)]


class Settings:
    """The configuration as the daemon uses it (`kernel.settings`)."""

    def __init__(self, config: Config, catalog: Catalog, audit: Callable[..., None],
                 reloaders: dict[str, Callable[[], Any]]) -> None:
        self.config = config
        self.catalog = catalog
        self.audit = audit
        # What a reload re-applies beyond the config object: channels, MCP servers, skills.
        self.reloaders = reloaders

    def effective(self) -> list[tuple[str, Any]]:
        """Every setting with its value in effect (defaults included), secrets masked."""
        cfg = self.config
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cfg):
            if f.name in ("raw", "database", "mcp_servers", "home"):
                continue
            values[f.name] = _plain(getattr(cfg, f.name))
        values["home"] = str(cfg.home)
        values["database"] = cfg.database.masked if cfg.database is not None else f"sqlite:{cfg.db_path}"
        values["mcp_servers"] = [_plain(s) for s in cfg.mcp_servers]
        for key, value in cfg.raw.items():  # what the typed config does not hold (channels' adapters, ...)
            typed = values.setdefault(key, value)
            if isinstance(typed, dict) and isinstance(value, dict) and typed is not value:
                values[key] = {**value, **typed}
        return flatten(mask(values))

    def reload(self) -> dict[str, Any]:
        """Read config.toml again and apply what can change live; BadRequest if it cannot be read."""
        try:
            fresh = load_config(self.config.home)
        except ConfigError as exc:
            raise BadRequest(f"cannot reload: {exc.message}") from None
        cfg = self.config
        for name in ("default_model", "provider_urls", "llm", "log_level", "raw"):
            setattr(cfg, name, getattr(fresh, name))
        logging.getLogger().setLevel(getattr(logging, cfg.log_level.upper(), logging.INFO))
        applied = ["default_model", "provider_urls", "llm", "log_level"]
        failed: list[str] = []
        for name, reload in self.reloaders.items():
            try:
                reload()
                applied.append(name)
            except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others
                log.warning("config reload: %s not applied: %s", name, getattr(exc, "message", exc))
                failed.append(name)
        self.audit("config.reload", "agentd", {"applied": applied, "failed": failed})
        return {"status": "reloaded", "applied": applied, "failed": failed}

    def set_default_model(self, provider: str, model: str) -> dict[str, str]:
        """Write `[default_model]` (provider, model, its key variable) and use it from now on."""
        info = self.catalog.get_provider(provider)
        if info is None:
            raise BadRequest(f"unknown provider {provider!r}")
        model = (model or "").strip()
        if not model or len(model) > 200 or any(c.isspace() for c in model):
            raise BadRequest("model must be a model name without spaces")
        values = {"provider": info.id, "model": model}
        if info.api_key_env:
            values["api_key_env"] = info.api_key_env
        edit_file(self.config.config_path, ["default_model"], values)
        current = self.config.default_model
        self.config.default_model = dataclasses.replace(current, provider=info.id, model=model,
                                                        api_key_env=info.api_key_env, base_url="")
        log.info("default model set to %s/%s", info.id, model)
        self.audit("config.default_model", "agentd", {"provider": info.id, "model": model})
        return {"status": "updated", "provider": info.id, "model": model}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
