"""agentd/api/body.py exactly: size limits at and one past the cap (declared and streamed),
content types, empty bodies, JSON syntax and depth, wrong types and the exact messages a
client reads. In process through a Flask app with the real error handlers (fast: mutation
testing runs these per mutant); tests/api/test_http_shell.py checks the same through the daemon.
"""

from __future__ import annotations

import io
import json

import pytest
from flask import Flask, jsonify
from marshmallow import Schema, fields, validate as mvalidate

from agentd.api import body
from agentd.api.routes_agents import MANIFEST_BODY_LIMIT
from agentd.api.errors import register_error_handlers
from agentd import jsonsafe
from agentd.jsonsafe import MAX_DEPTH, TOO_DEEP_MESSAGE


class Inner(Schema):
    size = fields.Integer(required=True, validate=mvalidate.Range(min=1))


class Thing(Schema):
    name = fields.String(required=True)
    count = fields.Integer(load_default=0)
    inner = fields.Nested(Inner)
    items = fields.List(fields.Nested(Inner))


def make_app() -> Flask:
    app = Flask("body-test")
    register_error_handlers(app)

    def answer(value):
        return jsonify({"value": value})

    app.add_url_rule("/api/json", "json", lambda: answer(body.json_body()), methods=["POST"])
    app.add_url_rule("/api/json-empty", "json_empty", lambda: answer(body.json_body(allow_empty=True)),
                     methods=["POST"])
    app.add_url_rule("/api/json-small", "json_small", lambda: answer(body.json_body(10)), methods=["POST"])
    app.add_url_rule("/api/raw-small", "raw_small", lambda: answer(body.raw_body(10).decode()), methods=["POST"])
    app.add_url_rule("/api/load", "load", lambda: answer(body.load(Thing())), methods=["POST"])
    app.add_url_rule("/api/load-empty", "load_empty", lambda: answer(body.load(Thing(partial=True), allow_empty=True)),
                     methods=["POST"])
    app.add_url_rule("/api/load-small", "load_small",
                     lambda: answer(body.load(Thing(partial=True), 16, allow_empty=True)), methods=["POST"])
    return app


@pytest.fixture(scope="module")
def client():
    return make_app().test_client()


def post(client, path: str, data: bytes | str, content_type: str | None = "application/json", **kwargs):
    headers = kwargs.pop("headers", {})
    if content_type is not None:
        headers["Content-Type"] = content_type
    return client.post(path, data=data, headers=headers, **kwargs)


def error(r) -> str:
    assert r.is_json, r.get_data(as_text=True)
    return r.get_json()["error"]


# -- size ---------------------------------------------------------------------------------------

def test_json_body_limit_is_exactly_1_5_mib(client) -> None:
    assert body.JSON_BODY_LIMIT == 1_572_864 == 1536 * 1024
    at_limit = json.dumps("x" * (body.JSON_BODY_LIMIT - 2)).encode()
    assert len(at_limit) == body.JSON_BODY_LIMIT
    r = post(client, "/api/json", at_limit)
    assert r.status_code == 200, "BUG: a body exactly at the limit was refused"
    assert len(r.get_json()["value"]) == body.JSON_BODY_LIMIT - 2
    one_past = json.dumps("x" * (body.JSON_BODY_LIMIT - 1)).encode()
    r = post(client, "/api/json", one_past)
    assert r.status_code == 413, "BUG: a body one byte past the limit was accepted"
    assert error(r) == "request body too large: 1572865 bytes (limit 1572864)"


@pytest.mark.parametrize("size, status", [(9, 200), (10, 200), (11, 413)])
def test_declared_length_at_and_past_a_small_cap(client, size: int, status: int) -> None:
    r = post(client, "/api/raw-small", b"a" * size, content_type="text/plain")
    assert r.status_code == status, f"BUG: a {size}-byte body against a 10-byte cap answered {r.status_code}"
    if status == 413:
        assert error(r) == f"request body too large: {size} bytes (limit 10)"
    else:
        assert r.get_json() == {"value": "a" * size}


