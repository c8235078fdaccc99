"""The session store: an agent's conversation, cached in memory and written through."""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from pony import orm

from agentd.agents.handle import COMPACT_KEEP, AgentHandle, parse_uuid
from agentd.agents.run_errors import AgentRunError
from agentd.agents.session import api_view, clean_history, estimate_tokens, to_llm, to_stored
from agentd.errors import NotFound
from agentd.kernel_time import utcnow
from agentd.llm.types import ChatRequest, LLMError, Message



class SessionStore:
    """Part of AgentManager: reads, appends, clears and compacts agent sessions."""

    # -- session ------------------------------------------------------------------
    def _load_session(self, handle: AgentHandle) -> list[dict[str, Any]]:
        """The stored messages; kept in memory after the first read (writes go through here too)."""
        if self.store.shared:  # another daemon may have written the session since
            handle.session_cache, handle.llm_history = None, None
        if handle.session_cache is None:
            with orm.db_session:
                row = self.store.e.SessionRow.get(id=handle.session_id)
                handle.session_cache = json.loads(row.messages or "[]") if row is not None else []
                handle.session_json = None  # (re)read: the text cached for the old list is stale
        return list(handle.session_cache)

    def _write_session(self, handle: AgentHandle, row: Any, messages: list[dict[str, Any]],
                       appended: bool = False) -> None:
        """Inside a db_session: persist `messages` and make them the cached copy.

        `appended`: `messages` is the cached session plus new messages at the end.
        """
        row.messages = json.dumps(messages, ensure_ascii=False)
        self._cache_session(handle, messages, appended)

    @staticmethod
    def _cache_session(handle: AgentHandle, messages: list[dict[str, Any]], appended: bool = False) -> None:
        """Make `messages` (just written) the handle's cached session."""
        handle.session_json = None  # callers that know the text set it afterwards
        previous = handle.llm_history
        handle.session_cache = messages
        if appended and previous is not None and len(previous) <= len(messages):
            # Appended to what was cached (the usual case): convert only the new tail.
            handle.llm_history = previous + [to_llm(m) for m in messages[len(previous):]]
        else:
            handle.llm_history = None

    @staticmethod
    def _history(handle: AgentHandle, stored: list[dict[str, Any]]) -> list[Message]:
        cached = handle.llm_history
        if cached is None or len(cached) != len(stored):
            cached = handle.llm_history = [to_llm(m) for m in stored]
        return clean_history(cached)

    def _flush_usage(self, usage: list[dict[str, Any]] | None) -> None:
        """Write usage rows a run collected and has not written with its session."""
        if usage and self.write_usage is not None:
            with orm.db_session:
                self.write_usage(usage)
            usage.clear()

    def _save_session(self, handle: AgentHandle, before: list[dict[str, Any]], new: list[Message],
                      image_refs: list[dict[str, Any]], usage: list[dict[str, Any]] | None = None,
                      also: Callable[[], None] | None = None) -> None:
        """End of a run: its usage rows, the session and the agent's last_active, one transaction
        (`also` adds more writes to it: the run record's close).

        Plain UPDATEs: this runs once per message, and loading two Pony entities to change
        two columns cost more than the statements themselves."""
        if handle.killed:
            self._flush_usage(usage)
            return
        added = [to_stored(m) for m in new]
        if added and image_refs:
            added[0]["images"] = image_refs
        now = utcnow()
        messages = before + added
        text = self._session_text(handle, before, added, messages)
        db = self.store.db
        with orm.db_session:
            if usage and self.write_usage is not None:
                self.write_usage(usage)
                usage.clear()
            ids = {"agent": handle.id, "session": handle.session_id, "now": now, "messages": text}
            if db.execute("UPDATE agents SET last_active = $now WHERE id = $agent", ids).rowcount == 0:
                return  # the agent was killed meanwhile
            if db.execute("UPDATE sessions SET messages = $messages WHERE id = $session", ids).rowcount == 0:
                db.execute("INSERT INTO sessions (id, agent, messages, created_at) "
                           "VALUES ($session, $agent, $messages, $now)", ids)
            if also is not None:
                also()
        self._cache_session(handle, messages, appended=True)
        handle.session_json = text
        handle.last_active = now

    @staticmethod
    def _session_text(handle: AgentHandle, before: list[dict[str, Any]], added: list[dict[str, Any]],
                      messages: list[dict[str, Any]]) -> str:
        """`json.dumps(messages)`, built from the cached text of `before` when that is what is
        cached (the usual case), so a message costs its own encoding, not the session's."""
        cached, text = handle.session_cache, handle.session_json
        if (text is None or cached is None or len(cached) != len(before) or not before
                or cached[-1] is not before[-1] or not text.endswith("]")):
            return json.dumps(messages, ensure_ascii=False)
        if not added:
            return text
        return f"{text[:-1]}, {json.dumps(added, ensure_ascii=False)[1:]}"

    def session(self, handle: AgentHandle) -> dict[str, Any]:
        """GET /api/agents/{id}/session."""
        stored = self._load_session(handle)
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=handle.session_id)
            label = row.label if row is not None else None
        messages = api_view(stored)
        return {"session_id": handle.session_id, "agent_id": handle.id,
                "message_count": len(messages),
                "context_window_tokens": estimate_tokens(stored, handle.manifest.model["system_prompt"]),
                "label": label, "messages": messages}

    def delete_session(self, session_id: str) -> None:
        """Clear a session's history (the agent keeps the same session id)."""
        key = parse_uuid(session_id, "session")
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=key)
            if row is None:
                raise NotFound("session not found")
            owner = self._agents.get(row.agent.id)
            row.messages = "[]"
            if owner is not None:
                owner.session_cache, owner.llm_history = [], None

    def reset_session(self, handle: AgentHandle) -> None:
        self.delete_session(handle.session_id)

    def compact(self, handle: AgentHandle) -> dict[str, Any]:
        """Summarise older messages with the agent's own model; keep the recent ones."""
        with handle.run_lock:
            stored = self._load_session(handle)
            split = len(stored) - COMPACT_KEEP
            # Never separate a tool result from the call that asked for it.
            while split > 0 and stored[split]["role"] == "tool":
                split -= 1
            if split <= 1:
                return {"status": "ok", "compacted": False, "summarized_messages": 0,
                        "kept_messages": len(stored),
                        "message": f"no compaction needed ({len(stored)} messages)"}
            older, kept = stored[:split], stored[split:]
            transcript = "\n\n".join(f"{m['role'].capitalize()}: {m.get('content', '')}"
                                     for m in older if m.get("content"))[-100_000:]
            request = ChatRequest(model=handle.model, system=(
                "You summarise conversations. Write a concise summary of the conversation below that keeps "
                "every fact, decision, name, number and open task needed to continue it."),
                messages=[Message(role="user", content=transcript)], max_tokens=1024, temperature=0.3)
            try:
                response = self._llm_call(handle)(request, None, threading.Event())
            except LLMError as exc:
                raise AgentRunError(f"compaction failed: {exc.message}", kind=exc.kind,
                                    http_status=exc.http_status) from None
            from agentd.llm.think import strip_think

            summary = strip_think(response.text).strip() or "(empty summary)"
            new = [{"role": "user", "content": f"[Summary of the earlier conversation]\n{summary}"}] + kept
            with orm.db_session:
                row = self.store.e.SessionRow.get(id=handle.session_id)
                self._write_session(handle, row, new)
        return {"status": "ok", "compacted": True, "summarized_messages": len(older),
                "kept_messages": len(kept),
                "message": f"compacted {len(older)} messages into a summary of {len(summary)} chars, "
                           f"kept {len(kept)} recent messages"}
