"""The session store: an agent's conversation, cached in memory and written through."""

from __future__ import annotations

import contextlib
import json
import operator
import threading
from typing import Any, Callable, Iterable, Union

from pony import orm

from agentd.agents.handle import COMPACT_KEEP, AgentHandle, ConversationSession, parse_uuid
from agentd.agents.model_call import ModelCalls
from agentd.agents.registry import AgentRegistry
from agentd.agents.session_cache import SessionCache
from agentd.agents.run_errors import AgentRunError
from agentd.agents.session import api_view, clean_history, estimate_tokens, to_llm, to_stored
from agentd.errors import NotFound
from agentd.timestamps import utcnow
from agentd.llm.types import ChatRequest, LLMError, Message
from agentd.store import Store
from agentd.store.writer import PonyTx, Tx

# The session a run reads and writes: the agent's own (its handle keeps the cache) or
# another one of its sessions (a channel conversation's).
Session = Union[AgentHandle, ConversationSession]
WriteUsage = Callable[[Tx, list[dict[str, Any]]], None]

_MESSAGE, _CALLS = operator.itemgetter(1), operator.itemgetter(2)  # of a `llm_tail` entry
# One encoder for the stored messages (json.dumps with options builds a new one per call).
_encode = json.JSONEncoder(ensure_ascii=False).encode