@pytest.mark.parametrize("size, status", [(10, 200), (11, 413), (5000, 413)])
def test_streamed_body_without_length_is_capped(client, size: int, status: int) -> None:
    # A chunked body: the server (waitress) terminates the stream and says so.
    r = client.post("/api/raw-small", input_stream=io.BytesIO(b"b" * size),
                    headers={"Transfer-Encoding": "chunked", "Content-Type": "text/plain"},
                    environ_base={"wsgi.input_terminated": True})
    assert r.status_code == status, f"BUG: a streamed {size}-byte body against a 10-byte cap answered {r.status_code}"
    if status == 413:
        assert error(r) == "request body too large (limit 10 bytes)"
    else:
        assert r.get_json() == {"value": "b" * size}


def test_streamed_body_is_read_no_further_than_one_byte_past_the_cap(client) -> None:
    # An endless upload must not be read whole before it is refused.
    stream = io.BytesIO(b"c" * 5000)
    r = client.post("/api/raw-small", input_stream=stream, headers={"Transfer-Encoding": "chunked"},
                    environ_base={"wsgi.input_terminated": True})
    assert r.status_code == 413
    assert stream.tell() == 11, f"BUG: {stream.tell()} bytes of a streamed body were read for a 10-byte cap"


def test_small_json_cap(client) -> None:
    assert post(client, "/api/json-small", b'"12345678"').get_json() == {"value": "12345678"}
    r = post(client, "/api/json-small", b'"123456789"')
    assert r.status_code == 413 and error(r) == "request body too large: 11 bytes (limit 10)"


def reader_app() -> Flask:
    """Routes that read the body more than once, or by werkzeug after raw_body."""
    app = Flask("body-readers")
    register_error_handlers(app)
    from flask import request

    def twice():
        first = body.raw_body(100)
        return jsonify({"first": first.decode(), "again": body.json_body(100),
                        "werkzeug": request.get_data(as_text=True)})

    def form():
        body.raw_body(1000)
        return jsonify({"file": request.files["file"].read().decode(), "name": request.form.get("name")})

    def caps():
        first = body.raw_body(100)
        return jsonify({"first": first.decode(), "then": body.raw_body(3).decode()})

    def after_werkzeug():
        form = request.form.to_dict()  # werkzeug reads the body first (as a CSRF check may)
        return jsonify({"form": form, "raw": body.raw_body(100).decode(), "werkzeug": request.get_data(as_text=True)})

    app.add_url_rule("/api/after-werkzeug", "after_werkzeug", after_werkzeug, methods=["POST"])
    app.add_url_rule("/api/twice", "twice", twice, methods=["POST"])
    app.add_url_rule("/api/form", "form", form, methods=["POST"])
    app.add_url_rule("/api/caps", "caps", caps, methods=["POST"])
    return app


def test_a_body_read_again_is_the_same_bytes() -> None:
    # raw_body reads a declared body once; json_body and werkzeug's own get_data read it again.
    r = reader_app().test_client().post("/api/twice", data=b'{"k": "v"}', content_type="application/json")
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json() == {"first": '{"k": "v"}', "again": {"k": "v"}, "werkzeug": '{"k": "v"}'}


def test_a_body_werkzeug_began_reading_is_left_to_werkzeug() -> None:
    r = reader_app().test_client().post("/api/after-werkzeug", data=b"a=1&b=2",
                                        content_type="application/x-www-form-urlencoded")
    assert r.status_code == 200, r.get_data(as_text=True)
    got = r.get_json()
    assert got["form"] == {"a": "1", "b": "2"} and got["raw"] == got["werkzeug"]
    # Its declared size is still held to the cap (100 here).
    for size, status in ((100, 200), (101, 413)):
        r = reader_app().test_client().post("/api/after-werkzeug", data=b"a=" + b"x" * (size - 2),
                                            content_type="application/x-www-form-urlencoded")
        assert r.status_code == status, (size, r.get_data(as_text=True))
        if status == 413:
            assert error(r) == "request body too large: 101 bytes (limit 100)"


