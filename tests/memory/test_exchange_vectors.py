"""What vector an auto-remembered exchange gets, through the real daemon and the real local
model: by default its user message's (the very vector recall made for that message, so the
exchange costs no model run of its own); with `[memory] embed_whole_exchange = true` the
vector of question and answer together. Read back from the export, compared with what
`POST /v1/embeddings` answers for the same texts."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from agentd.config.parse import memory_table
from agentd.errors import ConfigError
from agentd.memory.embedder import LOCAL_MODEL_NAME
from conftest import LLM_ENV, llm_config
from support import Daemon

QUESTION = "My sister Ingrid moved to Bergen last spring"


def exchange_vector(d: Daemon) -> tuple[str, np.ndarray, dict, str]:
    """Message a new agent once; its remembered exchange's content, vector, fragment and
    the agent's id."""
    r = d.post("/api/agents", json={"manifest_toml": f'name = "ev-{uuid.uuid4().hex[:8]}"\n'})
    assert r.status_code == 201, r.text
    agent = r.json()["agent_id"]
    r = d.post(f"/api/agents/{agent}/message", json={"message": QUESTION})
    assert r.status_code == 200, r.text
    deadline = time.time() + 20
    while time.time() < deadline:
        doc = d.get(f"/api/memory/agents/{agent}/export").json()
        if doc["memories"]:
            break
        time.sleep(0.05)
    (memory,) = doc["memories"]
    assert doc["embedding_model"] == LOCAL_MODEL_NAME
    return memory["content"], np.array(memory["embedding"], dtype=np.float32), memory, agent


def embed(d: Daemon, text: str) -> np.ndarray:
    r = d.post("/v1/embeddings", json={"model": LOCAL_MODEL_NAME, "input": text})
    assert r.status_code == 200, r.text
    return np.array(r.json()["data"][0]["embedding"], dtype=np.float32)


def test_an_exchange_gets_its_user_messages_vector(agent_daemon: Daemon) -> None:
    d = agent_daemon
    content, vector, memory, agent = exchange_vector(d)
    assert content == f"User asked: {QUESTION}\nI responded: echo: {QUESTION}"
    assert (memory["source"], memory["scope"]) == ("conversation", "episodic")
    assert float(vector @ embed(d, QUESTION)) > 0.9999
    assert float(vector @ embed(d, content)) < 0.99
    # The same exchange again is the same fragment; another message makes one of its own.
    for text in (QUESTION, f"{QUESTION} [[reply:Noted.]]"):
        r = d.post(f"/api/agents/{agent}/message", json={"message": text})
        assert r.status_code == 200, r.text
    deadline = time.time() + 20
    while d.get(f"/api/memory/agents/{agent}/memories").json()["total"] < 2 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # (nothing more arrives)
    page = d.get(f"/api/memory/agents/{agent}/memories").json()
    assert page["total"] == 2
    assert page["memories"][1]["id"] == memory["id"] and page["memories"][1]["content"] == content


def test_embed_whole_exchange_embeds_question_and_answer(daemon_factory, fake_llm) -> None:
    d = daemon_factory(llm_config(fake_llm, "\n[memory]\nembed_whole_exchange = true\n"), env_extra=LLM_ENV)
    content, vector, _, _ = exchange_vector(d)
    assert float(vector @ embed(d, content)) > 0.9999
    assert float(vector @ embed(d, QUESTION)) < 0.99


def test_embed_whole_exchange_is_a_boolean() -> None:
    assert memory_table({}).embed_whole_exchange is False
    assert memory_table({"memory": {"embed_whole_exchange": True}}).embed_whole_exchange is True
    with pytest.raises(ConfigError, match="memory.embed_whole_exchange"):
        memory_table({"memory": {"embed_whole_exchange": "yes"}})
