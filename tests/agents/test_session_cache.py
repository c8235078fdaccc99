"""Conversations keep their latest messages in memory only up to `[agents] cached_sessions`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared

from agentd.agents.session_cache import SessionCache


@dataclass
class FakeSession:
    session_id: str
    session_tail: list[dict[str, Any]] | None = field(default_factory=list)
    llm_tail: dict[int, Any] = field(default_factory=lambda: {1: "kept"})


def test_the_least_recently_used_session_loses_its_cache() -> None:
    cache = SessionCache(2)
    a, b, c = FakeSession("a"), FakeSession("b"), FakeSession("c")
    cache.touch(a)
    cache.touch(b)
    cache.touch(a)  # "b" is now the least recently used
    cache.touch(c)
    assert len(cache) == 2
    assert b.session_tail is None and b.llm_tail == {}
    assert a.session_tail == [] and a.llm_tail == {1: "kept"}
    assert c.session_tail == []


def test_a_session_whose_id_changed_keeps_its_new_cache() -> None:
    cache = SessionCache(1)
    handle = FakeSession("old")
    cache.touch(handle)
    handle.session_id = "new"  # a reset
    other = FakeSession("other")
    cache.touch(other)  # "old" goes, but the handle now holds session "new"
    assert handle.session_tail == []


def test_an_evicted_conversation_is_read_back_whole(tmp_path: Path, fake_llm) -> None:
    d = Daemon(make_home(tmp_path, llm_config(fake_llm, "\n[agents]\ncached_sessions = 1\n")),
               env_extra=LLM_ENV).start()
    try:
        ids = []
        for name in ("first", "second"):
            r = d.post("/api/agents", json={"manifest_toml": f'name = "cache-{name}"\n'})
            assert r.status_code == 201, r.text
            ids.append(r.json()["agent_id"])
        for turn in range(2):
            for n, agent_id in enumerate(ids):
                r = d.post(f"/api/agents/{agent_id}/message", json={"message": f"agent {n} turn {turn}"})
                assert r.status_code == 200, r.text
                sent = [m["content"] for m in fake_llm.requests[-1]["json"]["messages"] if m["role"] == "user"]
                # Each run read the other agent's conversation out of the one cached slot,
                # and still sends its own earlier turns.
                assert sent == [f"agent {n} turn {t}" for t in range(turn + 1)]
    finally:
        stop_shared(d)
