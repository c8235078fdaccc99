"""The channel catalogue (agentd/data/channels.json) and validation of adapter config.

The data file is the source of truth and is edited by hand: the spec's 40 adapters,
the fields the API shows, and every key an adapter's `[channels.<name>]` section
accepts with its kind and default (tests/channels/test_channel_catalog.py checks its shape).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentd.channels import overrides
from agentd.env_names import ENV_NAME
from agentd.errors import BadRequest, NotFound

DATA = Path(__file__).resolve().parents[1] / "data" / "channels.json"
# List keys that act as allow-lists of senders / of chats (adapter-specific names).
USER_LISTS = ("allowed_users", "allowed_senders")
# (Teams `allowed_tenants` lists tenant ids, not chats: the teams adapter checks it.)
# Number keys that only take whole numbers (Discord's intents are a bit field).
WHOLE_NUMBERS = ("intents",)
# The longest interval a key of each unit may name.
LONGEST = (("_secs", 86400, "a day"), ("_hours", 8760, "a year"))
CHAT_LISTS = ("allowed_channels", "allowed_rooms", "allowed_guilds", "allowed_teams",
              "streams", "space_ids", "server_ids")


@dataclass
class ChannelInfo:
    """One adapter's catalogue entry."""

    name: str
    data: dict[str, Any]

    @property
    def keys(self) -> dict[str, dict[str, Any]]:
        return self.data["keys"]

    def defaults(self) -> dict[str, Any]:
        """Every key's default (None where the adapter has none)."""
        return {k: spec["default"] for k, spec in self.keys.items()}


class ChannelCatalog:
    """Lookup and validation over the 40 adapters."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = [ChannelInfo(item["name"], item) for item in items]
        self._by_name = {info.name: info for info in self.items}

    @classmethod
    def load(cls, path: Path = DATA) -> "ChannelCatalog":
        return cls(json.loads(path.read_text(encoding="utf-8")))

    def get(self, name: str) -> ChannelInfo:
        """The adapter called `name`; 404 for an unknown one."""
        info = self._by_name.get(name)
        if info is None:
            raise NotFound(f"unknown channel {name!r}")
        return info

    def names(self) -> list[str]:
        return [info.name for info in self.items]


def validate(info: ChannelInfo, body: Any) -> dict[str, Any]:
    """Check a configure body (keys at the top level) and normalise its values.

    Number keys take numbers (or numeric strings), list keys arrays or comma strings,
    `*_env` keys an environment variable NAME, `overrides` the keys agentd honours
    (agentd/channels/overrides.py). 400 names the offending key.
    """
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object of configuration keys")
    if set(body) == {"fields"} and isinstance(body["fields"], dict):
        body = body["fields"]  # the original dashboard's shape: {"fields": {...}}
    out: dict[str, Any] = {}
    for key, value in body.items():
        spec = info.keys.get(key)
        if spec is None:
            raise BadRequest(f"{key}: unknown key for channel {info.name} "
                             f"(accepted: {', '.join(sorted(info.keys))})")
        if value is None:
            continue
        out[key] = (overrides.check(value, info.name) if key == "overrides"
                    else _coerce(key, spec["kind"], overrides.check_adapter_value(info.name, key, value)))
        if key.endswith("_secs") and out[key] == 0 and spec.get("default"):
            # The adapter reads 0 as "unset" and waits its default instead.
            raise BadRequest(f"{key}: must be more than 0 (leave it out for the default, {spec['default']})")
    return out


def _coerce(key: str, kind: str, value: Any) -> Any:
    if key.endswith("_env"):
        if not isinstance(value, str) or not ENV_NAME.match(value) or len(value) > 100:
            # Never echo the value: it may be the secret itself.
            raise BadRequest(f"{key}: must be the NAME of an environment variable "
                             "(like MY_TOKEN: A-Z, 0-9, _), not the secret itself")
        return value
    if kind == "number":
        if isinstance(value, bool):
            raise BadRequest(f"{key}: must be a number")
        if isinstance(value, str):
            text = value.strip()
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)  # 1.5, 1e3
                except ValueError:
                    raise BadRequest(f"{key}: must be a number, got {text!r}") from None
                if not math.isfinite(value):
                    raise BadRequest(f"{key}: must be a number, got {text!r}")
        if not isinstance(value, (int, float)):
            raise BadRequest(f"{key}: must be a number")
        if value < 0:
            raise BadRequest(f"{key}: must not be negative")
        if key.endswith("port") and not (isinstance(value, int) and 1 <= value <= 65535):
            raise BadRequest(f"{key}: must be a port number (1-65535)")
        if key in WHOLE_NUMBERS and not isinstance(value, int):
            raise BadRequest(f"{key}: must be a whole number, got {value!r}")
        for suffix, most, what in LONGEST:
            if key.endswith(suffix) and value > most:
                # A wait past this is a mistake, and past the platform's clock it breaks the loop.
                raise BadRequest(f"{key}: must be at most {most} ({what}), got {value!r}")
        return value
    if kind == "list":
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                           for v in value):
            return [str(v) for v in value]
        raise BadRequest(f"{key}: must be an array of strings or a comma-separated string")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0", ""):
            return value.strip().lower() in ("true", "yes", "1")
        raise BadRequest(f"{key}: must be true or false")
    if kind == "table":
        if not isinstance(value, dict):
            raise BadRequest(f"{key}: must be an object")
        return value
    if not isinstance(value, str):
        raise BadRequest(f"{key}: must be a string")
    return value


def settings_for(info: ChannelInfo, section: dict[str, Any]) -> dict[str, Any]:
    """An adapter's effective settings: catalogue defaults overlaid with its section."""
    merged = info.defaults()
    merged.update(section)
    return merged


def field_views(info: ChannelInfo, section: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The spec's channel fields with `has_value` (env var set, or a saved value)."""
    out = []
    for field in info.data["fields"]:
        item = {k: field[k] for k in ("key", "label", "type", "env_var", "required",
                                      "placeholder", "advanced")}
        item["env_var"] = item["env_var"] or ""
        saved = (section or {}).get(field["key"])
        if field["type"] == "secret":
            env = saved if isinstance(saved, str) and saved else field["env_var"]
            item["env_var"] = env or ""
            item["has_value"] = bool(env and os.environ.get(env))
        else:
            item["has_value"] = saved not in (None, "", [])
            if item["has_value"]:
                item["value"] = ", ".join(saved) if isinstance(saved, list) else saved
        out.append(item)
    return out
