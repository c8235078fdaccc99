"""A channel's `overrides` table: what each key means, its check at configure time, and
the per-message decisions the runtime takes from it.

Honoured: `model`, `system_prompt`, `dm_policy`, `group_policy`, `rate_limit_per_user`,
`threading`, `output_format` (read by the adapter's sender), `usage_footer`, `prefix_agent_name`,
`typing_mode` and `lifecycle_reactions` (the last two on adapters whose platform has typing /
reactions: agentd/channels/lifecycle.py). Keys agentd does not implement are refused (400
naming the key) rather than saved and ignored.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Any

from agentd.channels import lifecycle
from agentd.channels.conversation import ADDRESSED_ONLY, MENTION_ADAPTERS, THREAD_ADAPTERS
from agentd.channels.format import ALIASES, OUTPUT_FORMATS
from agentd.errors import BadRequest
from agentd.money import format_usd

POLICIES = ("respond", "mention-only", "ignore")
# `shared`: the group answers like `respond`, with one session for all its senders.
GROUP_POLICIES = ("respond", "mention-only", "shared", "ignore")
# The group policies that answer group messages not addressed to the bot.
UNADDRESSED = ("respond", "shared")
FOOTERS = ("off", "tokens", "cost", "full")
# Override keys agentd has no behaviour for: refused rather than saved and ignored.
NOT_IMPLEMENTED: tuple[str, ...] = ()
SLACK_MODES = ("socket", "events")
SLOW_DOWN = ("You are sending messages faster than this channel allows "
             "({limit} per minute). Please wait a moment and try again.")


def check(value: Any, channel: str = "") -> dict[str, Any]:
    """The `overrides` table of `channel`'s adapter, checked key by key (400 naming the first
    bad key; `mention-only` and `threading` only where the adapter can honour them)."""
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
            allowed = GROUP_POLICIES if key == "group_policy" else POLICIES
            if item not in allowed:
                raise BadRequest(f"{name}: must be one of {', '.join(allowed)}")
            if item == "mention-only" and channel and channel not in MENTION_ADAPTERS:
                raise BadRequest(f"{name}: mention-only is not supported by the {channel} adapter "
                                 "(it cannot tell whether the bot was mentioned); use respond or ignore")
            if key == "group_policy" and item in UNADDRESSED and channel in ADDRESSED_ONLY:
                raise BadRequest(f"{name}: {item} is not supported by the {channel} adapter (the platform "
                                 "hands the bot only the group messages that mention or reply to it); "
                                 "leave it unset or use ignore")
            out[key] = item
        elif key == "threading":
            if not isinstance(item, bool):
                raise BadRequest(f"{name}: must be true (answer in a thread) or false (in the channel)")
            if channel and channel not in THREAD_ADAPTERS:
                raise BadRequest(f"{name}: not supported by the {channel} adapter (threaded replies: "
                                 f"{', '.join(sorted(THREAD_ADAPTERS))})")
            out[key] = item
        elif key == "rate_limit_per_user":
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise BadRequest(f"{name}: must be a whole number of messages per minute (0: no limit)")
            out[key] = item
        elif key == "output_format":
            if item not in OUTPUT_FORMATS:
                raise BadRequest(f"{name}: must be one of {', '.join(OUTPUT_FORMATS)}")
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
                             "group_policy, rate_limit_per_user, threading, output_format, usage_footer, "
                             "typing_mode, lifecycle_reactions, prefix_agent_name)")
    return out


def choices_for(channel: str) -> dict[str, tuple[str, ...] | str]:
    """The overrides `channel`'s adapter honours, in the table's order, each with its
    choices ("text" and "number" for free values): what a form may offer."""
    mention = channel in MENTION_ADAPTERS
    out: dict[str, tuple[str, ...] | str] = {
        "model": "text", "system_prompt": "text",
        "dm_policy": tuple(p for p in POLICIES if mention or p != "mention-only"),
        "group_policy": tuple(p for p in GROUP_POLICIES if (mention or p != "mention-only")
                              and (channel not in ADDRESSED_ONLY or p not in UNADDRESSED)),
        "rate_limit_per_user": "number"}
    if channel in THREAD_ADAPTERS:
        out["threading"] = ("true", "false")
    out["output_format"] = tuple(f for f in OUTPUT_FORMATS if f not in ALIASES)
    out["usage_footer"] = FOOTERS
    if channel in lifecycle.TYPING:
        out["typing_mode"] = lifecycle.TYPING_MODES
    if channel in lifecycle.REACTIONS:
        out["lifecycle_reactions"] = ("true", "false")
    out["prefix_agent_name"] = ("true", "false")
    return out


def check_adapter_value(channel: str, key: str, value: Any) -> Any:
    """The adapter keys about threads, checked (400 naming the key) and normalised."""
    if (channel, key) == ("discord", "auto_thread"):
        text = str(value).strip().lower()
        if text not in ("true", "false"):
            raise BadRequest("auto_thread: must be true (answer each guild message in a new thread) or false")
        return text
    if (channel, key) == ("slack", "mode"):
        if value not in SLACK_MODES:
            raise BadRequest('mode: must be "socket" (Socket Mode, no public URL) or "events" '
                             "(the Events API at the daemon's /channels/slack/webhook)")
        return value
    if (channel, key) == ("telegram", "thread_routes"):
        if not isinstance(value, dict):
            raise BadRequest("thread_routes: must be an object of forum topic id -> agent name")
        routes = {}
        for topic, agent in value.items():
            if not str(topic).lstrip("-").isdigit() or not isinstance(agent, str) or not agent.strip():
                raise BadRequest("thread_routes: must map forum topic ids (message_thread_id) to agent names, "
                                 f"got {str(topic)[:40]!r}")
            routes[str(int(topic))] = agent.strip()
        return routes
    return value


def policy_refusal(overrides: dict[str, Any], direct: bool, mentioned: bool = False) -> str:
    """Why a message is not answered under the channel's dm/group policy ("" : answer)."""
    key = "dm_policy" if direct else "group_policy"
    policy = overrides.get(key)
    if policy == "ignore":
        return f"{key} is ignore"
    if policy == "mention-only" and not mentioned:
        return f"{key} is mention-only and the bot was not mentioned"
    return ""


def footer(mode: str, input_tokens: int, output_tokens: int, cost_usd: float | None) -> str:
    """The usage line appended to a reply ("" for off)."""
    parts = []
    if mode in ("tokens", "full"):
        parts.append(f"{input_tokens} in / {output_tokens} out tokens")
    if mode in ("cost", "full"):
        parts.append(format_usd(cost_usd) if cost_usd is not None else "cost unknown")
    return " · ".join(parts)


# Calls between two sweeps of the senders table.
SWEEP_EVERY = 1024


class SenderLimits:
    """Messages per sender per rolling minute, per channel."""

    def __init__(self, window: float = 60.0) -> None:
        self.window = window
        self._seen: dict[tuple[str, str], deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._calls = 0

    def allow(self, channel: str, sender: str, limit: int) -> bool:
        """Count one message of `sender`; False when it is over `limit` in the window."""
        if not limit:
            return True
        now = time.monotonic()
        with self._lock:
            self._calls += 1
            if self._calls % SWEEP_EVERY == 0:
                # Senders quiet for a window are forgotten: the table holds only recent ones.
                for key in [k for k, times in self._seen.items() if not times or now - times[-1] >= self.window]:
                    del self._seen[key]
            seen = self._seen[(channel, sender)]
            while seen and now - seen[0] >= self.window:
                seen.popleft()
            if len(seen) >= limit:
                return False
            seen.append(now)
            return True