def test_a_chunked_body_read_twice_is_the_same_bytes(client) -> None:
    # load(allow_empty=True) reads the body for its empty check, then again to parse it.
    r = client.post("/api/load-empty", input_stream=io.BytesIO(b'{"name": "x", "count": 2}'),
                    headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"},
                    environ_base={"wsgi.input_terminated": True})
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json() == {"value": {"name": "x", "count": 2}}


@pytest.mark.parametrize("size, declared, status", [(10, 11, 200), (11, 5, 413)])
def test_a_transfer_coding_wins_over_a_declared_length(client, size: int, declared: int, status: int) -> None:
    # (RFC 9112: the Content-Length beside a Transfer-Encoding is ignored; werkzeug reads the body.)
    r = client.post("/api/raw-small", input_stream=io.BytesIO(b"d" * size),
                    headers={"Transfer-Encoding": "chunked", "Content-Type": "text/plain"},
                    environ_base={"wsgi.input_terminated": True}, environ_overrides={"CONTENT_LENGTH": str(declared)})
    assert r.status_code == status, r.get_data(as_text=True)
    if status == 413:
        assert error(r) == "request body too large (limit 10 bytes)"
    else:
        assert r.get_json() == {"value": "d" * size}


def test_a_second_read_applies_its_own_cap() -> None:
    r = reader_app().test_client().post("/api/caps", data=b"abcd", content_type="text/plain")
    assert r.status_code == 413 and error(r) == "request body too large: 4 bytes (limit 3)"
    r = reader_app().test_client().post("/api/caps", data=b"abc", content_type="text/plain")
    assert r.get_json() == {"first": "abc", "then": "abc"}


def test_a_form_is_parsed_after_raw_body_read_it() -> None:
    r = reader_app().test_client().post("/api/form", data={"file": (io.BytesIO(b"file text"), "a.txt"), "name": "n1"},
                                        content_type="multipart/form-data")
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.get_json() == {"file": "file text", "name": "n1"}


def test_a_body_shorter_than_its_declared_length_is_a_400(client) -> None:
    r = client.post("/api/raw-small", input_stream=io.BytesIO(b"abc"),
                    headers={"Content-Type": "text/plain"}, environ_overrides={"CONTENT_LENGTH": "8"})
    assert r.status_code == 400 and error(r) == "request body ended after 3 of its 8 bytes"


def test_a_declared_body_is_read_no_further_than_its_length(client) -> None:
    stream = io.BytesIO(b"12345" + b"x" * 100)
    r = client.post("/api/raw-small", input_stream=stream, headers={"Content-Type": "text/plain"},
                    environ_overrides={"CONTENT_LENGTH": "5"})
    assert r.get_json() == {"value": "12345"}
    assert stream.tell() == 5, f"BUG: {stream.tell()} bytes read for a 5-byte body"


@pytest.mark.parametrize("length", ["+5", " 5", "5.0", "٥"])
def test_an_odd_content_length_goes_through_werkzeug(client, length: str) -> None:
    # Only plain ASCII digits take the direct read; anything else is werkzeug's to judge.
    r = client.post("/api/raw-small", input_stream=io.BytesIO(b"12345"),
                    headers={"Content-Type": "text/plain"}, environ_overrides={"CONTENT_LENGTH": length})
    assert r.status_code in (200, 400), r.get_data(as_text=True)
    assert r.status_code != 500


def test_an_empty_declared_body(client) -> None:
    stream = io.BytesIO(b"left over")
    r = client.post("/api/json-empty", input_stream=stream, environ_overrides={"CONTENT_LENGTH": "0"})
    assert r.status_code == 200 and r.get_json() == {"value": None}
    assert stream.tell() == 0


# -- empty bodies and content types ----------------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"   ", b"\n\t "])
def test_empty_body(client, data: bytes) -> None:
    r = post(client, "/api/json", data)
    assert r.status_code == 400 and error(r) == "request body is empty; expected JSON"
    # Empty is checked first: the content type of an empty body does not matter.
    r = post(client, "/api/json", data, content_type="text/plain")
    assert r.status_code == 400 and error(r) == "request body is empty; expected JSON"
    r = post(client, "/api/json-empty", data, content_type=None)
    assert r.status_code == 200 and r.get_json() == {"value": None}, "BUG: an allowed empty body was refused"


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON", "application/vnd.api+json",
                                          "application/merge-patch+json"])
