"""Agent sessions (agentd/agents/session_store.py), in process, with exact values.

A real manager on a real store and the fake LLM server: what a run writes (the JSON text
byte for byte, appended without re-encoding the session), what the session view shows,
clearing by session id (near-miss ids), compaction (where it splits, what the model is
asked, the summary that replaces the older messages, failures), and usage rows written
in the run's transaction.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from pony import orm

import support

from agentd.agents.handle import COMPACT_KEEP
from agentd.agents.run_errors import AgentRunError
from agentd.agents.session import estimate_tokens
from agentd.errors import BadRequest, NotFound
from agentd.llm.types import Message, ToolCall
from mgrsupport import Env, Recorder, llm_config, manifest, run, fake, lone_store_only  # noqa: F401 (fake: a fixture)


@pytest.fixture()
def env(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    e = Env(tmp_path, llm_config(fake))
    yield e
    e.close()


@pytest.fixture()
def mgr(env):
    return env.manager()


def stored_rows(env, session_id: str) -> list[tuple[int, str]]:
    """(id, body) of the session's message rows, in order."""
    with orm.db_session:
        return env.store.raw_rows("SELECT id, body FROM session_messages WHERE session = $s ORDER BY id",
                                  {"s": session_id})


def stored_text(env, session_id: str) -> str:
    """The session's rows as one JSON array text: what encoding the whole session gives."""
    return "[" + ", ".join(body for _, body in stored_rows(env, session_id)) + "]"


def put_session(env, session_id: str, messages: list) -> None:
    support.put_session(env.store, session_id, messages)


# -- what a run writes -------------------------------------------------------------------------
def test_runs_append_exact_json_text(env, mgr) -> None:
    h = mgr.spawn(manifest("w"))
    run(mgr, h, "héllo")
    first = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "echo: héllo"}]
    assert stored_text(env, h.session_id) == json.dumps(first, ensure_ascii=False)
    assert h.session_tail == first
    run(mgr, h, "zwei ünd")
    both = first + [{"role": "user", "content": "zwei ünd"}, {"role": "assistant", "content": "echo: zwei ünd"}]
    assert stored_text(env, h.session_id) == json.dumps(both, ensure_ascii=False), \
        "BUG: the appended session text differs from encoding the whole session"
    assert h.session_tail == both
    # A manager that never saw the session reads the same messages.
    other = env.manager()
    other.load()
    assert other.sessions.window(other.get(h.id)) == both


def test_the_cache_keeps_only_the_history_window_and_the_database_everything(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("window").replace("[model]", "max_history_messages = 3\n[model]"))
    for word in ("a", "b", "c"):
        run(mgr, h, word)
    everything = [m for w in ("a", "b", "c") for m in ({"role": "user", "content": w},
                                                       {"role": "assistant", "content": f"echo: {w}"})]
    assert stored_text(env, h.session_id) == json.dumps(everything, ensure_ascii=False), \
        "BUG: messages that left the window were dropped from the database"
    assert h.session_tail == everything[-3:], "BUG: the cache grows past the window"
    # The window [echo: b, c, echo: c] starts at a user turn: "echo: b" is not sent without its question.
    assert [(m["role"], m["content"]) for m in fake.requests[-1]["json"]["messages"][1:]] == [
        ("user", "b"), ("assistant", "echo: b"), ("user", "c")]
    assert [(m["role"], m["content"]) for m in mgr.session(h)["messages"]][:2] == [("User", "a"), ("Assistant", "echo: a")]


def test_the_window_defaults_to_20_messages(env, mgr, fake) -> None:
    for extra in ("", "max_history_messages = 0\n"):
        h = mgr.spawn(manifest(f"default{len(extra)}").replace("[model]", extra + "[model]"))
        put_session(env, h.session_id, [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                                        for i in range(30)])
        h.session_tail = None
        run(mgr, h, "now")
        sent = [m["content"] for m in fake.requests[-1]["json"]["messages"][1:]]
        assert sent == [f"m{i}" for i in range(10, 30)] + ["now"], extra


def test_a_run_appends_to_the_stored_text_as_it_is(env, mgr) -> None:
    h = mgr.spawn(manifest("fresh"))
    put_session(env, h.session_id, [{"role": "user", "content": "old ü"}, {"role": "assistant", "content": "a"}])
    run(mgr, h, "new")
    # The new messages are appended to the stored text as it was (written escaped, elsewhere).
    assert stored_text(env, h.session_id) == json.dumps(
        [{"role": "user", "content": "old ü"}, {"role": "assistant", "content": "a"}])[:-1] + ", " + json.dumps(
        [{"role": "user", "content": "new"}, {"role": "assistant", "content": "echo: new"}], ensure_ascii=False)[1:]