class SessionStore:
    """Reads, appends, clears and compacts agent sessions.

    A session is its `sessions` row and one `session_messages` row per message, in order of
    id: a run appends its own messages, whatever the length of the session before it.
    `write_usage(tx, rows)` (Metering.write_rows) writes a run's usage rows in the
    transaction that saves its session (one commit per run)."""

    def __init__(self, store: Store, registry: AgentRegistry, models: ModelCalls,
                 write_usage: WriteUsage | None = None, cached_sessions: int = 256) -> None:
        self.store = store
        self.cached = SessionCache(cached_sessions)
        self.registry = registry
        self.models = models
        self.write_usage = write_usage

    _SELECT = "SELECT body FROM session_messages WHERE session = $session ORDER BY id"
    _SELECT_LAST = "SELECT body FROM session_messages WHERE session = $session ORDER BY id DESC LIMIT $n"

    # -- session ------------------------------------------------------------------
    def _cache_session(self, handle: AgentHandle, messages: list[dict[str, Any]],
                       session: Session | None = None) -> None:
        """Make the window's tail of `messages` (the session, or its end) the session's cache."""
        session = session or handle
        session.session_tail = messages[-handle.manifest.history_messages:]
        self.cached.touch(session)

    def window(self, handle: AgentHandle, session: Session | None = None) -> list[dict[str, Any]]:
        """The stored messages a run sends to the model: the last `max_history_messages`,
        starting at a user turn (never at a tool result whose call was cut off)."""
        session = session or handle
        size = handle.manifest.history_messages
        tail = session.session_tail
        if self.store.shared or tail is None:  # (another daemon may have written a shared session)
            with orm.db_session:
                rows = self.store.raw_rows(self._SELECT_LAST, {"session": session.session_id, "n": size})
            tail = _decode(body for (body,) in reversed(rows))
            self._cache_session(handle, tail, session)
        else:
            self.cached.touch(session)
        window = tail[-size:]
        start = next((i for i, m in enumerate(window) if m["role"] == "user"), len(window))
        return window[start:]

    @staticmethod
    def _append(tx: Tx, session_id: str, bodies: list[str]) -> bool:
        """Add messages (JSON texts) to the end of a session in the write transaction `tx`;
        False, adding nothing, when the session has no row."""
        names = {"session": session_id}
        values = []
        for i, body in enumerate(bodies):
            names[f"b{i}"] = body
            values.append(f"($b{i}, {i})")
        # One statement whatever the count; `ORDER BY` keeps the messages' order in their ids.
        return tx.execute(
            "INSERT INTO session_messages (session, body) SELECT $session, column1 FROM "
            f"(VALUES {', '.join(values)}) AS added WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $session) "
            "ORDER BY column2", names) > 0

    @staticmethod
    def history(handle: Session, window: list[dict[str, Any]]) -> list[Message]:
        """The window as the model's messages; those of the previous run's window are reused
        (stored dicts are never changed in place, and nothing changes a `Message` it sends)."""
        # The loops are map() over C callables: this runs once per message, over the
        # whole window, and only the newest messages are converted.
        ids = list(map(id, window))
        entries = list(map(handle.llm_tail.get, ids))
        at = -1
        while None in entries:  # (an entry keeps its dict alive: the id stays its own)
            at = entries.index(None, at + 1)
            message = to_llm(window[at])
            entries[at] = (window[at], message, bool(message.tool_calls))
        handle.llm_tail = dict(zip(ids, entries))
        out = list(map(_MESSAGE, entries))
        return clean_history(out) if any(map(_CALLS, entries)) else out

    def flush_usage(self, usage: list[dict[str, Any]] | None) -> None:
        """Write usage rows a run collected and has not written with its session."""
        if usage and self.write_usage is not None:
            rows = list(usage)
            self.store.write(lambda tx: self.write_usage(tx, rows))
            usage.clear()

    def save(self, handle: AgentHandle, new: list[Message],
             image_refs: list[dict[str, Any]], usage: list[dict[str, Any]] | None = None,
             also: Callable[[Tx], None] | None = None, session: Session | None = None,
             source: str = "") -> None:
        """End of a run in `session` (default: the agent's own): its usage rows, the new
        messages, the agent's last_active, one write (`also(tx)` adds more statements to
        it: the run record's close). `source` marks the run's user message (`cron`).

        Plain statements through the store's writer, committed before the answer goes out
        (see agentd/store/writer.py for why it has a connection of its own): this runs once
        per message."""
        session = session or handle
        if handle.killed:
            self.flush_usage(usage)
            return
        added = [to_stored(m) for m in new]
        if added and image_refs:
            added[0]["images"] = image_refs
        if added and source:
            added[0]["source"] = source
        now = utcnow()
        bodies = [_encode(m) for m in added]
        rows = list(usage) if usage and self.write_usage is not None else []

        ids = {"agent": handle.id, "session": session.session_id, "now": now}
        ensure_row = session.session_row != session.session_id

        def write(tx: Tx) -> bool:
            # For an agent killed meanwhile (by another daemon too), each statement's own
            # condition finds no row and adds nothing; its usage and run record stay.
            if rows:
                self.write_usage(tx, rows)
            found = tx.execute("UPDATE agents SET last_active = $now WHERE id = $agent", ids) > 0
            if bodies and ensure_row:
                tx.execute("INSERT INTO sessions (id, agent, created_at) SELECT $session, $agent, $now "
                           "WHERE EXISTS (SELECT 1 FROM agents WHERE id = $agent) ON CONFLICT (id) DO NOTHING",
                           ids)
            if bodies:
                self._append(tx, session.session_id, bodies)
            if also is not None:
                also(tx)
            return found

        found = self.store.write(write)
        if rows:
            usage.clear()
        if bodies and ensure_row:
            session.session_row = session.session_id
        if handle.killed or not found:  # (another daemon killed it)
            return
        if session.session_tail is not None:
            session.session_tail = (session.session_tail + added)[-handle.manifest.history_messages:]
        handle.last_active = now

    def ensure(self, handle: AgentHandle, session_id: str, label: str = "") -> None:
        """Create session `session_id` of the agent (labelled `label`) unless it exists."""
        try:
            with orm.db_session:
                if self.store.e.SessionRow.get(id=session_id) is None:
                    agent_row = self.store.e.AgentRow.get(id=handle.id)
                    if agent_row is None:
                        raise NotFound("agent not found")
                    self.store.e.SessionRow(id=session_id, agent=agent_row, label=label or None,
                                            created_at=utcnow())
        except orm.TransactionIntegrityError:
            # Two first messages of one person at once: the other request created it.
            with orm.db_session:
                if self.store.e.SessionRow.get(id=session_id) is None:
                    raise

    def session(self, handle: AgentHandle, session_id: str | None = None) -> dict[str, Any]:
        """GET /api/agents/{id}/session (`session_id`: another session of the agent, a person's)."""
        session_id = session_id or handle.session_id
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=session_id)
            label = row.label if row is not None else None
            rows = self.store.raw_rows(self._SELECT, {"session": session_id})
        stored = _decode(body for (body,) in rows)
        messages = api_view(stored)
        return {"session_id": session_id, "agent_id": handle.id,
                "message_count": len(messages),
                "context_window_tokens": estimate_tokens(stored, handle.manifest.model["system_prompt"]),
                "label": label, "messages": messages}

    def delete_session(self, session_id: str, may: Callable[[str, str | None], bool] | None = None) -> None:
        """Clear a session's history (the agent keeps the same session id). `may(agent_id,
        label)` says whether the caller may clear it: one it may not is not found."""
        key = parse_uuid(session_id, "session")
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=key)
            if row is None or (may is not None and not may(row.agent.id, row.label)):
                raise NotFound("session not found")
            owner = self.registry.loaded_handle(row.agent.id)
            self.store.db.execute("DELETE FROM session_messages WHERE session = $key", {"key": key})
            if owner is not None:
                owner.session_tail = []

    def reset_session(self, handle: AgentHandle) -> None:
        self.delete_session(handle.session_id)

    def compact(self, handle: AgentHandle, session_id: str | None = None) -> dict[str, Any]:
        """Summarise older messages of the agent's own session (or of its session
        `session_id`) with the agent's own model; keep the recent ones.

        The older messages are replaced in place, the first by the summary: runs in another
        session take no lock, so a message one of them adds meanwhile is kept after the
        recent ones."""
        own = session_id is None or session_id == handle.session_id
        session_id = handle.session_id if own else session_id
        with handle.run_lock if own else contextlib.nullcontext():
            with orm.db_session:
                rows = self.store.raw_rows("SELECT id, body FROM session_messages WHERE session = $session "
                                           "ORDER BY id", {"session": session_id})
            stored = _decode(body for _, body in rows)
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
                response = self.models.llm_call(handle)(request, None, threading.Event())
            except LLMError as exc:
                raise AgentRunError(f"compaction failed: {exc.message}", kind=exc.kind,
                                    http_status=exc.http_status) from None
            from agentd.llm.think import strip_think

            summary = strip_think(response.text).strip() or "(empty summary)"
            first = {"role": "user", "content": f"[Summary of the earlier conversation]\n{summary}"}
            names = {"session": session_id, "first": rows[0][0], "last": rows[split - 1][0], "body": _encode(first)}
            with orm.db_session:
                self.store.db.execute("UPDATE session_messages SET body = $body WHERE id = $first", names)
                self.store.db.execute("DELETE FROM session_messages WHERE session = $session AND id > $first "
                                      "AND id <= $last", names)
            if own:
                self._cache_session(handle, [first] + kept)
        return {"status": "ok", "compacted": True, "summarized_messages": len(older),
                "kept_messages": len(kept),
                "message": f"compacted {len(older)} messages into a summary of {len(summary)} chars, "
                           f"kept {len(kept)} recent messages"}

def _decode(bodies: Iterable[str]) -> list[dict[str, Any]]:
    """Messages from their stored JSON texts (one parse for all of them)."""
    return json.loads("[" + ",".join(bodies) + "]")
