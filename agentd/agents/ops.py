"""What tools may do to other agents and memory, on behalf of one agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentd.agents.tools import ToolError
from agentd.errors import AgentdError

if TYPE_CHECKING:  # manager.py imports this module
    from agentd.agents.manager import AgentManager


class AgentOpsImpl:
    """What tools may do to other agents and memory, on behalf of one agent."""

    NESTED_LOCK_TIMEOUT = 30.0

    def __init__(self, manager: AgentManager) -> None:
        self.m = manager

    def list_agents(self) -> list[dict[str, Any]]:
        return [{"id": h.id, "name": h.name, "state": h.state, "mode": h.mode,
                 "model": f"{h.provider}/{h.model}", "description": h.manifest.data["description"],
                 "tags": h.manifest.data["tags"]} for h in self.m.handles()]

    def find_agents(self, query: str) -> list[dict[str, Any]]:
        q = query.lower()
        return [a for a in self.list_agents()
                if q in a["name"].lower() or q in a["description"].lower()
                or any(q in t.lower() for t in a["tags"])]

    def send_to_agent(self, caller_id: str, target: str, message: str) -> str:
        handle = self.m.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot send a message to itself")
        # Run inline (not on the executor) so nested sends cannot starve the pool.
        try:
            result = self.m.run(handle, message, lock_timeout=self.NESTED_LOCK_TIMEOUT)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return result.response

    def spawn_agent(self, caller_id: str, manifest_toml: str) -> dict[str, Any]:
        try:
            handle = self.m.spawn(manifest_toml)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return {"agent_id": handle.id, "name": handle.name}

    def kill_agent(self, caller_id: str, target: str) -> None:
        handle = self.m.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot kill itself")
        self.m.kill(handle)

    def kv_get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        return self.m.kv.get(agent_id, key)

    def kv_set(self, agent_id: str, key: str, value: Any) -> None:
        self.m.kv.set(agent_id, key, value)

    def memory_service(self) -> Any:
        """Semantic memory and the knowledge graph (agentd.memory.service.MemoryService)."""
        if self.m.memory is None:
            raise ToolError("semantic memory is not available here")
        return self.m.memory
