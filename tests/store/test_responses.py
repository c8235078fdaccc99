"""Stored OpenAI Responses (agentd/store/responses.py) on a real SQLite store: each is read back
as its client got it, with the key it answered and the label of the session it was answered
in; an admin's answer in the agent's own session is kept as the bare object; a row kept before
sessions were recorded names none; nothing is kept for a deleted agent."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from pony import orm

from agentd.store import open_store
from agentd.store.responses import StoredResponses
from memsupport import add_agent


@pytest.fixture()
def kept(tmp_path: Path):
    store = open_store(tmp_path / "agentd.db")
    yield StoredResponses(store), add_agent(store)
    store.close()


def response(rid: str, **fields) -> dict:
    return {"id": rid, "object": "response", "output_text": "ünïcode", **fields}


def raw(responses: StoredResponses, rid: str) -> str:
    with orm.db_session:
        return responses.store.db.select("SELECT body FROM openai_responses WHERE id = $i", {"i": rid})[0]


def test_each_is_read_back_with_its_key_and_session(kept) -> None:
    responses, agent = kept
    responses.save(agent, response("r1"))
    responses.save(agent, response("r2", user="ann"), session="user:ann")
    responses.save(agent, response("r3"), key_id="k1", session="key:k1")
    assert responses.get("r1") == (agent, response("r1"), "", "")
    assert raw(responses, "r1") == json.dumps(response("r1"), ensure_ascii=False, separators=(",", ":"))
    assert responses.get("r2") == (agent, response("r2", user="ann"), "", "user:ann")
    assert responses.get("r3") == (agent, response("r3"), "k1", "key:k1")
    assert responses.get("nope") is None
    # Saved again (its final state), the same row.
    responses.save(agent, response("r1", status="completed"))
    assert responses.get("r1")[1]["status"] == "completed"


def test_an_admins_answer_kept_bare_with_a_user_names_no_session(kept) -> None:
    """As rows were kept before the session was recorded: its `user` is all there is to go on."""
    responses, agent = kept
    with orm.db_session:
        responses.store.e.ResponseRow(id="old", agent_id=agent, created_at=datetime.now(),
                                      body=json.dumps(response("old", user="bo")))
    assert responses.get("old") == (agent, response("old", user="bo"), "", None)


def test_delete_and_a_deleted_agent(kept) -> None:
    responses, agent = kept
    responses.save(agent, response("r1"))
    assert responses.delete("r1") is True and responses.get("r1") is None
    assert responses.delete("r1") is False
    responses.save("no-such-agent", response("r2"))
    assert responses.get("r2") is None
