"""The default daemon (loopback, no api_key) against web pages the user visits,
plus the defects found trying it as a user. Everything goes through the real daemon."""

from __future__ import annotations

import json
from urllib.parse import quote
import threading
import time
import uuid

import openai
import pytest
import requests
import websocket

from conftest import LLM_ENV, llm_config
from support import FAST_API, run_cli
from tests.agents.test_agents import manifest, say, spawn
from tests.api.test_transports import sse_events

EVIL = "http://evil.example"


def raw(d, method: str, path: str, **kwargs) -> requests.Response:
    """A request without the test session's defaults (a browser-like one)."""
    kwargs.setdefault("timeout", 30)
    return requests.request(method, f"{d.url}{path}", **kwargs)


def user_turns_in(fake, marker: str) -> list[dict]:
    """Requests the fake LLM received whose body mentions `marker`."""
    return [r for r in list(fake.requests) if marker in json.dumps(r.get("json"))]


# -- cross-site requests ------------------------------------------------------------

def test_cross_site_form_post_cannot_shut_the_daemon_down(daemon_factory) -> None:
    d = daemon_factory()
    r = raw(d, "POST", "/api/shutdown", data="x=1",
            headers={"Content-Type": "text/plain", "Origin": EVIL})
    assert r.status_code == 403, "a cross-site form post reached POST /api/shutdown"
    assert r.json() == {"error": "cross-site request refused"}
    time.sleep(0.3)
    assert d.proc.poll() is None and d.get("/api/health").ok, "the daemon stopped after a cross-site post"


