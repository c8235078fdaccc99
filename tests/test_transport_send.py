"""transport.send_json: the prepared fast path sends what `Session.post(json=...)` sends.

A plain HTTP server on 127.0.0.1 records each request's line, headers and body; the same
call goes through the fast path and through `requests` itself, and the two must match."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from agentd.llm.drivers import transport


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Recorder.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                              "body": body})
        answer = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def server():
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _fast(url: str, headers: dict, body: dict) -> requests.Response:
    response = transport.send_json(url, headers, body, timeout=(5, 5))
    response.content  # noqa: B018 - read it (the call streams)
    return response


def test_fast_path_sends_the_same_request_as_requests(server, monkeypatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(transport, "_local", threading.local())  # a fresh per-thread session
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "n": 1}
    url = f"{server}/v1/chat/completions?alt=sse&x=a b"
    headers = {"Authorization": "Bearer k", "X-Extra": "1"}
    fast = _fast(url, headers, body)
    plain = requests.Session().post(url, json=body, headers=headers, timeout=5)
    assert fast.status_code == plain.status_code == 200 and fast.json() == {"ok": True}
    got, want = Recorder.seen
    assert got["path"] == want["path"] == "/v1/chat/completions?alt=sse&x=a%20b"
    assert got["body"] == want["body"] and json.loads(got["body"]) == body
    for name in ("authorization", "x-extra", "content-type", "content-length", "user-agent", "accept",
                 "accept-encoding", "connection", "host"):
        assert got["headers"].get(name) == want["headers"].get(name), f"BUG: header {name} differs"
    assert set(got["headers"]) == set(want["headers"])
    # A URL already seen is not parsed again: the normalised form comes from the cache.
    assert transport._urls[url] == fast.request.url


def test_a_provider_content_type_is_kept_and_nan_is_refused(server, monkeypatch) -> None:
    monkeypatch.setattr(transport, "_local", threading.local())
    _fast(f"{server}/x", {"Content-Type": "application/json; charset=utf-8"}, {"a": 1})
    assert Recorder.seen[-1]["headers"]["content-type"] == "application/json; charset=utf-8"
    with pytest.raises(requests.exceptions.InvalidJSONError):
        transport.send_json(f"{server}/x", {}, {"a": math.nan}, timeout=(5, 5))
    assert len(Recorder.seen) == 1  # nothing was sent


def test_the_url_cache_stays_small(server, monkeypatch) -> None:
    monkeypatch.setattr(transport, "_local", threading.local())
    monkeypatch.setattr(transport, "_urls", {})
    monkeypatch.setattr(transport, "URL_CACHE_SIZE", 3)
    for i in range(5):
        _fast(f"{server}/p{i}", {}, {})
    assert len(transport._urls) <= 3 and f"{server}/p4" in transport._urls
    assert [s["path"] for s in Recorder.seen] == [f"/p{i}" for i in range(5)]


def test_with_a_proxy_in_the_environment_the_full_session_path_is_used(server, monkeypatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # ... and the server is exempt from it
    monkeypatch.setattr(transport, "_local", threading.local())
    monkeypatch.setattr(transport, "_urls", {})
    response = _fast(f"{server}/via-session", {}, {"a": 1})
    assert response.status_code == 200
    assert transport._urls == {}, "BUG: the fast path ran although a proxy is configured"
    assert transport.session().trust_env is True
