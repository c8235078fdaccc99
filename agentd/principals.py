"""Who a request acts as: the admin, or one scoped API key (agentd/apikeys.py), with the
checks every entry point makes, and the run fields its runs carry."""

from __future__ import annotations

import fnmatch
import uuid
from typing import Any, Callable, Iterable

from agentd.errors import BadRequest, Forbidden, NotFound
from agentd.jsonsafe import NUL_MESSAGE

ADMIN_NAME = "admin"
# The longest `user` or `session` name a run takes (the message schema's bound too).
PERSON_MAX = 256


class Principal:
    """Who a request acts as: the admin, or one scoped key. `require` and `reach` are the
    checks every entry point makes (HTTP routes, sockets, MCP, A2A)."""

    def __init__(self, key_id: str = "", name: str = ADMIN_NAME, scopes: Iterable[str] = ("admin",),
                 agents: Iterable[str] = (), rate_limit_per_minute: int | None = None,
                 refused: Callable[["Principal", str, dict[str, Any]], None] | None = None) -> None:
        self.key_id = key_id
        self.name = name
        self.scopes = frozenset(scopes)
        self.agents = tuple(agents)
        self.rate_limit_per_minute = rate_limit_per_minute
        self._refused = refused

    @property
    def is_admin(self) -> bool:
        """The configured admin key (or a keyless daemon's loopback client)."""
        return not self.key_id

    def has(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def require(self, scope: str) -> None:
        """403 naming the missing scope (audited)."""
        if not self.has(scope):
            if self._refused is not None:
                self._refused(self, "scope", {"missing_scope": scope})
            raise Forbidden(f"forbidden: API key '{self.name}' is missing scope '{scope}'")

    def may_reach(self, agent: Any) -> bool:
        """Whether the key's agent list admits `agent` (a handle: `.id`, `.name`)."""
        if not self.agents:
            return True
        return any(p == agent.id or fnmatch.fnmatchcase(agent.name, p) for p in self.agents)

    @property
    def label(self) -> str | None:
        """A scoped key's session label (its people's begin with it and a colon); None for
        the admin, who talks in every session."""
        return None if self.is_admin else f"key:{self.key_id}"

    def talks_in(self, agent: Any, label: str | None) -> bool:
        """Whether the session of `agent` labelled `label` (as `run_fields` labels them) is one
        this principal talks in: any for the admin; for a scoped key its own, its people's and
        its named ones, of an agent in its list."""
        own = self.label
        if own is None:
            return True
        return self.may_reach(agent) and (label == own or (label or "").startswith(own + ":"))

    def sees(self, agent: Any) -> bool:
        """Whether the key's agent list admits `agent`; a refusal is audited."""
        if self.may_reach(agent):
            return True
        if self._refused is not None:
            self._refused(self, "agent", {"agent_id": agent.id})
        return False

    def reach(self, agent: Any) -> Any:
        """`agent`, or a 404 exactly like an unknown agent's (audited)."""
        if not self.sees(agent):
            raise NotFound("agent not found")
        return agent

    def check_spawn(self, agent: Any) -> None:
        """403 for a new agent the key could never reach: one its list does not name (audited)."""
        if not self.may_reach(agent):
            if self._refused is not None:
                self._refused(self, "spawn", {"name": agent.name})
            raise Forbidden(f"forbidden: API key '{self.name}' may only spawn agents its list names "
                            f"({', '.join(self.agents)}), not '{agent.name}'")

    def visible(self, agents: Iterable[Any]) -> list[Any]:
        return [a for a in agents if self.may_reach(a)]

    def seen_rows(self, rows: list[dict[str, Any]], agents: Callable[[], Iterable[Any]],
                  fields: Iterable[str] = ("agent_id",)) -> list[dict[str, Any]]:
        """The rows the key may see: those whose agent fields name only agents of its list
        (`agents()`: every agent), or no agent."""
        if not self.agents:
            return rows
        ids = {a.id for a in self.visible(agents())}
        named = tuple(fields)
        return [r for r in rows if all(not r.get(f) or r[f] in ids for f in named)]


ADMIN = Principal()

SESSION_NS = uuid.UUID("6d0c5e0a-35a4-4c1e-9a61-0d7f2f1c9b51")


def run_fields(who: Principal, handle: Any, user: str | None = None, session: str | None = None,
               own_session: bool = False) -> dict[str, str]:
    """RunRequest fields for a run `who` starts: the key that pays, and the session of the
    person talking (`user` or a named `session`; with `own_session`, a scoped key without
    either gets a session of its own). A scoped key's people are its own: the same `user`
    through two keys is two sessions."""
    for field, value in (("user", user), ("session", session)):
        # Checked here for every way in (`/v1`'s `user` has no schema of ours): the label
        # must be one `GET .../session?user=` can name, and one PostgreSQL can store.
        if value and len(value) > PERSON_MAX:
            raise BadRequest(f"invalid request: {field}: Length must be between 1 and {PERSON_MAX}.")
        if value and "\x00" in value:
            raise BadRequest(f"invalid request: {field}: {NUL_MESSAGE}")
    owner = ""
    if session:
        owner = f"session:{session}"
    elif user:
        owner = f"user:{user}"
    elif own_session and not who.is_admin:
        owner = "key"
    if owner and not who.is_admin:
        owner = who.label if owner == "key" else f"{who.label}:{owner}"
    return {"key_id": who.key_id, **session_fields(handle, owner)}


def session_fields(handle: Any, label: str) -> dict[str, str]:
    """RunRequest fields of the agent's session labelled `label` ("": its own)."""
    if not label:
        return {"owner": ""}
    return {"owner": label, "session_id": str(uuid.uuid5(SESSION_NS, f"{handle.id}|{label}")), "label": label}
