"""A scoped key's agent list applied to channels: a channel answers as agents (its
`default_agent`, thread routes, else the daemon's first agent), and a key limited to some
agents reaches only the channels that answer as its own."""

from __future__ import annotations

from typing import Any

from flask import current_app

from agentd.api.principal import principal, reach_agent
from agentd.errors import BadRequest, NotFound


def kernel() -> Any:
    return current_app.extensions["agentd.kernel"]


def hide_unreached(fields: list[dict[str, Any]]) -> None:
    """A key limited to some agents does not see the name of another agent a channel answers as."""
    who = principal()
    if not who.agents:
        return
    reached = {ref for h in who.visible(kernel().agents.handles()) for ref in (h.id, h.name)}
    for field in fields:
        if field["key"] == "default_agent" and field.get("value") and field["value"] not in reached:
            field["value"] = ""
            field["has_value"] = False


def hide_unreached_item(item: dict[str, Any]) -> None:
    """`hide_unreached` for a channel list item, and its start `error` for a key that does
    not reach the channel (it may name another agent)."""
    hide_unreached(item["fields"])
    if "error" in item and not reaches_channel(item["name"]):
        del item["error"]


def reach_channel(name: str, new: Any = None) -> None:
    """A key limited to some agents configures, removes and tests only a channel whose
    messages go to its agents (404 `agent not found` otherwise, as for the agents
    themselves), and names one of them as the `default_agent` of a `new` configuration
    (an agent that does not exist is as refused): without one the channel would answer as
    the daemon's first agent, whoever that is."""
    channels = kernel().channels
    channels.catalog.get(name)  # an unknown channel is 404 whoever asks
    who = principal()
    if not who.agents:
        return
    for ref in channels.agents_named(name):
        if ref:
            reach_agent(ref)
        else:
            first = kernel().agents.handles()[:1]
            if first:
                who.reach(first[0])
    if new is None:
        return
    for ref in channels.agents_named(name, new):
        if not ref:
            raise BadRequest("default_agent: a key limited to some agents must name one of its agents")
        if kernel().agents.find(ref) is None:
            # Not yet one of its agents; refused as one outside its list is, so the answer
            # tells no agent that exists from one that does not.
            raise NotFound("agent not found")
        reach_agent(ref)


def reaches_channel(name: str) -> bool:
    """Whether the request's key reaches every agent channel `name` answers as (what
    reach_channel checks, asked without auditing a refusal)."""
    who = principal()
    return not who.agents or all(h is None or who.may_reach(h) for h in kernel().channel_agents(name) or [])