def test_the_model_is_sent_the_history_and_the_history_is_converted_once(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("hist"))
    calls = [{"id": "c1", "name": "file_read", "arguments": {"path": "x"}}]
    put_session(env, h.session_id, [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "t", "tool_calls": calls},
        {"role": "tool", "content": "r", "tool_call_id": "c1", "tool_name": "file_read", "is_error": False},
        {"role": "assistant", "content": "a1"},
        {"role": "assistant", "content": "dangling", "tool_calls": [{"id": "c9", "name": "x", "arguments": {}}]}])
    run(mgr, h, "u2")
    sent = fake.requests[-1]["json"]["messages"]
    assert [(m["role"], m.get("content")) for m in sent] == [
        ("system", "You are a helpful AI agent."), ("user", "u1"), ("assistant", "t"), ("tool", "r"),
        ("assistant", "a1"), ("assistant", "dangling"), ("user", "u2")]
    run(mgr, h, "u3")
    assert [(m["role"], m.get("content")) for m in fake.requests[-1]["json"]["messages"]][-3:] == \
        [("user", "u2"), ("assistant", "echo: u2"), ("user", "u3")]


@lone_store_only   # (on a shared database the window is read from the rows, not this cache)
def test_a_window_without_a_user_turn_is_empty(mgr) -> None:
    h = mgr.spawn(manifest("notuser").replace("[model]", "max_history_messages = 2\n[model]"))
    h.session_tail = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                      {"role": "tool", "content": "r", "tool_call_id": "c"}]
    assert mgr.sessions.window(h) == []
    h.session_tail = [{"role": "tool", "content": "r", "tool_call_id": "c"}, {"role": "user", "content": "u2"}]
    assert mgr.sessions.window(h) == [{"role": "user", "content": "u2"}]
    assert [m.content for m in mgr.sessions.history(h, [{"role": "user", "content": "x"}])] == ["x"]


def test_the_history_reuses_the_messages_of_the_previous_window(mgr) -> None:
    h = mgr.spawn(manifest("reuse"))
    u1, a1 = {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}
    first = mgr.sessions.history(h, [u1, a1])
    assert [(m.role, m.content) for m in first] == [("user", "u1"), ("assistant", "a1")]
    u2 = {"role": "user", "content": "u2", "images": [{"id": "i"}]}
    second = mgr.sessions.history(h, [a1, u2])
    assert second[0] is first[1]  # a1 was converted once
    assert [(m.role, m.content) for m in second] == [("assistant", "a1"), ("user", "u2\n[Image]")]
    assert set(h.llm_tail) == {id(a1), id(u2)}  # u1 left the window and the cache
    # An equal dict that is another object (a session read back from the rows) is converted.
    again = mgr.sessions.history(h, [dict(a1)])
    assert again[0] is not second[0] and again[0].content == "a1"
    # A dangling tool call is still dropped from a reused message's turn.
    call = {"role": "assistant", "content": "c", "tool_calls": [{"id": "c1", "name": "x", "arguments": {}}]}
    mgr.sessions.history(h, [call])
    assert [(m.content, m.tool_calls) for m in mgr.sessions.history(h, [call])] == [("c", [])]


# -- the session view and clearing -------------------------------------------------------------
def test_session_view(env, mgr) -> None:
    h = mgr.spawn(manifest("view", 'system_prompt = "12345678"\n'))
    assert mgr.session(h) == {"session_id": h.session_id, "agent_id": h.id, "message_count": 0,
                              "context_window_tokens": 2, "label": None, "messages": []}
    run(mgr, h, "hello there")
    stored = json.loads(stored_text(env, h.session_id))
    assert mgr.session(h) == {
        "session_id": h.session_id, "agent_id": h.id, "message_count": 2,
        "context_window_tokens": estimate_tokens(stored, "12345678"), "label": None,
        "messages": [{"role": "User", "content": "hello there"}, {"role": "Assistant", "content": "echo: hello there"}]}
    assert estimate_tokens(stored, "12345678") == (8 + 11 + 16 + 17 + 16) // 4
    with orm.db_session:
        env.store.e.SessionRow.get(id=h.session_id).label = "chat"
    assert mgr.session(h)["label"] == "chat"


