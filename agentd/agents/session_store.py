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
    def _read_session(self, handle: AgentHandle) -> list[dict[str, Any]]:
        """Every stored message of the session, read from the database; refreshes the cache."""
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=handle.session_id)
            messages = json.loads(row.messages or "[]") if row is not None else []
        self._cache_session(handle, messages)
        return messages

    @staticmethod
    def _cache_session(handle: AgentHandle, messages: list[dict[str, Any]]) -> None:
        """Make the window's tail of `messages` (the whole session) the handle's cache."""
        handle.session_tail = messages[-handle.manifest.history_messages:]
        handle.session_count = len(messages)

    def _window(self, handle: AgentHandle) -> list[dict[str, Any]]:
        """The stored messages a run sends to the model: the last `max_history_messages`,
        starting at a user turn (never at a tool result whose call was cut off)."""
        size = handle.manifest.history_messages
        tail = handle.session_tail
        if self.store.shared or tail is None:  # (another daemon may have written a shared session)
            self._read_session(handle)
            tail = handle.session_tail
        window = tail[-size:]
        start = next((i for i, m in enumerate(window) if m["role"] == "user"), len(window))
        return window[start:]

    def _write_session(self, handle: AgentHandle, row: Any, messages: list[dict[str, Any]]) -> None:
        """Inside a db_session: persist `messages` as the whole session and cache them."""
        row.messages = json.dumps(messages, ensure_ascii=False)
        self._cache_session(handle, messages)

    @staticmethod
    def _history(window: list[dict[str, Any]]) -> list[Message]:
        return clean_history([to_llm(m) for m in window])

    def _flush_usage(self, usage: list[dict[str, Any]] | None) -> None:
        """Write usage rows a run collected and has not written with its session."""
        if usage and self.write_usage is not None:
            with orm.db_session:
                self.write_usage(usage)
            usage.clear()

    # Appends the new messages to the stored JSON array in the database itself, so a message
    # costs its own encoding, not the session's (same text as encoding the whole list).
    _APPEND = ("UPDATE sessions SET messages = CASE WHEN messages IS NULL OR messages IN ('', '[]') "
               "THEN $added ELSE substr(messages, 1, length(messages) - 1) || ', ' || $inner || ']' END "
               "WHERE id = $session")

    def _save_session(self, handle: AgentHandle, new: list[Message],
                      image_refs: list[dict[str, Any]], usage: list[dict[str, Any]] | None = None,
                      also: Callable[[], None] | None = None) -> None:
        """End of a run: its usage rows, the new messages, the agent's last_active, one
        transaction (`also` adds more writes to it: the run record's close).

        Plain UPDATEs: this runs once per message, and loading two Pony entities to change
        two columns cost more than the statements themselves."""
        if handle.killed:
            self._flush_usage(usage)
            return
        added = [to_stored(m) for m in new]
        if added and image_refs:
            added[0]["images"] = image_refs
        now = utcnow()
        text = json.dumps(added, ensure_ascii=False)
        db = self.store.db
        with orm.db_session:
            if usage and self.write_usage is not None:
                self.write_usage(usage)
                usage.clear()
            ids = {"agent": handle.id, "session": handle.session_id, "now": now, "added": text,
                   "inner": text[1:-1]}
            if db.execute("UPDATE agents SET last_active = $now WHERE id = $agent", ids).rowcount == 0:
                return  # the agent was killed meanwhile
            if added and db.execute(self._APPEND, ids).rowcount == 0:
                db.execute("INSERT INTO sessions (id, agent, messages, created_at) "
                           "VALUES ($session, $agent, $added, $now)", ids)
            if also is not None:
                also()
        if handle.session_tail is not None:
            handle.session_tail = (handle.session_tail + added)[-handle.manifest.history_messages:]
            handle.session_count += len(added)
        handle.last_active = now

    def session(self, handle: AgentHandle) -> dict[str, Any]:
        """GET /api/agents/{id}/session."""
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=handle.session_id)
            label = row.label if row is not None else None
            stored = json.loads(row.messages or "[]") if row is not None else []
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
                owner.session_tail, owner.session_count = [], 0

    def reset_session(self, handle: AgentHandle) -> None:
        self.delete_session(handle.session_id)

    def compact(self, handle: AgentHandle) -> dict[str, Any]:
        """Summarise older messages with the agent's own model; keep the recent ones."""
        with handle.run_lock:
            stored = self._read_session(handle)
            split = len(stored) - COMPACT_KEEP
            # Never separate a tool result from the call that asked for it.
            while split > 0 and stored[split]["role"] == "tool":
                split -= 1
            if split <= 1:
                return {"status": "ok", "compacted": False, "summarized_messages": 0,
                        "kept_messages": len(stored),
                        "message": f"no compaction needed ({len(stored)} messages)"}
            older, kept = stored[:split], stored[split:]
            transcript = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}"
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
