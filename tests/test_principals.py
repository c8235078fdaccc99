"""Who a request acts as (agentd/principals.py), in process: a scoped key's agent list, its
audited refusals, the sessions it talks in and the run fields of the sessions it names. The
same rules through the daemon, on every way in: tests/api/test_keys.py."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from agentd.errors import NotFound
from agentd.principals import ADMIN, SESSION_NS, Principal, run_fields, session_fields

MINE = SimpleNamespace(id="a-1", name="support-one")
OTHER = SimpleNamespace(id="a-2", name="sales-one")


def key(refusals: list[tuple[Any, ...]] | None = None, **fields: Any) -> Principal:
    def refused(who: Principal, reason: str, detail: dict[str, Any]) -> None:
        if refusals is not None:
            refusals.append((who, reason, detail))
    return Principal(**{"key_id": "k1", "name": "one", "scopes": ("read",), "agents": ("support-*",),
                        "refused": refused, **fields})


def test_an_agent_outside_the_list_is_refused_and_the_refusal_audited() -> None:
    refusals: list[tuple[Any, ...]] = []
    who = key(refusals)
    assert who.sees(MINE) is True and refusals == []
    assert who.sees(OTHER) is False
    assert refusals == [(who, "agent", {"agent_id": "a-2"})]
    with pytest.raises(NotFound) as caught:
        who.reach(OTHER)
    assert caught.value.message == "agent not found" and len(refusals) == 2
    assert who.reach(MINE) is MINE
    assert ADMIN.sees(OTHER) is True and key(agents=()).sees(OTHER) is True
    assert key(None, refused=None).sees(OTHER) is False  # (no audit wired: still refused)


def test_a_keys_sessions_are_its_own_and_its_peoples() -> None:
    who = key()
    assert who.label == "key:k1" and ADMIN.label is None
    assert [who.talks_in(MINE, label) for label in ("key:k1", "key:k1:user:ann", "key:k12", "", None)] == [
        True, True, False, False, False]
    assert who.talks_in(OTHER, "key:k1") is False
    assert ADMIN.talks_in(OTHER, "key:k9") is True


def test_the_run_fields_of_the_session_named() -> None:
    def sid(label: str) -> str:
        return str(uuid.uuid5(SESSION_NS, f"a-1|{label}"))

    assert session_fields(MINE, "") == {"owner": ""}
    assert session_fields(MINE, "user:ann") == {"owner": "user:ann", "session_id": sid("user:ann"),
                                                "label": "user:ann"}
    assert run_fields(ADMIN, MINE) == {"key_id": "", "owner": ""}
    assert run_fields(ADMIN, MINE, user="ann") == {"key_id": "", **session_fields(MINE, "user:ann")}
    assert run_fields(key(), MINE, own_session=True) == {"key_id": "k1", **session_fields(MINE, "key:k1")}
    assert run_fields(key(), MINE, session="s") == {"key_id": "k1", **session_fields(MINE, "key:k1:session:s")}
    assert run_fields(key(), MINE) == {"key_id": "k1", "owner": ""}