def test_session_view_of_a_missing_row(env, mgr) -> None:
    h = mgr.spawn(manifest("norow"))
    with orm.db_session:
        env.store.e.SessionRow.get(id=h.session_id).delete()
    view = mgr.session(h)
    assert (view["label"], view["messages"], view["message_count"]) == (None, [], 0)


@lone_store_only
def test_a_cached_session_is_not_read_again(env, mgr) -> None:
    h = mgr.spawn(manifest("cached"))
    assert mgr.sessions.window(h) == []
    put_session(env, h.session_id, [{"role": "user", "content": "written elsewhere"}])
    assert mgr.sessions.window(h) == [], "the session is cached after the first read"
    h.session_tail = None
    assert mgr.sessions.window(h) == [{"role": "user", "content": "written elsewhere"}]
    copy = mgr.sessions.window(h)
    copy.append("x")
    assert h.session_tail == [{"role": "user", "content": "written elsewhere"}], "BUG: the cache was handed out"


def test_on_a_shared_database_the_session_is_read_every_time(env) -> None:
    import dataclasses

    m = env.manager(store=dataclasses.replace(env.store, backend="postgres"))
    h = m.spawn(manifest("sharedsess"))
    assert m.sessions.window(h) == []
    put_session(env, h.session_id, [{"role": "user", "content": "from another daemon"}])
    assert m.sessions.window(h) == [{"role": "user", "content": "from another daemon"}]


def test_delete_session_clears_history_keeps_the_id(env, mgr) -> None:
    h = mgr.spawn(manifest("del"))
    other = mgr.spawn(manifest("other"))
    run(mgr, h, "one")
    run(mgr, other, "two")
    mgr.delete_session(h.session_id.upper())
    assert stored_text(env, h.session_id) == "[]" and h.session_tail == []
    assert mgr.session(h)["messages"] == [] and h.session_id == mgr.get(h.id).session_id
    assert json.loads(stored_text(env, other.session_id))[0]["content"] == "two"
    assert other.session_tail != []
    run(mgr, h, "after")
    assert json.loads(stored_text(env, h.session_id)) == [{"role": "user", "content": "after"},
                                                          {"role": "assistant", "content": "echo: after"}]
    run(mgr, other, "three")
    mgr.reset_session(other)
    assert stored_text(env, other.session_id) == "[]" and other.session_tail == []


def test_delete_session_near_misses(env, mgr) -> None:
    h = mgr.spawn(manifest("near"))
    for bad in ("", "near", h.session_id[:-1], h.session_id + "a"):
        with pytest.raises(BadRequest) as err:
            mgr.delete_session(bad)
        assert err.value.message == f"invalid session id: {bad!r} is not a UUID"
    with pytest.raises(NotFound) as err:
        mgr.delete_session(h.id)   # an agent id is not a session id
    assert err.value.message == "session not found"
    # The row of an agent this manager does not hold is cleared all the same.
    other = env.manager()
    g = other.spawn(manifest("elsewhere"))
    put_session(env, g.session_id, [{"role": "user", "content": "x"}])
    mgr.delete_session(g.session_id)
    assert stored_text(env, g.session_id) == "[]"


# -- compaction --------------------------------------------------------------------------------
def turns(n: int, reply: str = "SUMMARY") -> list[dict]:
    out = [{"role": "user", "content": f"[[reply:{reply}]] first"}]
    for i in range(1, n):
        out.append({"role": "assistant" if i % 2 else "user", "content": f"m{i}"})
    return out


def test_compaction_is_not_needed_up_to_keep_plus_one(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("small"))
    for n in (0, COMPACT_KEEP, COMPACT_KEEP + 1):
        put_session(env, h.session_id, turns(n) if n else [])
        before = len(fake.requests)
        assert mgr.compact(h) == {"status": "ok", "compacted": False, "summarized_messages": 0,
                                  "kept_messages": n, "message": f"no compaction needed ({n} messages)"}
        assert len(fake.requests) == before, "BUG: the model was called for nothing"


