"""Agent cards: the daemon's (one skill per agent) and each agent's own.

A card carries both the single-interface fields older clients read (`url`,
`protocolVersion`, `preferredTransport`) and the A2A 1.0 `supportedInterfaces` list,
all naming the same JSON-RPC endpoint, and its security in both generations' shapes.
"""

from __future__ import annotations

from typing import Any

from agentd import __version__

PROTOCOL_VERSION = "1.0"
TRANSPORT = "JSONRPC"
MODES = ["text/plain"]
CARD_PATH = "/.well-known/agent-card.json"
LEGACY_CARD_PATH = "/.well-known/agent.json"


def agent_path(name: str) -> str:
    """The JSON-RPC endpoint of one agent (its card is under it, at CARD_PATH)."""
    return f"/a2a/agents/{name}"


def _skill_of(handle: Any) -> dict[str, Any]:
    data = handle.manifest.data
    return {"id": handle.name, "name": handle.name,
            "description": data.get("description") or f"The agentd agent {handle.name}",
            "tags": list(data.get("tags") or []), "inputModes": MODES, "outputModes": MODES}


def _card(name: str, description: str, endpoint: str, skills: list[dict[str, Any]], keyed: bool,
          base: str) -> dict[str, Any]:
    card: dict[str, Any] = {
        "name": name,
        "description": description,
        "url": endpoint,
        "version": __version__,
        "protocolVersion": PROTOCOL_VERSION,
        "preferredTransport": TRANSPORT,
        "supportedInterfaces": [{"url": endpoint, "protocolBinding": TRANSPORT,
                                 "protocolVersion": PROTOCOL_VERSION}],
        "provider": {"organization": "agentd", "url": base},
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": MODES,
        "defaultOutputModes": MODES,
        "skills": skills,
    }
    if keyed:
        # One scheme in both generations' shapes, as a2a-sdk's own server writes it: 0.3 reads
        # `type` and `scheme` and `security`, 1.0 the `httpAuthSecurityScheme` member and
        # `securityRequirements`; each ignores the other's fields.
        described = {"description": "The daemon's API key"}
        card["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer", **described,
                                              "httpAuthSecurityScheme": {"scheme": "Bearer", **described}}}
        card["security"] = [{"bearer": []}]
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    return card


def daemon_card(base: str, handles: list[Any], keyed: bool) -> dict[str, Any]:
    """The daemon's card: its endpoint takes `metadata.agent` to pick the agent."""
    return _card("agentd", "agentd hosts these agents; name one in the message's metadata.agent "
                 "or use its own endpoint (its card: /a2a/agents/<name>/.well-known/agent-card.json).",
                 f"{base}/a2a", [_skill_of(h) for h in handles], keyed, base)


def agent_card(base: str, handle: Any, keyed: bool) -> dict[str, Any]:
    data = handle.manifest.data
    return _card(handle.name, data.get("description") or f"The agentd agent {handle.name}",
                 f"{base}{agent_path(handle.name)}", [_skill_of(handle)], keyed, base)
