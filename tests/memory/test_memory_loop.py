"""Recall in the loop: semantic memory is searched before every model call of a run, not
once per run, through the real daemon and the fake LLM (what the model was sent is read
from the fake's request log)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from support import Daemon


@pytest.fixture(scope="module")
def d(agent_daemon: Daemon) -> Daemon:
    return agent_daemon


def spawn(d: Daemon) -> str:
    name = f"ml-{uuid.uuid4().hex[:8]}"
    toml = f'name = "{name}"\nprofile = "full"\n[model]\nprovider = "default"\nmodel = "default"\n'
    r = d.post("/api/agents", json={"manifest_toml": toml})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def systems_for(fake: Any, since: int, user_text: str) -> list[str]:
    """System prompts of the model calls made for `user_text` since request number `since`."""
    out = []
    for req in fake.requests[since:]:
        messages = (req.get("json") or {}).get("messages", [])
        if not any(m.get("role") == "user" and m.get("content") == user_text for m in messages):
            continue
        out.append("\n".join(m.get("content") or "" for m in messages if m.get("role") == "system"))
    return out


def test_a_fact_stored_mid_run_reaches_the_next_model_call(d: Daemon, fake_llm) -> None:
    agent = spawn(d)
    text = ('[[tool:memory_remember {"content": "The vault code is 4471", "scope": "semantic"}]] '
            "Which code opens the vault?")
    mark = len(fake_llm.requests)
    r = d.post(f"/api/agents/{agent}/message", json={"message": text})
    assert r.status_code == 200, r.text
    assert r.json()["response"].startswith("tool said: remembered as memory ")
    first, second = systems_for(fake_llm, mark, text)
    # Nothing was remembered before the first call; the tool stored the fact, and the
    # recall before the second call put it in the system prompt.
    assert "Relevant memories" not in first and "4471" not in first
    assert "## Relevant memories" in second
    assert "\n- The vault code is 4471" in second
    fid = r.json()["response"].rsplit(" ", 1)[1]
    got = d.get(f"/api/memory/agents/{agent}/memories/{fid}").json()
    assert got["access_count"] == 1  # recalled once, by the second call


def test_unchanged_memory_is_recalled_into_every_call_and_counted_once(d: Daemon, fake_llm) -> None:
    agent = spawn(d)
    r = d.post(f"/api/memory/agents/{agent}/memories", json={"content": "The office wifi password is tulip-42"})
    assert r.status_code == 201, r.text
    fid = r.json()["id"]
    # Three KV lookups (they do not touch semantic memory), then the answer: four model calls.
    text = '[[tool:memory_recall {"key": "wifi"} x3]] What is the password of the office wireless network?'
    mark = len(fake_llm.requests)
    r = d.post(f"/api/agents/{agent}/message", json={"message": text})
    assert r.status_code == 200, r.text
    prompts = systems_for(fake_llm, mark, text)
    assert len(prompts) == 4
    for system in prompts:
        assert "## Relevant memories" in system and "\n- The office wifi password is tulip-42" in system
    # The memory did not change between the calls, so it was searched (and counted) once.
    assert d.get(f"/api/memory/agents/{agent}/memories/{fid}").json()["access_count"] == 1


def test_a_fact_added_over_http_during_a_run_reaches_its_later_calls(d: Daemon, fake_llm) -> None:
    agent = spawn(d)
    d.post(f"/api/memory/agents/{agent}/memories", json={"content": "The team lunch is on Thursday"})
    # The tool sleeps on the daemon's side while the fact arrives through the API.
    text = '[[tool:shell_exec {"command": "sleep 2"}]] When is the team lunch and who brings the cake?'
    mark = len(fake_llm.requests)
    result: dict[str, Any] = {}
    run = threading.Thread(target=lambda: result.update(r=d.post(f"/api/agents/{agent}/message",
                                                                   json={"message": text})))
    run.start()
    try:
        for _ in range(100):
            if systems_for(fake_llm, mark, text):
                break
            time.sleep(0.02)
        r = d.post(f"/api/memory/agents/{agent}/memories",
                   json={"content": "Priya brings the cake to the team lunch"})
        assert r.status_code == 201, r.text
    finally:
        run.join(30)
    assert result["r"].status_code == 200, result["r"].text
    first, second = systems_for(fake_llm, mark, text)
    assert "team lunch is on Thursday" in first and "Priya" not in first
    assert "team lunch is on Thursday" in second and "\n- Priya brings the cake to the team lunch" in second


def test_an_agent_found_empty_recalls_what_is_remembered_for_it_later(d: Daemon, fake_llm) -> None:
    # The first message finds no fragments (and the daemon notes that, to skip the count
    # next time); a fact stored afterwards, over HTTP or by an import, must still be recalled.
    agent = spawn(d)
    for i in range(2):
        mark = len(fake_llm.requests)
        assert d.post(f"/api/agents/{agent}/message", json={"message": f"hello {i}"}).status_code == 200
        assert "Relevant memories" not in systems_for(fake_llm, mark, f"hello {i}")[0]
    r = d.post(f"/api/memory/agents/{agent}/memories", json={"content": "The boat is called Heron"})
    assert r.status_code == 201, r.text
    mark = len(fake_llm.requests)
    assert d.post(f"/api/agents/{agent}/message", json={"message": "What is the boat called?"}).status_code == 200
    (system,) = systems_for(fake_llm, mark, "What is the boat called?")
    assert "\n- The boat is called Heron" in system, "BUG: a fact stored after an empty recall was not recalled"
    # Emptied again (the fragment deleted), then filled by an import: recalled again.
    d.delete(f"/api/memory/agents/{agent}/memories/{r.json()['id']}")
    mark = len(fake_llm.requests)
    assert d.post(f"/api/agents/{agent}/message", json={"message": "and now?"}).status_code == 200
    assert "Heron" not in systems_for(fake_llm, mark, "and now?")[0]