def test_compaction_summarises_the_older_messages(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("big", 'system_prompt = "own prompt"\n'))
    messages = turns(COMPACT_KEEP + 2)
    put_session(env, h.session_id, messages)
    result = mgr.compact(h)
    assert result == {"status": "ok", "compacted": True, "summarized_messages": 2, "kept_messages": COMPACT_KEEP,
                      "message": f"compacted 2 messages into a summary of 7 chars, kept {COMPACT_KEEP} recent messages"}
    new = json.loads(stored_text(env, h.session_id))
    assert new == [{"role": "user", "content": "[Summary of the earlier conversation]\nSUMMARY"}] + messages[2:]
    assert h.session_tail == new[-20:]
    body = fake.requests[-1]["json"]
    assert body["model"] == "gpt-4o" and body["max_tokens"] == 1024 and body["temperature"] == 0.3
    assert body["messages"] == [
        {"role": "system", "content": "You summarise conversations. Write a concise summary of the conversation "
                                      "below that keeps every fact, decision, name, number and open task needed "
                                      "to continue it."},
        {"role": "user", "content": "User: [[reply:SUMMARY]] first\n\nAssistant: m1"}]
    assert not body.get("stream")


def test_compaction_never_separates_tool_results_from_their_call(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("tools"))
    messages = [{"role": "user", "content": "[[reply:SUMMARY]] first"}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "m2"}, {"role": "assistant", "content": "m3"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "file_read", "arguments": {}}]},
                {"role": "tool", "content": "r1", "tool_call_id": "c1", "tool_name": "file_read", "is_error": False},
                {"role": "tool", "content": "r2", "tool_call_id": "c2", "tool_name": "file_read", "is_error": False}]
    messages += [{"role": "assistant" if i % 2 else "user", "content": f"k{i}"} for i in range(COMPACT_KEEP - 1)]
    put_session(env, h.session_id, messages)
    split = len(messages) - COMPACT_KEEP
    assert messages[split]["role"] == "tool" and messages[split - 1]["role"] == "tool"
    result = mgr.compact(h)
    assert (result["summarized_messages"], result["kept_messages"]) == (split - 2, COMPACT_KEEP + 2)
    new = json.loads(stored_text(env, h.session_id))
    assert new[1]["tool_calls"][0]["id"] == "c1" and new[1:] == messages[split - 2:]
    # The transcript leaves out messages without content (the tool call) and cuts to 100,000 chars.
    assert fake.requests[-1]["json"]["messages"][1]["content"] == \
        "User: [[reply:SUMMARY]] first\n\nUser: m2\n\nAssistant: m3"


def test_compaction_of_tool_results_only_at_the_start_is_not_needed(env, mgr) -> None:
    h = mgr.spawn(manifest("alltools"))
    messages = [{"role": "user", "content": "u"}] + [
        {"role": "tool", "content": f"r{i}", "tool_call_id": f"c{i}", "tool_name": "x", "is_error": False}
        for i in range(COMPACT_KEEP + 1)]
    put_session(env, h.session_id, messages)
    assert mgr.compact(h)["compacted"] is False
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}] + messages[1:]
    put_session(env, h.session_id, messages)
    result = mgr.compact(h)
    assert result["compacted"] is False and result["message"] == f"no compaction needed ({len(messages)} messages)"


def test_the_transcript_keeps_its_last_100000_characters(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("long"))
    messages = [{"role": "user", "content": "x" * 120_000}, {"role": "assistant", "content": "[[reply:S]] tail"}]
    messages += [{"role": "user", "content": f"k{i}"} for i in range(COMPACT_KEEP)]
    put_session(env, h.session_id, messages)
    result = mgr.compact(h)
    sent = fake.requests[-1]["json"]["messages"][1]["content"]
    assert len(sent) == 100_000 and sent.endswith("\n\nAssistant: [[reply:S]] tail")
    assert result["message"] == f"compacted 2 messages into a summary of 1 chars, kept {COMPACT_KEEP} recent messages"


def test_a_summary_is_stripped_of_think_text_and_never_empty(env, mgr) -> None:
    h = mgr.spawn(manifest("think"))
    put_session(env, h.session_id, [{"role": "user", "content": "[[think]] [[reply:the gist]]"}]
                + turns(COMPACT_KEEP + 2)[1:])
    mgr.compact(h)
    assert json.loads(stored_text(env, h.session_id))[0]["content"] == "[Summary of the earlier conversation]\nthe gist"
    put_session(env, h.session_id, [{"role": "user", "content": "[[reply:<think>only thoughts</think>]]"}]
                + turns(COMPACT_KEEP + 2)[1:])
    result = mgr.compact(h)
    assert json.loads(stored_text(env, h.session_id))[0]["content"] == "[Summary of the earlier conversation]\n(empty summary)"
    assert "summary of 15 chars" in result["message"]


