"""What a tool is, what it may touch, and the registry of built-in tools."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from agentd.config import ToolsConfig


class ToolError(Exception):
    """A tool failed in a way the model should hear about ("error: <message>")."""


class AgentOps(Protocol):
    """What tools may do to other agents and to memory (implemented by the agent manager)."""

    def list_agents(self) -> list[dict[str, Any]]: ...
    def find_agents(self, query: str) -> list[dict[str, Any]]: ...
    def send_to_agent(self, caller_id: str, target: str, message: str) -> str: ...
    def spawn_agent(self, caller_id: str, manifest_toml: str) -> dict[str, Any]: ...
    def kill_agent(self, caller_id: str, target: str) -> None: ...
    def kv_get(self, agent_id: str, key: str) -> tuple[bool, Any]: ...
    def kv_set(self, agent_id: str, key: str, value: Any) -> None: ...
    def memory_service(self) -> Any: ...


@dataclass
class ToolContext:
    """Everything one tool call may use, for one agent.

    `capabilities` holds the manifest's grants: `shell` (allowed program names, "*" = any),
    `network` (allowed hosts, "*" = any), `agent_spawn`, and `read_only_mode` in Observe mode.
    """

    agent_id: str
    workspace: Path
    capabilities: dict[str, Any]
    tools_config: ToolsConfig
    ops: AgentOps | None = None
    cancel: threading.Event | None = None
    # Kernel services some tools use, by name ("cron": agentd/schedules/jobs.py CronJobs).
    services: dict[str, Any] = field(default_factory=dict)

    def require_ops(self) -> AgentOps:
        if self.ops is None:
            raise ToolError("agent operations are not available here")
        return self.ops

    def service(self, name: str) -> Any:
        found = self.services.get(name)
        if found is None:
            raise ToolError(f"{name} is not available here")
        return found


@dataclass(frozen=True)
class Tool:
    """A built-in tool: schema for the model, gate, and implementation."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[ToolContext, dict[str, Any]], str]
    read_only: bool = False
    capability: str | None = None  # shell | network | agent_spawn


REGISTRY: dict[str, Tool] = {}


def tool(name: str, description: str, properties: dict[str, Any], required: tuple[str, ...] = (),
         read_only: bool = False, capability: str | None = None) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register the decorated function as a tool with an object schema."""
    schema = {"type": "object", "properties": properties, "required": list(required),
              "additionalProperties": False}

    def register(fn: Callable[[ToolContext, dict[str, Any]], str]) -> Callable[..., str]:
        REGISTRY[name] = Tool(name, description, schema, fn, read_only, capability)
        return fn

    return register


def get_tool(name: str) -> Tool | None:
    return REGISTRY.get(name)


def all_tools() -> list[Tool]:
    """Every built-in tool, in registration order."""
    return list(REGISTRY.values())


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def validate_args(t: Tool, args: dict[str, Any]) -> None:
    """Check arguments against the tool's schema; ToolError says what is wrong."""
    if not isinstance(args, dict):
        raise ToolError(f"arguments for '{t.name}' must be a JSON object")
    props: dict[str, Any] = t.parameters.get("properties", {})
    missing = [k for k in t.parameters.get("required", []) if k not in args]
    if missing:
        raise ToolError(f"'{t.name}' is missing required argument(s): {', '.join(missing)}")
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            if t.parameters.get("additionalProperties") is False:
                raise ToolError(f"'{t.name}' has no argument '{key}' (expected: {', '.join(props) or 'none'})")
            continue
        expected = spec.get("type")
        if expected and expected in _JSON_TYPES and not _JSON_TYPES[expected](value):
            raise ToolError(f"argument '{key}' of '{t.name}' must be of type {expected}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolError(f"argument '{key}' of '{t.name}' must be one of {spec['enum']}")

