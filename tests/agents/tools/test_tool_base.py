"""The tool plumbing in process: registration, the registry, argument checks with their exact
messages (what the model reads as "error: ..."), and every JSON type at its near misses."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentd.agents.tools import REGISTRY, Tool, ToolContext, ToolError, all_tools, get_tool, validate_args
from agentd.agents.tools.base import tool
from agentd.config import ToolsConfig


def probe(ctx, args) -> str:
    return "ran"


@pytest.fixture()
def registered():
    """A tool registered by `tool()` for one test, then taken out of the registry again."""
    names: list[str] = []

    def make(name: str, *a, **kw) -> Tool:
        names.append(name)
        assert tool(name, *a, **kw)(probe) is probe, "the decorator hands back the function itself"
        return REGISTRY[name]

    yield make
    for name in names:
        REGISTRY.pop(name, None)


def test_tool_registers_an_exact_object_schema(registered) -> None:
    t = registered("zz_probe", "Probe things.", {"a": {"type": "string"}}, ("a",), read_only=True,
                   capability="shell")
    assert t == Tool("zz_probe", "Probe things.",
                     {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                      "additionalProperties": False}, probe, True, "shell")
    assert get_tool("zz_probe") is t and all_tools()[-1] is t, "registration order is the listing order"
    plain = registered("zz_plain", "Plain.", {})
    assert plain.parameters == {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    assert (plain.read_only, plain.capability) == (False, None)
    assert isinstance(plain.parameters["required"], list)


def test_registry_lookup_and_order() -> None:
    assert get_tool("no_such_tool") is None
    names = [t.name for t in all_tools()]
    assert names[:5] == ["file_read", "file_write", "file_list", "create_directory", "apply_patch"]
    assert names.index("system_time") < names.index("process_start") < names.index("docker_exec")
    assert names[-6:] == ["schedule_create", "schedule_list", "schedule_delete", "cron_create", "cron_list",
                          "cron_cancel"] and len(names) == len(set(names)) == len(REGISTRY)
    listed = all_tools()
    listed.clear()
    assert all_tools(), "BUG: all_tools must hand out a copy, not the registry"


def test_require_ops(tmp_path: Path) -> None:
    ctx = ToolContext("a", tmp_path, {}, ToolsConfig())
    assert ctx.ops is None and ctx.cancel is None
    with pytest.raises(ToolError) as info:
        ctx.require_ops()
    assert str(info.value) == "agent operations are not available here"
    ops = object()
    ctx = ToolContext("a", tmp_path, {}, ToolsConfig(), ops=ops, cancel=threading.Event())   # type: ignore[arg-type]
    assert ctx.require_ops() is ops


def message(t: Tool, args) -> str:
    with pytest.raises(ToolError) as info:
        validate_args(t, args)
    return str(info.value)


def test_arguments_must_be_an_object() -> None:
    t = get_tool("file_read")
    for bad in (None, [], "path", 3):
        assert message(t, bad) == "arguments for 'file_read' must be a JSON object"


def test_missing_required_arguments_are_all_named_in_order() -> None:
    write = get_tool("file_write")
    assert message(write, {}) == "'file_write' is missing required argument(s): path, content"
    assert message(write, {"content": "x"}) == "'file_write' is missing required argument(s): path"
    validate_args(write, {"path": "a", "content": ""})   # present but empty is not missing


def test_unknown_arguments() -> None:
    assert message(get_tool("file_write"), {"path": "a", "content": "x", "mode": "w"}) == (
        "'file_write' has no argument 'mode' (expected: path, content)")
    assert message(get_tool("system_time"), {"x": 1}) == "'system_time' has no argument 'x' (expected: none)"


def test_a_schema_without_additional_properties_false_lets_extra_arguments_through() -> None:
    loose = Tool("loose", "", {"type": "object", "properties": {"a": {"type": "string"}}}, probe)
    validate_args(loose, {"a": "x", "extra": 1})
    with pytest.raises(ToolError, match="^argument 'a' of 'loose' must be of type string$"):
        validate_args(loose, {"extra": 1, "a": 5})   # an extra argument first: the rest is still checked
    bare = Tool("bare", "", {"type": "object"}, probe)
    validate_args(bare, {"anything": [1]})
    open_ = Tool("open", "", {"type": "object", "properties": {}, "additionalProperties": True}, probe)
    validate_args(open_, {"x": 1})
    with pytest.raises(ToolError, match="^'loose' has no argument 'x' \\(expected: a\\)$"):
        validate_args(Tool("loose", "", {"properties": {"a": {}}, "additionalProperties": False}, probe), {"x": 1})


TYPES = {
    "string": (["", "x"], [1, None, True, ["x"]]),
    "integer": ([0, -3, 2**40], [True, False, 1.0, "1", None]),
    "number": ([0, 1.5, -2], [True, "1.5", None, [1]]),
    "boolean": ([True, False], [0, 1, "true", None]),
    "array": ([[], [1, "a"]], [(), {}, "[]", None]),
    "object": ([{}, {"a": 1}], [[], "{}", None]),
}


@pytest.mark.parametrize("kind", list(TYPES))
def test_every_json_type_and_its_near_misses(kind: str) -> None:
    t = Tool("typed", "", {"type": "object", "properties": {"v": {"type": kind}}, "required": [],
                           "additionalProperties": False}, probe)
    good, bad = TYPES[kind]
    for value in good:
        validate_args(t, {"v": value})
    for value in bad:
        assert message(t, {"v": value}) == f"argument 'v' of 'typed' must be of type {kind}", value


def test_untyped_and_unknown_types_accept_anything() -> None:
    t = Tool("t", "", {"type": "object", "properties": {"any": {"description": "x"}, "n": {"type": "null"}},
                       "additionalProperties": False}, probe)
    for value in (None, 1, "x", [1], {"a": 1}, True):
        validate_args(t, {"any": value, "n": value})
    validate_args(get_tool("memory_store"), {"key": "k", "value": {"nested": [1]}})


def test_enum_values() -> None:
    fetch = get_tool("web_fetch")
    validate_args(fetch, {"url": "http://x", "method": "HEAD"})
    assert message(fetch, {"url": "http://x", "method": "get"}) == (
        "argument 'method' of 'web_fetch' must be one of ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE']")
    assert message(fetch, {"url": "http://x", "method": 5}) == "argument 'method' of 'web_fetch' must be of type string"
    untyped = Tool("e", "", {"properties": {"level": {"enum": [1, 2]}}}, probe)
    validate_args(untyped, {"level": 2})
    assert message(untyped, {"level": 3}) == "argument 'level' of 'e' must be one of [1, 2]"


def test_a_tool_acts_as_the_runs_key_with_the_scope_it_asks(tmp_path: Path) -> None:
    from agentd.errors import Forbidden
    from agentd.principals import ADMIN

    asked: list[tuple] = []

    class KeyRuns:
        def acting(self, key_id: str, scope: str) -> str:
            asked.append((key_id, scope))
            if scope == "admin":
                raise Forbidden(f"forbidden: API key 'k' is missing scope '{scope}'")
            return f"principal of {key_id}"

    def ctx(**kw) -> ToolContext:
        return ToolContext(agent_id="a", workspace=tmp_path, capabilities={}, tools_config=ToolsConfig(), **kw)

    assert ctx().acting() is ADMIN and ctx(key_id="").acting("read") is ADMIN  # the admin's run
    with pytest.raises(ToolError, match="^scoped API keys are not available here$"):
        ctx(key_id="k1").acting()
    keyed = ctx(key_id="k1", key_runs=KeyRuns())
    assert keyed.acting() == "principal of k1" and keyed.acting("read") == "principal of k1"
    with pytest.raises(ToolError, match="^forbidden: API key 'k' is missing scope 'admin'$"):
        keyed.acting("admin")
    assert asked == [("k1", "manage"), ("k1", "read"), ("k1", "admin")]
