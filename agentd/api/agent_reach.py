"""A scoped key's agent list applied to what belongs to an agent (cron jobs, triggers): an
item of an agent outside the list is left out of lists and is 404 like an unknown one, and
naming such an agent in a body is refused as naming an unknown agent is."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from flask import current_app

from agentd.api.principal import principal
from agentd.errors import AgentdError, NotFound


def _may_reach(agent_ref: Any) -> bool:
    who = principal()
    if who.is_admin or not who.agents or not agent_ref or not isinstance(agent_ref, str):
        return True
    handle = current_app.extensions["agentd.kernel"].agents.find(agent_ref)
    # An agent that no longer exists reveals nothing; its items are gone or going.
    return handle is None or who.may_reach(handle)


def visible(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items whose agent the request's key may reach."""
    return [item for item in items if _may_reach(item.get("agent_id"))]


def reach(item: dict[str, Any], missing: str) -> dict[str, Any]:
    """`item`, or the 404 `missing` says for an unknown one."""
    if not _may_reach(item.get("agent_id")):
        raise NotFound(missing)
    return item


def check_body_agent(data: Any, refusal: Callable[[str], AgentdError]) -> None:
    """Refuse a body's `agent_id` outside the key's list with `refusal(ref)`: the words an
    unknown agent gets."""
    ref = data.get("agent_id") if isinstance(data, dict) else None
    if not _may_reach(ref):
        raise refusal(ref)
