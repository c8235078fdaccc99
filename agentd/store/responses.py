"""Stored OpenAI Responses: the response objects `POST /v1/responses` kept (`store: true`)."""

from __future__ import annotations

import json
from typing import Any

from pony import orm

from agentd.store.db import Store
from agentd.timestamps import utcnow


class StoredResponses:
    """Keeps response objects by id; each is read back exactly as its client got it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def save(self, agent_id: str, response: dict[str, Any], key_id: str = "", session: str = "") -> None:
        """Keep `response` (nothing once the agent is deleted); `key_id` names the scoped API
        key whose request it answered (only that key, and the admin, may read it back),
        `session` the label of the agent's session it was answered in ("" its own)."""
        kept = {"key_id": key_id, "session": session, "response": response} if key_id or session else response
        body = json.dumps(kept, ensure_ascii=False, separators=(",", ":"))
        with orm.db_session(optimistic=False):
            # The agent's row is locked first, as its deletion locks it first: a run that ends
            # after the agent was deleted keeps nothing, its responses went with it.
            if self.store.e.AgentRow.get_for_update(id=agent_id) is None:
                return
            row = self.store.e.ResponseRow.get(id=response["id"])
            if row is None:
                self.store.e.ResponseRow(id=response["id"], agent_id=agent_id, created_at=utcnow(), body=body)
            else:
                row.body = body

    def get(self, response_id: str) -> tuple[str, dict[str, Any], str, str | None] | None:
        """(agent id, response object, the key it answered or "", the label of its session:
        "" the agent's own, None when not recorded), or None for an id never stored."""
        rows = self.store.e.ResponseRow
        with orm.db_session:
            # Both columns in one query: the body is a lazy column, and a second query for it
            # finds nothing once a concurrent delete has removed the row in between.
            found = orm.select((r.agent_id, r.body) for r in rows if r.id == response_id)[:1]
        if not found:
            return None
        body = json.loads(found[0][1])
        if body.get("object") == "response":  # an admin's answer (in the agent's own session
            # unless it names a `user`: kept so before sessions were recorded)
            return found[0][0], body, "", None if body.get("user") else ""
        return found[0][0], body["response"], body["key_id"], body.get("session")

    def delete(self, response_id: str) -> bool:
        """Forget one stored response; False when there was none (or a concurrent delete won)."""
        rows = self.store.e.ResponseRow
        with orm.db_session:
            return orm.select(r for r in rows if r.id == response_id).delete(bulk=True) > 0