def test_a_failed_compaction_keeps_the_session(env, mgr) -> None:
    h = mgr.spawn(manifest("fail"))
    messages = [{"role": "user", "content": "[[fail:429 retry_after=7]]"}] + turns(COMPACT_KEEP + 2)[1:]
    put_session(env, h.session_id, messages)
    with pytest.raises(AgentRunError) as err:
        mgr.compact(h)
    exc = err.value
    assert exc.message.startswith("compaction failed: ") and "429" in exc.message
    assert (exc.kind, exc.http_status, exc.status) == ("rate_limit", 429, 500)
    assert json.loads(stored_text(env, h.session_id)) == messages
    assert h.run_lock.acquire(blocking=False), "BUG: a failed compaction keeps the agent locked"
    h.run_lock.release()


# -- usage rows ----------------------------------------------------------------------------------
def test_usage_rows_are_written_with_the_session_and_cleared(env) -> None:
    writes = Recorder()
    rows: list = []
    mgr = env.manager(write_usage=lambda tx, usage: (writes(list(usage)), rows.extend(usage)))
    env.usage.value = lambda handle, provider, model, response, usage=None: (
        usage.append({"model": model}) if usage is not None else None) or 0.5
    h = mgr.spawn(manifest("usage"))
    result = run(mgr, h, "count me")
    assert writes.calls == [([{"model": "gpt-4o", "key_id": None}],)]
    assert result.cost_usd == 0.5
    pending = [{"model": "x"}]
    mgr.sessions.flush_usage(pending)
    assert writes.calls[-1] == ([{"model": "x"}],) and pending == []
    mgr.sessions.flush_usage([])
    mgr.sessions.flush_usage(None)
    assert len(writes.calls) == 2
    kept = [{"model": "y"}]
    env.manager().sessions.flush_usage(kept)
    assert kept == [{"model": "y"}]


def test_a_killed_agents_run_writes_its_usage_but_no_session(env) -> None:
    written: list = []
    mgr = env.manager(write_usage=lambda tx, rows: written.extend(rows))
    h = mgr.spawn(manifest("killed"))
    h.killed = True
    usage = [{"model": "m"}]
    mgr.sessions.save(h, [Message("user", "u")], [], usage)
    assert written == [{"model": "m"}] and usage == []
    assert stored_text(env, h.session_id) == "[]"


def test_a_save_after_the_agent_row_is_gone_writes_nothing(env, mgr) -> None:
    h = mgr.spawn(manifest("gone"))
    mgr.sessions.window(h)
    other = env.manager()
    other.load()
    other.kill(other.get(h.id))
    mgr.sessions.save(h, [Message("user", "u")], [])
    with orm.db_session:
        assert env.store.e.SessionRow.get(id=h.session_id) is None
    assert h.session_tail == []


def test_a_save_recreates_a_missing_session_row(env, mgr) -> None:
    h = mgr.spawn(manifest("recreate"))
    mgr.sessions.window(h)
    with orm.db_session:
        env.store.e.SessionRow.get(id=h.session_id).delete()
    before = h.last_active
    mgr.sessions.save(h, [Message("user", "u"), Message("assistant", "a",
                                                               tool_calls=[ToolCall("c", "n", {})])],
                      [{"file_id": "f"}])
    expected = [{"role": "user", "content": "u", "images": [{"file_id": "f"}]},
                {"role": "assistant", "content": "a", "tool_calls": [{"id": "c", "name": "n", "arguments": {}}]}]
    assert json.loads(stored_text(env, h.session_id)) == expected
    assert h.session_tail == expected and h.last_active > before
    with orm.db_session:
        row = env.store.e.SessionRow.get(id=h.session_id)
        assert row.agent.id == h.id
        assert env.store.e.AgentRow.get(id=h.id).last_active.replace(tzinfo=h.last_active.tzinfo) == h.last_active


def test_the_session_row_is_made_sure_of_once_and_only_by_a_save_with_messages(env, mgr) -> None:
    h = mgr.spawn(manifest("row-once"))
    mgr.sessions.window(h)
    mgr.sessions.save(h, [], [])  # nothing to append: the row is not looked at
    assert h.session_row == ""
    with orm.db_session:
        env.store.e.SessionRow.get(id=h.session_id).delete()
    mgr.sessions.save(h, [Message("user", "u")], [])  # recreates it, then remembers that
    assert h.session_row == h.session_id
    assert json.loads(stored_text(env, h.session_id)) == [{"role": "user", "content": "u"}]


