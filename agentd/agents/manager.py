"""The agents as the API sees them: one object over the agent services.

The services, each built with its collaborators by the kernel (agentd/kernel.py):
- registry.py (AgentRegistry): loading, spawning, lookup, views, mode changes and kill
  (views.py: what the API shows; toolset.py: the tools offered; model_resolve.py: the model);
- session_store.py (SessionStore): sessions (cache, append, clear, compact);
- model_call.py (ModelCalls): provider endpoints and the model call with fallbacks;
- uploads.py (Uploads): uploaded files;
- runs.py (Runs): the one way to start a run (`Runs.start(RunRequest)`), its checks,
  the per-agent queues (runqueue.py), stops and the run itself;
- ops.py: what tools may do to other agents; handle.py (AgentHandle, RunOptions, limits)
  and run_errors.py (AgentRunError).
`AgentManager` only forwards to them; names other code imports are re-exported here.
"""

from __future__ import annotations

from typing import Any, Callable

from agentd.agents.handle import (CAPABILITY_TOOLS, COMPACT_KEEP, MESSAGE_LIMIT, MODES, STOPPED_NOTE,
                                  UPLOAD_LIMIT, UPLOAD_TYPES, AgentHandle, RunOptions, parse_uuid)
from agentd.agents.model_call import ModelCalls
from agentd.agents.ops import AgentOpsImpl
from agentd.agents.registry import AgentRegistry
from agentd.agents.run_errors import AgentRunError, run_error
from agentd.agents.runs import Runs
from agentd.agents.session_store import SessionStore
from agentd.agents.uploads import Uploads
from agentd.errors import NotFound

__all__ = ["AgentHandle", "AgentManager", "AgentOpsImpl", "AgentRunError", "CAPABILITY_TOOLS", "COMPACT_KEEP",
           "MESSAGE_LIMIT", "MODES", "RunOptions", "STOPPED_NOTE", "UPLOAD_LIMIT", "UPLOAD_TYPES",
           "parse_uuid", "run_error"]


class AgentManager:
    """The agent services behind one name for the API layer (`kernel.agents`)."""

    def __init__(self, registry: AgentRegistry, sessions: SessionStore, models: ModelCalls,
                 uploads: Uploads, runs: Runs) -> None:
        self.registry = registry
        self.sessions = sessions
        self.models = models
        self.uploads = uploads
        self.runs = runs
        self.store = registry.store
        self.url_overrides = models.url_overrides

    # -- registry ---------------------------------------------------------------------
    def load(self) -> int:
        return self.registry.load()

    def spawn(self, manifest_toml: str | None, signed_manifest: str | None = None, key_id: str = "",
              check: Callable[[AgentHandle], None] | None = None) -> AgentHandle:
        """`key_id`: the scoped API key spawning it, which its manifest's jobs and triggers act as;
        `check(handle)`: what may refuse the new agent before it is stored."""
        return self.registry.spawn(manifest_toml, signed_manifest, key_id, check)

    def spawn_warnings(self, handle: AgentHandle) -> list[str]:
        """What a spawn reports without failing: unknown manifest keys, a provider without a key."""
        missing = self.registry.missing_key(handle)
        return list(handle.manifest.warnings) + ([missing] if missing else [])

    def get(self, agent_id: str) -> AgentHandle:
        return self.registry.get(agent_id)

    def find(self, ref: str) -> AgentHandle | None:
        return self.registry.find(ref)

    def by_name(self, name: str) -> AgentHandle | None:
        return self.registry.by_name(name)

    def handles(self) -> list[AgentHandle]:
        return self.registry.handles()

    def summary(self, handle: AgentHandle) -> dict[str, Any]:
        return self.registry.summary(handle)

    def list_item(self, handle: AgentHandle, auth: str | None = None, tier: str | None = None) -> dict[str, Any]:
        return self.registry.list_item(handle, auth, tier)

    def list_json(self) -> str:
        return self.registry.list_json()

    def detail(self, handle: AgentHandle) -> dict[str, Any]:
        return self.registry.detail(handle)

    def tools_by_origin(self, handle: AgentHandle) -> dict[str, list[str]]:
        return self.registry.tools_by_origin(handle)

    def set_mode(self, handle: AgentHandle, mode: str) -> None:
        self.registry.set_mode(handle, mode)

    def kill(self, handle: AgentHandle) -> None:
        self.registry.kill(handle)

    def update_manifest(self, handle: AgentHandle, manifest_toml: str, key_id: str = "") -> list[str]:
        """Replace the agent's manifest (PUT /api/agents/{id}/manifest); its warnings."""
        self.registry.update_manifest(handle, manifest_toml, key_id)
        return self.spawn_warnings(handle)

    def set_model(self, handle: AgentHandle, model_ref: str, key_id: str = "") -> list[str]:
        """Point the agent at `provider/model` (or `default`), keeping the rest of its manifest."""
        from agentd.agents.manifest_edit import with_model

        self.registry.update_manifest(handle, with_model(handle.manifest.toml_text, model_ref), key_id)
        return self.spawn_warnings(handle)

    # -- sessions and uploads ---------------------------------------------------------
    def session(self, handle: AgentHandle, session_id: str | None = None) -> dict[str, Any]:
        return self.sessions.session(handle, session_id)

    def delete_session(self, session_id: str, may: Callable[[str, str | None], bool] | None = None) -> None:
        self.sessions.delete_session(session_id, may)

    def reset_session(self, handle: AgentHandle, session_id: str | None = None) -> None:
        """Clear the agent's own session, or its session `session_id` (a person's, a named
        one): one never talked in has nothing to clear."""
        if session_id is None:
            self.sessions.reset_session(handle)
            return
        try:
            self.sessions.delete_session(session_id)
        except NotFound:
            pass

    def compact(self, handle: AgentHandle, session_id: str | None = None) -> dict[str, Any]:
        """Summarise the older messages of the agent's own session, or of its session
        `session_id` (a person's, a named one)."""
        return self.sessions.compact(handle, session_id)

    def save_upload(self, handle: AgentHandle, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        return self.uploads.save_upload(handle, filename, content_type, data)

    def uploads_of(self, handle: AgentHandle) -> list[dict[str, Any]]:
        return self.uploads.listing(handle)

    def upload_content(self, handle: AgentHandle, file_id: str) -> dict[str, Any]:
        return self.uploads.content(handle, file_id)

    # -- runs -------------------------------------------------------------------------
    def stop(self, handle: AgentHandle, session_id: str | None = None) -> bool:
        """Cancel the agent's current run (with `session_id`: the runs in that session of
        it); True when one was running."""
        return self.runs.stop(handle, session_id)

    def stop_all(self) -> None:
        self.runs.stop_all()