@pytest.mark.parametrize("headers", [
    {"Origin": EVIL},
    {"Origin": "null"},
    {"Origin": "http://127.0.0.1.evil.example"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"},
])
def test_state_changing_cross_site_requests_are_refused(shared_daemon, headers) -> None:
    d = shared_daemon
    before = d.get("/api/agents").json()
    body = json.dumps({"manifest_toml": 'name = "pwned"\nprofile = "coding"\n'})
    for method, path in [("POST", "/api/agents"), ("PUT", f"/api/agents/{uuid.uuid4()}/mode"),
                         ("DELETE", f"/api/agents/{uuid.uuid4()}"), ("PATCH", "/api/agents"),
                         ("POST", "/v1/chat/completions"), ("POST", "/api/shutdown")]:
        r = raw(d, method, path, data=body, headers={"Content-Type": "text/plain", **headers})
        assert r.status_code == 403, f"{method} {path} with {headers} answered {r.status_code}"
        assert r.json() == {"error": "cross-site request refused"}, "the issue's body on every route, /v1 too"
    assert d.get("/api/agents").json() == before, "a refused request changed state"


def test_cross_site_multipart_upload_and_session_actions_are_refused(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    say(d, agent_id, "remember this")
    r = raw(d, "POST", f"/api/agents/{agent_id}/upload", files={"file": ("a.txt", b"hi", "text/plain")},
            headers={"Origin": EVIL})
    assert r.status_code == 403
    for action in ("session/reset", "stop", "session/compact"):
        r = raw(d, "POST", f"/api/agents/{agent_id}/{action}", headers={"Origin": EVIL})
        assert r.status_code == 403, f"cross-site {action} was served"
    assert d.get(f"/api/agents/{agent_id}/session").json()["message_count"] == 2, "session changed"


def _send_headers_only(d, head: str, timeout: float = 5.0) -> bytes:
    """Send a request's headers (announcing a body that never comes) and read the answer."""
    import socket
    with socket.create_connection(("127.0.0.1", d.port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1"))
        data = b""
        try:
            while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + 20:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
        return data


@pytest.mark.parametrize("headers, status, body", [
    ("Origin: http://evil.example\r\n", "403 Forbidden", b'{"error": "cross-site request refused"}'),
    ("Sec-Fetch-Site: cross-site\r\nExpect: 100-continue\r\n", "403 Forbidden",
     b'{"error": "cross-site request refused"}'),
    ("Transfer-Encoding: chunked\r\nOrigin: null\r\n", "403 Forbidden", b'{"error": "cross-site request refused"}'),
    ("X-Host: x\r\n", "400 Bad Request", b'{"error": "host not allowed"}'),
])
def test_a_refused_request_is_answered_before_its_body_arrives(shared_daemon, headers, status, body) -> None:
    """The issue: refused "before any handler runs and before the body is read". The body is
    announced (1 MB) and never sent; the answer must come anyway, and no 100 Continue."""
    d = shared_daemon
    host = "attacker.example" if "X-Host" in headers else f"127.0.0.1:{d.port}"
    length = "" if "chunked" in headers else "Content-Length: 1000000\r\n"
    answer = _send_headers_only(d, f"POST /api/shutdown HTTP/1.1\r\nHost: {host}\r\n"
                                   f"Content-Type: text/plain\r\n{length}{headers}\r\n")
    assert answer.startswith(f"HTTP/1.1 {status}\r\n".encode()), answer[:200]
    assert b"100 Continue" not in answer
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head and b"Connection: close" in head
    assert rest == body
    assert d.get("/api/health").ok, "the daemon is still up"


@pytest.mark.parametrize("head, status, error", [
    ("POST /api/agents HTTP/1.1\r\nHost: {host}\r\nContent-Length: abc\r\n\r\n", "400 Bad Request",
     "bad request: Content-Length is invalid"),
    ("GET /api/health HTTP/1.1\r\nHost: {host}\r\nX-Big: " + "x" * 300_000 + "\r\n\r\n",
     "431 Request Header Fields Too Large", "request header fields too large: exceeds max_header of 262144"),
])
def test_errors_waitress_answers_itself_are_json_too(shared_daemon, head: str, status: str, error: str) -> None:
    d = shared_daemon
    answer = _send_headers_only(d, head.format(host=f"127.0.0.1:{d.port}"))
    top, _, rest = answer.partition(b"\r\n\r\n")
    # (waitress answers an unparsable request as HTTP/1.0)
    assert top.split(b"\r\n")[0] in (f"HTTP/1.1 {status}".encode(), f"HTTP/1.0 {status}".encode()), top[:100]
    assert b"Content-Type: application/json" in top and b"X-Request-Id: " in top
    assert json.loads(rest) == {"error": error}


def test_an_allowed_request_still_waits_for_its_body(shared_daemon) -> None:
    """Only refusals are early: a same-origin post with a slow body is read whole and served."""
    import socket
    d = shared_daemon
    body = json.dumps({"manifest_toml": f'name = "slow-{uuid.uuid4().hex[:6]}"\n'}).encode()
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as sock:
        sock.sendall(f"POST /api/agents HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n"
                     f"Origin: http://127.0.0.1:{d.port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        time.sleep(0.3)
        sock.sendall(body[5:])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 201 "), answer[:200]


def test_same_origin_and_plain_clients_are_served(shared_daemon) -> None:
    d = shared_daemon
    for origin in (d.url, f"http://localhost:{d.port}", f"HTTP://127.0.0.1:{d.port}/"):
        name = f"same-{uuid.uuid4().hex[:6]}"
        r = raw(d, "POST", "/api/agents", json={"manifest_toml": f'name = "{name}"\n'},
                headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"})
        assert r.status_code == 201, f"same-origin {origin} refused: {r.text}"
    r = raw(d, "POST", "/api/agents", json={"manifest_toml": 'name = "curl-like"\n'})
    assert r.status_code == 201, "a request without Origin/Sec-Fetch-Site was refused"
    # Reads are not state changes: a cross-site GET is answered (CORS keeps its body from the page).
    assert raw(d, "GET", "/api/health", headers={"Origin": EVIL, "Sec-Fetch-Site": "cross-site"}).ok
    # Sec-Fetch-Site none (typed URL, bookmark) is the user's own action.
    r = raw(d, "POST", "/api/agents", json={"manifest_toml": 'name = "typed"\n'},
            headers={"Sec-Fetch-Site": "none"})
    assert r.status_code == 201


def test_a_configured_cors_origin_may_post_under_a_key_and_the_dev_ports_always(daemon_factory) -> None:
    key = "k3y-for-cors"
    cors = 'cors_origins = ["https://app.example.com"]\n'
    keyed = daemon_factory(f'api_key = "{key}"\n' + FAST_API + cors, api_key=key)
    keyless = daemon_factory(FAST_API + cors)
    auth = {"Authorization": f"Bearer {key}"}
    r = raw(keyed, "POST", "/api/agents", json={"manifest_toml": 'name = "cors-ok"\n'},
            headers={"Origin": "https://app.example.com", "Sec-Fetch-Site": "cross-site", **auth})
    assert r.status_code == 201, r.text
    for near in ("https://app.example.com.evil.example", "http://app.example.com", "https://evil-app.example.com"):
        r = raw(keyed, "POST", "/api/agents", json={"manifest_toml": 'name = "cors-no"\n'},
                headers={"Origin": near, **auth})
        assert r.status_code == 403, f"near-miss origin {near} was allowed"
    # Without a key CORS lets in the daemon's own and the dev ports' loopback origins only
    # (the spec's list), and the guard the same ones: what a preflight allows, a post may do.
    for origin, allowed in (("https://app.example.com", False), ("http://localhost:3000", True),
                            ("http://127.0.0.1:8080", True), ("http://localhost:3001", False)):
        preflight = raw(keyless, "OPTIONS", "/api/agents", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert preflight.status_code == (204 if allowed else 403), origin
        r = raw(keyless, "POST", "/api/agents", json={"manifest_toml": f'name = "dev-{origin[-4:]}"\n'},
                headers={"Origin": origin, "Sec-Fetch-Site": "same-site"})
        assert r.status_code == (201 if allowed else 403), (origin, r.text)


def test_cross_site_websocket_handshake_is_refused(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    url = f"ws://127.0.0.1:{d.port}/api/agents/{agent_id}/ws"
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(url, timeout=5, origin=EVIL)
    assert info.value.status_code == 403
    ws = websocket.create_connection(url, timeout=5, origin=d.url)
    assert json.loads(ws.recv())["type"] == "connected"
    ws.close()


# -- Host allow-list ----------------------------------------------------------------

def test_foreign_host_is_refused_dns_rebinding(shared_daemon) -> None:
    d = shared_daemon
    for method, path, body in [("GET", "/api/agents", None), ("GET", "/api/health", None),
                               ("POST", "/api/agents", {"manifest_toml": 'name = "rebound"\n'}),
                               ("GET", "/", None)]:
        r = raw(d, method, path, json=body, headers={"Host": "attacker.example"})
        assert r.status_code == 400, f"{method} {path} served Host attacker.example"
        if path.startswith("/api/"):
            assert r.json() == {"error": "host not allowed"}
    assert not any(a["name"] == "rebound" for a in d.get("/api/agents").json())
    for host in ("localhost", f"localhost:{d.port}", f"127.0.0.1:{d.port}", f"[::1]:{d.port}", "LOCALHOST.",
                 "127.0.0.2"):
        assert raw(d, "GET", "/api/health", headers={"Host": host}).ok, f"loopback Host {host} refused"
    for host in ("localhost.attacker.example", "127.0.0.1.nip.io", "attacker.example:4200"):
        assert raw(d, "GET", "/api/health", headers={"Host": host}).status_code == 400, host


def test_allowed_hosts_exact_wildcard_and_star(daemon_factory) -> None:
    d = daemon_factory(FAST_API + 'allowed_hosts = ["agents.internal", "*.example.com"]\n')
    ok = ["agents.internal", "agents.internal:8443", "a.example.com", "a.b.example.com:443"]
    refused = ["example.com", "evilexample.com", "example.com.evil.net", "other.internal"]
    for host in ok:
        assert raw(d, "GET", "/api/health", headers={"Host": host}).ok, f"allowed host {host} refused"
    for host in refused:
        assert raw(d, "GET", "/api/health", headers={"Host": host}).status_code == 400, f"{host} served"
    d2 = daemon_factory(FAST_API + 'allowed_hosts = ["*"]\n')
    assert raw(d2, "GET", "/api/health", headers={"Host": "anything.example"}).ok


def test_bad_allowed_hosts_config_is_refused(daemon_factory) -> None:
    from agentd.config import parse_config
    from agentd.errors import ConfigError

    with pytest.raises(ConfigError, match="allowed_hosts"):
        parse_config({"api": {"allowed_hosts": "x"}}, __import__("pathlib").Path("/tmp"))
    with pytest.raises(ConfigError, match="allowed_hosts"):
        parse_config({"api": {"allowed_hosts": [""]}}, __import__("pathlib").Path("/tmp"))


def test_doctor_warns_on_non_loopback_listen_without_key(tmp_path) -> None:
    from support import make_home

    home = make_home(tmp_path / "exposed", 'api_listen = "0.0.0.0:0"\n'.replace(":0", ":4999"))
    out = run_cli(home, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out.stdout)}
    assert checks["exposure"]["status"] == "warn" and "api_key" in checks["exposure"]["message"]
    home2 = make_home(tmp_path / "keyed", 'api_listen = "0.0.0.0:4999"\napi_key = "x"\n')
    checks = {c["check"]: c for c in json.loads(run_cli(home2, "doctor", "--json").stdout)}
    assert checks["exposure"]["status"] == "ok"
    home3 = make_home(tmp_path / "local", 'api_listen = "127.0.0.1:4999"\n')
    checks = {c["check"]: c for c in json.loads(run_cli(home3, "doctor", "--json").stdout)}
    assert checks["exposure"]["status"] == "ok"


# -- KV null and every JSON value ----------------------------------------------------

def test_kv_stores_every_json_value_including_null(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    values = [None, 0, -1.5, "", "text", True, False, [], {}, [None, {"a": None}], {"nested": [1, "x"]}]
    for i, value in enumerate(values):
        r = d.put(f"/api/memory/agents/{agent_id}/kv/k{i}", data=json.dumps(value),
                  headers={"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json() == {"status": "ok"}, f"PUT {value!r}: {r.status_code} {r.text}"
        r = d.get(f"/api/memory/agents/{agent_id}/kv/k{i}")
        assert r.status_code == 200 and r.json() == value, f"{value!r} read back as {r.text}"
    assert d.get(f"/api/memory/agents/{agent_id}/kv").json()["k0"] is None
    # null then overwritten, and a value overwritten with null
    d.put(f"/api/memory/agents/{agent_id}/kv/k4", data="null", headers={"Content-Type": "application/json"})
    assert d.get(f"/api/memory/agents/{agent_id}/kv/k4").json() is None
    assert d.delete(f"/api/memory/agents/{agent_id}/kv/k0").json() == {"status": "deleted"}
    assert d.get(f"/api/memory/agents/{agent_id}/kv/k0").status_code == 404


def test_kv_keys_are_taken_exactly_as_given(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    json_header = {"Content-Type": "application/json"}
    for key, value in (("sp", "no-space"), ("sp ", "trailing"), (" sp", "leading"), ("  ", "blank")):
        r = d.put(f"/api/memory/agents/{agent_id}/kv/{quote(key)}", data=json.dumps(value), headers=json_header)
        assert (r.status_code, r.json()) == (200, {"status": "ok"}), repr(key)
    for key, value in (("sp", "no-space"), ("sp ", "trailing"), (" sp", "leading"), ("  ", "blank")):
        assert d.get(f"/api/memory/agents/{agent_id}/kv/{quote(key)}").json() == value, repr(key)
    assert d.get(f"/api/memory/agents/{agent_id}/kv").json() == \
        {"  ": "blank", " sp": "leading", "sp": "no-space", "sp ": "trailing"}
    assert d.delete(f"/api/memory/agents/{agent_id}/kv/{quote('  ')}").json() == {"status": "deleted"}


@pytest.mark.parametrize("text, message", [
    ("NaN", "numbers must be finite (no NaN, Infinity or values past 1.8e308)"),
    ('{"a": Infinity}', "numbers must be finite (no NaN, Infinity or values past 1.8e308)"),
    ("[-Infinity]", "numbers must be finite (no NaN, Infinity or values past 1.8e308)"),
    ("1e400", "numbers must be finite (no NaN, Infinity or values past 1.8e308)"),
    ('"\\ud800"', "a string holds a lone surrogate (\\ud800-\\udfff without its pair)"),
    ('{"k": ["ok", "\\udfff"]}', "a string holds a lone surrogate (\\ud800-\\udfff without its pair)"),
])
def test_what_json_cannot_hold_is_a_400_not_a_500_or_bad_json_later(agent_daemon, text: str, message: str) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    json_header = {"Content-Type": "application/json"}
    r = d.put(f"/api/memory/agents/{agent_id}/kv/k", data=text, headers=json_header)
    assert (r.status_code, r.json()) == (400, {"error": f"malformed JSON: {message}"})
    assert d.get(f"/api/memory/agents/{agent_id}/kv").json() == {}, "nothing stored"
    r = d.post(f"/api/agents/{agent_id}/message", data=json.dumps({"message": "x"})[:-1] + f', "extra": {text}}}',
               headers=json_header)
    assert (r.status_code, r.json()) == (400, {"error": f"malformed JSON: {message}"})
    # A well-formed surrogate pair is one character, and fine.
    r = d.put(f"/api/memory/agents/{agent_id}/kv/k", data='"\\ud83d\\ude00"', headers=json_header)
    assert r.status_code == 200 and d.get(f"/api/memory/agents/{agent_id}/kv/k").json() == "\U0001F600"


BIG = "1" + "0" * 400  # an integer JSON and TOML allow, past what a float holds


def test_an_integer_past_the_float_limit_is_a_400_in_every_number_field(agent_daemon) -> None:
    d = agent_daemon
    name = f"big-{uuid.uuid4().hex[:8]}"
    agent_id = spawn(d, name)
    mem = f"/api/memory/agents/{agent_id}"
    memory_id = d.post(f"{mem}/memories", json={"content": "kept"}).json()["id"]
    trigger_id = d.post("/api/triggers", json={"agent_id": agent_id, "pattern": {"content_match": "x"},
                                              "prompt_template": "p"}).json()["trigger_id"]
    job_id = d.post("/api/cron/jobs", json={
        "name": "big", "agent_id": agent_id, "schedule": {"kind": "every", "every_secs": 3600}, "enabled": False,
        "action": {"kind": "agent_turn", "message": "m"}}).json()["id"]
    chat = f'{{"model": "{name}", "messages": [{{"role": "user", "content": "hi"}}], '
    bodies = [
        ("PUT", "/api/budget", '{"limit_usd": BIG}'),
        ("POST", f"{mem}/memories", '{"content": "c", "confidence": BIG}'),
        ("PUT", f"{mem}/memories/{memory_id}", '{"content": "c", "confidence": BIG}'),
        ("POST", f"{mem}/recall", '{"query": "x", "min_score": -BIG}'),
        ("POST", f"{mem}/recall", '{"query": "x", "filter": {"min_confidence": BIG}}'),
        ("POST", f"{mem}/relations", '{"source": "a", "relation": "r", "target": "b", "confidence": BIG}'),
        ("POST", "/api/models/custom", '{"id": "m-big", "provider": "openai", "input_cost_per_m": BIG}'),
        ("PATCH", f"/api/triggers/{trigger_id}", '{"max_cost_usd_per_day": BIG}'),
        ("PATCH", f"/api/cron/jobs/{job_id}", '{"max_cost_usd_per_day": BIG}'),
        ("POST", "/api/keys", '{"name": "kb", "scopes": ["read"], "budget_usd_per_day": BIG}'),
        ("PUT", f"{mem}/kv/big", "BIG"),
        ("POST", "/v1/chat/completions", chat + '"temperature": BIG}'),
        ("POST", "/v1/chat/completions", chat + '"top_p": BIG}'),
        ("POST", "/v1/responses", f'{{"model": "{name}", "input": "hi", "temperature": BIG}}'),
    ]
    for method, path, text in bodies:
        r = d.request(method, path, data=text.replace("BIG", BIG), headers={"Content-Type": "application/json"})
        error = r.json()["error"]
        if path.startswith("/v1/"):
            assert error["type"] == "invalid_request_error", (path, r.text)
            error = error["message"]
        assert (r.status_code, error) == (400, "malformed JSON: numbers must be finite (no NaN, Infinity or "
                                                "values past 1.8e308)"), (method, path, text, r.text)
    assert d.get(f"{mem}/kv").json() == {}, "nothing stored"
    # The largest integer a float holds is an ordinary number.
    r = d.put(f"{mem}/kv/big", data=str(int(1.7976931348623157e308)), headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    # TOML integers have no bound either: a manifest names the key.
    for extra, error in [
        (f"[model]\ntemperature = {BIG}\n", "model.temperature: Number too large (past 1.8e308)."),
        (f"[schedule.proactive]\nconditions = [{{ content_match = \"x\", max_cost_usd_per_day = {BIG} }}]\n",
         "schedule.proactive.conditions[0].max_cost_usd_per_day: must be a number greater than 0"),
    ]:
        text = f'name = "big-spawn"\n{extra}'
        r = d.post("/api/agents", json={"manifest_toml": text})
        assert (r.status_code, r.json()) == (400, {"error": f"invalid manifest format: {error}"}), r.text
        r = d.put(f"/api/agents/{agent_id}/manifest", json={"manifest_toml": text.replace("big-spawn", name)})
        assert (r.status_code, r.json()) == (400, {"error": f"invalid manifest format: {error}"}), r.text
    assert "OverflowError" not in d.log()


# -- deeply nested JSON ---------------------------------------------------------------

@pytest.mark.parametrize("path", ["/api/agents", "/api/memory/agents/{id}/kv/deep", "/api/agents/{id}/message",
                                  "/v1/chat/completions", "/api/workflows", "/api/budget"])
def test_deeply_nested_json_is_a_400_everywhere(agent_daemon, path) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    method = "PUT" if "/kv/" in path or path == "/api/budget" else "POST"
    r = d.request(method, path.format(id=agent_id), data=b"[" * 100_000,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400, f"{path}: {r.status_code} {r.text[:200]}"
    message = r.json()["error"]["message"] if path.startswith("/v1/") else r.json()["error"]
    assert message == "JSON nested too deeply"
    assert "Traceback" not in d.log() and "RecursionError" not in d.log()


def test_nesting_limit_is_exactly_64(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    ok = "[" * 64 + "]" * 64
    r = d.put(f"/api/memory/agents/{agent_id}/kv/depth", data=ok, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, "64 levels must be accepted"
    assert json.dumps(d.get(f"/api/memory/agents/{agent_id}/kv/depth").json()).count("[") == 64
    too_deep = "[" * 65 + "]" * 65
    r = d.put(f"/api/memory/agents/{agent_id}/kv/depth", data=too_deep, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json() == {"error": "JSON nested too deeply"}
    # Brackets inside strings do not nest.
    stringy = json.dumps({"text": "[" * 1000 + "\\\"" + "{" * 500})
    r = d.put(f"/api/memory/agents/{agent_id}/kv/stringy", data=stringy, headers={"Content-Type": "application/json"})
    assert r.status_code == 200


def test_deeply_nested_websocket_frame_gets_an_error_frame(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    ws = websocket.create_connection(f"ws://127.0.0.1:{d.port}/api/agents/{agent_id}/ws", timeout=10)
    assert json.loads(ws.recv())["type"] == "connected"
    ws.send("[" * 50_000)
    frame = json.loads(ws.recv())
    assert frame == {"type": "error", "content": "JSON nested too deeply"}
    ws.send(json.dumps({"type": "ping"}))
    assert json.loads(ws.recv()) == {"type": "pong"}, "the socket did not survive"
    ws.close()


# -- SSE phase detail -------------------------------------------------------------------

def test_sse_phase_detail_is_always_a_string(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "minimal"')
    for text in ("plain answer", '[[tool:file_list {"path": "."}]]'):
        r = d.post(f"/api/agents/{agent_id}/message/stream", json={"message": text}, stream=True)
        phases = [e for n, e in sse_events(r) if n == "phase"]
        assert phases, "no phase events"
        for event in phases:
            assert isinstance(event["detail"], str), f"phase {event['phase']} has detail {event['detail']!r}"
        assert {"phase": "streaming", "detail": ""} in phases and {"phase": "done", "detail": ""} in phases


# -- budget shape and money text ----------------------------------------------------------

def test_budget_is_numbers_with_limited_flag(daemon_factory, fake_llm) -> None:
    d = daemon_factory(llm_config(fake_llm), env_extra=LLM_ENV)
    status = d.get("/api/budget").json()
    assert status["limit_usd"] == 0 and status["remaining_usd"] == 0 and status["limited"] is False
    assert isinstance(status["remaining_usd"], (int, float)) and not isinstance(status["remaining_usd"], bool)
    agent_id = spawn(d)
    assert say(d, agent_id, "spend a little").status_code == 200
    spent = d.get("/api/budget").json()["spent_usd"]
    assert spent > 0
    # A limit of a tenth of a cent: the refusal and the alerts must not read "$0.00".
    assert d.put("/api/budget", json={"limit_usd": 0.001}).status_code == 200
    status = d.get("/api/budget").json()
    assert status["limited"] is True and status["limit_usd"] == 0.001
    assert status["remaining_usd"] == pytest.approx(max(0.0, 0.001 - spent))
    while d.get("/api/budget").json()["spent_usd"] < 0.001:
        assert say(d, agent_id, "spend " + "word " * 200).status_code == 200
    r = say(d, agent_id, "refused now")
    assert r.status_code == 429 and "$0.0010" in r.json()["error"], r.json()["error"]
    assert "$0.00 " not in r.json()["error"]
    status = d.get("/api/budget").json()
    assert status["remaining_usd"] == 0 and status["limited"] is True
    messages = [a["message"] for a in status["alerts"]]
    assert messages and all("$0.0010" in m for m in messages), messages


def test_format_usd() -> None:
    from agentd.money import format_usd

    assert [format_usd(x) for x in (0, 0.001, 0.0008, 0.05, 0.5, 1, 12.345, 0.000012)] == [
        "$0.00", "$0.0010", "$0.00080", "$0.050", "$0.50", "$1.00", "$12.35", "$0.000012"]


# -- /v1 errors follow OpenAI's conventions ---------------------------------------------

@pytest.fixture(scope="module")
def no_retry_daemon(tmp_path_factory, fake_llm):
    from support import Daemon, make_home

    config = llm_config(fake_llm).replace("retries = 1", "retries = 0")
    d = Daemon(make_home(tmp_path_factory.mktemp("noretry"), config), env_extra=LLM_ENV).start()
    yield d
    d.stop()


def sdk(d) -> openai.OpenAI:
    # The SDK's default retry policy (2 retries) is what real clients use.
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", timeout=30)


def test_v1_upstream_500_is_one_upstream_call_and_not_retried(no_retry_daemon, fake_llm) -> None:
    d = no_retry_daemon
    agent_id = spawn(d)
    marker = uuid.uuid4().hex
    with pytest.raises(openai.APIStatusError) as info:
        sdk(d).chat.completions.create(model=agent_id, messages=[
            {"role": "user", "content": f"[[fail:500]] {marker}"}])
    assert info.value.status_code == 503
    assert info.value.response.headers["x-should-retry"] == "false"
    assert info.value.body["type"] == "server_error"
    assert len(user_turns_in(fake_llm, marker)) == 1, "one failing request must make exactly one upstream call"


@pytest.mark.parametrize("upstream", [400, 404])
def test_v1_upstream_refusal_is_500_server_error_and_not_retried(no_retry_daemon, fake_llm, upstream: int) -> None:
    """The spec answers an agent that failed with 500 `server_error` and no code, whatever the
    provider said."""
    d = no_retry_daemon
    agent_id = spawn(d)
    marker = uuid.uuid4().hex
    with pytest.raises(openai.InternalServerError) as info:
        sdk(d).chat.completions.create(model=agent_id, messages=[
            {"role": "user", "content": f"[[fail:{upstream}]] {marker}"}])
    assert info.value.status_code == 500
    assert info.value.response.headers["x-should-retry"] == "false"
    assert info.value.response.json() == {"error": {
        "message": f"message delivery failed: openai model gpt-4o: HTTP {upstream}: fakellm: scripted failure "
                   f"{upstream}", "type": "server_error"}}
    assert len(user_turns_in(fake_llm, marker)) == 1, "the SDK retried a final answer"


def test_v1_missing_provider_key_is_not_the_clients_key(no_retry_daemon, fake_llm) -> None:
    """Not a 401: the client's own key to agentd is fine, and a 401 would say it is not."""
    d = no_retry_daemon
    agent_id = spawn(d, model='[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n')
    with pytest.raises(openai.APIStatusError) as info:
        sdk(d).chat.completions.create(model=agent_id, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 424 and info.value.body["type"] == "invalid_request_error"
    assert info.value.body["code"] == "provider_key_missing"
    assert "GROQ_API_KEY" in info.value.body["message"]


def test_v1_upstream_401_and_429_map_to_their_classes(no_retry_daemon, fake_llm) -> None:
    d = no_retry_daemon
    agent_id = spawn(d)
    marker = uuid.uuid4().hex
    # The provider refused agentd's key to it: the agent failed (500), not the client's key.
    with pytest.raises(openai.InternalServerError) as failed:
        sdk(d).chat.completions.create(model=agent_id, messages=[{"role": "user", "content": f"[[fail:401]] {marker}"}])
    assert failed.value.body["type"] == "server_error" and "rejected the API key" in failed.value.body["message"]
    assert failed.value.response.headers["x-should-retry"] == "false"
    assert len(user_turns_in(fake_llm, marker)) == 1
    marker = uuid.uuid4().hex
    with pytest.raises(openai.RateLimitError) as info:
        sdk(d).chat.completions.create(model=agent_id, messages=[
            {"role": "user", "content": f"[[fail:429 retry_after=7]] {marker}"}])
    assert info.value.response.headers["retry-after"] == "7"
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(user_turns_in(fake_llm, marker)) == 1


def test_v1_stopped_run_is_final_and_not_redone(no_retry_daemon, fake_llm) -> None:
    d = no_retry_daemon
    agent_id = spawn(d)
    marker = uuid.uuid4().hex
    result: dict = {}

    def call() -> None:
        try:
            sdk(d).chat.completions.create(model=agent_id, messages=[
                {"role": "user", "content": f"[[slow:3]] {marker}"}])
        except openai.APIStatusError as exc:
            result["exc"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    assert fake_llm.wait_requests(1, 10)
    deadline = time.monotonic() + 10
    while not user_turns_in(fake_llm, marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
    thread.join(20)
    exc = result["exc"]
    assert exc.status_code == 409 and exc.response.headers["x-should-retry"] == "false"
    time.sleep(0.5)
    assert len(user_turns_in(fake_llm, marker)) == 1, "the stop was undone by a retry"


def test_v1_budget_refusal_is_429_with_retry_after(daemon_factory, fake_llm) -> None:
    d = daemon_factory(llm_config(fake_llm), env_extra=LLM_ENV)
    agent_id = spawn(d)
    assert say(d, agent_id, "spend").status_code == 200
    d.put("/api/budget", json={"limit_usd": 0.0000001})
    r = d.post("/v1/chat/completions", json={"model": agent_id, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "budget_exceeded"


# -- runs that end without an answer ---------------------------------------------------

def _roles_sent(entry: dict) -> list[str]:
    return [m["role"] for m in entry["json"]["messages"] if m["role"] != "system"]


def test_failed_run_leaves_no_orphan_user_message(agent_daemon, fake_llm) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = say(d, agent_id, "[[fail:400]] this one fails")
    assert r.status_code >= 400
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert [m["role"] for m in messages] == ["User", "Assistant"]
    assert messages[1]["content"].startswith("[run failed:")
    marker = uuid.uuid4().hex
    assert say(d, agent_id, f"next turn {marker}").status_code == 200
    sent = user_turns_in(fake_llm, marker)[-1]
    roles = _roles_sent(sent)
    assert roles == ["user", "assistant", "user"], f"history sent to the model: {roles}"
    assert not any(a == b == "user" for a, b in zip(roles, roles[1:])), "two user turns in a row"


def test_stopped_run_leaves_no_orphan_user_message(agent_daemon, fake_llm) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    marker = uuid.uuid4().hex
    thread = threading.Thread(target=lambda: say(d, agent_id, f"[[slow:3]] {marker}"))
    thread.start()
    deadline = time.monotonic() + 10
    while not user_turns_in(fake_llm, marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
    thread.join(20)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
        if len(messages) == 2:
            break
        time.sleep(0.1)
    assert [m["role"] for m in messages] == ["User", "Assistant"]
    assert "stopped" in messages[1]["content"]
    marker2 = uuid.uuid4().hex
    assert say(d, agent_id, f"after stop {marker2}").status_code == 200
    assert _roles_sent(user_turns_in(fake_llm, marker2)[-1]) == ["user", "assistant", "user"]


# -- manifest keys nobody uses --------------------------------------------------------------

LOCAL_MODEL = '[model]\nprovider = "ollama"\nmodel = "llama3.2"\n'

def test_unknown_manifest_keys_are_reported_as_warnings(shared_daemon) -> None:
    d = shared_daemon
    name = f"typo-{uuid.uuid4().hex[:6]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\nprofle = "coding"\n'
                                                     '[model]\nprovder = "openai"\n'})
    assert r.status_code == 201
    warnings = r.json()["warnings"]
    assert any("'profle'" in w and "'profile'" in w for w in warnings), warnings
    assert any("'model.provder'" in w and "'model.provider'" in w for w in warnings), warnings
    assert f"manifest: unknown key 'profle'" in d.log()
    # (A local provider: a missing provider key would be a warning too.)
    r = d.post("/api/agents", json={"manifest_toml": f'name = "clean-{uuid.uuid4().hex[:6]}"\n'
                                                     'profile = "minimal"\n' + LOCAL_MODEL})
    assert r.status_code == 201 and r.json()["warnings"] == []


def test_unknown_tool_names_are_reported_as_warnings(shared_daemon) -> None:
    d = shared_daemon
    name = f"tools-{uuid.uuid4().hex[:6]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n[capabilities]\n'
                                                     'tools = ["file_read", "fiel_write"]\n' + LOCAL_MODEL})
    assert r.status_code == 201
    warnings = r.json()["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("capabilities.tools: unknown tool 'fiel_write' ignored (known: ")
    assert "file_write" in warnings[0]
    assert d.get(f"/api/agents/{r.json()['agent_id']}").json()["capabilities"]["tools"] == ["file_read"]


# -- WebSocket frame order ---------------------------------------------------------------------

def test_websocket_typing_stop_comes_before_the_response(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    ws = websocket.create_connection(f"ws://127.0.0.1:{d.port}/api/agents/{agent_id}/ws", timeout=10)
    assert json.loads(ws.recv())["type"] == "connected"
    for _ in range(3):
        ws.send(json.dumps({"type": "message", "content": "[[chunks:3]] hi"}))
        frames = []
        while True:
            frame = json.loads(ws.recv())
            frames.append(frame)
            if frame["type"] == "response":
                break
        typing = [f for f in frames if f["type"] == "typing"]
        assert typing[0]["state"] == "start" and typing[-1]["state"] == "stop"
        ws.settimeout(0.5)
        try:
            extra = json.loads(ws.recv())
        except websocket.WebSocketTimeoutException:
            extra = None
        ws.settimeout(10)
        assert extra is None, f"a frame arrived after the response: {extra}"
    ws.close()
