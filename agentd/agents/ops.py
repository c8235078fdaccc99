"""What tools may do to other agents and memory, on behalf of one agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentd.agents.tools import ToolError
from agentd.api.scopes import scope_of
from agentd.errors import AgentdError
from agentd.memory.kv import KvMemory
from agentd.principals import ADMIN, Principal
from agentd.tasks.board import TASK_AGENTS

if TYPE_CHECKING:  # runs.py imports this module
    from agentd.agents.cooperation import Cooperation
    from agentd.agents.registry import AgentRegistry
    from agentd.agents.runs import Runs
    from agentd.memory.service import MemoryService


class AgentOpsImpl:
    """What tools may do to other agents and memory, on behalf of one agent."""

    NESTED_LOCK_TIMEOUT = 30.0

    def __init__(self, registry: AgentRegistry, runs: Runs, kv: KvMemory,
                 memory: MemoryService | None = None, cooperation: Cooperation | None = None,
                 origin: str = "", key_id: str = "") -> None:
        self.registry = registry
        self.runs = runs
        self.kv = kv
        self.memory = memory
        self.cooperation = cooperation
        # The origin of the run these operations serve: the events they cause carry it.
        self.origin = origin
        # The scoped API key that run is paid by: the runs and agents it starts are that key's.
        self.key_id = key_id

    def list_agents(self) -> list[dict[str, Any]]:
        """Every agent; in a scoped key's run, those in the key's list (as GET /api/agents)."""
        handles = self.registry.handles()
        if self.key_id:
            handles = self._acting().visible(handles)
        return [{"id": h.id, "name": h.name, "state": h.state, "mode": h.mode,
                 "model": f"{h.provider}/{h.model}", "description": h.manifest.data["description"],
                 "tags": h.manifest.data["tags"]} for h in handles]

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
        from agentd.agents.run_request import INLINE, RunRequest

        try:
            acting = self._key_runs().fields(self.key_id, handle, scope=None,
                                             hidden=lambda: ToolError(f"no agent with id or name {target!r}")) \
                if self.key_id else {}
            result = self.runs.start(RunRequest(handle, message, on=INLINE, wait=self.NESTED_LOCK_TIMEOUT,
                                                from_client=False, origin="agent", **acting)).result()
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return result.response

    def _key_runs(self) -> Any:
        if self.runs.key_runs is None:
            raise ToolError("scoped API keys are not available here")
        return self.runs.key_runs

    def _acting(self, scope: str | None = None) -> Any:
        """The run's scoped key as it is now (a disabled or deleted key, or one without
        `scope`, is a ToolError)."""
        try:
            return self._key_runs().acting(self.key_id, scope=scope)
        except AgentdError as exc:
            raise ToolError(exc.message) from None

    def _as_route(self, endpoint: str) -> Principal:
        """Who the run acts as, holding the scope the API route `endpoint` needs: the tool may
        do what the run's key may do through the API, no more (the admin in the admin's run)."""
        return self._acting(scope_of(endpoint)) if self.key_id else ADMIN

    def _reach(self, who: Principal, handle: Any, unknown: str) -> None:
        """An agent outside the key's list is refused as an unknown one is (`unknown`)."""
        if who.agents:
            self._key_runs().reach(who, handle, lambda: ToolError(unknown))

    def _seen(self, who: Principal, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tasks the key sees, as GET /api/tasks shows them to it."""
        return who.seen_rows(tasks, self.registry.handles, TASK_AGENTS)

    def spawn_agent(self, caller_id: str, manifest_toml: str) -> dict[str, Any]:
        try:
            handle = self.registry.spawn(manifest_toml, key_id=self.key_id,
                                         check=self._acting().check_spawn if self.key_id else None)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return {"agent_id": handle.id, "name": handle.name}

    def kill_agent(self, caller_id: str, target: str) -> None:
        handle = self.registry.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot kill itself")
        if self.key_id:
            self._reach(self._acting(), handle, f"no agent with id or name {target!r}")
        self.registry.kill(handle)

    def kv_get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        return self.kv.get(agent_id, key)

    def kv_set(self, agent_id: str, key: str, value: Any) -> None:
        self.kv.set(agent_id, key, value, origin=self.origin)

    def memory_service(self) -> Any:
        """Semantic memory and the knowledge graph (agentd.memory.service.MemoryService)."""
        if self.memory is None:
            raise ToolError("semantic memory is not available here")
        return self.memory

    # -- the task board, events, activation (agentd/agents/tools/cooperation.py) ----------
    def _cooperation(self) -> Cooperation:
        if self.cooperation is None:
            raise ToolError("the task board and events are not available here")
        return self.cooperation

    def _audit(self, event: str, caller_id: str, detail: dict[str, Any]) -> None:
        audit = self._cooperation().audit
        if audit is not None:
            caller = self.registry.loaded_handle(caller_id) if self.registry is not None else None
            audit(event, caller.name if caller is not None else caller_id, {"agent_id": caller_id, **detail})

    def task_post(self, caller_id: str, title: str, description: str, assigned_to: str | None) -> dict[str, Any]:
        who = self._as_route("tasks.create")
        handle = self.registry.find(assigned_to) if assigned_to else None
        if handle is not None:
            self._reach(who, handle, f"no agent with id or name {assigned_to!r}")
        try:
            task = self._cooperation().tasks.post(title, description, assigned_to, created_by=caller_id)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        self._audit("tool.task_post", caller_id, {"task_id": task["id"]})
        return task

    def task_claim(self, caller_id: str) -> dict[str, Any] | None:
        who = self._as_route("tasks.claim")
        task = self._cooperation().tasks.claim_next(caller_id, seen=lambda tasks: self._seen(who, tasks))
        if task is not None:
            self._audit("tool.task_claim", caller_id, {"task_id": task["id"]})
        return task

    def task_complete(self, caller_id: str, task_id: str, result: str) -> dict[str, Any]:
        who = self._as_route("tasks.complete")
        board = self._cooperation().tasks
        try:
            if who.agents and not self._seen(who, [board.get(task_id)]):
                raise ToolError("task not found")
            task = board.complete(task_id, result, agent_ref=caller_id)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        self._audit("tool.task_complete", caller_id, {"task_id": task_id})
        return task

    def task_list(self, caller_id: str, status: str | None) -> list[dict[str, Any]]:
        who = self._as_route("tasks.list_tasks")
        try:
            tasks = self._seen(who, self._cooperation().tasks.list(status=status))
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        self._audit("tool.task_list", caller_id, {"status": status, "count": len(tasks)})
        return tasks

    def event_publish(self, caller_id: str, event_type: str, payload: dict[str, Any]) -> str:
        from agentd.triggers.bus import CUSTOM, Event

        event = self._cooperation().events.publish(Event(CUSTOM, event_type, payload, agent_id=caller_id,
                                                         origin=self.origin, key_id=self.key_id))
        self._audit("tool.event_publish", caller_id, {"event_id": event.id, "event_type": event_type})
        return event.id

    def activate_agent(self, caller_id: str, target: str) -> dict[str, Any]:
        """Bring an agent into this daemon's registry (from the shared database when another
        daemon spawned it) and mark it Running; a killed agent stays gone."""
        unknown = f"no agent with id or name {target!r} (terminated agents cannot be revived)"
        handle = self.registry.find(target)
        if handle is None:
            raise ToolError(unknown)
        if self.key_id:
            self._reach(self._acting(), handle, unknown)
        was = handle.state
        if was != "Running":
            self.registry.set_state(handle, "Running")
        self._audit("tool.agent_activate", caller_id, {"target": handle.id, "was": was})
        return {"agent_id": handle.id, "name": handle.name, "state": handle.state, "was": was}
