"""browser_* through the real daemon: the fake LLM calls the tools, the system Chromium runs the pages."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from agentd.agents.tools.browser import CALL_LIMIT
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home, stop_shared, wait_until
from tests.agents.tools.tool_calls import call, spawn

pytest.importorskip("selenium")
if not Path("/usr/bin/chromium").exists() or not Path("/usr/bin/chromedriver").exists():
    pytest.skip("chromium and chromedriver are not installed", allow_module_level=True)

NET = '[capabilities]\nnetwork = ["*"]\n'
PAGES = {
    # The text is written by JavaScript: a plain fetch would not see it.
    "/": """<html><head><title>Local app</title></head><body><h1 id="h">static</h1>
<input id="name"><button id="go" onclick="document.getElementById('out').textContent =
 'hello ' + document.getElementById('name').value">Greet</button><p id="out"></p>
<a href="/second">Second page</a>
<button onclick="location.href = 'http://localhost:' + location.port + '/secret'">Leave</button>
<script>document.getElementById('h').textContent = 'rendered by script';
setTimeout(() => { const d = document.createElement('div'); d.id = 'late'; d.textContent = 'late content';
document.body.appendChild(d); }, 300);</script></body></html>""",
    "/second": "<html><head><title>Second</title></head><body><p>the second page</p></body></html>",
    "/secret": "<html><body>internal secret</body></html>",
    # Requests a page makes by itself, to an address the agent may not reach.
    "/embeds": """<html><head><title>Embeds</title></head><body><p>embeds</p><script>
const other = 'http://localhost:' + location.port;
new Image().src = other + '/pixel';
fetch(other + '/fetched', {mode: 'no-cors'}).catch(() => {});
const f = document.createElement('iframe'); f.src = other + '/framed'; document.body.appendChild(f);
</script></body></html>""",
}
HITS: list[str] = []
# WebRTC asks a STUN server over UDP, past any HTTP proxy, unless the browser is told not to.
WEBRTC = """<html><head><title>Peer</title></head><body><script>
const pc = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.1:' + location.hash.slice(1)}]});
pc.createDataChannel('x');
pc.createOffer().then(offer => pc.setLocalDescription(offer));
</script></body></html>"""


class _Site(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        HITS.append(f"{self.headers['Host'].split(':')[0]} {self.path}")
        if self.path == "/peer":
            body = WEBRTC.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/secret")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = PAGES.get(self.path, "<html><body>not found</body></html>").encode()
        self.send_response(200 if self.path in PAGES else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def bd(tmp_path_factory, fake_llm):
    extra = '\n[tools]\nfetch_allow_hosts = ["127.0.0.1"]\nbrowser_idle_secs = 2\nbrowser_max_text_bytes = 4000\n'
    home = make_home(tmp_path_factory.mktemp("browser"), llm_config(fake_llm, extra + NO_REMEMBERING))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def drivers(d: Daemon) -> list[int]:
    """chromedriver processes the daemon started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2:].split()
        if text[text.index("(") + 1:text.rindex(")")] == "chromedriver" and int(rest[1]) == d.proc.pid:
            found.append(int(stat.parent.name))
    return found


