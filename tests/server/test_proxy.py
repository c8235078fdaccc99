"""agentd behind a real nginx, under /agentd/, with TLS.

nginx runs docs/nginx-agentd.conf (see nginxproxy.py) in front of the real daemon,
whose config is the one docs/deploy.md shows. A remote client is simulated two
ways: through an X-Forwarded-For chain (an outer proxy on loopback forwarded a
client's request, as a load balancer in front of nginx would), and, where this
machine has a non-loopback address, by really connecting from it.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
import tomlkit
import tomllib
import websocket

from conftest import LLM_ENV, llm_config
from nginxproxy import DEPLOY_DOC, PUBLIC_NAME, ROOT, SITE_CONF, Nginx, lan_address
from support import Daemon, free_port, make_home, run_cli
from tests.agents.test_agents import manifest

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
                                reason="nginx is not installed (.ci/apt-packages installs it)")

KEY = "proxy-test-key"
REMOTE = "203.0.113.7"          # a client on the internet (TEST-NET-3)
OTHER_REMOTE = "198.51.100.9"   # another one (TEST-NET-2)
LAN = lan_address()
needs_lan = pytest.mark.skipif(LAN is None, reason="this machine has no non-loopback address")


def deploy_toml() -> dict:
    """The agentd config block of docs/deploy.md."""
    block = re.search(r"```toml\n(.*?)```", DEPLOY_DOC.read_text(), re.S)
    assert block, "docs/deploy.md has no ```toml block"
    return tomllib.loads(block.group(1))


def config_text(fake=None, top: dict | None = None, **api: object) -> str:
    """deploy.md's config, with test-only overrides (the port comes from AGENTD_LISTEN)."""
    data = deploy_toml()
    data["api"].update({"rate_limit_per_second": 100000, "rate_limit_burst": 100000,
                        "shutdown_grace_secs": 3})
    data["api"].update(api)
    data.update(top or {})
    base = llm_config(fake).split("\n[llm]", 1)[1] if fake is not None else ""
    return tomlkit.dumps(data) + ("\n[llm]" + base if base else "")


