"""Trigger patterns and templates exactly (agentd/triggers/patterns.py), in process."""

from __future__ import annotations

import json

import pytest

from agentd.errors import BadRequest
from agentd.triggers import patterns
from agentd.triggers.bus import AGENT, CHANNEL, CUSTOM, MEMORY, WORKFLOW, Event

OWNER = "owner-id"


def kv(key: str, agent_id: str = OWNER) -> Event:
    return Event(MEMORY, "memory_key_changed", {"agent_id": agent_id, "key": key, "value": 1, "operation": "set"},
                 agent_id=agent_id)


def test_validate_normalises_and_names_what_is_wrong() -> None:
    assert patterns.validate({"content_match": "x"}) == ("content_match", {"content_match": "x"})
    assert patterns.validate({"channel_message": {"channel": "irc"}}) == (
        "channel_message", {"channel_message": {"channel": "irc", "match": ""}})
    cases = [
        ("x", "pattern: must be an object with exactly one of memory_key_pattern, content_match, "
              "workflow_completed, agent_failed, channel_message"),
        ({}, "pattern: must be an object with exactly one of memory_key_pattern, content_match, "
             "workflow_completed, agent_failed, channel_message"),
        ({"cron": "x"}, "pattern: unknown pattern 'cron'; expected one of memory_key_pattern, content_match, "
                        "workflow_completed, agent_failed, channel_message"),
        ({"agent_failed": ""}, "pattern.agent_failed: must be a non-empty string"),
        ({"agent_failed": 5}, "pattern.agent_failed: must be a non-empty string"),
        ({"content_match": "x" * 1001}, "pattern.content_match: at most 1000 characters"),
        ({"channel_message": "irc"}, 'pattern.channel_message: must be an object {"channel", "match"}'),
        ({"channel_message": {"channel": "irc", "extra": 1}},
         'pattern.channel_message: must be an object {"channel", "match"}'),
        ({"channel_message": {"channel": "irc", "match": 3}},
         "pattern.channel_message.match: must be a regular expression of at most 1000 characters"),
        ({"channel_message": {"channel": "irc", "match": "a{99999999999}"}},
         "pattern.channel_message.match: invalid regular expression: the repetition number is too large"),
    ]
    for pattern, message in cases:
        with pytest.raises(BadRequest) as info:
            patterns.validate(pattern)
        assert info.value.message == message
    with pytest.raises(BadRequest) as info:
        patterns.validate({"channel_message": {"channel": "irc", "match": "(a"}}, "c[0]")
    assert info.value.message.startswith("c[0].channel_message.match: invalid regular expression: ")


def test_memory_key_pattern_is_a_case_sensitive_glob_on_the_owners_keys() -> None:
    p = {"memory_key_pattern": "inbox.*"}
    assert patterns.matches(p, OWNER, kv("inbox.1"))
    assert patterns.matches(p, OWNER, kv("inbox."))
    assert not patterns.matches(p, OWNER, kv("Inbox.1"))
    assert not patterns.matches(p, OWNER, kv("my.inbox.1"))
    assert not patterns.matches(p, OWNER, kv("inbox.1", agent_id="someone-else"))
    assert patterns.matches({"memory_key_pattern": "a?c"}, OWNER, kv("abc"))
    assert not patterns.matches({"memory_key_pattern": "a?c"}, OWNER, kv("abbc"))
    custom = Event(CUSTOM, "inbox.1", {}, agent_id=OWNER)
    assert not patterns.matches(p, OWNER, custom), "a custom event is not a KV change"


def test_content_match_searches_type_and_payload_ignoring_case() -> None:
    p = {"content_match": "Deploy"}
    assert patterns.matches(p, OWNER, Event(CUSTOM, "deploy_done", {}))
    assert patterns.matches(p, OWNER, Event(CUSTOM, "x", {"note": "DEPLOY now"}))
    assert patterns.matches({"content_match": "ünï"}, OWNER, Event(CUSTOM, "x", {"k": "ÜNÏ"}))
    assert not patterns.matches(p, OWNER, Event(CUSTOM, "build", {"note": "deplo y"}))
    assert not patterns.matches(p, OWNER, Event(WORKFLOW, "workflow_completed", {"output": "deploy"})), \
        "content_match hears only published events"


def test_workflow_agent_and_channel_patterns() -> None:
    done = Event(WORKFLOW, "workflow_completed", {"workflow_id": "w1", "workflow_name": "nightly"})
    assert patterns.matches({"workflow_completed": "*"}, OWNER, done)
    assert patterns.matches({"workflow_completed": "w1"}, OWNER, done)
    assert patterns.matches({"workflow_completed": "nightly"}, OWNER, done)
    assert not patterns.matches({"workflow_completed": "w2"}, OWNER, done)
    failed = Event(AGENT, "agent_failed", {"agent_id": "a1", "agent_name": "bob"})
    assert patterns.matches({"agent_failed": "*"}, OWNER, failed)
    assert patterns.matches({"agent_failed": "a1"}, OWNER, failed)
    assert patterns.matches({"agent_failed": "bob"}, OWNER, failed)
    assert not patterns.matches({"agent_failed": "a2"}, OWNER, failed)
    assert not patterns.matches({"agent_failed": "*"}, OWNER, done)
    msg = Event(CHANNEL, "channel_message", {"channel": "irc", "text": "order #42 now"})
    assert patterns.matches({"channel_message": {"channel": "irc", "match": r"#\d+"}}, OWNER, msg)
    assert patterns.matches({"channel_message": {"channel": "*", "match": r"now$"}}, OWNER, msg)
    assert patterns.matches({"channel_message": {"channel": "irc", "match": ""}}, OWNER, msg)
    assert not patterns.matches({"channel_message": {"channel": "slack", "match": ""}}, OWNER, msg)
    assert not patterns.matches({"channel_message": {"channel": "irc", "match": "^now"}}, OWNER, msg)


def test_render_replaces_only_the_event_placeholder() -> None:
    event = Event(CUSTOM, "t", {"a": "ü", "b": [1, None]}, agent_id="x", origin="api")
    text = patterns.render("{{event}} {event} {{ event }} {{{event}}} {{event}}", event)
    as_json = json.dumps(event.as_json(), ensure_ascii=False)
    assert text == f"{as_json} {{event}} {{{{ event }}}} {{{as_json}}} {as_json}"
    assert json.loads(as_json) == {"id": event.id, "type": "t", "agent_id": "x", "payload": {"a": "ü", "b": [1, None]},
                                   "timestamp": event.as_json()["timestamp"]}
    assert "origin" not in as_json