def test_json_content_types_are_accepted(client, content_type: str) -> None:
    r = post(client, "/api/json", b'{"a": [1, 2.5, null, true]}', content_type=content_type)
    assert r.status_code == 200, f"BUG: Content-Type {content_type} refused"
    assert r.get_json() == {"value": {"a": [1, 2.5, None, True]}}


@pytest.mark.parametrize("content_type, shown", [
    ("text/plain", "text/plain"), ("text/plain; charset=utf-8", "text/plain; charset=utf-8"),
    ("application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),
    ("application/jsonp", "application/jsonp"), ("application/json+xml", "application/json+xml"),
    ("multipart/form-data; boundary=x", "multipart/form-data; boundary=x"), (None, "none"),
])
def test_other_content_types_are_415(client, content_type, shown: str) -> None:
    r = post(client, "/api/json", b'{"a": 1}', content_type=content_type)
    assert r.status_code == 415, f"BUG: Content-Type {content_type} accepted as JSON"
    assert error(r) == f"Content-Type must be application/json (got {shown})"


# -- syntax and depth --------------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    (b"{not json", "malformed JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    (b'{"a": }', "malformed JSON: Expecting value at line 1 column 7"),
    (b'{"a": 1,\n "b": ]}', "malformed JSON: Expecting value at line 2 column 7"),
    (b'[1, 2', "malformed JSON: Expecting ',' delimiter at line 1 column 6"),
    (b'"\xff"', "malformed JSON: body is not UTF-8"),
    (b'{"a": 1} x', "malformed JSON: Extra data at line 1 column 10"),
])
def test_malformed_json_messages(client, data: bytes, message: str) -> None:
    r = post(client, "/api/json", data)
    assert r.status_code == 400 and error(r) == message


@pytest.mark.parametrize("data, message", [
    (b'{"a": NaN}', "malformed JSON: numbers must be finite (no NaN, Infinity or values past 1.8e308)"),
    (b'["\\ud800"]', "malformed JSON: a string holds a lone surrogate (\\ud800-\\udfff without its pair)"),
])
def test_what_json_cannot_hold_is_a_400_naming_it(client, data: bytes, message: str) -> None:
    r = post(client, "/api/json", data)
    assert r.status_code == 400 and error(r) == message


def test_nesting_at_and_past_the_limit(client) -> None:
    assert MAX_DEPTH == 64
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert post(client, "/api/json", ok).status_code == 200
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    r = post(client, "/api/json", deep)
    assert r.status_code == 400 and error(r) == TOO_DEEP_MESSAGE == "JSON nested too deeply"
    r = post(client, "/api/json", b"[" * 100_000)
    assert r.status_code == 400 and error(r) == "JSON nested too deeply"


def test_any_json_value_is_returned_by_json_body(client) -> None:
    for value in (None, 0, -1.5, "x", [], {}, [{"a": None}], True):
        r = post(client, "/api/json", json.dumps(value))
        assert r.status_code == 200 and r.get_json() == {"value": value}


# -- schemas -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, kind", [("null", "NoneType"), ("[1, 2]", "list"), ('"x"', "str"), ("5", "int"),
                                        ("1.5", "float"), ("true", "bool")])
def test_load_needs_an_object(client, data: str, kind: str) -> None:
    r = post(client, "/api/load", data)
    assert r.status_code == 400 and error(r) == f"request body must be a JSON object, got {kind}"
    r = post(client, "/api/load-empty", data)
    assert r.status_code == 400 and error(r) == f"request body must be a JSON object, got {kind}", \
        "BUG: a JSON null body counted as an empty one"


