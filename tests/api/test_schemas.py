"""The functions of the API's schema modules exactly: `stop` of the chat request (a string or
up to 4 strings, at and one past the limit), the memory schemas' text and type fields (their
limits, blank values, the documented shapes), and the `@doc` registry. mutmut 3 mutates only
functions, and these run when the modules are imported, so they are called here directly as
well as through the schemas the routes use."""

from __future__ import annotations

import pytest
from marshmallow import Schema, ValidationError

from agentd.api import apidoc, schemas_memory
from agentd.api.schemas import CHAT_REQUEST_SCHEMA, NOT_BLANK, StopField


def chat(**extra) -> dict:
    return CHAT_REQUEST_SCHEMA.load({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra})


# -- stop ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, loaded", [
    ("END", ("END",)), ("", ("",)), ([], ()), (["a"], ("a",)), (["a", "b", "c", "d"], ("a", "b", "c", "d"))])
def test_stop_loads_as_a_tuple(value, loaded) -> None:
    assert StopField(allow_none=True).deserialize(value) == loaded
    assert chat(stop=value)["stop"] == loaded


def test_stop_null() -> None:
    assert StopField(allow_none=True).deserialize(None) is None
    assert chat(stop=None)["stop"] is None
    with pytest.raises(ValidationError) as info:
        StopField().deserialize(None)
    assert info.value.messages == ["Field may not be null."]


@pytest.mark.parametrize("value", [["a", "b", "c", "d", "e"], ["a", 5], [None], 5, {"a": 1}, ("a",), True,
                                   [["a"]]])
def test_stop_refused(value) -> None:
    with pytest.raises(ValidationError) as info:
        StopField().deserialize(value)
    assert info.value.messages == ["must be a string or an array of at most 4 strings"]
    with pytest.raises(ValidationError) as info:
        chat(stop=value)
    assert info.value.messages == {"stop": ["must be a string or an array of at most 4 strings"]}


# -- memory schema helpers ----------------------------------------------------------------------------------------

def load_one(field, value):
    schema = Schema.from_dict({"f": field})()
    return schema.load({"f": value})["f"]


def test_text_field_limit_and_blank() -> None:
    field = schemas_memory._text(5, required=True)
    assert field.required is True
    assert load_one(schemas_memory._text(5), "abcde") == "abcde"
    assert load_one(schemas_memory._text(5), " a ") == " a "
    with pytest.raises(ValidationError) as info:
        load_one(schemas_memory._text(5), "abcdef")
    assert info.value.messages == {"f": ["Longer than maximum length 5."]}
    for blank in ("", "   ", "\n\t"):
        with pytest.raises(ValidationError) as info:
            load_one(schemas_memory._text(5), blank)
        assert info.value.messages == {"f": ["String does not match expected pattern."]}
    field = schemas_memory._text(9, allow_none=True, metadata={"description": "d"})
    assert field.allow_none is True and field.metadata == {"description": "d"}
    assert [type(v).__name__ for v in field.validators] == ["Length", "Regexp"]
    assert field.validators[0].max == 9 and field.validators[0].min is None
    assert field.validators[1].regex.pattern == NOT_BLANK


STRING = {"type": "string", "maxLength": 64, "pattern": NOT_BLANK}
CUSTOM = {"type": "object", "required": ["custom"], "additionalProperties": False,
          "properties": {"custom": {"type": "string", "maxLength": 64, "pattern": NOT_BLANK}}}


def test_kind_field_shapes() -> None:
    field = schemas_memory._kind(required=True, metadata={"description": "kinds"})
    assert field.required is True and field.allow_none is False
    assert field.metadata == {"anyOf": [STRING, CUSTOM], "description": "kinds"}
    optional = schemas_memory._kind(allow_none=True)
    assert optional.allow_none is True
    assert optional.metadata == {"anyOf": [STRING, CUSTOM, {"type": "null"}]}
    assert schemas_memory._kind(allow_none=False).metadata == {"anyOf": [STRING, CUSTOM]}
    assert schemas_memory._kind().metadata == {"anyOf": [STRING, CUSTOM]}
    assert load_one(schemas_memory._kind(), {"custom": "x"}) == {"custom": "x"}


# -- apidoc ---------------------------------------------------------------------------------------------------------

def test_doc_attaches_an_operation() -> None:
    def view():
        return None

    assert apidoc.operation_of(view) is None
    marked = apidoc.doc("Summary", tags="agents", ok=201, errors={404: "x"})(view)
    assert marked is view
    op = apidoc.operation_of(view)
    assert op == apidoc.Operation("Summary", tags=("agents",), ok=201, errors={404: "x"})
    assert apidoc.doc("S", tags=("a", "b"))(lambda: None).__apidoc__.tags == ("a", "b")
    assert apidoc.doc("S")(lambda: None).__apidoc__ == apidoc.Operation("S")


