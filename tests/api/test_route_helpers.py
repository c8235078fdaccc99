"""The undecorated helpers of the route modules exactly (mutmut 3 leaves the Flask-decorated
route functions alone; these are what it mutates): usage windows and their ISO 8601 parsing
(routes_catalog), KV key bounds, JSON object bodies and integer query arguments
(routes_memory), the audit trail's RFC 3339 `since`/`until` (routes_channels), the app's
kernel (routes_system), the lazily built document
(routes_docs), a webhook's body and reply (routes_webhooks, in a bare app). Inside request
contexts of the daemon's own app, in process."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

import pytest
from flask import Flask

from agentd.api import (create_app, routes_catalog, routes_channels, routes_docs, routes_memory, routes_system,
                        routes_webhooks)
from agentd.channels.bases.webhook import MAX_BODY
from agentd.cluster.webhook_intake import Reply
from agentd.config import parse_config
from agentd.errors import BadRequest, PayloadTooLarge
from agentd.kernel import Kernel
from agentd.metering import month_bounds
from support import with_test_db

UTC = timezone.utc


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    tmp = tmp_path_factory.mktemp("helpers")
    kernel = Kernel.open(parse_config(with_test_db({}, tmp), tmp))
    yield create_app(kernel)
    kernel.close()


def iso(app, query: str, name: str = "since"):
    with app.test_request_context(f"/x?{query}"):
        return routes_catalog._iso_arg(name)


@pytest.mark.parametrize("query, expected", [
    ("since=2026-03-04", datetime(2026, 3, 4, tzinfo=UTC)),
    ("since=2026-03-04T05:06:07Z", datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)),
    ("since=2026-03-04t05:06:07z", datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)),
    ("since=2026-03-04T05:06:07.123456789Z", datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)),
    ("since=2026-03-04T05:06:07.5Z", datetime(2026, 3, 4, 5, 6, 7, 500000, tzinfo=UTC)),
    ("since=2026-03-04T05:06:07%2B02:00", datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=2)))),
    ("since=2026-03-04T05:06:07", datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)),
    ("since=2026-03-04T05:06:07.1234567-05:30", datetime(2026, 3, 4, 5, 6, 7, 123456,
                                                          tzinfo=timezone(-timedelta(hours=5, minutes=30)))),
    ("since=2026-03-04%2005:06Z", datetime(2026, 3, 4, 5, 6, tzinfo=UTC)),
])
def test_iso_arg_parses_rfc3339(app, query: str, expected: datetime) -> None:
    got = iso(app, query)
    assert got == expected and got.utcoffset() == expected.utcoffset()


def test_iso_arg_absent_or_empty(app) -> None:
    assert iso(app, "") is None
    assert iso(app, "since=") is None
    assert iso(app, "until=2026-01-01", "since") is None
    assert iso(app, "until=2026-01-01", "until") == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01", "2026-03-04T25:00", "0"])
def test_iso_arg_refuses(app, value: str) -> None:
    with pytest.raises(BadRequest) as info:
        iso(app, f"until={value}", "until")
    assert info.value.message == f"'until' must be an ISO 8601 date or time, got {value!r}"


def window(app, query: str):
    with app.test_request_context(f"/x?{query}"):
        return routes_catalog._window()


def test_window(app) -> None:
    start, end = month_bounds(datetime.now(UTC))
    assert window(app, "") == (start, end)
    since = datetime(2026, 1, 1, tzinfo=UTC)
    until = datetime(2026, 2, 1, tzinfo=UTC)
    assert window(app, "since=2026-01-01") == (since, end)
    assert window(app, "until=2026-02-01") == (start, until)
    assert window(app, "since=2026-01-01&until=2026-02-01") == (since, until)
    for query in ("since=2026-02-01&until=2026-02-01", "since=2026-02-02&until=2026-02-01"):
        with pytest.raises(BadRequest) as info:
            window(app, query)
        assert info.value.message == "'since' must be before 'until'"
    assert window(app, "since=2026-01-31T23:59:59.999999Z&until=2026-02-01") == \
        (datetime(2026, 1, 31, 23, 59, 59, 999999, tzinfo=UTC), until), "BUG: a one-microsecond window refused"


def audit_time(app, query: str, name: str = "since"):
    with app.test_request_context(f"/x?{query}"):
        return routes_channels.audit_time(name)


@pytest.mark.parametrize("query, expected", [
    ("since=2026-01-31T09:00:00Z", datetime(2026, 1, 31, 9, tzinfo=UTC)),
    ("since=2026-01-31t09:00:00z", datetime(2026, 1, 31, 9, tzinfo=UTC)),
    ("since=2026-01-31T09:00:00.5Z", datetime(2026, 1, 31, 9, 0, 0, 500000, tzinfo=UTC)),
    ("since=2026-01-31T09:00:00.123456%2B02:00", datetime(2026, 1, 31, 9, 0, 0, 123456,
                                                           tzinfo=timezone(timedelta(hours=2)))),
    ("since=2026-01-31T09:00:00-05:30", datetime(2026, 1, 31, 9, tzinfo=timezone(-timedelta(hours=5, minutes=30)))),
])
def test_audit_time_parses_rfc3339(app, query: str, expected: datetime) -> None:
    got = audit_time(app, query)
    assert got == expected and got.utcoffset() == expected.utcoffset()


def test_audit_time_absent(app) -> None:
    assert audit_time(app, "") is None
    assert audit_time(app, "since=2026-01-31T09:00:00Z", "until") is None
    assert audit_time(app, "until=2026-01-31T09:00:00Z", "until") == datetime(2026, 1, 31, 9, tzinfo=UTC)


@pytest.mark.parametrize("value", ["", "yesterday", "2026-01-31", "2026-01-31T09:00:00", "2026-01-31%2009:00:00Z",
                                   "2026-01-31T09:00:00.1234567Z", "2026-01-31T09:00:00Zx", "x2026-01-31T09:00:00Z",
                                   "2026-01-31T09:00:00Z%0A", "2026-13-01T09:00:00Z", "2026-01-31T09:00:00%2B0200"])
def test_audit_time_refuses(app, value: str) -> None:
    with pytest.raises(BadRequest) as info:
        audit_time(app, f"until={value}", "until")
    shown = unquote(value)
    assert info.value.message == f"until: must be an RFC 3339 time such as 2026-01-31T09:00:00Z, got {shown!r}"


def test_kv_key_bounds() -> None:
    assert routes_memory._key("k") == "k"
    assert routes_memory._key("k" * 256) == "k" * 256
    for bad in ("", "k" * 257):
        with pytest.raises(BadRequest) as info:
            routes_memory._key(bad)
        assert info.value.message == "key must be 1-256 characters"


def test_obj_body(app) -> None:
    with app.test_request_context("/x", method="POST", json={"a": 1}):
        assert routes_memory._obj() == {"a": 1}
    for data in ("[1]", '"s"', "5", "null"):
        with app.test_request_context("/x", method="POST", data=data, content_type="application/json"):
            with pytest.raises(BadRequest) as info:
                routes_memory._obj()
            assert info.value.message == "request body must be a JSON object"
    big = {"v": "x" * 100}
    with app.test_request_context("/x", method="POST", json=big):
        with pytest.raises(PayloadTooLarge):
            routes_memory._obj(50)
    with app.test_request_context("/x", method="POST", json=big):
        assert routes_memory._obj(len('{"v": "' + "x" * 100 + '"}')) == big


def int_arg(app, query: str, default: int = 7) -> int:
    with app.test_request_context(f"/x?{query}"):
        return routes_memory._int_arg("n", default)


def test_int_arg(app) -> None:
    assert int_arg(app, "") == 7
    assert int_arg(app, "n=") == 7
    assert int_arg(app, "m=3") == 7
    assert int_arg(app, "n=3") == 3
    assert int_arg(app, "n=-2") == -2
    assert int_arg(app, "n=0", 5) == 0
    for bad in ("x", "1.5", "1e3"):
        with pytest.raises(BadRequest) as info:
            int_arg(app, f"n={bad}")
        assert info.value.message == "n must be an integer"


def test_kernel_and_document(app) -> None:
    with app.app_context():
        assert routes_system.kernel() is app.extensions["agentd.kernel"]
    document = routes_docs.cached_document(app)
    assert document is app.extensions["agentd.openapi"]
    assert routes_docs.cached_document(app) is document
    assert "/api/health" in document["paths"]


def test_path_of_a_real_request(app, tmp_path: Path) -> None:
    client = app.test_client()
    r = client.get("/api/usage?since=2026-01-01&until=2026-01-01", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert r.status_code == 400 and r.get_json() == {"error": "'since' must be before 'until'"}


# -- routes_webhooks: the body read up to the adapters' limit, each reply as it is --------
HOOK_PATH = "/channels/webhook/webhook"


class Input(io.BytesIO):
    """A request body that counts what was read of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.taken += len(chunk)
        return chunk


