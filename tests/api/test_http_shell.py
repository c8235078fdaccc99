"""The HTTP shell: error shapes, auth, CORS, rate limits, headers (in-process app
for fine control of the client address, plus the real daemon for the rest)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
from requests.adapters import HTTPAdapter

from agentd.api import create_app
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
REMOTE = {"REMOTE_ADDR": "203.0.113.9"}


def make_client(tmp_path: Path, extra: dict | None = None):
    data = {"api": {"rate_limit_per_second": 1000, "rate_limit_burst": 1000}}
    data.update(extra or {})
    config = parse_config(with_test_db(data, tmp_path), tmp_path)
    kernel = Kernel.open(config)
    app = create_app(kernel)

    @app.get("/api/_test/boom")
    def boom():
        raise RuntimeError("secret internal detail")

    return app.test_client(), kernel


@pytest.fixture
def client(tmp_path: Path) -> Iterator:
    c, kernel = make_client(tmp_path)
    yield c
    kernel.close()


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator:
    c, kernel = make_client(tmp_path, {"api_key": "s3cret",
                                       "api": {"cors_origins": ["https://app.example.com"],
                                               "rate_limit_per_second": 1000, "rate_limit_burst": 1000}})
    yield c
    kernel.close()


# -- error shapes -------------------------------------------------------------------

def test_unknown_route_is_json_404_in_both_shapes(client) -> None:
    r = client.get("/api/nope", environ_base=LOCAL)
    assert r.status_code == 404 and r.is_json
    assert "not found" in r.get_json()["error"]
    r = client.get("/v1/nope", environ_base=LOCAL)
    assert r.status_code == 404
    err = r.get_json()["error"]
    assert set(err) == {"message", "type"} and err["type"] == "invalid_request_error"


def test_wrong_method_is_json_405(client) -> None:
    r = client.delete("/api/health", environ_base=LOCAL)
    assert r.status_code == 405 and r.is_json
    assert "DELETE" in r.get_json()["error"]


def test_unexpected_error_is_500_without_traceback(client) -> None:
    r = client.get("/api/_test/boom", environ_base=LOCAL)
    assert r.status_code == 500 and r.is_json
    text = r.get_data(as_text=True)
    assert "secret internal detail" not in text and "Traceback" not in text
    assert r.headers["X-Request-Id"] in r.get_json()["error"]


def test_malformed_json_wrong_type_and_content_type(client) -> None:
    r = client.post("/api/agents", data="{not json", content_type="application/json", environ_base=LOCAL)
    assert r.status_code == 400 and "malformed JSON" in r.get_json()["error"]
    r = client.post("/api/agents", data=json.dumps({"manifest_toml": 5}),
                    content_type="application/json", environ_base=LOCAL)
    assert r.status_code == 400 and "manifest_toml" in r.get_json()["error"]
    r = client.post("/api/agents", data='{"manifest_toml": "name = \\"x\\""}',
                    content_type="text/plain", environ_base=LOCAL)
    assert r.status_code == 415 and "application/json" in r.get_json()["error"]
    r = client.post("/api/agents", data=json.dumps([1, 2]), content_type="application/json",
                    environ_base=LOCAL)
    assert r.status_code == 400 and "JSON object" in r.get_json()["error"]


def test_two_megabyte_body_is_413(client) -> None:
    payload = json.dumps({"manifest_toml": "x" * (2 * 1024 * 1024)})
    r = client.post("/api/agents", data=payload, content_type="application/json", environ_base=LOCAL)
    assert r.status_code == 413 and r.is_json


# -- auth ---------------------------------------------------------------------------

def test_no_key_serves_loopback_only(client) -> None:
    assert client.get("/api/status", environ_base=LOCAL).status_code == 200
    r = client.get("/api/status", environ_base=REMOTE)
    assert r.status_code == 401 and "api_key" in r.get_json()["error"]
    assert client.get("/api/health", environ_base=REMOTE).status_code == 200
    assert client.get("/v1/models", environ_base=REMOTE).status_code == 401


def test_key_required_everywhere_but_public_routes(keyed) -> None:
    for path in ("/api/health", "/api/version", "/login", "/static/app.css"):
        assert keyed.get(path, environ_base=REMOTE).status_code == 200, path
    r = keyed.get("/api/status", environ_base=LOCAL)  # loopback still needs the key
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert "missing" in r.get_json()["error"]
    r = keyed.get("/api/status", headers={"Authorization": "Bearer wrong"}, environ_base=REMOTE)
    assert r.status_code == 401 and r.get_json()["error"] == "invalid API key"
    assert keyed.get("/api/status", headers={"Authorization": "Bearer s3cret"}, environ_base=REMOTE).status_code == 200
    for scheme in ("bearer", "BEARER", "BeArEr"):  # the scheme is case-insensitive (RFC 7235)
        assert keyed.get("/api/status", headers={"Authorization": f"{scheme} s3cret"},
                         environ_base=REMOTE).status_code == 200, scheme
    assert keyed.get("/api/status", headers={"Authorization": "Basic s3cret"}, environ_base=REMOTE).status_code == 401
    assert keyed.get("/api/status", headers={"X-API-Key": "s3cret"}, environ_base=REMOTE).status_code == 200
    assert keyed.get("/api/status?token=s3cret", environ_base=REMOTE).status_code == 200
    assert keyed.get("/api/health/detail", environ_base=REMOTE).status_code == 401
    r = keyed.get("/v1/models", environ_base=REMOTE)
    assert r.status_code == 401 and r.get_json()["error"]["type"] == "authentication_error"
    assert keyed.post("/api/shutdown", environ_base=LOCAL).status_code == 401


def test_dashboard_hides_data_without_key(keyed) -> None:
    r = keyed.get("/", environ_base=REMOTE)
    assert r.status_code == 303 and r.headers["Location"].startswith("/login")
    assert "Uptime" not in r.get_data(as_text=True)
    page = keyed.get("/agents?token=s3cret", environ_base=REMOTE).get_data(as_text=True)
    assert "<h1>Agents" in page and 'id="spawn-form"' in page


# -- CORS ---------------------------------------------------------------------------

def preflight(c, origin: str):
    return c.options("/api/status", headers={"Origin": origin, "Access-Control-Request-Method": "GET"},
                     environ_base=LOCAL)


def test_cors_without_key_allows_local_dev_origins_only(client) -> None:
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "http://localhost:4200"):
        r = preflight(client, origin)
        assert r.status_code == 204, origin
        assert r.headers["Access-Control-Allow-Origin"] == origin
        assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
    assert preflight(client, "https://evil.example.com").status_code == 403
    # Configured origins apply only when a key protects the daemon.
    assert preflight(client, "https://app.example.com").status_code == 403
    r = client.get("/api/health", headers={"Origin": "http://localhost:3000"}, environ_base=LOCAL)
    assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    r = client.get("/api/health", headers={"Origin": "https://evil.example.com"}, environ_base=LOCAL)
    assert "Access-Control-Allow-Origin" not in r.headers


def test_cors_with_key_adds_configured_origins(keyed) -> None:
    r = preflight(keyed, "https://app.example.com")
    assert r.status_code == 204 and r.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert preflight(keyed, "http://localhost:3000").status_code == 204


# -- headers ------------------------------------------------------------------------

def test_security_and_request_id_headers(client) -> None:
    seen = set()
    for path in ("/api/health", "/api/nope", "/"):
        r = client.get(path, environ_base=LOCAL)
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["X-Frame-Options"] == "DENY"
        seen.add(r.headers["X-Request-Id"])
    assert len(seen) == 3
    r = client.get("/api/health", environ_base=LOCAL)
    assert r.headers["Cache-Control"] == "no-store"
    assert int(r.headers["X-RateLimit-Remaining"]) >= 0 and "X-RateLimit-Reset" in r.headers


def test_every_answer_names_the_daemon_once(tmp_path: Path) -> None:
    c, kernel = make_client(tmp_path)
    try:
        for path in ("/api/health", "/api/nope", "/", "/api/_test/boom"):
            r = c.get(path, environ_base=LOCAL)
            assert r.headers.getlist("X-Agentd-Daemon") == [kernel.cluster.id], path
        assert kernel.cluster.id
    finally:
        kernel.close()


# -- through the real daemon ----------------------------------------------------------

def test_health_version_status_shapes(shared_daemon) -> None:
    assert shared_daemon.get("/api/health").json() == {"status": "ok"}
    version = shared_daemon.get("/api/version").json()
    for key in ("name", "version", "build_date", "git_sha", "rust_version", "platform", "arch"):
        assert isinstance(version[key], str), key
    assert version["name"] == "agentd"
    status = shared_daemon.get("/api/status").json()
    assert status["status"] == "running"
    assert isinstance(status["agent_count"], int) and isinstance(status["uptime_seconds"], int)
    assert status["api_listen"] == f"127.0.0.1:{shared_daemon.port}"
    assert status["home_dir"] == str(shared_daemon.home)
    assert isinstance(status["network_enabled"], bool) and isinstance(status["agents"], list)
    for key in ("default_provider", "default_model", "log_level"):
        assert isinstance(status[key], str)
    detail = shared_daemon.get("/api/health/detail").json()
    assert detail["database"] == "connected" and detail["thread_pool"]["threads"] == 128, "[api] threads default"


def test_dashboard_is_html(shared_daemon) -> None:
    # No provider has a key here: the overview gives way to the first-run setup.
    r = shared_daemon.get("/")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert r.url.endswith("/setup") and "<h1>Set up agentd</h1>" in r.text and "Agents" in r.text


class SourceAdapter(HTTPAdapter):
    """Sends from a chosen loopback address (127.0.0.2 is another client)."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        return super().init_poolmanager(*args, **kwargs)


