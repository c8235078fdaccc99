"""Session records: what is stored, what the model is sent back, what the API shows."""

from __future__ import annotations

from agentd.agents.session import api_view, clean_history, estimate_tokens, to_llm, to_stored
from agentd.llm.types import Message, ToolCall

CALL = ToolCall("c1", "file_read", {"path": "a"})


def test_stored_shapes_round_trip() -> None:
    plain = Message("user", "hi")
    assert to_stored(plain) == {"role": "user", "content": "hi"}
    asked = Message("assistant", "looking", tool_calls=[CALL])
    assert to_stored(asked) == {"role": "assistant", "content": "looking",
                                "tool_calls": [{"id": "c1", "name": "file_read", "arguments": {"path": "a"}}]}
    result = Message("tool", "text", tool_call_id="c1", tool_name="file_read", is_error=True)
    assert to_stored(result) == {"role": "tool", "content": "text", "tool_call_id": "c1",
                                 "tool_name": "file_read", "is_error": True}
    for message in (plain, asked, result):
        assert to_llm(to_stored(message)) == message, f"BUG: {message.role} message changes when stored"


def test_stored_images_become_markers_for_the_model() -> None:
    images = [{"file_id": "f1"}, {"file_id": "f2"}]
    assert to_llm({"role": "user", "content": "see", "images": images}).content == "see\n[Image][Image]"
    assert to_llm({"role": "user", "content": "", "images": images[:1]}).content == "[Image]"
    assert to_llm({"role": "user"}).content == ""
    assert to_llm({"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "name": "n"}]}).tool_calls == \
        [ToolCall("c", "n", {})]
    assert to_llm({"role": "tool", "content": "r", "tool_call_id": "c"}).is_error is False


def test_dangling_tool_calls_are_dropped_but_their_text_kept() -> None:
    other = ToolCall("c2", "file_read", {})
    messages = [Message("user", "u"), Message("assistant", "half", tool_calls=[CALL, other]),
                Message("tool", "r1", tool_call_id="c1"), Message("assistant", "", tool_calls=[ToolCall("c3", "x", {})]),
                Message("assistant", "answered", tool_calls=[CALL])]
    cleaned = clean_history(messages)
    assert [(m.role, m.content, len(m.tool_calls)) for m in cleaned] == [
        ("user", "u", 0), ("assistant", "half", 0), ("tool", "r1", 0), ("assistant", "answered", 1)], \
        "BUG: a tool call without its result is sent to the provider (or answered ones are dropped)"
    assert clean_history([to_llm(to_stored(m)) for m in messages]) == cleaned


def test_api_view_attaches_tools_to_their_turn() -> None:
    stored = [{"role": "user", "content": "u", "images": [{"file_id": "f"}]},
              {"role": "assistant", "content": "a",
               "tool_calls": [{"id": "c1", "name": "file_read", "arguments": {"path": "a"}},
                              {"id": "c9", "name": "web_fetch"}]},
              {"role": "tool", "content": "r1", "tool_call_id": "c1", "is_error": True},
              {"role": "assistant", "content": "done"}, {"role": "user"}, {"role": "assistant"}]
    assert api_view(stored) == [
        {"role": "User", "content": "u", "images": [{"file_id": "f"}]},
        {"role": "Assistant", "content": "a", "tools": [
            {"name": "file_read", "input": {"path": "a"}, "result": "r1", "is_error": True},
            {"name": "web_fetch", "input": {}, "result": None, "is_error": False}]},
        {"role": "Assistant", "content": "done"},
        {"role": "User", "content": ""},
        {"role": "Assistant", "content": ""}]


def test_token_estimate_is_four_characters_a_token_plus_overhead() -> None:
    assert estimate_tokens([], "") == 0
    assert estimate_tokens([{"content": "x" * 24}], "s" * 4) == (4 + 24 + 16) // 4 == 11
    assert estimate_tokens([{"content": "abc"}, {}], "") == (3 + 16 + 16) // 4 == 8
