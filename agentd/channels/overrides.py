"""A channel's `overrides` table: what each key means, its check at configure time, and
the per-message decisions the runtime takes from it.

Honoured: `model`, `system_prompt`, `dm_policy`, `group_policy`, `rate_limit_per_user`,
`usage_footer`, `prefix_agent_name`, `typing_mode` and `lifecycle_reactions` (the last two
on adapters whose platform has typing / reactions: agentd/channels/lifecycle.py). Keys
agentd does not implement are refused (400 naming the key) rather than saved and ignored;
so are a few adapter-specific keys.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Any

from agentd.channels import lifecycle
from agentd.errors import BadRequest

POLICIES = ("respond", "ignore")
FOOTERS = ("off", "tokens", "cost", "full")
NOT_IMPLEMENTED = ("threading", "output_format")
# Adapter keys of the catalogue that no adapter reads yet: refused, never saved.
ADAPTER_KEYS_NOT_IMPLEMENTED = {
    "telegram": ("thread_routes",),
    "discord": ("auto_thread",),
    "slack": ("thread_ttl_hours",),
    "matrix": ("refresh_token_env",),
}
SLOW_DOWN = ("You are sending messages faster than this channel allows "
             "({limit} per minute). Please wait a moment and try again.")


def check(value: Any, channel: str = "") -> dict[str, Any]:
    """The `overrides` table of adapter `channel`, checked key by key (400 naming the first
    bad key)."""
    if not isinstance(value, dict):
        raise BadRequest("overrides: must be an object")
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"overrides.{key}"
        if key in NOT_IMPLEMENTED:
            raise BadRequest(f"{name}: not implemented by agentd; remove it (it would be saved and ignored)")
        if item is None:
            continue
        if key in ("model", "system_prompt"):
            if not isinstance(item, str) or not item.strip():
                raise BadRequest(f"{name}: must be a non-empty string")
            out[key] = item.strip() if key == "model" else item
        elif key in ("dm_policy", "group_policy"):
            if item == "mention-only":
                raise BadRequest(f"{name}: mention-only is not implemented; use respond or ignore")
            if item not in POLICIES:
                raise BadRequest(f"{name}: must be one of {', '.join(POLICIES)}")
            out[key] = item
        elif key == "rate_limit_per_user":
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise BadRequest(f"{name}: must be a whole number of messages per minute (0: no limit)")
            out[key] = item
        elif key == "usage_footer":
            if item not in FOOTERS:
                raise BadRequest(f"{name}: must be one of {', '.join(FOOTERS)}")
            out[key] = item
        elif key == "typing_mode":
            out[key] = lifecycle.check_typing_mode(channel, item)
        elif key == "lifecycle_reactions":
            out[key] = lifecycle.check_reactions(channel, item)
        elif key == "prefix_agent_name":
            if not isinstance(item, bool):
                raise BadRequest(f"{name}: must be true or false")
            out[key] = item
        else:
            raise BadRequest(f"{name}: unknown override (accepted: model, system_prompt, dm_policy, "
                             "group_policy, rate_limit_per_user, usage_footer, typing_mode, lifecycle_reactions, "
                             "prefix_agent_name)")
    return out


def check_adapter_key(channel: str, key: str) -> None:
    """400 for an adapter key of the catalogue that agentd does not implement."""
    if key in ADAPTER_KEYS_NOT_IMPLEMENTED.get(channel, ()):
        raise BadRequest(f"{key}: not implemented by the {channel} adapter; remove it "
                         "(it would be saved and ignored)")


def policy_refusal(overrides: dict[str, Any], direct: bool) -> str:
    """Why a message is not answered under the channel's dm/group policy ("" : answer)."""
    key = "dm_policy" if direct else "group_policy"
    return f"{key} is ignore" if overrides.get(key) == "ignore" else ""


def footer(mode: str, input_tokens: int, output_tokens: int, cost_usd: float | None) -> str:
    """The usage line appended to a reply ("" for off)."""
    parts = []
    if mode in ("tokens", "full"):
        parts.append(f"{input_tokens} in / {output_tokens} out tokens")
    if mode in ("cost", "full"):
        parts.append(f"${cost_usd:.4f}" if cost_usd is not None else "cost unknown")
    return " · ".join(parts)


class SenderLimits:
    """Messages per sender per rolling minute, per channel."""

    def __init__(self, window: float = 60.0) -> None:
        self.window = window
        self._seen: dict[tuple[str, str], deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def allow(self, channel: str, sender: str, limit: int) -> bool:
        """Count one message of `sender`; False when it is over `limit` in the window."""
        if not limit:
            return True
        now = time.monotonic()
        with self._lock:
            seen = self._seen[(channel, sender)]
            while seen and now - seen[0] >= self.window:
                seen.popleft()
            if len(seen) >= limit:
                return False
            seen.append(now)
            return True