def group(leader: int) -> list[int]:
    """The live processes of `leader`'s process group (chromedriver's: every Chromium process)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[3]) == leader and rest[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_a_page_that_needs_javascript(bd, site) -> None:
    agent = spawn(bd, extra=NET)
    page = call(bd, agent, "browser_navigate", url=site + "/")
    assert page.startswith(f"title: Local app\nurl: {site}/\n\nrendered by script"), page
    assert call(bd, agent, "browser_wait", selector="#late", timeout_ms=5000) == "#late is present"
    assert call(bd, agent, "browser_wait", selector="#late", timeout_ms=0) == \
        "error: timeout_ms is a number of milliseconds, at least 1, not 0"
    assert call(bd, agent, "browser_wait", selector="#never", timeout_ms=50) == "error: '#never' did not appear within 50 ms"
    assert "late content" in call(bd, agent, "browser_read_page")
    assert call(bd, agent, "browser_type", selector="#name", text="Ann") == "typed 3 characters into #name"
    assert "hello Ann" in call(bd, agent, "browser_click", selector="#go")
    assert call(bd, agent, "browser_run_js", expression="document.title + ' ' + (6 * 7)") == '"Local app 42"'
    # A link named by its visible text, then back.
    assert call(bd, agent, "browser_click", selector="Second page").startswith("title: Second\n")
    assert call(bd, agent, "browser_back").startswith("title: Local app\n")
    assert call(bd, agent, "browser_scroll", direction="sideways") == \
        "error: direction must be one of up, down, left, right, not 'sideways'"
    assert call(bd, agent, "browser_scroll", direction="up", amount=-300) == \
        "error: amount is a number of pixels, at least 1 (the direction says which way), not -300"
    assert call(bd, agent, "browser_scroll", amount=0) == \
        "error: amount is a number of pixels, at least 1 (the direction says which way), not 0"
    shot = json.loads(call(bd, agent, "browser_screenshot"))
    assert shot["content_type"] == "image/png" and shot["url"] == site + "/"
    listed = bd.get(f"/api/agents/{agent}/uploads").json()
    assert [u["file_id"] for u in listed] == [shot["file_id"]]
    png = bd.get(f"/api/agents/{agent}/uploads/{shot['file_id']}")
    assert png.status_code == 200 and png.headers["Content-Type"] == "image/png"
    assert png.content.startswith(b"\x89PNG") and len(png.content) == shot["size"]
    page = bd.get(f"/agents/{agent}/files")
    assert page.status_code == 200 and f'src="/agents/{agent}/files/{shot["file_id"]}"' in page.text
    assert call(bd, agent, "browser_close") == "browser closed"
    assert call(bd, agent, "browser_close") == "no browser was open"
    events = [e["event"] for e in bd.get("/api/audit/recent?limit=100").json()
              if (e.get("detail") or {}).get("agent_id") == agent]
    assert {"tool.browser_navigate", "tool.browser_type", "tool.browser_click", "tool.browser_run_js",
            "tool.browser_back", "tool.browser_screenshot", "tool.browser_close"} <= set(events)
    assert events.count("tool.browser_close") == 1


def test_private_addresses_are_refused_like_web_fetch(bd, site) -> None:
    agent = spawn(bd, extra=NET)
    port = site.rsplit(":", 1)[1]
    refused = call(bd, agent, "browser_navigate", url=f"http://localhost:{port}/secret")
    assert refused.startswith("error: refusing to fetch localhost: it resolves to the private or loopback "
                              "address"), refused
    assert call(bd, agent, "browser_navigate", url="file:///etc/passwd") == \
        "error: only http and https URLs can be fetched, not 'file'"
    # A page that sends the browser to a refused address loses it.
    call(bd, agent, "browser_navigate", url=site + "/")
    left = call(bd, agent, "browser_click", selector="Leave")
    assert left.startswith("error: refusing to fetch localhost"), left
    assert "internal secret" not in call(bd, agent, "browser_read_page")
    redirected = call(bd, agent, "browser_navigate", url=site + "/redirect")
    assert redirected.startswith("error: refusing to fetch localhost"), redirected
    assert call(bd, agent, "browser_navigate", url=site + "/embeds").startswith("title: Embeds\n")
    assert call(bd, agent, "browser_navigate", url=site + "/second").startswith("title: Second\n")
    assert [hit for hit in HITS if hit.startswith("localhost")] == [], \
        "BUG: the browser connected to an address web_fetch refuses"
    stun = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stun.bind(("127.0.0.1", 0))
    stun.settimeout(3)
    with stun:
        assert call(bd, agent, "browser_navigate", url=f"{site}/peer#{stun.getsockname()[1]}").startswith(
            "title: Peer\n")
        with pytest.raises(socket.timeout):
            stun.recvfrom(2048)
    narrow = spawn(bd, extra='[capabilities]\nnetwork = ["example.com"]\n')
    assert call(bd, narrow, "browser_navigate", url=site + "/") == \
        "error: host 127.0.0.1 is not in this agent's network allowlist (example.com)"


def test_idle_and_killed_agents_lose_their_browser(bd, site) -> None:
    before = set(drivers(bd))
    agent = spawn(bd, extra=NET)
    call(bd, agent, "browser_navigate", url=site + "/second")
    started = set(drivers(bd)) - before
    assert len(started) == 1
    wait_until(lambda: not set(drivers(bd)) & started, "the idle browser closes", timeout=30)
    other = spawn(bd, extra=NET)
    call(bd, other, "browser_navigate", url=site + "/second")
    mine = set(drivers(bd)) - before
    assert bd.delete(f"/api/agents/{other}").status_code == 200
    wait_until(lambda: not set(drivers(bd)) & mine, "the killed agent's browser closes", timeout=15)


def test_a_script_that_never_ends_costs_the_browser_and_no_more(bd, site) -> None:
    before = set(drivers(bd))
    agent = spawn(bd, extra=NET)
    assert call(bd, agent, "browser_navigate", url=site + "/second").startswith("title: Second\n")
    (driver,) = set(drivers(bd)) - before
    assert len(group(driver)) > 1, "chromedriver leads a group with its Chromium processes"
    begun = time.monotonic()
    answer = call(bd, agent, "browser_run_js", expression="while (true) {}")
    assert answer == (f"error: the browser did not answer within {CALL_LIMIT:g} s (a script that never ends?): "
                      "it was closed, and the next browser call starts a new one")
    assert time.monotonic() - begun < CALL_LIMIT + 10
    wait_until(lambda: not group(driver), "the wedged browser's processes end", timeout=10)
    assert call(bd, agent, "browser_navigate", url=site + "/second").startswith("title: Second\n")
    assert len(set(drivers(bd)) - before - {driver}) == 1
    assert call(bd, agent, "browser_close") == "browser closed"