def test_a_webhook_body_is_read_up_to_the_limit_only() -> None:
    app = Flask("helpers")
    for size, length in ((MAX_BODY, True), (MAX_BODY, False), (0, True), (MAX_BODY + 1, False),
                         (MAX_BODY + 99, False)):
        stream = Input(b"x" * size)
        environ = {"wsgi.input": stream, "wsgi.input_terminated": not length}
        if length:
            environ["CONTENT_LENGTH"] = str(size)
        with app.test_request_context(HOOK_PATH, method="POST", environ_overrides=environ):
            got = routes_webhooks._read_body()
        assert (None if got is None else len(got)) == (size if size <= MAX_BODY else None), (size, length)
        assert stream.taken == min(size, MAX_BODY + 1)  # never more than one byte past the limit
    stream = Input(b"x" * (MAX_BODY + 1))
    environ = {"wsgi.input": stream, "CONTENT_LENGTH": str(MAX_BODY + 1)}
    with app.test_request_context(HOOK_PATH, method="POST", environ_overrides=environ):
        assert routes_webhooks._read_body() is None
    assert stream.taken == 0  # a declared size over the limit: not a byte read


def test_a_webhook_reply_is_answered_as_it_is() -> None:
    app = Flask("helpers")
    with app.test_request_context(HOOK_PATH):
        text = routes_webhooks._response(Reply(200, b"challenge", {"Content-Type": "text/plain; charset=utf-8"}))
        relayed = routes_webhooks._response(Reply(401, b'{"error": "invalid signature"}',
                                                  {"Content-Type": "application/json", "X-Agentd-Forwarded-To": "a"}))
        refused = routes_webhooks._response(Reply(503, {"error": "not running"}, {"Retry-After": "5"}))
        served = routes_webhooks._response(Reply(202, {"status": "accepted"}))
    assert (text.status_code, text.get_data(), text.headers["Content-Type"]) == (200, b"challenge",
                                                                                "text/plain; charset=utf-8")
    assert (relayed.status_code, relayed.get_data(), relayed.headers["Content-Type"],
            relayed.headers["X-Agentd-Forwarded-To"]) == (401, b'{"error": "invalid signature"}',
                                                          "application/json", "a")
    assert (refused.status_code, refused.get_json(), refused.headers["Retry-After"]) == (503, {"error": "not running"},
                                                                                        "5")
    assert (served.status_code, served.get_json(), served.mimetype) == (202, {"status": "accepted"}, "application/json")
    assert "Retry-After" not in served.headers