def test_run_images_are_recorded_on_the_user_turn_only(env, mgr) -> None:
    h = mgr.spawn(manifest("img"))
    mgr.sessions.save(h, [], [{"file_id": "f"}])
    assert stored_text(env, h.session_id) == "[]"


def test_compaction_waits_for_a_running_run(env, mgr) -> None:
    h = mgr.spawn(manifest("locked"))
    put_session(env, h.session_id, turns(COMPACT_KEEP + 2))
    h.run_lock.acquire()
    done = threading.Event()
    t = threading.Thread(target=lambda: (mgr.compact(h), done.set()))
    t.start()
    assert not done.wait(0.3), "BUG: compaction ran while the agent was busy"
    h.run_lock.release()
    t.join(10)
    assert done.is_set()
    assert uuid.UUID(h.session_id)


def test_compacting_another_session_waits_for_no_run_of_the_agents_own(env, mgr) -> None:
    h = mgr.spawn(manifest("person"))
    other = str(uuid.uuid4())
    mgr.sessions.ensure(h, other, "user:ann")
    put_session(env, other, turns(COMPACT_KEEP + 2))
    h.run_lock.acquire()  # the agent's own session is busy
    try:
        done = threading.Event()
        threading.Thread(target=lambda: (mgr.compact(h, other), done.set()), daemon=True).start()
        assert done.wait(10), "BUG: compacting a person's session waited for the agent's own run"
    finally:
        h.run_lock.release()
    assert json.loads(stored_text(env, other))[0]["content"] == "[Summary of the earlier conversation]\nSUMMARY"
    assert stored_rows(env, h.session_id) == []


def test_a_compacted_session_is_stored_as_unescaped_json_text(env, mgr) -> None:
    h = mgr.spawn(manifest("utf"))
    messages = [{"role": "user", "content": "[[reply:Zusammenfassung für dich]] ä"}] + \
        [{"role": "assistant" if i % 2 else "user", "content": f"ü{i}"} for i in range(1, COMPACT_KEEP + 2)]
    put_session(env, h.session_id, messages)
    kept = [body for _, body in stored_rows(env, h.session_id)][2:]
    mgr.compact(h)
    summary = {"role": "user", "content": "[Summary of the earlier conversation]\nZusammenfassung für dich"}
    # The summary is new text; the recent messages keep their rows as they were.
    assert [body for _, body in stored_rows(env, h.session_id)] == [json.dumps(summary, ensure_ascii=False)] + kept


def test_a_session_without_message_rows_is_empty(env, mgr) -> None:
    h = mgr.spawn(manifest("blank"))
    assert stored_rows(env, h.session_id) == []
    assert mgr.sessions.window(h) == [] and mgr.session(h)["messages"] == []
    run(mgr, h, "x")
    assert json.loads(stored_text(env, h.session_id)) == [{"role": "user", "content": "x"},
                                                          {"role": "assistant", "content": "echo: x"}]


def test_a_run_adds_rows_and_leaves_the_earlier_ones_as_they_are(env, mgr) -> None:
    """Appending costs the new messages only: earlier rows keep their ids and text."""
    h = mgr.spawn(manifest("rows"))
    put_session(env, h.session_id, [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                                    for i in range(40)])
    before = stored_rows(env, h.session_id)
    run(mgr, h, "one more")
    after = stored_rows(env, h.session_id)
    assert after[:40] == before, "BUG: a run rewrote the messages before it"
    assert [body for _, body in after[40:]] == ['{"role": "user", "content": "one more"}',
                                                '{"role": "assistant", "content": "echo: one more"}']
    assert after[40][0] > before[-1][0] and after[41][0] > after[40][0]


def test_a_save_of_many_messages_keeps_their_order(env, mgr) -> None:
    h = mgr.spawn(manifest("order"))
    new = [Message("user" if i % 2 == 0 else "assistant", f"n{i}") for i in range(12)]
    mgr.sessions.save(h, new, [])
    assert [json.loads(body)["content"] for _, body in stored_rows(env, h.session_id)] == [f"n{i}" for i in range(12)]


