"""The browser's proxy over real sockets: tunnels and plain requests reach only what the check allows."""

from __future__ import annotations

import socket
import threading

import pytest

from agentd.agents.tools.base import ToolError
from agentd.agents.tools.browser_proxy import BrowserProxy
from support import wait_until


@pytest.fixture()
def upstream():
    """A TCP server on loopback that records what it receives and answers one HTTP response."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(65536)
                received.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], received
    server.close()


def refuse_localhost(url: str) -> None:
    if "//localhost" in url:
        raise ToolError("refusing to fetch localhost: it resolves to the private or loopback address 127.0.0.1")


def ask(proxy: BrowserProxy, request: bytes) -> bytes:
    port = int(proxy.address.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.fixture()
def proxy():
    server = BrowserProxy(refuse_localhost, ["127.0.0.1"])
    yield server
    server.close()


def test_a_plain_request_goes_to_its_server_in_origin_form_one_per_connection(proxy, upstream) -> None:
    port, received = upstream
    answer = ask(proxy, f"GET http://127.0.0.1:{port}/page?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        "Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n".encode())
    assert answer.endswith(b"\r\n\r\nok")
    assert received == [f"GET /page?q=1 HTTP/1.1\r\nConnection: close\r\nHost: 127.0.0.1:{port}\r\n"
                        "Accept: */*\r\n\r\n".encode()]
    body = "a=1\r\nconnection: kept, it is the body"
    ask(proxy, f"POST http://127.0.0.1:{port}/form HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: keep-alive\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    assert received[1] == (f"POST /form HTTP/1.1\r\nConnection: close\r\nHost: 127.0.0.1:{port}\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n{body}").encode()


def test_a_tunnel_carries_bytes_to_an_allowed_host(proxy, upstream) -> None:
    port, received = upstream
    answer = ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nhello".encode())
    assert answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\n")
    assert received == [b"hello"]


def test_refused_targets_are_never_connected(proxy, upstream) -> None:
    port, received = upstream
    for request in (f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n",
                    f"GET http://localhost:{port}/secret HTTP/1.1\r\nHost: localhost\r\n\r\n"):
        answer = ask(proxy, request.encode())
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
        assert answer.endswith(b"\r\n\r\nrefusing to fetch localhost: it resolves to the private or loopback "
                               b"address 127.0.0.1\n")
    assert received == []


def test_requests_that_are_not_proxy_requests(proxy) -> None:
    assert ask(proxy, b"nonsense\r\n\r\n").endswith(b"\r\n\r\nmalformed request\n")
    assert ask(proxy, b"GET /relative HTTP/1.1\r\n\r\n").endswith(
        b"\r\n\r\nnot a proxy request: GET /relative HTTP/1.1\n")
    assert ask(proxy, b"GET ftp://127.0.0.1/x HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert ask(proxy, b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n").endswith(
        b"\r\n\r\nbad port in 127.0.0.1:99999\n")


def test_the_connected_address_is_checked_again(upstream) -> None:
    """A name checked as public that connects to a private address (DNS rebinding) is refused
    before anything is sent, as web_fetch refuses it."""
    port, received = upstream
    server = BrowserProxy(lambda url: None, [])
    try:
        answer = ask(server, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    finally:
        server.close()
    assert answer.endswith(b"\r\n\r\nrefusing to fetch 127.0.0.1: it resolves to the private or loopback "
                           b"address 127.0.0.1 (add the host to [tools] fetch_allow_hosts to permit it)\n")
    wait_until(lambda: received, "the server sees the connection close")
    assert received == [b""]


def test_bytes_sent_later_cross_the_tunnel_both_ways(proxy, upstream) -> None:
    port, received = upstream
    with socket.create_connection(("127.0.0.1", int(proxy.address.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(65536) == b"HTTP/1.1 200 Connection established\r\n\r\n"
        sock.sendall(b"later")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert received == [b"later"]
    assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def test_a_request_head_in_pieces_is_read_whole(proxy, upstream) -> None:
    port, received = upstream
    with socket.create_connection(("127.0.0.1", int(proxy.address.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHo".encode())
        threading.Event().wait(0.2)  # the first piece arrives alone
        sock.sendall(f"st: 127.0.0.1:{port}\r\n\r\n".encode())
        while sock.recv(65536):
            pass
    assert received == [f"GET /x HTTP/1.1\r\nConnection: close\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()]


def test_status_lines_say_what_went_wrong(proxy) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    answer = ask(proxy, f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n")
    assert f"\r\n\r\ncannot connect to 127.0.0.1:{port}: ".encode() in answer
    for request in (b"nonsense\r\n\r\n", b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
                    b"GET /relative HTTP/1.1\r\n\r\n"):
        assert ask(proxy, request).startswith(b"HTTP/1.1 400 Bad Request\r\n")


def test_allowed_hosts_are_matched_whatever_their_case(upstream) -> None:
    """A host in fetch_allow_hosts, written in any case, may connect to a loopback address."""
    port, received = upstream
    server = BrowserProxy(lambda url: None, ["LocalHost"])
    try:
        answer = ask(server, f"CONNECT LOCALHOST:{port} HTTP/1.1\r\n\r\nhi".encode())
    finally:
        server.close()
    assert answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\n")
    assert received == [b"hi"]


def test_a_refused_connection_is_logged_with_its_reason(proxy, upstream, caplog) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="agentd.tools.browser")
    ask(proxy, f"CONNECT localhost:{upstream[0]} HTTP/1.1\r\n\r\n".encode())
    assert [r.getMessage() for r in caplog.records if r.name == "agentd.tools.browser"] == [
        "browser connection refused: refusing to fetch localhost: it resolves to the private or loopback "
        "address 127.0.0.1"]
