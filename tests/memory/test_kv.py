"""Key-value memory keeps every JSON value exactly as written, numbers included, through the
API and the memory tools, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import json

import pytest

from tests.agents.test_agents import say, spawn

# Each value's JSON text, as the daemon answers it back (compact, as it answers JSON).
EXACT = [
    "9007199254740993",                      # 2**53 + 1: past what a double holds
    "9223372036854775807",                   # the largest 64-bit integer
    "-9223372036854775808",
    "18446744073709551617",                  # 2**64 + 1: past 64 bits
    "-9223372036854775809",
    "100000000000000000000000000000000000001",
    "0",
    "1.0",
    "12.5",
    "-0.25",
    "true",
    "null",
    '"18446744073709551617"',
    '{"a":18446744073709551617,"b":[9007199254740993,1.0]}',
]


def _compact(answer: str) -> str:
    # Python's decoder keeps 1.0 a float and big integers exact, so this is the answer's text
    # (an object's keys sorted: PostgreSQL's jsonb keeps them in an order of its own).
    return json.dumps(json.loads(answer), separators=(",", ":"), sort_keys=True)


@pytest.mark.parametrize("text", EXACT)
def test_a_value_reads_back_exactly(agent_daemon, text: str) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = d.put(f"/api/memory/agents/{agent_id}/kv/n", data=text, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert _compact(d.get(f"/api/memory/agents/{agent_id}/kv/n").text) == text
    assert _compact(d.get(f"/api/memory/agents/{agent_id}/kv").text) == '{"n":' + text + "}"


def test_big_integers_overwrite_and_read_back_exactly(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    url = f"/api/memory/agents/{agent_id}/kv/counter"
    for value in (2**64 + 1, 2**64 + 2, 3, 2**70):
        assert d.put(url, json=value).status_code == 200
        assert d.get(url).text == str(value)


def test_the_memory_tools_keep_big_integers(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "messaging"')
    say(d, agent_id, '[[tool:memory_store {"key": "big", "value": 18446744073709551617}]]')
    assert d.get(f"/api/memory/agents/{agent_id}/kv/big").text == "18446744073709551617"
    d.put(f"/api/memory/agents/{agent_id}/kv/other", json=9007199254740993)
    body = say(d, agent_id, '[[tool:memory_recall {"key": "other"}]]').json()
    assert body["response"] == "tool said: 9007199254740993"
