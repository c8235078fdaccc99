"""The `[triggers]` table of config.toml."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentd.errors import ConfigError


@dataclass(frozen=True)
class TriggerSettings:
    # Firings per trigger per minute when the trigger sets no `rate_limit_per_minute`.
    rate_limit_per_minute: int = 6


def trigger_settings(raw: Any) -> TriggerSettings:
    table = raw.get("triggers", {}) if isinstance(raw, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError("config key triggers: must be a table")
    rate = table.get("rate_limit_per_minute", TriggerSettings.rate_limit_per_minute)
    if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= 10_000:
        raise ConfigError("config key triggers.rate_limit_per_minute: must be an integer between 1 and 10000")
    return TriggerSettings(rate_limit_per_minute=rate)
