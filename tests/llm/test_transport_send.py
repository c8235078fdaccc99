"""transport.send_json: the prepared fast path sends what `Session.post(json=...)` sends.

A plain HTTP server on 127.0.0.1 records each request's line, headers and body; the same
call goes through the fast path and through `requests` itself, and the two must match."""

from __future__ import annotations

import json
import math
import shutil
import ssl
import subprocess
import threading
import time
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
        if self.path == "/slow":
            time.sleep(1.0)
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
    with pytest.raises(requests.exceptions.InvalidJSONError) as caught:
        transport.send_json(f"{server}/x", {}, {"a": math.nan}, timeout=(5, 5))
    assert str(caught.value) == "Out of range float values are not JSON compliant", "BUG: the reason was lost"
    assert len(Recorder.seen) == 1  # nothing was sent


def test_the_url_cache_stays_small(server, monkeypatch) -> None:
    monkeypatch.setattr(transport, "_local", threading.local())
    monkeypatch.setattr(transport, "_urls", {})
    monkeypatch.setattr(transport, "URL_CACHE_SIZE", 3)
    for i in range(5):
        _fast(f"{server}/p{i}", {}, {})
        assert len(transport._urls) <= 3, f"BUG: {len(transport._urls)} URLs kept, the limit is 3"
    assert f"{server}/p4" in transport._urls
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


def test_the_session_path_sends_the_body_and_headers_streams_and_keeps_the_timeout(server, monkeypatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(transport, "_local", threading.local())
    response = transport.send_json(f"{server}/via-session", {"X-Extra": "1"}, {"a": 1}, timeout=(5, 5))
    assert transport._local.session.trust_env is True  # (the session path, as above)
    # Streamed: the body is still on the connection when send_json returns.
    assert response.raw.read() == b'{"ok": true}', "BUG: the answer was read before the caller asked"
    seen = Recorder.seen[-1]
    assert json.loads(seen["body"]) == {"a": 1}
    assert (seen["headers"]["x-extra"], seen["headers"]["content-type"]) == ("1", "application/json")
    with pytest.raises(requests.exceptions.ReadTimeout):
        transport.send_json(f"{server}/slow", {}, {}, timeout=(5, 0.2))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """An HTTPS Recorder with a certificate for 127.0.0.1 that no public CA signed; its file."""
    openssl = shutil.which("openssl") or pytest.skip("openssl is not installed")
    root = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem")], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(root / "cert.pem", root / "key.pem")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", str(root / "cert.pem")
    httpd.shutdown()
    httpd.server_close()


def test_https_is_verified_against_the_configured_ca_bundle(tls_server, monkeypatch) -> None:
    url, cert = tls_server
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", cert)
    monkeypatch.setattr(transport, "_local", threading.local())
    Recorder.seen = []
    response = _fast(f"{url}/tls", {}, {"a": 1})
    assert response.json() == {"ok": True} and Recorder.seen[-1]["path"] == "/tls"
    # Without the bundle the same certificate is refused: verification is on, not skipped.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.setattr(transport, "_local", threading.local())
    with pytest.raises(requests.exceptions.SSLError):
        transport.send_json(f"{url}/tls", {}, {"a": 1}, timeout=(5, 5))
