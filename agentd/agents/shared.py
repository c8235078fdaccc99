"""Agents on a database other daemons write too (PostgreSQL shared by N daemons).

A daemon keeps a handle per agent in memory (locks, queues, caches). On a shared store
the agents table is the truth: an agent spawned, re-moded or killed through another
daemon must look the same here. AgentRegistry calls these on every lookup when
`store.shared` is true; on the embedded SQLite database (one daemon) they are never
called, so that path is unchanged. While the database is out, the daemon's own view of
its agents serves (a stop, an agent's detail): nobody can spawn or kill one meanwhile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pony import orm

from agentd.store.outage import unless_unavailable

if TYPE_CHECKING:
    from agentd.agents.handle import AgentHandle
    from agentd.agents.registry import AgentRegistry

log = logging.getLogger("agentd.agents")


@unless_unavailable
def sync_agent(registry: "AgentRegistry", agent_id: str | None = None, name: str | None = None) -> None:
    """Make the in-memory handle of one agent (by id or name) match its database row:
    adopt an agent spawned elsewhere, forget one killed elsewhere, take over its mode."""
    if not (agent_id if agent_id is not None else name):
        return  # no agent has an empty id or name (and Pony refuses to look one up: a 500)
    with orm.db_session:
        rows = registry.store.e.AgentRow
        row = _row(rows, agent_id, name)
        if row is not None:
            _adopt(registry, row)
            return
    with registry._lock:
        gone = agent_id if agent_id is not None else registry._by_name.get(name or "")
    if gone is not None:
        _forget(registry, gone)


@unless_unavailable
def sync_all(registry: "AgentRegistry") -> None:
    """Make the set of handles match the agents table (for lists and status)."""
    with orm.db_session:
        current = {aid: (mode, session_id) for aid, mode, session_id in
                   orm.select((a.id, a.mode, a.session_id) for a in registry.store.e.AgentRow)}
        with registry._lock:
            known = set(registry._agents)
        for agent_id in known - set(current):
            _forget(registry, agent_id)
        for agent_id, (mode, session_id) in current.items():
            if agent_id in known:
                _refresh(registry._agents.get(agent_id), mode, session_id)
            else:
                rows = registry.store.e.AgentRow
                row = _row(rows, agent_id)
                if row is not None:
                    _adopt(registry, row)


def _row(rows: Any, agent_id: str | None, name: str | None = None) -> Any:
    """The agent row with this id (else this name), its manifest text read in the same SELECT.

    Pony reads a LongStr column lazily, in a second SELECT when it is first used; an agent
    deleted in between (killed by any daemon) would leave that read with no row, which Pony
    fails on with a TypeError. One SELECT sees the row whole or not at all."""
    if agent_id is not None:
        query = orm.select(a for a in rows if a.id == agent_id)
    else:
        query = orm.select(a for a in rows if a.name == name)
    return query.prefetch(rows.manifest_toml).first()


def _refresh(handle: "AgentHandle | None", mode: str, session_id: str) -> None:
    if handle is None:
        return
    handle.mode = mode
    if handle.session_id != session_id:
        handle.session_id = session_id
        handle.session_tail = None


def _new_manifest(registry: "AgentRegistry", handle: "AgentHandle", text: str) -> None:
    """Take over a manifest another daemon saved (PUT /api/agents/{id}/manifest there)."""
    from agentd.agents.manifest import parse_manifest
    from agentd.errors import AgentdError

    try:
        registry.apply_manifest(handle, parse_manifest(text, new=False))
        handle.unreadable_manifest = ""
    except AgentdError as exc:
        handle.unreadable_manifest = text
        log.error("agent %s (%s): the manifest saved elsewhere cannot be read: %s", handle.name, handle.id,
                  exc.message)


def _adopt(registry: "AgentRegistry", row: Any) -> None:
    """Inside a db_session: register (or refresh) the handle of `row`."""
    with registry._lock:
        if row.id in registry._killing:
            return  # this daemon is deleting it: the row is about to go
        handle = registry._agents.get(row.id)
        if handle is not None:
            _refresh(handle, row.mode, row.session_id)
            handle.key_id = row.key_id or ""
            text = row.manifest_toml  # Pony strips what it stores
            if text != handle.manifest.toml_text.strip() and text != handle.unreadable_manifest:
                _new_manifest(registry, handle, text)
            return
        stale = registry._by_name.get(row.name)
    # `_by_name` only names registered handles, and `row.id` has none (checked above), so a
    # handle under this name is another agent: killed elsewhere, and the name taken again since.
    if stale is not None:
        _forget(registry, stale)
    handle = registry.handle_from_row(row)
    if handle is None:
        return
    with registry._lock:
        if row.id not in registry._agents and row.id not in registry._killing:
            registry._register(handle)
            log.info("agent %s (%s) adopted from the shared database", row.name, row.id)


def _forget(registry: "AgentRegistry", agent_id: str) -> None:
    """Drop the handle of an agent that is no longer in the database (killed elsewhere)."""
    with registry._lock:
        handle = registry._agents.pop(agent_id, None)
        if handle is None:
            return
        handle.killed = True
        handle.state = "Terminated"
        if registry._by_name.get(handle.name) == agent_id:
            del registry._by_name[handle.name]
    registry.queues.cancel(handle)
    log.info("agent %s (%s) was killed through another daemon", handle.name, agent_id)