def test_rate_limit_per_client(daemon_factory) -> None:
    d = daemon_factory("[api]\nrate_limit_per_second = 10\nrate_limit_burst = 10\n")
    flooder = requests.Session()
    other = requests.Session()
    other.mount("http://", SourceAdapter("127.0.0.2"))
    statuses = []
    other_statuses = []

    def flood() -> None:
        for _ in range(100):
            statuses.append(flooder.get(f"{d.url}/api/health"))

    thread = threading.Thread(target=flood)
    thread.start()
    while thread.is_alive() and len(other_statuses) < 5:
        other_statuses.append(other.get(f"{d.url}/api/health").status_code)
        time.sleep(0.15)
    thread.join()
    limited = [r for r in statuses if r.status_code == 429]
    assert limited, "100 rapid requests at 10/s should be limited"
    sample = limited[0]
    assert sample.json()["error"].startswith("rate limit exceeded")
    assert int(sample.headers["Retry-After"]) >= 1
    assert sample.headers["X-RateLimit-Remaining"] == "0"
    assert all(s == 200 for s in other_statuses)


def test_sse_events_arrive_one_by_one(shared_daemon) -> None:
    """The first event reaches the client before the server has even produced the second."""
    r = shared_daemon.get("/api/_sse/ticks?n=2&interval=1.5", stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    first_seen_at = None
    events = []
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data:"):
            data = json.loads(line[5:])
            if first_seen_at is None:
                first_seen_at = time.time()
            events.append(data)
            if data.get("done"):
                break
    assert [e.get("n") for e in events[:2]] == [0, 1]
    assert first_seen_at < events[1]["sent_at"]
