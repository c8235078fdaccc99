"""What tools may do to other agents and memory, on behalf of one agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentd.agents.tools import ToolError
from agentd.errors import AgentdError
from agentd.memory.kv import KvMemory

if TYPE_CHECKING:  # runs.py imports this module
    from agentd.agents.registry import AgentRegistry
    from agentd.agents.runs import Runs
    from agentd.memory.service import MemoryService


class AgentOpsImpl:
    """What tools may do to other agents and memory, on behalf of one agent."""

    NESTED_LOCK_TIMEOUT = 30.0

    def __init__(self, registry: AgentRegistry, runs: Runs, kv: KvMemory,
                 memory: MemoryService | None = None) -> None:
        self.registry = registry
        self.runs = runs
        self.kv = kv
        self.memory = memory

    def list_agents(self) -> list[dict[str, Any]]:
        return [{"id": h.id, "name": h.name, "state": h.state, "mode": h.mode,
                 "model": f"{h.provider}/{h.model}", "description": h.manifest.data["description"],
                 "tags": h.manifest.data["tags"]} for h in self.registry.handles()]

    def find_agents(self, query: str) -> list[dict[str, Any]]:
        q = query.lower()
        return [a for a in self.list_agents()
                if q in a["name"].lower() or q in a["description"].lower()
                or any(q in t.lower() for t in a["tags"])]

    def send_to_agent(self, caller_id: str, target: str, message: str) -> str:
        handle = self.registry.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot send a message to itself")
        # Run inline (not on the executor) so nested sends cannot starve the pool.
        from agentd.agents.runs import INLINE, RunRequest

        try:
            result = self.runs.start(RunRequest(handle, message, on=INLINE, wait=self.NESTED_LOCK_TIMEOUT,
                                                from_client=False, origin="agent")).result()
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return result.response

    def spawn_agent(self, caller_id: str, manifest_toml: str) -> dict[str, Any]:
        try:
            handle = self.registry.spawn(manifest_toml)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return {"agent_id": handle.id, "name": handle.name}

    def kill_agent(self, caller_id: str, target: str) -> None:
        handle = self.registry.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot kill itself")
        self.registry.kill(handle)

    def kv_get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        return self.kv.get(agent_id, key)

    def kv_set(self, agent_id: str, key: str, value: Any) -> None:
        self.kv.set(agent_id, key, value)

    def memory_service(self) -> Any:
        """Semantic memory and the knowledge graph (agentd.memory.service.MemoryService)."""
        if self.memory is None:
            raise ToolError("semantic memory is not available here")
        return self.memory
