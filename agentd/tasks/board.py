"""The shared task board: agents (and people, through /api/tasks) post tasks, agents claim
and complete them.

A claim is one conditional UPDATE (`... WHERE id = ? AND status = 'pending'`): of two
claimers of one task, on one daemon or on several sharing PostgreSQL, exactly one changes
the row; the other sees no row changed and moves on to the next task.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Callable

from pony import orm

from agentd.schema_fields import is_blank
from agentd.errors import BadRequest, Conflict, NotFound
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.store import Store
from agentd.timestamps import iso, utcnow

STATUSES = ("pending", "in_progress", "completed")
# The agents a task names: for whom, by whom claimed, by whom posted.
TASK_AGENTS = ("assigned_to", "claimed_by", "created_by")
MAX_TITLE = 200
MAX_TEXT = 65_536
LIST_LIMIT = 500
_write = orm.db_session(optimistic=False)
Seen = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _text(value: Any, name: str, limit: int, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or (not empty_ok and is_blank(value)):
        raise BadRequest(f"{name}: must be a non-empty string")
    if len(value) > limit:
        raise BadRequest(f"{name}: at most {limit} characters")
    if holds_nul(value):
        raise BadRequest(f"{name}: {NUL_MESSAGE}")
    return value


class TaskBoard:
    """`find_agent(ref)` is the agent with that id or name (None: no such agent)."""

    def __init__(self, store: Store, find_agent: Callable[[str], Any]) -> None:
        self.store = store
        self.find_agent = find_agent

    def agent(self, ref: str) -> Any:
        handle = self.find_agent(ref) if isinstance(ref, str) and ref else None
        if handle is None:
            raise NotFound(f"no agent with id or name {ref!r}")
        return handle

    def _id_of(self, ref: str | None) -> str | None:
        """The id of the agent `ref` names; `ref` itself when it names none (a removed agent's id)."""
        handle = self.find_agent(ref) if ref else None
        return handle.id if handle is not None else ref

    @staticmethod
    def _json(row: Any) -> dict[str, Any]:
        return {"id": row.id, "title": row.title, "description": row.description, "status": row.status,
                "assigned_to": row.assigned_to, "created_by": row.created_by, "claimed_by": row.claimed_by,
                "result": row.result, "created_at": iso(row.created_at),
                "claimed_at": iso(row.claimed_at) if row.claimed_at else None,
                "completed_at": iso(row.completed_at) if row.completed_at else None}

    def post(self, title: str, description: str, assigned_to: str | None = None,
             created_by: str | None = None) -> dict[str, Any]:
        """`assigned_to`: an agent's id or name; `created_by`: the posting agent's id."""
        title = _text(title, "title", MAX_TITLE)
        description = _text(description, "description", MAX_TEXT, empty_ok=True)
        if assigned_to:
            assigned_to = self.agent(assigned_to).id
        with _write:
            row = self.store.e.TaskRow(id=str(uuid.uuid4()), title=title, description=description,
                                       status="pending", assigned_to=assigned_to or None,
                                       created_by=created_by, created_at=_now())
            orm.flush()
            return self._json(row)

    def _whole(self, query: Any) -> Any:
        """`query` reading the two text columns in the same query: they are lazy, and a second
        query for them finds nothing once a concurrent delete has removed the row."""
        rows = self.store.e.TaskRow
        return query.prefetch(rows.description, rows.result)

    def get(self, task_id: str) -> dict[str, Any]:
        with orm.db_session:
            found = self._whole(orm.select(t for t in self.store.e.TaskRow if t.id == task_id))[:1]
            if not found:
                raise NotFound("task not found")
            return self._json(found[0])

    def list(self, status: str | None = None, assigned_to: str | None = None,
             claimed_by: str | None = None) -> list[dict[str, Any]]:
        """The newest LIST_LIMIT tasks, oldest first; `assigned_to` and `claimed_by` take an
        agent's id or name."""
        if status is not None and status not in STATUSES:
            raise BadRequest(f"status: must be one of {', '.join(STATUSES)}")
        if holds_nul(assigned_to) or holds_nul(claimed_by):
            return []  # no task names such an agent (and PostgreSQL refuses NUL in a query)
        assigned_to, claimed_by = (self._id_of(ref) for ref in (assigned_to, claimed_by))
        with orm.db_session:
            query = self.store.e.TaskRow.select()
            if status is not None:
                query = query.filter(lambda t: t.status == status)
            if assigned_to is not None:
                query = query.filter(lambda t: t.assigned_to == assigned_to)
            if claimed_by is not None:
                query = query.filter(lambda t: t.claimed_by == claimed_by)
            newest = self._whole(query.order_by(lambda t: (orm.desc(t.created_at), orm.desc(t.id))))[:LIST_LIMIT]
            return [self._json(r) for r in reversed(newest)]

    def _take(self, task_id: str, agent_id: str) -> bool:
        """The conditional update: True when this call moved the task to in_progress."""
        with _write:
            cursor = self.store.db.execute(
                "UPDATE tasks SET status = 'in_progress', claimed_by = $agent_id, claimed_at = $now "
                "WHERE id = $task_id AND status = 'pending'",
                {"agent_id": agent_id, "now": _now(), "task_id": task_id})
            return cursor.rowcount == 1

    def claim(self, task_id: str, agent_ref: str) -> dict[str, Any]:
        """Claim one task for an agent (id or name); 409 when it is not pending (another
        agent was first) or is assigned to another agent."""
        current = self.get(task_id)
        agent_id = self.agent(agent_ref).id
        if current["assigned_to"] not in (None, agent_id):
            raise Conflict(f"task {task_id} is assigned to another agent")
        if not self._take(task_id, agent_id):
            raise Conflict(f"task {task_id} is not pending (status: {self.get(task_id)['status']})")
        return self.get(task_id)

    def claim_next(self, agent_id: str, seen: Seen | None = None) -> dict[str, Any] | None:
        """The oldest pending task assigned to the agent or to nobody, claimed; None when
        there is none left. `seen(tasks)`: those of the tasks (their id and TASK_AGENTS) the
        claimer may see (a scoped key's run)."""
        with orm.db_session:
            rows = orm.select(t for t in self.store.e.TaskRow
                              if t.status == "pending" and (t.assigned_to is None or t.assigned_to == agent_id))
            ordered = [{"id": r.id, **{f: getattr(r, f) for f in TASK_AGENTS}}
                       for r in rows.order_by(lambda t: (t.created_at, t.id)).limit(LIST_LIMIT)]
        for task in seen(ordered) if seen is not None else ordered:
            if self._take(task["id"], agent_id):
                return self.get(task["id"])
        return None

    def complete(self, task_id: str, result: str, agent_ref: str | None = None) -> dict[str, Any]:
        """in_progress -> completed; `agent_ref`: only the agent that claimed it may."""
        result = _text(result, "result", MAX_TEXT, empty_ok=True)
        agent_id = self.agent(agent_ref).id if agent_ref is not None else None
        # One conditional update, like a claim: of a completion and a concurrent delete or
        # second completion, exactly one changes the row.
        sql = ("UPDATE tasks SET status = 'completed', result = $result, completed_at = $now "
               "WHERE id = $task_id AND status = 'in_progress'")
        params = {"result": result, "now": _now(), "task_id": task_id}
        if agent_id is not None:
            sql += " AND claimed_by = $agent_id"
            params["agent_id"] = agent_id
        with _write:
            done = self.store.db.execute(sql, params).rowcount == 1
        if done:
            return self.get(task_id)
        current = self.get(task_id)
        if current["status"] != "in_progress":
            raise Conflict(f"task {task_id} is {current['status']}, not in_progress")
        raise Conflict(f"task {task_id} was claimed by another agent")

    def delete(self, task_id: str) -> None:
        """Of two deletes at once, one removes the task and the other finds it gone."""
        with _write:
            if self.store.db.execute("DELETE FROM tasks WHERE id = $t", {"t": task_id}).rowcount != 1:
                raise NotFound("task not found")


def _now() -> datetime:
    """Now in UTC."""
    return utcnow()
