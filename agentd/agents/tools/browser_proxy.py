"""The forward proxy every connection of an agent's browser goes through.

Checking only the page the browser ends up on would let a page reach private addresses
anyway: its redirects, images, frames and scripts connect before any check could see them.
Chromium sends everything here instead (`--proxy-server`, loopback included), and each
connection is made only to a target web_fetch could fetch, by the same rules: the agent's
network allowlist, and no private or loopback address unless `[tools] fetch_allow_hosts`
names the host, checked again on the connected socket.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import socketserver
import threading
from typing import Callable
from urllib.parse import urlsplit

from agentd.agents.tools.base import ToolError
from agentd.agents.tools.web import blocked_address, refusal

log = logging.getLogger("agentd.tools.browser")
HEAD_MAX = 65_536
CONNECT_TIMEOUT = 15.0

# (URL) -> None, or raises ToolError saying why the browser may not go there.
Check = Callable[[str], None]


def _read_head(sock: socket.socket) -> bytes:
    """The request line and headers (up to the blank line), and whatever body bytes came with them."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > HEAD_MAX:
            break
    return data


def _answer(sock: socket.socket, status: str, text: str) -> None:
    body = (text + "\n").encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.sendall(head + body)
    except OSError:
        pass


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(socketserver.BaseRequestHandler):
    server: "BrowserProxy"

    def handle(self) -> None:
        client: socket.socket = self.request
        head = _read_head(client)
        line, _, rest = head.partition(b"\r\n")
        try:
            method, target, version = line.decode("latin-1").split(" ")
        except ValueError:
            _answer(client, "400 Bad Request", "malformed request")
            return
        tunnel = method == "CONNECT"
        url = f"https://{target}/" if tunnel else target
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            _answer(client, "400 Bad Request", f"bad port in {target}")
            return
        if not parts.hostname or (not tunnel and parts.scheme != "http"):
            _answer(client, "400 Bad Request", f"not a proxy request: {line.decode('latin-1')[:200]}")
            return
        try:
            self.server.check(url)
            upstream = self._connect(parts.hostname, port)
        except ToolError as exc:
            log.info("browser connection refused: %s", exc)
            _answer(client, "403 Forbidden", str(exc))
            return
        except OSError as exc:
            _answer(client, "502 Bad Gateway", f"cannot connect to {parts.hostname}:{port}: {exc}")
            return
        with upstream:
            if tunnel:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = head[head.index(b"\r\n\r\n") + 4:] if b"\r\n\r\n" in head else b""
            else:
                # Origin form for the server; one request per connection, so every request
                # Chromium sends to another host comes back here to be checked.
                path = parts.path or "/"
                path += f"?{parts.query}" if parts.query else ""
                fields, _, body = rest.partition(b"\r\n\r\n")
                headers = [h + b"\r\n" for h in fields.split(b"\r\n") if h and not h.lower().startswith(
                    (b"proxy-connection:", b"connection:", b"keep-alive:"))]
                first = (f"{method} {path} {version}\r\nConnection: close\r\n".encode() + b"".join(headers)
                         + b"\r\n" + body)
            if first:
                upstream.sendall(first)
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join()

    def _connect(self, host: str, port: int) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        sock.settimeout(None)
        if host.lower() not in self.server.allow_hosts:
            # The name may resolve differently now than when it was checked (DNS rebinding).
            address = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
            if blocked_address(address):
                sock.close()
                raise refusal(host, address)
        return sock


class BrowserProxy(socketserver.ThreadingTCPServer):
    """One agent's proxy on a loopback port; `check` may be replaced while it runs."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, check: Check, allow_hosts: list[str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.check = check
        self.allow_hosts = {h.lower() for h in allow_hosts}
        threading.Thread(target=self.serve_forever, args=(0.5,), daemon=True, name="browser-proxy").start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
