"""web_fetch's SSRF guard and body handling, with near misses and exact messages.

Every address category the guard must refuse is listed, with public addresses next to them;
names are resolved through a scripted getaddrinfo so the test does not depend on DNS.
"""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
from typing import Any

import pytest

from agentd.agents.tools import ToolContext, ToolError
from agentd.agents.tools.web import blocked_address
from tests.agents.tools.test_tools import make_ctx, rebind, run, site  # noqa: F401  (site is a fixture)

REFUSED = ["127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "100.64.0.1",
           "0.0.0.0", "240.0.0.1", "224.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fc00::1",
           "ff02::1", "::2", "::ffff:127.0.0.1", "::ffff:10.0.0.1"]
PUBLIC = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700::1111", "2a00:1450:4001:80b::200e"]


@pytest.mark.parametrize("address", REFUSED)
def test_every_non_public_category_is_blocked(address) -> None:
    assert blocked_address(ipaddress.ip_address(address)), f"BUG: SSRF guard lets {address} through"


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_not_blocked(address) -> None:
    assert not blocked_address(ipaddress.ip_address(address)), f"BUG: public address {address} refused"


def refusal(ctx: ToolContext, **args: Any) -> str:
    with pytest.raises(ToolError) as caught:
        run(ctx, "web_fetch", **args)
    return str(caught.value)


def resolving(monkeypatch, answers: dict[str, str]) -> None:
    """getaddrinfo answers `answers[host]` for the scripted names, the real thing otherwise."""
    real = socket.getaddrinfo

    def fake(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        if answers[host] == "":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        family = socket.AF_INET6 if ":" in answers[host] else socket.AF_INET
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (answers[host], port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def test_refusal_messages_are_exact(tmp_path, monkeypatch) -> None:
    ctx = make_ctx(tmp_path, network=["*"])
    resolving(monkeypatch, {"gone.example": "", "inner.example": "10.9.8.7", "scoped.example": "fe80::1%lo"})
    assert refusal(ctx, url="ftp://x/") == "only http and https URLs can be fetched, not 'ftp'"
    assert refusal(ctx, url="/just/a/path") == "only http and https URLs can be fetched, not 'a bare path'"
    assert refusal(ctx, url="http:///nohost") == "URL has no host: http:///nohost"
    assert refusal(ctx, url="http://gone.example/") == \
        "cannot resolve host gone.example: [Errno -2] Name or service not known"
    assert refusal(ctx, url="https://inner.example/") == (
        "refusing to fetch inner.example: it resolves to the private or loopback address 10.9.8.7 "
        "(add the host to [tools] fetch_allow_hosts to permit it)"), "BUG: https URLs skip the SSRF guard"
    assert "private or loopback address fe80::1 " in refusal(ctx, url="http://scoped.example/"), \
        "BUG: a scoped IPv6 address (fe80::1%lo) is not parsed by the SSRF guard"


def test_network_allowlist_messages_and_grants(tmp_path, site) -> None:  # noqa: F811
    empty = make_ctx(tmp_path, network=[])
    assert refusal(empty, url=f"{site}/page") == "host 127.0.0.1 is not in this agent's network allowlist (empty)"
    two = make_ctx(tmp_path, network=["a.example", "b.example"])
    assert refusal(two, url=f"{site}/page") == \
        "host 127.0.0.1 is not in this agent's network allowlist (a.example, b.example)"
    for grants in (True, ["127.0.0.1"]):
        ctx = make_ctx(tmp_path, network=grants)
        ctx.tools_config.fetch_allow_hosts = ["127.0.0.1"]
        assert run(ctx, "web_fetch", url=f"{site}/page") == "HTTP 200\npage body", \
            f"BUG: network grant {grants!r} does not allow its host"


def test_https_connections_recheck_the_connected_address(tmp_path, site, monkeypatch) -> None:  # noqa: F811
    """Rebinding over https: the peer is checked on connect, before any TLS handshake."""
    port = int(site.rsplit(":", 1)[1])
    rebind(monkeypatch, port)
    ctx = make_ctx(tmp_path, network=["*"])
    assert refusal(ctx, url=f"https://rebind.example:{port}/page") == (
        "refusing to fetch rebind.example: it resolves to the private or loopback address 127.0.0.1 "
        "(add the host to [tools] fetch_allow_hosts to permit it)"), \
        "BUG: https connections are not checked against the address actually connected"


class _Sized(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        size = int(self.path.strip("/"))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()   # no Content-Length: the body arrives in several reads
        for start in range(0, size, 50_000):
            self.wfile.write(bytes(ord("a") + (start // 50_000) % 26 for _ in range(min(50_000, size - start))))
            self.wfile.flush()


@pytest.fixture()
def sized(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sized)
    server.protocol_version = "HTTP/1.0"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ctx = make_ctx(tmp_path, network=["*"])
    ctx.tools_config.fetch_allow_hosts = ["127.0.0.1"]
    yield ctx, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_body_cap_is_inclusive_and_keeps_the_first_bytes(sized) -> None:
    ctx, base = sized
    ctx.tools_config.fetch_max_bytes = 120_000
    whole = run(ctx, "web_fetch", url=f"{base}/120000")
    assert whole == "HTTP 200\n" + "a" * 50_000 + "b" * 50_000 + "c" * 20_000, \
        "BUG: a body of exactly the cap is cut or reassembled wrongly"
    cut = run(ctx, "web_fetch", url=f"{base}/150000")
    assert cut == "HTTP 200\n" + "a" * 50_000 + "b" * 50_000 + "c" * 20_000 + "\n[truncated at 120000 bytes]"