def test_load_validates_with_exact_field_messages(client) -> None:
    r = post(client, "/api/load", json.dumps({"name": "a", "count": "7"}))
    assert r.status_code == 200 and r.get_json() == {"value": {"name": "a", "count": 7}}
    r = post(client, "/api/load", json.dumps({"count": "x"}))
    assert r.status_code == 400
    assert error(r) == "invalid request: name: Missing data for required field.; count: Not a valid integer."
    r = post(client, "/api/load", json.dumps({"name": "a", "inner": {"size": 0}, "extra": 1}))
    assert error(r) == ("invalid request: inner.size: Must be greater than or equal to 1.; "
                        "extra: Unknown field.")
    r = post(client, "/api/load", json.dumps({"name": "a", "items": [{"size": 1}, {"size": "q"}]}))
    assert error(r) == "invalid request: items.1.size: Not a valid integer."


def test_load_of_empty_bodies(client) -> None:
    r = post(client, "/api/load", b"")
    assert r.status_code == 400 and error(r) == "request body is empty; expected JSON", \
        "BUG: load() accepts an empty body without allow_empty"
    r = post(client, "/api/load-empty", b"  ", content_type=None)
    assert r.status_code == 200 and r.get_json() == {"value": {}}
    # A real body on an allow-empty route is read (once) and validated.
    r = post(client, "/api/load-empty", json.dumps({"name": "z", "count": 3}))
    assert r.status_code == 200 and r.get_json() == {"value": {"name": "z", "count": 3}}
    r = post(client, "/api/load-empty", json.dumps({"count": "x"}))
    assert r.status_code == 400 and error(r) == "invalid request: count: Not a valid integer."
    r = post(client, "/api/load-empty", b'{"name": "z"}', content_type="text/plain")
    assert r.status_code == 415


def test_load_cap_applies_on_the_empty_check_too(client) -> None:
    assert post(client, "/api/load-small", b'{"count": 12345}').status_code == 200
    r = post(client, "/api/load-small", b'{"count": 123456}')
    assert r.status_code == 413 and error(r) == "request body too large: 17 bytes (limit 16)"


# -- format_validation -------------------------------------------------------------------------------

@pytest.mark.parametrize("messages, prefix, text", [
    ("bad", "", "bad"),
    ("bad", "f", "f: bad"),
    (["a", "b"], "", "a b"),
    (["a", "b"], "f", "f: a b"),
    ({"f": ["bad"]}, "", "f: bad"),
    ({"f": ["bad"], "g": ["worse", "worst"]}, "", "f: bad; g: worse worst"),
    ({"f": {"g": ["bad"]}}, "", "f.g: bad"),
    ({"f": {"g": ["bad"]}}, "top", "top.f.g: bad"),
    ({"_schema": ["whole body wrong"]}, "", "body: whole body wrong"),
    ({"f": {"_schema": ["bad"]}}, "", "f: bad"),
    ({"f": {0: {"g": ["bad"]}, 2: ["x"]}}, "", "f.0.g: bad; f.2: x"),
    ({"f": [{"g": ["bad"]}, "plain"]}, "", "f: f.g: bad plain"),
    ([{"g": ["bad"]}], "", "g: bad"),
    ({}, "", ""),
    ({"f": 5}, "", "f: 5"),
])
def test_format_validation(messages, prefix: str, text: str) -> None:
    assert body.format_validation(messages, prefix) == text


def test_format_validation_prefix_defaults_to_none() -> None:
    assert body.format_validation("bad") == "bad"
    assert body.format_validation({"_schema": ["x"]}) == "body: x"


def test_validate_directly() -> None:
    assert body.validate(Thing(), {"name": "n"}) == {"name": "n", "count": 0}
    from agentd.errors import BadRequest
    with pytest.raises(BadRequest) as info:
        body.validate(Thing(), {"name": 1})
    assert str(info.value) == "invalid request: name: Not a valid string."
    with pytest.raises(BadRequest) as info:
        body.validate(Thing(), ["name"])
    assert str(info.value) == "request body must be a JSON object, got list"


# -- through the daemon: a chunked body (no Content-Length header) at and past the cap -------------------------------

