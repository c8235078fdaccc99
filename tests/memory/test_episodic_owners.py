"""Episodic memory belongs to the person whose session it came from: with auto-remember on,
an exchange of one `user` is recalled into that user's later runs and never into another
user's prompt; facts stored explicitly stay agent-wide; a manifest's `[memory]
share_episodic = true` shares exchanges again. Real daemon, fake LLM (what the model was
sent is read from its request log)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from agentd.principals import SESSION_NS
from agentd.memory.service import others_of
from support import Daemon


def spawn(d: Daemon, extra: str = "") -> str:
    r = d.post("/api/agents", json={"manifest_toml": f'name = "eo-{uuid.uuid4().hex[:8]}"\n{extra}'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def systems(fake: Any, since: int) -> list[str]:
    return ["\n".join(m.get("content") or "" for m in (req.get("json") or {}).get("messages", [])
                      if m.get("role") == "system") for req in fake.requests[since:]]


def stored(d: Daemon, agent: str, count: int) -> list[dict[str, Any]]:
    deadline = time.time() + 20
    while time.time() < deadline:
        page = d.get(f"/api/memory/agents/{agent}/memories").json()
        if page["total"] >= count:
            return page["memories"]
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} memories stored")


def ask(d: Daemon, fake: Any, agent: str, text: str, user: str) -> str:
    mark = len(fake.requests)
    r = d.post(f"/api/agents/{agent}/message", json={"message": text, "user": user})
    assert r.status_code == 200, r.text
    return systems(fake, mark)[0]


def test_one_persons_exchanges_are_recalled_only_for_them(agent_daemon: Daemon, fake_llm) -> None:
    d = agent_daemon
    agent = spawn(d)
    ask(d, fake_llm, agent, "Please note that my favourite drink is green tea", "alice")
    fragment = stored(d, agent, 1)[0]
    assert fragment["scope"] == "episodic" and fragment["metadata"]["owner"] == "user:alice"
    assert "green tea" not in ask(d, fake_llm, agent, "What beverage do I like?", "bob")
    # An explicit fact is agent-wide: bob's runs recall it.
    r = d.post(f"/api/memory/agents/{agent}/memories", json={"content": "The office coffee machine is on floor 3"})
    assert r.status_code == 201
    assert "floor 3" in ask(d, fake_llm, agent, "Where is the coffee machine?", "bob")
    # Alice's own later session (the first one cleared) recalls her exchange.
    alice_session = str(uuid.uuid5(SESSION_NS, f"{agent}|user:alice"))
    assert d.delete(f"/api/sessions/{alice_session}").status_code == 200
    system = ask(d, fake_llm, agent, "What beverage do I like?", "alice")
    assert "## Relevant memories" in system and "favourite drink is green tea" in system


def test_share_episodic_in_the_manifest_shares_exchanges(agent_daemon: Daemon, fake_llm) -> None:
    d = agent_daemon
    agent = spawn(d, "[memory]\nshare_episodic = true\n")
    ask(d, fake_llm, agent, "Please note that my favourite colour is teal", "carol")
    assert "owner" not in stored(d, agent, 1)[0]["metadata"]
    assert "favourite colour is teal" in ask(d, fake_llm, agent, "Which colour do I like best?", "dave")


def test_who_may_see_a_fragment() -> None:
    hide = others_of("user:alice")
    mine = {"source": "conversation", "scope": "episodic", "metadata": {"owner": "user:alice"}}
    theirs = {"source": "conversation", "scope": "episodic", "metadata": {"owner": "user:bob"}}
    agents_own = {"source": "conversation", "scope": "episodic", "metadata": {"owner": ""}}
    older = {"source": "conversation", "scope": "episodic", "metadata": {"session_id": "s"}}
    fact = {"source": "user_provided", "scope": "semantic", "metadata": {"owner": "user:bob"}}
    assert [hide(f) for f in (mine, theirs, agents_own, older, fact)] == [False, True, True, False, False]
    # A scoped key's recall sees its own exchanges and its people's, not another key's.
    key = others_of("key:k1", people=True)
    assert [key({**mine, "metadata": {"owner": owner}}) for owner in ("key:k1", "key:k1:user:ann", "key:k12", "")
            ] == [False, False, True, True]
