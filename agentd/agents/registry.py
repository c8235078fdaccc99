"""The agent registry: loading, spawning, looking up, describing, re-moding and killing agents."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from pony import orm

from agentd.agents import shared, toolset, views
from agentd.agents.handle import MODES, AgentHandle, parse_uuid
from agentd.agents.listing import list_json
from agentd.agents.manifest import Manifest, parse_manifest
from agentd.agents.model_resolve import resolve_model
from agentd.agents.runqueue import RunQueues
from agentd.agents.signing import verify_envelope
from agentd.agents.tools import Tool
from agentd.config import Config
from agentd.errors import AgentdError, BadRequest, Conflict, NotFound
from agentd.timestamps import utcnow
from agentd.llm.catalog import Catalog
from agentd.store import Store

if TYPE_CHECKING:
    from agentd.memory.service import MemoryService

# The kernel's audit trail (AuditLog.record): (event, subject, detail).
Audit = Callable[[str, str, dict[str, Any]], None]


class AgentHooks(Protocol):
    """What a service does at an agent's spawn or manifest change (after `check` accepted the
    manifest), at a start and at a kill; what it keeps for the manifest acts as `handle.key_id`."""

    def check(self, manifest: Manifest) -> None: ...
    def spawned(self, handle: AgentHandle) -> None: ...
    def loaded(self, handle: AgentHandle) -> None: ...
    def killed(self, handle: AgentHandle) -> None: ...

log = logging.getLogger("agentd.agents")

# Changes of an agent's row lock it (as its deletion does) rather than trust Pony's optimistic
# check, which turns a change racing the deletion into an error instead of "agent not found".
_write = orm.db_session(optimistic=False)



class AgentRegistry:
    """The agents in memory (`_agents`, `_by_name`, under `_lock`), written through to the
    store before a call returns.

    A kill cancels the agent's runs (`queues`), deletes what it owned, forgets its semantic
    memory (`memory`) and is audited (`audit`, with spawns and refused signatures).

    `hooks` (AgentHooks) check each manifest before a spawn and hear of each agent spawned,
    loaded at start and killed: manifest schedules, proactive triggers, tools' programs."""

    def __init__(self, config: Config, store: Store, catalog: Catalog, queues: RunQueues,
                 memory: MemoryService | None = None, audit: Audit | None = None,
                 mcp_tools: toolset.McpTools | None = None,
                 hooks: Sequence[AgentHooks] = ()) -> None:
        self.config = config
        # Services that keep something per agent in step with its manifest and life.
        self.hooks = tuple(hooks)
        self.store = store
        self.catalog = catalog
        self.queues = queues
        self.memory = memory
        self.audit = audit
        # The tools of the MCP servers an allow-list names (empty: all), agentd/mcp/hub.py.
        self.mcp_tools = mcp_tools
        self._agents: dict[str, AgentHandle] = {}
        self._by_name: dict[str, str] = {}
        # Agents this daemon is killing: dropped from `_agents` before their rows are deleted,
        # so a lookup in between must not adopt them back from the row (agents/shared.py).
        self._killing: set[str] = set()
        self._lock = threading.RLock()

    # -- loading and spawning ---------------------------------------------
    def load(self) -> int:
        """Bring persisted agents back (same ids, mode and session)."""
        with orm.db_session:
            rows = list(self.store.e.AgentRow.select())
            for row in rows:
                handle = self.handle_from_row(row)
                if handle is not None:
                    self._register(handle)
        for handle in list(self._agents.values()):
            for hook in self.hooks:
                hook.loaded(handle)
        return len(self._agents)

    def handle_from_row(self, row: Any) -> AgentHandle | None:
        """A handle for a stored agent row, not registered yet (None, logged, when its
        manifest cannot be read: one bad row must not keep the others from loading)."""
        try:
            manifest = parse_manifest(row.manifest_toml, new=False)
        except AgentdError as exc:
            log.error("agent %s (%s) has an unreadable manifest: %s", row.name, row.id, exc.message)
            return None
        handle = self._handle(row.id, manifest, row.mode, row.created_at, row.session_id)
        handle.last_active = row.last_active
        handle.key_id = row.key_id or ""
        return handle

    def _handle(self, agent_id: str, manifest: Manifest, mode: str, created_at: datetime,
                session_id: str) -> AgentHandle:
        provider, model, env, base = resolve_model(self.config, self.catalog, manifest)
        return AgentHandle(id=agent_id, name=manifest.name, manifest=manifest, mode=mode,
                           state="Running", created_at=created_at, last_active=created_at,
                           session_id=session_id, provider=provider, model=model,
                           api_key_env=env, base_url=base)

    def _register(self, handle: AgentHandle) -> None:
        with self._lock:
            self._agents[handle.id] = handle
            self._by_name[handle.name] = handle.id

    def spawn(self, manifest_toml: str | None, signed_manifest: str | None = None, key_id: str = "",
              check: Callable[[AgentHandle], None] | None = None) -> AgentHandle:
        """Validate, persist and register a new agent; `check(handle)` may refuse it first."""
        if signed_manifest is not None:
            try:
                manifest_toml = verify_envelope(signed_manifest, manifest_toml)
            except AgentdError as exc:
                if self.audit is not None:
                    self.audit("agent.signature_rejected", "", {"error": exc.message[:200]})
                raise
        if not manifest_toml or not manifest_toml.strip():
            raise BadRequest("manifest_toml is required")
        manifest = parse_manifest(manifest_toml)
        manifest.warnings.extend(toolset.unknown_tools(manifest.capabilities["tools"]))
        for hook in self.hooks:
            hook.check(manifest)
        now = utcnow()
        handle = self._handle(str(uuid.uuid4()), manifest, "Auto", now, str(uuid.uuid4()))
        handle.key_id = key_id
        if self.catalog.get_provider(handle.provider) is None and not handle.base_url:
            raise BadRequest(f"invalid manifest format: model.provider: unknown provider "
                             f"{handle.provider!r} (set model.base_url for a custom endpoint)")
        if check is not None:
            check(handle)
        if self.store.shared:
            shared.sync_agent(self, name=manifest.name)
        with self._lock:
            if manifest.name in self._by_name:
                raise Conflict(f"an agent named {manifest.name!r} already exists")
            try:
                with orm.db_session:
                    row = self.store.e.AgentRow(id=handle.id, name=handle.name, manifest_toml=manifest_toml,
                                                manifest=manifest.data, mode=handle.mode, state=handle.state,
                                                created_at=now, last_active=now, session_id=handle.session_id,
                                                key_id=key_id or None)
                    self.store.e.SessionRow(id=handle.session_id, agent=row, created_at=now)
            except orm.TransactionIntegrityError:
                # Another daemon on the shared database spawned this name a moment ago.
                raise Conflict(f"an agent named {manifest.name!r} already exists") from None
            self._register(handle)
        log.info("spawned agent %s (%s) on %s/%s", handle.name, handle.id, handle.provider, handle.model)
        for warning in manifest.warnings:
            log.warning("agent %s manifest: %s", handle.name, warning)
        if self.audit is not None:
            self.audit("agent.spawn", handle.name, {"agent_id": handle.id})
        for hook in self.hooks:
            hook.spawned(handle)
        return handle

    def update_manifest(self, handle: AgentHandle, manifest_toml: str, key_id: str = "") -> list[str]:
        """Replace a live agent's manifest (its name stays); its session, mode and id are kept.
        Returns the manifest's warnings, as a spawn does."""
        if not manifest_toml or not manifest_toml.strip():
            raise BadRequest("manifest_toml is required")
        manifest = parse_manifest(manifest_toml)
        if manifest.name != handle.name:
            raise BadRequest(f"name: an agent keeps its name ({handle.name!r}); spawn a new agent for another")
        manifest.warnings.extend(toolset.unknown_tools(manifest.capabilities["tools"]))
        for hook in self.hooks:
            hook.check(manifest)
        provider, model, env, base = resolve_model(self.config, self.catalog, manifest)
        if self.catalog.get_provider(provider) is None and not base:
            raise BadRequest(f"invalid manifest format: model.provider: unknown provider "
                             f"{provider!r} (set model.base_url for a custom endpoint)")
        with self._lock:
            with _write:
                row = self.store.e.AgentRow.get_for_update(id=handle.id)
                if row is None:
                    raise NotFound("agent not found")
                row.manifest_toml = manifest_toml
                row.manifest = manifest.data
                row.key_id = key_id or None
            self.apply_manifest(handle, manifest)
            handle.key_id = key_id
        log.info("agent %s (%s) manifest updated: %s/%s", handle.name, handle.id, provider, model)
        if self.audit is not None:
            self.audit("agent.update", handle.name, {"agent_id": handle.id, "provider": provider, "model": model})
        for hook in self.hooks:
            hook.spawned(handle)  # the hooks sync what they keep to the new manifest
        return list(manifest.warnings)

    def apply_manifest(self, handle: AgentHandle, manifest: Manifest) -> None:
        """Point a live handle at `manifest` (stored already: here or by another daemon)."""
        provider, model, env, base = resolve_model(self.config, self.catalog, manifest)
        handle.manifest = manifest
        handle.provider, handle.model, handle.api_key_env, handle.base_url = provider, model, env, base
        handle.list_json = None

    # -- lookup -------------------------------------------------------------
    def get(self, agent_id: str) -> AgentHandle:
        """By UUID; 400 for a malformed id, 404 for an unknown one."""
        key = parse_uuid(agent_id)
        if self.store.shared:  # other daemons spawn and kill agents too (agents/shared.py)
            shared.sync_agent(self, agent_id=key)
        handle = self._agents.get(key)
        if handle is None or handle.killed:
            raise NotFound("agent not found")
        return handle

    def find(self, ref: str) -> AgentHandle | None:
        """By id or exact name (tools and workflows refer to agents either way)."""
        if isinstance(ref, str) and "\x00" in ref:
            return None  # no id or name holds NUL, and PostgreSQL refuses it in a query
        if self.store.shared:
            try:
                shared.sync_agent(self, agent_id=str(uuid.UUID(ref)))
            except (ValueError, AttributeError):
                shared.sync_agent(self, name=ref)
        try:
            handle = self._agents.get(str(uuid.UUID(ref)))
        except (ValueError, AttributeError):
            handle = None
        if handle is None:
            agent_id = self._by_name.get(ref)
            handle = self._agents.get(agent_id) if agent_id else None
        return None if handle is None or handle.killed else handle

    def by_name(self, name: str) -> AgentHandle | None:
        if self.store.shared:
            shared.sync_agent(self, name=name)
        agent_id = self._by_name.get(name)
        return self._agents.get(agent_id) if agent_id else None

    def handles(self) -> list[AgentHandle]:
        if self.store.shared:
            shared.sync_all(self)
        with self._lock:
            return sorted((h for h in self._agents.values() if not h.killed), key=lambda h: h.created_at)

    def count(self) -> int:
        return len(self._agents)

    def loaded(self) -> list[AgentHandle]:
        """Every handle in memory, as it is (no sync with a shared database)."""
        with self._lock:
            return list(self._agents.values())

    def loaded_handle(self, agent_id: str) -> AgentHandle | None:
        """The handle in memory for `agent_id`, if any (no sync with a shared database)."""
        return self._agents.get(agent_id)

    # -- views (agents/views.py) and tools (agents/toolset.py) --------------
    def auth_status(self, handle: AgentHandle) -> str:
        return views.auth_status(self.catalog, handle)

    def missing_key(self, handle: AgentHandle) -> str | None:
        return views.missing_key(self.catalog, handle)

    def summary(self, handle: AgentHandle) -> dict[str, Any]:
        return views.summary(handle)

    def list_item(self, handle: AgentHandle, auth: str | None = None, tier: str | None = None) -> dict[str, Any]:
        return views.list_item(self.catalog, handle, auth, tier)

    def list_json(self) -> str:
        """The body of GET /api/agents (without its final newline), see listing.py."""
        return list_json(self, self.handles())

    def detail(self, handle: AgentHandle) -> dict[str, Any]:
        return views.detail(self.catalog, handle, *self.effective_tools(handle))

    def effective_tools(self, handle: AgentHandle, mode: str | None = None) -> tuple[list[Tool], dict[str, Any]]:
        """The tools offered to the model (in the agent's mode unless `mode` says otherwise)
        and the capabilities that gate them."""
        return toolset.effective_tools(handle, mode or handle.mode, self.mcp_tools)

    def tools_by_origin(self, handle: AgentHandle) -> dict[str, list[str]]:
        """The agent's tools grouped by where they come from: `built-in`, `skill` (the tools
        that read the installed skills), `mcp:<server>`."""
        groups: dict[str, list[str]] = {}
        for t in self.effective_tools(handle)[0]:
            groups.setdefault("skill" if t.family == "skills" else t.origin, []).append(t.name)
        return groups

    # -- mode and kill --------------------------------------------------------------
    def set_mode(self, handle: AgentHandle, mode: str) -> None:
        if mode not in MODES:
            raise BadRequest(f"invalid mode {mode!r}: expected one of {', '.join(MODES)}")
        handle.mode = mode
        handle.last_active = utcnow()
        with _write:
            row = self.store.e.AgentRow.get_for_update(id=handle.id)
            if row is None:
                raise NotFound("agent not found")
            row.mode = mode
            row.last_active = handle.last_active

    def set_state(self, handle: AgentHandle, state: str) -> None:
        handle.state = state
        with orm.db_session:
            row = self.store.e.AgentRow.get(id=handle.id)
            if row is not None:
                row.state = state

    def kill(self, handle: AgentHandle) -> None:
        """Cancel any run, forget the agent and delete everything it owned."""
        with self._lock:
            state = handle.state
            handle.killed = True
            handle.state = "Terminated"
            self._agents.pop(handle.id, None)
            if self._by_name.get(handle.name) == handle.id:
                del self._by_name[handle.name]
            self._killing.add(handle.id)
        try:
            self.queues.cancel(handle)
            self._delete_rows(handle.id)
        except BaseException:
            # The rows are still there (a full disk, the database away): the agent lives on,
            # as it would after a restart, rather than vanish only from this process.
            with self._lock:
                handle.killed, handle.state = False, state
                self._agents[handle.id] = handle
                self._by_name.setdefault(handle.name, handle.id)
            raise
        finally:
            with self._lock:
                self._killing.discard(handle.id)
        if self.memory is not None:
            self.memory.forget_agent(handle.id)
        for hook in self.hooks:
            hook.killed(handle)
        log.info("killed agent %s (%s)", handle.name, handle.id)
        if self.audit is not None:
            self.audit("agent.kill", handle.name, {"agent_id": handle.id})

    def _delete_rows(self, agent_id: str) -> None:
        """The agent's row and everything it owned, in one transaction."""
        with orm.db_session:
            # Locked first, as every writer of the agent's rows locks it first (key-value
            # memory, uploads, cron jobs, triggers, stored responses, graph writes).
            row = self.store.e.AgentRow.get_for_update(id=agent_id)
            if row is None:
                return
            for upload in row.uploads:
                if upload.path:  # an upload from before schema 2 may still be a file
                    Path(upload.path).unlink(missing_ok=True)
            # Plain SQL: the database deletes the sessions' messages with them (ON DELETE
            # CASCADE) instead of Pony loading every message row to delete it.
            self.store.db.execute("DELETE FROM sessions WHERE agent = $agent", {"agent": agent_id})
            orm.delete(k for k in self.store.e.KvRow if k.agent.id == agent_id)
            orm.delete(u for u in self.store.e.UploadRow if u.agent.id == agent_id)
            orm.delete(r for r in self.store.e.ResponseRow if r.agent_id == agent_id)  # its /v1/responses
            row.delete()