def test_chunked_body_past_the_cap_is_413_through_the_daemon(shared_daemon) -> None:
    import requests

    d = shared_daemon

    def chunks(total: int):
        text = json.dumps({"manifest_toml": "x" * (total - 30)}).encode()
        text = text[:-2] + b" " * (total - len(text)) + text[-2:]
        assert len(text) == total
        for i in range(0, total, 65536):
            yield text[i:i + 65536]

    cap = MANIFEST_BODY_LIMIT  # the spawn route's cap
    r = requests.post(f"{d.url}/api/agents", data=chunks(cap + 1),
                      headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, f"BUG: a chunked body one byte past the cap answered {r.status_code}: {r.text[:200]}"
    # waitress buffers a chunked body and declares its length, so the declared-size message shows.
    assert r.json() == {"error": f"request body too large: {cap + 1} bytes (limit {cap})"}
    r = requests.post(f"{d.url}/api/agents", data=chunks(cap),
                      headers={"Content-Type": "application/json"}, timeout=60)
    # Read whole and parsed: the spawn route itself refuses the 3 MB manifest.
    assert r.json() == {"error": "manifest too large (max 1 MB)"}, \
        f"BUG: a chunked body exactly at the cap was cut or refused: {r.text[:200]}"


def test_a_spawn_or_manifest_body_over_1_mb_is_judged_by_its_size_first(shared_daemon) -> None:
    d = shared_daemon
    agent_id = d.post("/api/agents", json={"manifest_toml": 'name = "resized"\n'}).json()["agent_id"]
    over = b"x" * (1024 * 1024 + 1)
    for method, path in (("POST", "/api/agents"), ("PUT", f"/api/agents/{agent_id}/manifest")):
        for data, content_type in ((over, "application/json"), (over, "text/plain"),
                                   (json.dumps({"manifest_toml": over.decode(), "x": 1}).encode(), "application/json")):
            r = d.request(method, path, data=data, headers={"Content-Type": content_type})
            assert (r.status_code, r.json()) == (413, {"error": "manifest too large (max 1 MB)"}), (path, r.text)
        r = d.request(method, path, data=b"x" * 1024, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON"), r.text
    # Over 1 MB as JSON, within it once its escapes are undone: taken.
    escaped = json.dumps({"manifest_toml": 'name = "resized"\n#' + "é" * 200_000 + "\n"}).encode()
    assert len(escaped) > 1024 * 1024
    r = d.put(f"/api/agents/{agent_id}/manifest", data=escaped, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_validate_takes_a_schemas_fast_load_when_it_answers() -> None:
    """A schema's `fast_load` (the common bodies without marshmallow) answers first; None
    from it, or no fast_load at all, means the schema's own load()."""
    from marshmallow import Schema, fields

    from agentd.api import body as body_module

    class Fast(Schema):
        a = fields.Integer(required=True)

        def fast_load(self, data):
            return {"fast": data["a"]} if data.get("a") == 1 else None

    class Plain(Schema):
        a = fields.Integer(required=True)

    assert body_module.validate(Fast(), {"a": 1}) == {"fast": 1}
    assert body_module.validate(Fast(), {"a": 2}) == {"a": 2}
    assert body_module.validate(Plain(), {"a": 1}) == {"a": 1}


# -- what JSON cannot hold (agentd/jsonsafe.py) ------------------------------------------

@pytest.mark.parametrize("text", [b"NaN", b"-Infinity", b"Infinity", b"[1, NaN]", b"1e309", b"-1e309",
                                  b'{"a": {"b": 1e400}}', b"9" + b"0" * 308, b"-1" + b"0" * 400,
                                  b"[1" + b"0" * 400 + b"]"])
def test_non_finite_numbers_are_refused(text: bytes) -> None:
    with pytest.raises(jsonsafe.JsonNotPortable, match="^numbers must be finite"):
        jsonsafe.loads(text)


@pytest.mark.parametrize("text", [b"1.7976931348623157e308", b"-1e308", b"5e-324", b"0.1", b"1e-400"])
def test_finite_numbers_pass_exactly(text: bytes) -> None:
    assert jsonsafe.loads(text) == float(text)


@pytest.mark.parametrize("value", [0, -7, 10 ** 308, int(1.7976931348623157e308), -int(1.7976931348623157e308)])
def test_integers_a_float_holds_pass_exactly(value: int) -> None:
    assert jsonsafe.loads(str(value)) == value


@pytest.mark.parametrize("text", [b'"\\ud800"', b'"\\uDBFF"', b'"\\udc00x"', b'"a\\ude00"', b'["\\ud83d"]',
                                  b'{"\\ud800": 1}', '"\ud800"', '"x\udfff"',
                                  b'"\xed\xa0\x80"'])  # the last: a surrogate encoded as UTF-8 bytes
def test_lone_surrogates_are_refused(text) -> None:
    with pytest.raises(jsonsafe.JsonNotPortable, match="lone surrogate"):
        jsonsafe.loads(text)


@pytest.mark.parametrize("text, value", [(b'"\\ud83d\\ude00"', "\U0001F600"), (b'"\\uD83D\\uDE00"', "\U0001F600"),
                                         (b'"\\ud7ff\\ue000"', "\ud7ff\ue000"), (b'"\\\\ud800"', "\\ud800"),
                                         ('"\U0001F600"', "\U0001F600")])
def test_pairs_and_neighbours_of_the_surrogate_range_pass(text, value: str) -> None:
    assert jsonsafe.loads(text) == value


@pytest.mark.parametrize("data, deep", [
    (b"[" * 64 + b"]" * 64, False), (b"[" * 65 + b"]" * 65, True),            # at and past the limit
    (b'{"a":' * 64 + b"1" + b"}" * 64, False), (b'{"a":' * 65 + b"1" + b"}" * 65, True),  # objects count too
    (b"[{" * 33 + b"}]" * 33, True), (b"[{" * 32 + b"}]" * 32, False),
    (b"[]" * 70, False),                                                       # closing lowers the depth
    (b"[" * 60 + b"]" + b"[" * 5 + b"]" * 64, False),                          # 64 at most
    (b"[" * 60 + b"]" + b"[" * 6 + b"]" * 65, True),                           # 65
    (b'["' + b"[" * 100 + b'"]', False),                                       # brackets in a string
])
def test_depth_exceeds_counts_open_arrays_and_objects(data: bytes, deep: bool) -> None:
    assert jsonsafe.depth_exceeds(data) is deep


def test_loads_takes_its_own_limit() -> None:
    assert jsonsafe.loads(b"[[]]", limit=2) == [[]]
    with pytest.raises(jsonsafe.JsonTooDeep) as info:
        jsonsafe.loads(b"[[[]]]", limit=2)
    assert str(info.value) == TOO_DEEP_MESSAGE == "JSON nested too deeply"


@pytest.mark.parametrize("data", [
    b'{"a": 1.5, "b": [1, 2, {"c": "\\u00e9"}], "d": null, "e": true}', '{"x": -0.0, "y": 10}',
    b'\xef\xbb\xbf{"bom": 1}', '{"a":1}'.encode("utf-16"), '[1]'.encode("utf-32"), '"x"'.encode("utf-16-be"),
    bytearray(b'[1]'), '"\u00e9"', "[1e5, 3, 2.50]",
])
def test_loads_decodes_as_json_loads_does(data) -> None:
    assert jsonsafe.loads(data) == json.loads(data)
    assert type(jsonsafe.loads(data)) is type(json.loads(data))


@pytest.mark.parametrize("data", [
    "\ufeff{}", b"", "  ", b"[1, 2", b'{"a": 1} x', b"\xff\xfe\x00", "{'a': 1}",
    b"NaN is a word", "Infinity and beyond", b"[1e400, ",  # not JSON at all, wherever a NaN sits
])
def test_loads_fails_as_json_loads_does(data) -> None:
    with pytest.raises(ValueError) as ours:
        jsonsafe.loads(data)
    with pytest.raises(ValueError) as theirs:
        json.loads(data)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def test_loads_from_threads_at_once() -> None:
    import threading

    texts = [json.dumps({"i": i, "v": [i / 3] * (i % 9), "s": "é" * i}).encode() for i in range(64)]
    bad: list[int] = []

    def work() -> None:
        for _ in range(50):
            for i, text in enumerate(texts):
                if jsonsafe.loads(text) != json.loads(text):
                    bad.append(i)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