@pytest.mark.parametrize("size", [1, 3, 20])
def test_an_uncached_window_reads_the_last_rows_only(env, mgr, size) -> None:
    h = mgr.spawn(manifest(f"last{size}").replace("[model]", f"max_history_messages = {size}\n[model]"))
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(45)]
    put_session(env, h.session_id, messages)
    # A row before the window that is not JSON: reading the whole session would fail on it.
    with orm.db_session:
        env.store.db.execute("UPDATE session_messages SET body = 'not JSON' WHERE id = $first",
                             {"first": stored_rows(env, h.session_id)[0][0]})
    h.session_tail = None
    expected = messages[-size:]
    assert mgr.sessions.window(h) == expected[next(i for i, m in enumerate(expected) if m["role"] == "user"):]
    assert h.session_tail == expected


def test_a_missing_session_row_reads_as_empty(env, mgr) -> None:
    h = mgr.spawn(manifest("rowless"))
    with orm.db_session:
        env.store.e.SessionRow.get(id=h.session_id).delete()
    h.session_tail = None
    assert mgr.sessions.window(h) == [] and h.session_tail == []


def test_no_usage_rows_no_usage_write(env) -> None:
    calls: list = []
    mgr = env.manager(write_usage=lambda tx, rows: calls.append(rows))
    h = mgr.spawn(manifest("nousage"))
    mgr.sessions.save(h, [Message("user", "u")], [], [])
    mgr.sessions.save(h, [Message("user", "v")], [], None)
    assert calls == [] and len(json.loads(stored_text(env, h.session_id))) == 2


def test_compaction_of_a_session_of_tool_results_only(env, mgr) -> None:
    h = mgr.spawn(manifest("onlytools"))
    messages = [{"role": "tool", "content": f"r{i}", "tool_call_id": f"c{i}", "tool_name": "x", "is_error": False}
                for i in range(COMPACT_KEEP + 3)]
    put_session(env, h.session_id, messages)
    assert mgr.compact(h)["message"] == f"no compaction needed ({COMPACT_KEEP + 3} messages)"


def test_compaction_steps_back_over_a_single_tool_result(env, mgr) -> None:
    h = mgr.spawn(manifest("onetool"))
    messages = [{"role": "user", "content": "[[reply:S]] a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "x", "arguments": {}}]},
                {"role": "tool", "content": "r1", "tool_call_id": "c1", "tool_name": "x", "is_error": False}]
    messages += [{"role": "assistant" if i % 2 else "user", "content": f"k{i}"} for i in range(COMPACT_KEEP - 1)]
    put_session(env, h.session_id, messages)
    assert messages[len(messages) - COMPACT_KEEP]["role"] == "tool"
    result = mgr.compact(h)
    assert (result["summarized_messages"], result["kept_messages"]) == (3, COMPACT_KEEP + 1)
    assert json.loads(stored_text(env, h.session_id))[1:] == messages[3:]


def _setting(env, key: str):
    with orm.db_session:
        row = env.store.e.Setting.get(key=key)
        return None if row is None else row.value


def test_usage_and_the_run_record_are_written_in_the_sessions_own_transaction(env) -> None:
    """write_usage and `also` get the session write's transaction and write through it."""
    put = "INSERT INTO settings (key, value) VALUES ($k, $v)"
    mgr = env.manager(write_usage=lambda tx, rows: [tx.execute(put, {"k": f"usage-{r['model']}", "v": '"u"'})
                                                    for r in rows])
    h = mgr.spawn(manifest("txs"))
    mgr.sessions.save(h, [Message("user", "u")], [], [{"model": "a"}],
                      also=lambda tx: tx.execute(put, {"k": "also", "v": '"r"'}))
    assert (_setting(env, "usage-a"), _setting(env, "also")) == ("u", "r")
    mgr.sessions.flush_usage([{"model": "b"}])
    assert _setting(env, "usage-b") == "u"

    def fails(tx):
        tx.execute(put, {"k": "rolled-back", "v": '"x"'})
        raise RuntimeError("the close failed")

    with pytest.raises(RuntimeError):
        mgr.sessions.save(h, [Message("user", "v")], [], [{"model": "c"}], also=fails)
    assert (_setting(env, "rolled-back"), _setting(env, "usage-c")) == (None, None), \
        "BUG: part of a failed session write was committed"
    assert len(json.loads(stored_text(env, h.session_id))) == 1
