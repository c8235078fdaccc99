"""What a tool is, what it may touch, and the registry of built-in tools."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from agentd.config import ToolsConfig
from agentd.errors import AgentdError
from agentd.principals import ADMIN, Principal


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
    # The daemon's long-lived tool backends (processes, browsers, channels, media, uploads,
    # audit): agentd/agents/tools/services.py. None where a tool runs outside a daemon.
    services: Any = None
    agent_name: str = ""
    # The agent's model and provider (services.ModelAccess), for the media tools.
    model: Any = None
    # The skills this agent's manifest permits (agentd/skills), as they were when the run started.
    skills: list[Any] | None = None
    # The A2A client the a2a_* tools call remote agents with (agentd/a2a/client.py).
    a2a: Any = None
    # The cron jobs the schedule_* and cron_* tools manage (agentd/schedules/jobs.py).
    cron: Any = None
    # The scoped API key the run is paid by ("": the admin's), which what the tools start
    # from inside it acts as, and the checks it must pass (agentd/key_runs.py).
    key_id: str = ""
    key_runs: Any = None

    def require_ops(self) -> AgentOps:
        if self.ops is None:
            raise ToolError("agent operations are not available here")
        return self.ops

    def require_services(self) -> Any:
        if self.services is None:
            raise ToolError("this tool needs the daemon's tool services, which are not available here")
        return self.services

    def acting(self, scope: str = "manage") -> Principal:
        """Who what this run does acts as (a job it makes is created by): its scoped key as
        the key is now (refused when disabled, deleted, expired or without `scope`), else the admin."""
        if not self.key_id:
            return ADMIN
        if self.key_runs is None:
            raise ToolError("scoped API keys are not available here")
        try:
            return self.key_runs.acting(self.key_id, scope)
        except AgentdError as exc:
            raise ToolError(exc.message) from None

    def audit(self, event: str, detail: dict[str, Any]) -> None:
        """One audit entry for a side effect a tool performed (`tool.<name>`)."""
        if self.services is not None:
            self.services.audit(event, self.agent_name or self.agent_id, {"agent_id": self.agent_id, **detail})


@dataclass(frozen=True)
class Tool:
    """A built-in tool: schema for the model, gate, and implementation."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[ToolContext, dict[str, Any]], str]
    read_only: bool = False
    capability: str | None = None  # shell | network | agent_spawn
    origin: str = "built-in"  # or "mcp:<server>" for an MCP server's tool
    family: str = "other"
    # Why the tool cannot work in this daemon (None when it can); cheap, asked per listing.
    check: Callable[[ToolsConfig], str | None] | None = None

    def unavailable(self, config: ToolsConfig) -> str | None:
        return self.check(config) if self.check is not None else None


REGISTRY: dict[str, Tool] = {}
PACKAGE = __name__.rsplit(".", 1)[0] + "."


def tool(name: str, description: str, properties: dict[str, Any], required: tuple[str, ...] = (),
         read_only: bool = False, capability: str | None = None, family: str = "",
         check: Callable[[ToolsConfig], str | None] | None = None) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register the decorated function as a tool with an object schema.

    `family` defaults to the name of the tools module the function is in (`files`, `web`, ...),
    so a tool added elsewhere is listed as `other` until it names its own.
    """
    schema = {"type": "object", "properties": properties, "required": list(required),
              "additionalProperties": False}

    def register(fn: Callable[[ToolContext, dict[str, Any]], str]) -> Callable[..., str]:
        module = fn.__module__
        group = family or (module.removeprefix(PACKAGE) if module.startswith(PACKAGE) else "other")
        def checked(ctx: ToolContext, args: dict[str, Any]) -> str:
            reason = check(ctx.tools_config) if check is not None else None
            if reason:
                raise ToolError(f"'{name}' is not available in this daemon: {reason}")
            return fn(ctx, args)

        run = fn if check is None else checked
        REGISTRY[name] = Tool(name, description, schema, run, read_only, capability, family=group, check=check)
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
        expected = spec.get("type") if isinstance(spec, dict) else None
        # An MCP server's schema may list several types (["string", "null"]); the server checks those.
        if isinstance(expected, str) and expected in _JSON_TYPES and not _JSON_TYPES[expected](value):
            raise ToolError(f"argument '{key}' of '{t.name}' must be of type {expected}")
        if isinstance(spec, dict) and "enum" in spec and value not in spec["enum"]:
            raise ToolError(f"argument '{key}' of '{t.name}' must be one of {spec['enum']}")

