"""What the API shows of an agent: its key status, its summary, its list item and its detail."""

from __future__ import annotations

import os
from typing import Any

from agentd.agents.handle import AgentHandle
from agentd.agents.tools import Tool
from agentd.llm.catalog import Catalog
from agentd.timestamps import iso


def auth_status(catalog: Catalog, handle: AgentHandle) -> str:
    """`configured`, `missing` or `not_required`: whether the daemon has the agent's provider key."""
    provider = catalog.get_provider(handle.provider)
    env = handle.api_key_env or (provider.api_key_env if provider else "")
    if provider is not None and not provider.key_required and not handle.api_key_env:
        return "not_required"
    if not env:
        return "not_required"
    return "configured" if os.environ.get(env) else "missing"


def missing_key(catalog: Catalog, handle: AgentHandle) -> str | None:
    """What to do when the agent's provider needs a key the daemon lacks (None: it has one)."""
    if auth_status(catalog, handle) != "missing":
        return None
    provider = catalog.get_provider(handle.provider)
    env = handle.api_key_env or (provider.api_key_env if provider else "")
    fix = f"set {env}"
    if provider is not None and env == provider.api_key_env:
        fix += f" or POST /api/providers/{handle.provider}/key"
    return f"provider {handle.provider} has no API key: {fix}"


def summary(handle: AgentHandle) -> dict[str, Any]:
    """Short form used by /api/status."""
    return {"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
            "created_at": iso(handle.created_at), "model_provider": handle.provider,
            "model_name": handle.model, "profile": handle.manifest.profile or "custom"}


def list_item(catalog: Catalog, handle: AgentHandle, auth: str | None = None,
              tier: str | None = None) -> dict[str, Any]:
    """One item of GET /api/agents (`auth`, `tier`: already looked up by the caller)."""
    if tier is None:
        info = catalog.get_model(handle.model)
        tier = info.tier if info else "custom"
    if auth is None:
        auth = auth_status(catalog, handle)
    identity = handle.manifest.data["identity"]
    return {"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
            "created_at": iso(handle.created_at), "last_active": iso(handle.last_active),
            "model_provider": handle.provider, "model_name": handle.model,
            "model_tier": tier, "auth_status": auth,
            "ready": handle.state == "Running" and auth != "missing",
            "profile": handle.manifest.profile or "custom",
            "identity": {"emoji": identity["emoji"], "avatar_url": identity["avatar_url"],
                         "color": identity["color"]}}


def detail(catalog: Catalog, handle: AgentHandle, tools: list[Tool], caps: dict[str, Any]) -> dict[str, Any]:
    """GET /api/agents/{id}, given the agent's effective tools and capabilities."""
    data = handle.manifest.data
    item = list_item(catalog, handle)
    return {"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
            "profile": item["profile"], "created_at": item["created_at"],
            "last_active": item["last_active"], "session_id": handle.session_id,
            "model": {"provider": handle.provider, "model": handle.model},
            "capabilities": {"tools": [t.name for t in tools], "network": bool(caps["network"])},
            "description": data["description"], "tags": data["tags"],
            "identity": item["identity"], "skills": data["skills"],
            "skills_mode": "allowlist" if data["skills"] else "all",
            "mcp_servers": data["mcp_servers"],
            "mcp_servers_mode": "allowlist" if data["mcp_servers"] else "all",
            "fallback_models": data["fallback_models"],
            "system_prompt": data["model"]["system_prompt"]}
