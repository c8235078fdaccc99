"""A daemon SIGKILLed while its agents' sessions are being written (a session is
rows, appended by every message).

Four clients message four agents as fast as they are answered, and four more write their
key-value memories; the daemon is killed in the middle of that and started again on the
same home (and database). Every message a client saw answered must be in its agent's
session, each exchange whole (the user's turn, then the answer to it), in order, nothing
doubled; the one message in flight at the kill is either all there or not there at all.
Every key-value write that was answered is there with its value. Then the agents go on: a
new message is appended after them.
"""

from __future__ import annotations

import threading
import time

import requests

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home

AGENTS = 4
ANSWERED_BEFORE_KILL = 60  # messages answered (all agents) before the kill


def _exchanges(messages: list[dict]) -> list[str]:
    """The user texts of a session view, checking that each is followed by its answer."""
    assert len(messages) % 2 == 0, f"a torn exchange: {messages[-3:]}"
    users = []
    for question, answer in zip(messages[::2], messages[1::2]):
        assert (question["role"], answer["role"]) == ("User", "Assistant"), (question, answer)
        assert answer["content"] == f"echo: {question['content']}", (question, answer)
        users.append(question["content"])
    return users


def test_sessions_survive_a_sigkill_mid_write(tmp_path, fake_llm) -> None:
    home = make_home(tmp_path, llm_config(fake_llm))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    ids = []
    for i in range(AGENTS):
        r = daemon.post("/api/agents", json={"manifest_toml": f'name = "crash-{i}"\nprofile = "minimal"\n'})
        assert r.status_code == 201, r.text
        ids.append(r.json()["agent_id"])
    answered: dict[str, list[str]] = {agent_id: [] for agent_id in ids}
    stop = threading.Event()

    def client(agent_id: str) -> None:
        http = requests.Session()
        n = 0
        while not stop.is_set():
            text = f"m{n}"
            try:
                r = http.post(f"{daemon.url}/api/agents/{agent_id}/message", json={"message": text}, timeout=20)
            except requests.RequestException:
                return  # the daemon is gone: this message was in flight
            if r.status_code != 200:
                return
            answered[agent_id].append(text)
            n += 1

    written: dict[str, list[str]] = {agent_id: [] for agent_id in ids}

    def kv_client(agent_id: str) -> None:
        http = requests.Session()
        n = 0
        while not stop.is_set():
            key = f"k{n}"
            try:
                r = http.put(f"{daemon.url}/api/memory/agents/{agent_id}/kv/{key}", json={"n": n}, timeout=20)
            except requests.RequestException:
                return
            if r.status_code != 200:
                return
            written[agent_id].append(key)
            n += 1

    threads = [threading.Thread(target=client, args=(agent_id,)) for agent_id in ids]
    threads += [threading.Thread(target=kv_client, args=(agent_id,)) for agent_id in ids]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while sum(map(len, answered.values())) < ANSWERED_BEFORE_KILL and time.monotonic() < deadline:
        time.sleep(0.01)
    daemon.kill()
    stop.set()
    for t in threads:
        t.join(30)
    assert sum(map(len, answered.values())) >= ANSWERED_BEFORE_KILL
    assert sum(map(len, written.values())) > 0

    again = Daemon(home, env_extra=LLM_ENV).start()
    try:
        for agent_id in ids:
            stored = _exchanges(again.get(f"/api/agents/{agent_id}/session").json()["messages"])
            seen = answered[agent_id]
            assert stored[:len(seen)] == seen, "BUG: an answered message is missing or out of order"
            # The message in flight at the kill: committed (its answer never reached the
            # client) or not at all, never half.
            assert stored[len(seen):] in ([], [f"m{len(seen)}"]), stored[len(seen):]
            memory = again.get(f"/api/memory/agents/{agent_id}/kv").json()
            kept = {key: memory.get(key) for key in written[agent_id]}
            assert kept == {f"k{n}": {"n": n} for n in range(len(written[agent_id]))}, \
                "BUG: an answered key-value write is missing"
        r = again.post(f"/api/agents/{ids[0]}/message", json={"message": "after the crash"})
        assert r.status_code == 200 and r.json()["response"] == "echo: after the crash"
        after = _exchanges(again.get(f"/api/agents/{ids[0]}/session").json()["messages"])
        seen = answered[ids[0]]
        assert after[-1] == "after the crash" and after[:-1] in (seen, seen + [f"m{len(seen)}"])
    finally:
        again.stop()
