"""a2a_discover and a2a_send: other A2A agents, reached under web_fetch's address rules
(private and loopback hosts only when listed in [tools] fetch_allow_hosts, and the agent's
network grant)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.agents.tools.web import check_url, guarded_session

_CONTEXTS = uuid.UUID("6f1c6d52-4b53-4c53-9a1e-2b0a2a000002")


def _client(ctx: ToolContext) -> Any:
    if ctx.a2a is None:
        raise ToolError("A2A is not available here")
    return ctx.a2a


@tool("a2a_discover", "Discover an external A2A agent by fetching its agent card from a URL. Returns the "
      "agent's name, description, skills, and supported protocols.",
      {"url": {"type": "string", "description": "Base URL of the remote A2A agent (or its agent card URL)"}},
      ("url",), read_only=True, capability="network")
def a2a_discover(ctx: ToolContext, args: dict[str, Any]) -> str:
    from agentd.a2a.client import A2AClientError, summary
    import requests

    client = _client(ctx)
    with guarded_session(ctx.tools_config.fetch_allow_hosts) as session:
        try:
            card, card_url = client.fetch_card(args["url"], session.get, lambda u: check_url(ctx, u))
        except A2AClientError as exc:
            raise ToolError(str(exc)) from None
        except requests.RequestException as exc:
            raise ToolError(f"fetching the agent card failed: {type(exc).__name__}") from None
    return json.dumps(summary(card, card_url))


@tool("a2a_send", "Send a task/message to an external A2A agent and get the response. Use agent_name to "
      "send to a previously discovered (or configured) agent, or agent_url for direct addressing.",
      {"message": {"type": "string", "description": "The task/message to send to the remote agent"},
       "agent_url": {"type": "string", "description": "Direct URL of the remote agent's A2A endpoint"},
       "agent_name": {"type": "string", "description": "Name of a previously discovered A2A agent"},
       "session_id": {"type": "string", "description": "Optional session ID for multi-turn conversations"}},
      ("message",), capability="network")
def a2a_send(ctx: ToolContext, args: dict[str, Any]) -> str:
    from agentd.a2a.client import A2AClientError
    import requests

    client = _client(ctx)
    if bool(args.get("agent_url")) == bool(args.get("agent_name")):
        raise ToolError("give exactly one of agent_url and agent_name")
    with guarded_session(ctx.tools_config.fetch_allow_hosts) as session:
        try:
            url = args.get("agent_url") or client.resolve(args["agent_name"])

            def check(u: str) -> None:
                check_url(ctx, u)

            endpoint, version = client.endpoint(url, session.get, check)
            # Without a session id, one conversation per (agent, remote endpoint) continues.
            context = args.get("session_id") or str(uuid.uuid5(_CONTEXTS, f"{ctx.agent_id}:{endpoint}"))
            return client.send(endpoint, args["message"], context, session.post, check, version)
        except A2AClientError as exc:
            raise ToolError(str(exc)) from None
        except requests.RequestException as exc:
            raise ToolError(f"sending to the A2A agent failed: {type(exc).__name__}") from None