@pytest.mark.parametrize("rule, api", [
    ("/api/agents", True), ("/v1/models", True), ("/api", False), ("/api/", True), ("/v1", False),
    ("/apix/a", False), ("/static/x", False), ("/", False), ("/dashboard/api/x", False),
    ("/metrics", True), ("/metrics/x", False), ("/mcp", True), ("/mcp/x", False), ("/a2a", True),
    ("/a2a/agents/<name>", True), ("/.well-known/agent-card.json", True), ("/.well-known/agent.json", True),
    ("/.well-known/other", False), ("/channels/<name>/webhook", False)])
def test_is_api_path(rule: str, api: bool) -> None:
    assert apidoc.is_api_path(rule) is api


# -- fast loads: the common bodies without marshmallow, exactly what load() returns -------------------------------

from agentd.api import body as body_module  # noqa: E402
from agentd.api.schemas import MESSAGE_SCHEMA, ChatRequestSchema, MessageSchema  # noqa: E402
from agentd.errors import BadRequest  # noqa: E402

USER = {"role": "user", "content": "hi"}

# Bodies the fast path takes: (schema, body).
FAST = [
    (MESSAGE_SCHEMA, {"message": "hello"}),
    (MESSAGE_SCHEMA, {"message": " x \n"}),
    (MESSAGE_SCHEMA, {"message": "hello", "sender_id": "u1", "extra": [1]}),  # unknown keys dropped
    (CHAT_REQUEST_SCHEMA, {"model": "agentd:a", "messages": [USER]}),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER], "stream": True}),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER], "stream": False}),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [{"role": r, "content": None} for r in
                                                     ("system", "developer", "user", "assistant", "tool")]}),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [{"role": "user"}]}),  # content is optional
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}],
                                                       "name": "n", "tool_call_id": 5}]}),  # kept (INCLUDE)
]

# Bodies it leaves to load(): (schema, body, load()'s error or None when valid).
SLOW = [
    (MESSAGE_SCHEMA, {"message": "hi", "attachments": []}, None),
    (MESSAGE_SCHEMA, {"message": "hi", "attachments": None, "user": None, "session": None}, None),
    (MESSAGE_SCHEMA, {"message": "  \n\t"}, "message: must not be empty"),
    (MESSAGE_SCHEMA, {"message": ""}, "message: must not be empty"),
    (MESSAGE_SCHEMA, {"message": 5}, "message: Not a valid string."),
    (MESSAGE_SCHEMA, {"message": None}, "message: Field may not be null."),
    (MESSAGE_SCHEMA, {}, "message: Missing data for required field."),
    (MESSAGE_SCHEMA, {"text": "hi"}, "message: Missing data for required field."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER], "temperature": 0.5}, None),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER], "custom": 1}, None),
    (CHAT_REQUEST_SCHEMA, {"model": "", "messages": [USER]}, None),
    (CHAT_REQUEST_SCHEMA, {"model": 5, "messages": [USER]}, "model: Not a valid string."),
    (CHAT_REQUEST_SCHEMA, {"messages": [USER]}, "model: Missing data for required field."),
    (CHAT_REQUEST_SCHEMA, {"model": "m"}, "messages: Missing data for required field."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": []}, None),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": USER}, "messages: Not a valid list."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": (USER,)}, None),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER], "stream": 1}, "stream: Not a valid boolean."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER], "stream": None}, None),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [USER, "x"]}, "messages.1: Invalid input type."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [{"role": "bot"}]},
     "messages.0.role: Must be one of: system, developer, user, assistant, tool."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [{"role": ["user"]}]}, "messages.0.role: Not a valid string."),
    (CHAT_REQUEST_SCHEMA, {"model": "m", "messages": [{"content": "x"}]},
     "messages.0.role: Missing data for required field."),
]


@pytest.mark.parametrize("schema, data", FAST)
def test_the_fast_load_is_what_load_returns(schema, data) -> None:
    fast = schema.fast_load(data)
    assert fast is not None, "the common body should not need marshmallow"
    assert fast == schema.load(data)
    assert body_module.validate(schema, data) == fast
    if schema is CHAT_REQUEST_SCHEMA:  # new dicts: the route may change them without touching the body
        assert fast is not data and all(a is not b for a, b in zip(fast["messages"], data["messages"]))


@pytest.mark.parametrize("schema, data, error", SLOW)
def test_other_bodies_go_through_load(schema, data, error) -> None:
    assert schema.fast_load(data) is None
    if error is None:
        assert body_module.validate(schema, data) == schema.load(data)
        return
    with pytest.raises(BadRequest) as info:
        body_module.validate(schema, data)
    assert info.value.message == f"invalid request: {error}"


def test_the_fast_loads_belong_to_the_schema_classes() -> None:
    assert MessageSchema().fast_load({"message": "a"}) == {"message": "a", "attachments": []}
    assert ChatRequestSchema().fast_load({"model": "m", "messages": [USER]}) == {"model": "m", "messages": [USER]}
    fresh = [MESSAGE_SCHEMA.fast_load({"message": "a"})["attachments"] for _ in range(2)]
    assert fresh[0] is not fresh[1], "BUG: one attachments list shared by every request"