class Stack:
    """A daemon and the nginx in front of it."""

    def __init__(self, root: Path, config: str, api_key: str = "", env: dict | None = None,
                 lan: str | None = None) -> None:
        self.daemon = Daemon(make_home(root, config), api_key=api_key,
                             env_extra={**(env or {}), **({"AGENTD_API_KEY": api_key} if api_key else {})})
        self.daemon.start()
        self.nginx = Nginx(self.daemon.port, lan).start()
        self.verify = str(self.nginx.cert)

    def get(self, path: str, base: str | None = None, **kwargs) -> requests.Response:
        return self.request("GET", path, base, **kwargs)

    def post(self, path: str, base: str | None = None, **kwargs) -> requests.Response:
        return self.request("POST", path, base, **kwargs)

    def request(self, method: str, path: str, base: str | None = None, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("verify", self.verify)
        kwargs.setdefault("allow_redirects", False)
        return requests.request(method, f"{base or self.nginx.url}{path}", **kwargs)

    def stop(self) -> None:
        self.nginx.stop()
        self.daemon.stop()


def bearer(key: str = KEY, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, fake_llm) -> Iterator[Stack]:
    """The deployment of docs/deploy.md: key, trusted nginx, public name, fast keep-alive."""
    stack = Stack(tmp_path_factory.mktemp("keyed"), config_text(fake_llm, sse_keepalive_secs=0.3),
                  api_key=KEY, env=LLM_ENV, lan=LAN)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def keyless(tmp_path_factory) -> Iterator[Stack]:
    """The issue's report: behind nginx with no api_key, but with trusted_proxies set."""
    stack = Stack(tmp_path_factory.mktemp("keyless"), config_text(), lan=LAN)
    yield stack
    stack.stop()


# -- the doc and the tested config are the same ---------------------------------------

def test_deploy_doc_shows_the_tested_nginx_config() -> None:
    doc = DEPLOY_DOC.read_text()
    assert SITE_CONF.read_text().rstrip() in doc, "docs/deploy.md must include docs/nginx-agentd.conf verbatim"
    unit = (ROOT / "docs" / "agentd.service").read_text()
    assert unit.rstrip() in doc
    api = deploy_toml()["api"]
    assert api["trusted_proxies"] and api["allowed_hosts"] == [PUBLIC_NAME]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_has_no_unknown_settings(tmp_path: Path) -> None:
    unit = (ROOT / "docs" / "agentd.service").read_text()
    unit = re.sub(r"ExecStart=.*", "ExecStart=/bin/true", unit).replace("EnvironmentFile=", "#")
    path = tmp_path / "agentd.service"
    path.write_text(unit)
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    problems = [line for line in r.stderr.splitlines() if str(path) in line]
    assert problems == [], problems


# -- the JSON API through the prefix ---------------------------------------------------

def test_api_through_the_prefix_over_tls(keyed: Stack) -> None:
    r = keyed.get("/agentd/api/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert keyed.get("/agentd/api/agents").status_code == 401
    r = keyed.post("/agentd/api/agents", headers=bearer(),
                   json={"manifest_toml": manifest("via-nginx")})
    assert r.status_code == 201, r.text
    agent_id = r.json()["agent_id"]
    r = keyed.post(f"/agentd/api/agents/{agent_id}/message", headers=bearer(), json={"message": "through nginx"})
    assert r.status_code == 200 and r.json()["response"] == "echo: through nginx"
    r = keyed.get("/agentd/v1/models", headers=bearer())
    assert "agentd:via-nginx" in [m["id"] for m in r.json()["data"]]
    # Outside the prefix nginx serves nothing of agentd's.
    assert keyed.get("/api/health").status_code == 404


def test_body_limits_answer_json_through_nginx(keyed: Stack) -> None:
    r = keyed.post("/agentd/api/agents", headers=bearer(), data=b'{"manifest_toml": "' + b"x" * 4_000_000 + b'"}',
                   timeout=60)
    assert r.status_code == 413 and "error" in r.json(), "the daemon's own 413 passes through"
    agent_id = keyed.post("/agentd/api/agents", headers=bearer(),
                          json={"manifest_toml": manifest("uploader")}).json()["agent_id"]
    r = keyed.post(f"/agentd/api/agents/{agent_id}/upload", headers=bearer(),
                   files={"file": ("big.txt", b"y" * (9 * 1024 * 1024), "text/plain")}, timeout=60)
    assert r.status_code == 201, "a 9 MB upload fits nginx's client_max_body_size"
    r = keyed.post(f"/agentd/api/agents/{agent_id}/upload", headers=bearer(),
                   files={"file": ("huge.txt", b"z" * (12 * 1024 * 1024), "text/plain")}, timeout=60)
    assert r.status_code == 413
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json() == {"error": "request body too large"}


# -- the real client address -------------------------------------------------------------

def test_remote_client_behind_trusted_proxy_needs_the_key(keyless: Stack) -> None:
    d = keyless.daemon
    remote = {"X-Forwarded-For": REMOTE}
    r = keyless.get("/agentd/api/agents", headers=remote)
    assert r.status_code == 401, "a remote client behind nginx was served as loopback"
    assert r.json()["error"].startswith("API key required for non-loopback clients")
    r = keyless.post("/agentd/api/shutdown", headers=remote)
    assert r.status_code == 401
    time.sleep(0.3)
    assert d.proc.poll() is None and d.get("/api/health").ok, "a remote client shut the daemon down"
    # The dashboard holds back what the daemon knows too.
    page = keyless.get("/agentd/", headers=remote)
    assert page.status_code in (200, 303, 401) and "uptime" not in page.text.lower()
    # A client on this machine, through nginx, is loopback and needs no key.
    assert keyless.get("/agentd/api/agents").status_code == 200


@pytest.mark.parametrize("forged", [
    {"X-Forwarded-For": "127.0.0.1"},
    {"X-Forwarded-For": f"127.0.0.1, {REMOTE}"},
    {"Forwarded": "for=127.0.0.1"},
    {"Forwarded": 'for="[::1]"', "X-Forwarded-For": REMOTE},
])
def test_remote_client_cannot_claim_loopback(keyless: Stack, forged: dict) -> None:
    # The outer proxy (loopback, trusted) appended the client it saw: REMOTE. Whatever
    # the client put before that is left of the right-most untrusted hop.
    headers = dict(forged)
    headers["X-Forwarded-For"] = ", ".join(filter(None, [forged.get("X-Forwarded-For"), REMOTE]))
    r = keyless.get("/agentd/api/agents", headers=headers)
    assert r.status_code == 401, f"{forged} made a remote client loopback"


@needs_lan
def test_client_from_a_non_loopback_address_through_nginx(keyless: Stack, keyed: Stack) -> None:
    public = {"Host": PUBLIC_NAME}
    for forged in ({}, {"X-Forwarded-For": "127.0.0.1"}, {"Forwarded": "for=127.0.0.1"}):
        r = keyless.get("/agentd/api/agents", base=keyless.nginx.lan_url, headers={**public, **forged})
        assert r.status_code == 401, f"peer {LAN} with {forged} was served without a key"
    r = keyless.post("/agentd/api/shutdown", base=keyless.nginx.lan_url,
                     headers={**public, "X-Forwarded-For": "::1"})
    assert r.status_code == 401
    r = keyed.get("/agentd/api/agents", base=keyed.nginx.lan_url, headers=bearer(**public))
    assert r.status_code == 200


def test_remote_client_with_the_key_is_served(keyed: Stack) -> None:
    remote = {"X-Forwarded-For": REMOTE}
    assert keyed.get("/agentd/api/status", headers=remote).status_code == 401
    r = keyed.get("/agentd/api/status", headers=bearer(**remote))
    assert r.status_code == 200 and r.json()["status"] == "running"
    assert keyed.get("/agentd/api/status", headers=bearer("wrong", **remote)).status_code == 401


@needs_lan
def test_spoofed_forwarding_headers_from_an_untrusted_peer_are_ignored(tmp_path: Path) -> None:
    # The daemon itself listens beyond loopback; the test connects from LAN, which is
    # not a trusted proxy, and claims to be a loopback client behind one.
    port = free_port()
    home = make_home(tmp_path, config_text(allowed_hosts=[LAN]))
    d = Daemon(home, port=port, env_extra={"AGENTD_LISTEN": f"0.0.0.0:{port}"}).start()
    try:
        for forged in ({"X-Forwarded-For": "127.0.0.1"}, {"Forwarded": "for=127.0.0.1"},
                       {"X-Forwarded-For": "::1", "X-Forwarded-Host": "localhost"}):
            r = requests.get(f"http://{LAN}:{port}/api/agents", headers=forged, timeout=10)
            assert r.status_code == 401, f"{forged} from untrusted {LAN} was believed"
    finally:
        d.stop()


def test_forwarding_headers_from_an_untrusted_loopback_peer_are_ignored(tmp_path: Path) -> None:
    # Only 10.9.9.9 is trusted: the test's own loopback connection is not a proxy.
    d = Daemon(make_home(tmp_path, config_text(trusted_proxies=["10.9.9.9/32"]))).start()
    try:
        r = d.get("/api/agents", headers={"X-Forwarded-For": REMOTE, "Forwarded": f"for={REMOTE}"})
        assert r.status_code == 200, "X-Forwarded-For from an untrusted peer changed the client"
        r = d.get("/api/agents", headers={"X-Forwarded-Host": "evil.example"})
        assert r.status_code == 200, "X-Forwarded-Host from an untrusted peer reached the Host check"
        page = d.get("/", headers={"X-Forwarded-Prefix": "/evil", "X-Forwarded-Proto": "https"})
        assert "/evil/" not in page.text and 'href="/static/' in page.text
        assert "Secure" not in page.headers.get("Set-Cookie", "")
    finally:
        d.stop()


def test_a_rebound_page_on_this_machine_cannot_forward_a_host_of_its_own(tmp_path: Path) -> None:
    # deploy.md's config without the key: loopback peers are trusted proxies. A page whose
    # name now resolves to 127.0.0.1 sends its own Host, and may add X-Forwarded-Host itself.
    d = Daemon(make_home(tmp_path, config_text())).start()
    try:
        for forwarded in ({"X-Forwarded-Host": f"localhost:{d.port}"}, {"X-Forwarded-Host": PUBLIC_NAME},
                          {"Forwarded": "for=127.0.0.1;host=localhost"}):
            r = d.get("/api/agents", headers={"Host": f"attacker.example:{d.port}", **forwarded})
            assert (r.status_code, r.json()) == (400, {"error": "host not allowed"}), forwarded
        # What a proxy on this machine sends: its own upstream address, or the public name.
        for host in (f"127.0.0.1:{d.port}", PUBLIC_NAME):
            r = d.get("/api/agents", headers={"Host": host, "X-Forwarded-Host": PUBLIC_NAME})
            assert r.status_code == 200, host
    finally:
        d.stop()


def test_rate_limit_and_request_log_use_the_real_client(tmp_path: Path) -> None:
    stack = Stack(tmp_path, config_text(top={"log_level": "debug"}, rate_limit_per_second=0.01,
                                        rate_limit_burst=2), api_key=KEY)
    try:
        # The client forges a different address at the left each time; the hop the
        # outer proxy appended (REMOTE) is what counts.
        codes = [stack.get("/agentd/api/agents", headers=bearer(**{"X-Forwarded-For": f"192.0.2.{i}, {REMOTE}"}))
                 .status_code for i in range(3)]
        assert codes == [200, 200, 429], "forged left-most hops got fresh rate-limit budgets"
        r = stack.get("/agentd/api/agents", headers=bearer(**{"X-Forwarded-For": OTHER_REMOTE}))
        assert r.status_code == 200, "one remote client's flood throttled another behind the same proxy"
        assert r.headers["X-RateLimit-Remaining"] == "1"
        deadline = time.monotonic() + 5
        while f"client {OTHER_REMOTE} via 127.0.0.1" not in stack.daemon.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = stack.daemon.log()
        assert f"GET /api/agents -> 429" in log and f"client {REMOTE} via 127.0.0.1" in log
        assert f"client {OTHER_REMOTE} via 127.0.0.1" in log
        # With the daemon gone, nginx answers in the API's error shape.
        stack.daemon.stop()
        r = stack.get("/agentd/api/health")
        assert r.status_code == 502 and r.json() == {"error": "agentd is not reachable"}
    finally:
        stack.stop()


# -- host, scheme and origin as the browser sees them ----------------------------------------

def test_public_name_and_https_origin(keyed: Stack) -> None:
    port = keyed.nginx.port
    public = {"Host": f"{PUBLIC_NAME}:{port}"}
    assert keyed.get("/agentd/api/health", headers=public).status_code == 200
    r = keyed.get("/agentd/api/health", headers={"Host": f"other.example:{port}"})
    assert r.status_code == 400 and r.json() == {"error": "host not allowed"}
    body = {"manifest_toml": manifest("origin-check")}
    own = f"https://{PUBLIC_NAME}:{port}"
    r = keyed.post("/agentd/api/agents", headers=bearer(Origin=own, **public), json=body)
    assert r.status_code == 201, f"the browser's own https origin was refused: {r.text}"
    for foreign in (f"http://{PUBLIC_NAME}:{port}", f"https://{PUBLIC_NAME}", "https://evil.example"):
        r = keyed.post("/agentd/api/agents", headers=bearer(Origin=foreign, **public),
                       json={"manifest_toml": manifest("never")})
        assert r.status_code == 403, f"Origin {foreign} was taken for the daemon's own"


# -- streams ------------------------------------------------------------------------------

def test_sse_events_arrive_one_by_one_through_nginx(keyed: Stack) -> None:
    # 1.5 s apart: a loaded client still reads each tick before the next is made.
    r = keyed.get("/agentd/api/_sse/ticks?n=3&interval=1.5", headers=bearer(), stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["Cache-Control"] == "no-cache"
    ticks = []
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data:"):
            data = json.loads(line[5:])
            if "n" in data:
                ticks.append((data["sent_at"], time.time()))
    assert len(ticks) == 3
    for (_, arrived), (next_sent, _) in zip(ticks, ticks[1:]):
        # Each tick was in the client's hands before the daemon even made the next one.
        assert arrived < next_sent, f"nginx held events back: {ticks}"


def test_sse_keepalive_comments_at_the_configured_interval(keyed: Stack) -> None:
    agent_id = keyed.post("/agentd/api/agents", headers=bearer(),
                          json={"manifest_toml": manifest("slowpoke")}).json()["agent_id"]
    r = keyed.post(f"/agentd/api/agents/{agent_id}/message/stream", headers=bearer(),
                   json={"message": "[[slow:1.6]] wait for it"}, stream=True)
    assert r.status_code == 200
    lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    keepalives = [line for line in lines if line == ": keep-alive"]
    # 0.3 s apart over a 1.6 s wait; the default (15 s) would give none.
    assert len(keepalives) >= 3, lines
    events = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    assert events[-1]["done"] is True
    assert "".join(e.get("content", "") for e in events if e.get("done") is False) == "echo: wait for it"


def test_websocket_chat_through_nginx(keyed: Stack) -> None:
    agent_id = keyed.post("/agentd/api/agents", headers=bearer(),
                          json={"manifest_toml": manifest("ws-chat")}).json()["agent_id"]
    url = f"wss://127.0.0.1:{keyed.nginx.port}/agentd/api/agents/{agent_id}/ws"
    sslopt = {"ca_certs": keyed.verify, "cert_reqs": ssl.CERT_REQUIRED}
    ws = websocket.create_connection(url, sslopt=sslopt, timeout=15, header=[f"Authorization: Bearer {KEY}"],
                                     origin=f"https://127.0.0.1:{keyed.nginx.port}")
    try:
        assert json.loads(ws.recv()) == {"type": "connected", "agent_id": agent_id}
        ws.send(json.dumps({"type": "message", "content": "[[chunks:3]] hi"}))
        frames = []
        while True:
            frame = json.loads(ws.recv())
            frames.append(frame)
            if frame["type"] in ("response", "error"):
                break
        assert frame["type"] == "response" and frame["content"] == "w1 w2 w3"
        assert "".join(f["content"] for f in frames if f["type"] == "text_delta") == "w1 w2 w3"
        ws.send(json.dumps({"type": "ping"}))
        assert json.loads(ws.recv()) == {"type": "pong"}
    finally:
        ws.close()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(url, sslopt=sslopt, timeout=15, header=[f"Authorization: Bearer {KEY}"],
                                    origin="https://evil.example")
    assert refused.value.status_code == 403
    with pytest.raises(websocket.WebSocketBadStatusException) as anonymous:
        websocket.create_connection(url, sslopt=sslopt, timeout=15, header=[f"X-Forwarded-For: {REMOTE}"])
    assert anonymous.value.status_code == 401


# -- the dashboard under the prefix --------------------------------------------------------

def test_dashboard_links_and_assets_keep_the_prefix(keyed: Stack) -> None:
    r = keyed.get("/agentd")
    assert r.status_code == 301 and r.headers["Location"].endswith(f":{keyed.nginx.port}/agentd/")
    page = keyed.get("/agentd/", headers=bearer())
    assert page.status_code in (200, 303)
    html = page.text if page.status_code == 200 else keyed.get(
        page.headers["Location"].removeprefix(keyed.nginx.url)).text
    links = re.findall(r'(?:href|src|action|data-[a-z-]*url)="([^"#]+)"', html)
    local = [link for link in links if not link.startswith(("http:", "https:", "data:", "mailto:"))]
    assert local, html
    assert all(link.startswith("/agentd/") for link in local), local
    for link in local:
        if "/static/" in link:
            asset = keyed.get(link)
            assert asset.status_code == 200, link


def test_doctor_warns_about_trusted_proxies_without_a_key(tmp_path: Path) -> None:
    home = make_home(tmp_path, config_text())
    r = run_cli(home, "doctor", "--json", port=free_port())
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert checks["trusted_proxies"]["status"] == "warn"
    assert "api_key" in checks["trusted_proxies"]["message"]
    r = run_cli(home, "doctor", "--json", port=free_port(), env_extra={"AGENTD_API_KEY": "k"})
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert checks["trusted_proxies"]["status"] == "ok"


def test_dashboard_login_under_prefix_and_https(keyed: Stack) -> None:
    """Login redirects, form actions, the cookie's path and its Secure flag behind nginx."""
    if not (ROOT / "agentd" / "api" / "pages").is_dir():
        pytest.skip("this tree has no dashboard login yet")
    http = requests.Session()  # keeps the session cookie between requests
    tls = {"verify": keyed.verify, "allow_redirects": False, "timeout": 30}
    base = keyed.nginx.url
    r = http.get(f"{base}/agentd/agents", **tls)
    assert r.status_code == 303 and r.headers["Location"].startswith("/agentd/login"), r.headers.get("Location")
    login = http.get(base + r.headers["Location"], **tls)
    assert login.status_code == 200
    cookie = login.headers.get("Set-Cookie", "")
    assert "; Secure" in cookie and "Path=/agentd" in cookie, cookie
    action = re.search(r'<form method="post" action="([^"]+)"', login.text).group(1)
    assert action == "/agentd/login"
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', login.text))
    r = http.post(base + action, data={**fields, "api_key": KEY}, headers={"Origin": base}, **tls)
    assert r.status_code == 303, r.text
    assert r.headers["Location"].startswith("/agentd/"), f"login redirected out of the prefix: {r.headers['Location']}"
    assert "; Secure" in r.headers["Set-Cookie"]
    page = http.get(base + r.headers["Location"], **tls)
    assert page.status_code == 200
    links = re.findall(r'(?:href|src|action|data-[a-z-]*url)="([^"#]+)"', page.text)
    local = [link for link in links if link.startswith("/")]
    assert local and all(link.startswith("/agentd/") for link in local), local


def test_webhook_audit_names_the_sender_behind_a_trusted_proxy(tmp_path: Path, fake_llm) -> None:
    from channel_fixtures import AGENT_TOML, CHANNEL_ENV, audit, configure, wait_active, wait_for

    config = llm_config(fake_llm).replace("[api]\n", '[api]\ntrusted_proxies = ["127.0.0.1"]\n', 1)
    d = Daemon(make_home(tmp_path, config), env_extra={**LLM_ENV, **CHANNEL_ENV}).start()
    try:
        assert d.post("/api/agents", json={"manifest_toml": AGENT_TOML}).status_code == 201
        port = free_port()
        configure(d, "webhook", listen_port=port, callback_url="http://127.0.0.1:9/cb",
                  secret_env="WEBHOOK_TEST_SECRET", default_agent="helper")
        wait_active(d, "webhook")
        for xff in (REMOTE, f"127.0.0.1, {OTHER_REMOTE}, 127.0.0.1"):
            r = requests.post(f"http://127.0.0.1:{port}/", data=b"{}", timeout=5,
                              headers={"X-Forwarded-For": xff, "X-Webhook-Signature": "sha256=00"})
            assert r.status_code == 401
        wait_for(lambda: len(audit(d, "channel.refused", "webhook")) == 2, what="audit entries")
        remotes = [e["detail"]["remote"] for e in audit(d, "channel.refused", "webhook")]
        assert remotes == [OTHER_REMOTE, REMOTE]
    finally:
        d.stop()
