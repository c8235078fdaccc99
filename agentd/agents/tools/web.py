"""web_fetch and web_search, with an SSRF guard on every hop."""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, urljoin, urlsplit

from agentd.agents.tools.base import ToolContext, ToolError, tool

# requests and urllib3 are imported where a tool runs: the tool registry is loaded at start
# and most daemons never fetch a page (the daemon's idle memory stays ~6 MB smaller).
if TYPE_CHECKING:
    import requests

MAX_REDIRECTS = 5
SAFE_METHODS = {"GET", "HEAD"}
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
# Credentials meant for one host must not follow a redirect to another.
_HOST_BOUND_HEADERS = {"authorization", "cookie", "proxy-authorization"}


def blocked_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True for anything that is not a public unicast address (loopback, private, CGNAT, ...)."""
    # Not global covers private, loopback, link-local, unspecified and CGNAT (100.64.0.0/10);
    # multicast and some reserved IPv6 ranges count as "global" and are named explicitly.
    # tests/agents/tools/test_tool_web.py checks every category, so a change in Python's tables shows.
    return address.is_multicast or address.is_reserved or not address.is_global


def refusal(host: str, address: Any) -> ToolError:
    return ToolError(f"refusing to fetch {host}: it resolves to the private or loopback address "
                     f"{address} (add the host to [tools] fetch_allow_hosts to permit it)")


def _host_allowed_by_caps(ctx: ToolContext, host: str) -> None:
    grants = ctx.capabilities.get("network") or []
    if grants is True or "*" in grants:
        return
    if host not in grants:
        raise ToolError(f"host {host} is not in this agent's network allowlist ({', '.join(grants) or 'empty'})")


def check_url(ctx: ToolContext, url: str) -> None:
    """Only http(s); private, loopback and link-local targets need an explicit daemon allowance."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ToolError(f"only http and https URLs can be fetched, not {parts.scheme or 'a bare path'!r}")
    host = (parts.hostname or "").lower()
    if not host:
        raise ToolError(f"URL has no host: {url}")
    _host_allowed_by_caps(ctx, host)
    if host in ctx.tools_config.fetch_allow_hosts:
        return
    try:
        infos = socket.getaddrinfo(host, None)  # every address the name has; the port is irrelevant
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"cannot resolve host {host}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if blocked_address(address):
            raise refusal(host, address)


def guarded_session(allow_hosts: list[str]) -> requests.Session:
    """A session whose direct connections re-check the peer address once connected.

    check_url resolves the name before the request, but the HTTP client resolves it again;
    a DNS answer that changes in between (rebinding) would otherwise reach a private address.
    Checking the connected socket, before anything is sent, closes that gap. Connections
    through an environment proxy use requests' own proxy manager and are not affected.
    """
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    allowed = {h.lower() for h in allow_hosts}

    def check_peer(host: str, sock: socket.socket) -> None:
        if host.lower().strip("[]") in allowed:
            return
        address = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
        if blocked_address(address):
            sock.close()
            raise refusal(host, address)

    class Conn(HTTPConnection):
        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            check_peer(self.host, sock)
            return sock

    class TLSConn(HTTPSConnection):
        def _new_conn(self) -> socket.socket:
            sock = super()._new_conn()
            check_peer(self.host, sock)
            return sock

    class Pool(HTTPConnectionPool):
        ConnectionCls = Conn

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = TLSConn

    adapter = HTTPAdapter()
    adapter.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": TLSPool}
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _read_capped(response: requests.Response, limit: int) -> tuple[bytes, bool]:
    body = bytearray()
    for chunk in response.iter_content(chunk_size=65536):
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False


@tool("web_fetch", "Fetch a URL over HTTP(S) and return the status and body text.",
      {"url": {"type": "string", "description": "http or https URL"},
       "method": {"type": "string", "enum": METHODS, "description": "HTTP method (default GET)"},
       "headers": {"type": "object", "description": "Extra request headers"},
       "body": {"type": "string", "description": "Request body for POST/PUT/PATCH"}},
      ("url",), read_only=True, capability="network")
def web_fetch(ctx: ToolContext, args: dict[str, Any]) -> str:
    method = (args.get("method") or "GET").upper()
    if ctx.capabilities.get("read_only_mode") and method not in SAFE_METHODS:
        raise ToolError(f"{method} is not allowed in Observe mode (only GET and HEAD)")
    headers = {str(k): str(v) for k, v in (args.get("headers") or {}).items()}
    cfg = ctx.tools_config
    url = args["url"]
    import requests

    with guarded_session(cfg.fetch_allow_hosts) as session:
        for _ in range(MAX_REDIRECTS + 1):
            check_url(ctx, url)
            try:
                response = session.request(method, url, headers=headers, data=args.get("body"), stream=True,
                                           allow_redirects=False, timeout=cfg.fetch_timeout_secs)
            except requests.Timeout:
                raise ToolError(f"no answer from {url} within {cfg.fetch_timeout_secs:g}s") from None
            except requests.RequestException as exc:
                raise ToolError(f"fetching {url} failed: {type(exc).__name__}") from None
            with response:
                if response.is_redirect and "Location" in response.headers:
                    # Each hop is checked again: a public URL may redirect to a private one.
                    target = urljoin(url, response.headers["Location"])
                    if urlsplit(target).hostname != urlsplit(url).hostname:
                        headers = {k: v for k, v in headers.items() if k.lower() not in _HOST_BOUND_HEADERS}
                    url = target
                    if response.status_code in (301, 302, 303) and method != "HEAD":
                        method, args = "GET", {**args, "body": None}
                    continue
                body, cut = _read_capped(response, cfg.fetch_max_bytes)
                try:
                    text = body.decode(response.encoding or "utf-8", errors="replace")
                except LookupError:  # the server named a charset Python does not know
                    text = body.decode("utf-8", errors="replace")
                note = f"\n[truncated at {cfg.fetch_max_bytes} bytes]" if cut else ""
                return f"HTTP {response.status_code}\n{text}{note}"
    raise ToolError(f"too many redirects (more than {MAX_REDIRECTS})")


@tool("web_search", "Search the web; returns titles, URLs and snippets.",
      {"query": {"type": "string", "description": "What to search for"},
       "max_results": {"type": "integer", "description": "How many results (default 5)"}},
      ("query",), read_only=True, capability="network")
def web_search(ctx: ToolContext, args: dict[str, Any]) -> str:
    cfg = ctx.tools_config
    if not cfg.search_url:
        raise ToolError("web search is not configured: set [tools] search_url in config.toml "
                        "(a SearXNG-style JSON endpoint)")
    url = cfg.search_url.replace("{query}", quote_plus(args["query"]))
    import requests

    try:
        response = requests.get(url, timeout=cfg.fetch_timeout_secs, headers={"Accept": "application/json"})
        response.raise_for_status()
        results = response.json().get("results") or []
    except (requests.RequestException, ValueError, AttributeError) as exc:
        raise ToolError(f"the search backend failed: {type(exc).__name__}") from None
    if not isinstance(results, list):
        raise ToolError("the search backend answered an unexpected shape ('results' is not a list)")
    limit = max(1, min(int(args.get("max_results") or 5), 20))
    lines = []
    for i, item in enumerate(results[:limit], 1):
        if isinstance(item, dict):
            lines.append(f"{i}. {item.get('title', '')}\n   {item.get('url', '')}\n   {item.get('content', '')}")
    return "\n".join(lines) if lines else f"no results for {json.dumps(args['query'])}"
