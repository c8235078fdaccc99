"""The JSON text of GET /api/agents, kept per agent between listings.

With 1,000 agents, building and encoding every item again cost most of a listing; an
item only changes when something it shows changes (state, mode, last activity, key
status, model, manifest), so each agent keeps its item's text with what it showed,
and a listing joins the texts, encoding only the items that changed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentd.agents.handle import AgentHandle
    from agentd.agents.registry import AgentRegistry


def list_json(registry: AgentRegistry, handles: list[AgentHandle]) -> str:
    """`json.dumps([registry.list_item(h) for h in handles])` as the API sends it (compact,
    ASCII), with each unchanged item's text reused."""
    auth_of: dict[tuple[str, str], str] = {}  # the key status depends on provider and key name only
    parts = []
    for handle in handles:
        which = (handle.provider, handle.api_key_env)
        auth = auth_of.get(which)
        if auth is None:
            auth = auth_of[which] = registry.auth_status(handle)
        # (The model tier is not in `shown`: it follows from the model id, which is; custom
        # models never take a built-in id and always have the tier "custom".)
        shown = (handle.state, handle.mode, handle.last_active, auth, handle.provider, handle.model, handle.name)
        cached = handle.list_json
        if cached is None or cached[0] is not handle.manifest or cached[1] != shown:
            item = registry.list_item(handle, auth=auth)
            cached = handle.list_json = (handle.manifest, shown, json.dumps(item, separators=(",", ":")))
        parts.append(cached[2])
    return f"[{','.join(parts)}]"
