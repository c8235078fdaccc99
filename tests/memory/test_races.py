"""Memory routes under concurrent clients, through the real daemon: writes to one key-value key
are last-writer-wins and never answer 500, whether they race each other, a DELETE of the key or
the agent's own deletion; an export or a recall racing deletions of fragments answers with what is left;
one entity or relation added by many clients at once is stored once with every client's properties."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

import pytest
import requests

from support import db_rows, wait_until
from tests.agents.test_agents import spawn


def _together(workers: int, work: Callable[[int, requests.Session], None]) -> None:
    start = threading.Barrier(workers)

    def run(i: int) -> None:
        with requests.Session() as session:
            start.wait()
            work(i, session)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_puts_and_deletes_of_one_key_at_once(shared_daemon) -> None:
    d = shared_daemon
    agent_id = spawn(d)
    url = f"{d.url}/api/memory/agents/{agent_id}/kv"
    answers: Counter = Counter()
    wrong: list[str] = []   # threads' findings: an assert in a thread would not fail the test

    def work(i: int, s: requests.Session) -> None:
        for j in range(25):
            if (i + j) % 3 == 2:
                r = s.delete(f"{url}/same")
                answers[("DELETE", r.status_code)] += 1
                if r.json() not in ({"status": "deleted"}, {"error": "key not found: same"}):
                    wrong.append(r.text)
            else:
                r = s.put(f"{url}/same", json={"writer": i, "n": j})
                answers[("PUT", r.status_code)] += 1
                if r.json() != {"status": "ok"}:
                    wrong.append(r.text)
            # Each round a fresh key is created by every worker at once.
            r = s.put(f"{url}/fresh-{j}", json=i)
            answers[("PUT", r.status_code)] += 1

    _together(8, work)
    assert set(answers) <= {("PUT", 200), ("DELETE", 200), ("DELETE", 404)}, answers
    assert wrong == []
    stored = d.get(f"/api/memory/agents/{agent_id}/kv").json()
    assert sorted(k for k in stored if k.startswith("fresh-")) == sorted(f"fresh-{j}" for j in range(25))
    assert all(stored[f"fresh-{j}"] in range(8) for j in range(25))
    assert d.put(f"/api/memory/agents/{agent_id}/kv/same", json="last").status_code == 200
    assert d.get(f"/api/memory/agents/{agent_id}/kv/same").json() == "last"


def test_puts_racing_the_agents_deletion(shared_daemon) -> None:
    d = shared_daemon
    for _ in range(3):
        agent_id = spawn(d)
        url = f"{d.url}/api/memory/agents/{agent_id}/kv"
        answers: Counter = Counter()
        wrong: list[str] = []

        def work(i: int, s: requests.Session) -> None:
            if i == 0:
                answers[("KILL", s.delete(f"{d.url}/api/agents/{agent_id}").status_code)] += 1
                return
            for j in range(10):
                r = s.put(f"{url}/k{j % 2}", json=j)
                answers[("PUT", r.status_code)] += 1
                if r.status_code == 404 and r.json() != {"error": "agent not found"}:
                    wrong.append(r.text)

        _together(6, work)
        assert answers[("KILL", 200)] == 1
        assert set(answers) <= {("KILL", 200), ("PUT", 200), ("PUT", 404)}, answers
        assert wrong == []
        assert d.get(f"/api/memory/agents/{agent_id}/kv").status_code == 404


READS = {
    "export": lambda s, base: s.get(f"{base}/export"),
    "recall": lambda s, base: s.post(f"{base}/recall", json={"query": "fact number", "limit": 50}),
    "recall with a filter": lambda s, base: s.post(f"{base}/recall", json={
        "query": "fact number", "limit": 50, "filter": {"scope": "semantic"}}),
}


@pytest.mark.parametrize("read", list(READS))
def test_reads_while_fragments_are_deleted(shared_daemon, read: str) -> None:
    d = shared_daemon
    agent_id = spawn(d)
    base = f"{d.url}/api/memory/agents/{agent_id}"
    ids = [d.post(f"/api/memory/agents/{agent_id}/memories",
                  json={"content": f"fact number {i}", "scope": "semantic"}).json()["id"] for i in range(60)]
    done = threading.Event()
    exports: Counter = Counter()

    def export() -> None:
        with requests.Session() as s:
            while not done.is_set():
                r = READS[read](s, base)
                exports[r.status_code] += 1
                if r.status_code == 200:
                    memories = r.json()["memories"]
                    if (not all(m["content"].startswith("fact number ") for m in memories)
                            or len({m["id"] for m in memories}) != len(memories)):
                        exports["wrong list"] += 1

    readers = [threading.Thread(target=export) for _ in range(3)]
    for t in readers:
        t.start()

    def delete(i: int, s: requests.Session) -> None:
        for memory_id in ids[i::3]:
            exports[("DELETE", s.delete(f"{base}/memories/{memory_id}").status_code)] += 1

    _together(3, delete)
    done.set()
    for t in readers:
        t.join()
    assert set(exports) == {200, ("DELETE", 200)}, exports
    assert READS[read](d.http, base).json()["memories"] == []


def test_one_entity_and_relation_added_from_many_clients_at_once(shared_daemon) -> None:
    d = shared_daemon
    agent_id = spawn(d)
    base = f"{d.url}/api/memory/agents/{agent_id}"
    answers: Counter = Counter()

    def work(i: int, s: requests.Session) -> None:
        for j in range(4):
            r = s.post(f"{base}/entities", json={"name": f"Ada{j}", "entity_type": "person", "properties": {f"p{i}": i}})
            answers[("entity", r.status_code)] += 1
        for j in range(1, 4):
            r = s.post(f"{base}/relations", json={"source": "ada0", "relation": "knows", "target": f"Ada{j}"})
            answers[("relation", r.status_code)] += 1

    _together(8, work)
    assert answers == {("entity", 201): 32, ("relation", 201): 24}, \
        f"BUG: one entity added at once by many clients answered {answers}"
    exported = d.get(f"/api/memory/agents/{agent_id}/export").json()
    entities = {e["name"]: e for e in exported["entities"]}
    assert sorted(entities) == ["Ada0", "Ada1", "Ada2", "Ada3"] and len(exported["entities"]) == 4, \
        "BUG: an entity added at once by many clients was created more than once"
    assert all(e["properties"] == {f"p{i}": i for i in range(8)} for e in entities.values()), \
        "BUG: a client's properties were lost to another's merge"
    assert sorted((r["source"], r["relation"], r["target"]) for r in exported["relations"]) == \
        sorted((entities["Ada0"]["id"], "knows", entities[f"Ada{j}"]["id"]) for j in range(1, 4))


CUT_OFF = "run cancelled: the agent was stopped before it answered"


def test_fragments_remembered_while_the_agent_is_deleted_go_with_it(agent_daemon) -> None:
    d = agent_daemon
    warm = spawn(d)  # the embedding model loads once, before the races
    assert d.post(f"/api/memory/agents/{warm}/memories", json={"content": "warm up"}).status_code == 201
    killed: list[str] = []
    answers: Counter = Counter()
    wrong: list[str] = []

    for _ in range(12):
        agent_id = spawn(d)
        killed.append(agent_id)
        base = f"{d.url}/api/memory/agents/{agent_id}"
        writing = threading.Event()

        def work(i: int, s: requests.Session) -> None:
            if i == 0:
                writing.wait(10)  # the deletion lands among the writes, not before them all
                answers[("KILL", s.delete(f"{d.url}/api/agents/{agent_id}").status_code)] += 1
            elif i == 1:
                # Each answered message queues its exchange for the background auto-remember.
                for j in range(4):
                    r = s.post(f"{d.url}/api/agents/{agent_id}/message", json={"message": f"hello {j}"})
                    answers[("MESSAGE", r.status_code)] += 1
                    if r.status_code == 409 and r.json() != {"error": CUT_OFF}:
                        wrong.append(r.text)
            else:
                for j in range(8):
                    r = s.post(f"{base}/memories", json={"content": f"writer {i} fact {j}"})
                    writing.set()
                    answers[("REMEMBER", r.status_code)] += 1
                    if r.status_code == 404 and r.json() != {"error": "agent not found"}:
                        wrong.append(r.text)

        _together(6, work)

    # The worker stores exchanges in the order they were queued: once a later agent's
    # exchange is stored, every exchange of the deleted agents has been handled.
    last = spawn(d)
    assert d.post(f"/api/agents/{last}/message", json={"message": "the last one"}).status_code == 200
    wait_until(lambda: d.get(f"/api/memory/agents/{last}/memories").json()["total"] == 1,
               "the last exchange to be remembered")
    assert answers[("KILL", 200)] == 12 and answers[("REMEMBER", 201)] > 0, answers
    assert set(answers) <= {("KILL", 200), ("REMEMBER", 201), ("REMEMBER", 404),
                            ("MESSAGE", 200), ("MESSAGE", 404), ("MESSAGE", 409)}, answers
    assert wrong == []
    marks = ", ".join("?" for _ in killed)
    left = db_rows(d.home, f"SELECT agent_id, content FROM memory_fragments WHERE agent_id IN ({marks})",
                   tuple(killed))
    assert left == [], f"{len(left)} fragment(s) outlived their deleted agent: {left[:5]}"
