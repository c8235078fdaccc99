"""answer_head.py: a provider answer's head parsed as http.client parses it, for less CPU.

Every case is compared with the stock parser and the stock `HTTPResponse`, field by field:
the fast path must never give a different answer, only a cheaper one.
"""

from __future__ import annotations

import email.errors
import http.client
import io

import pytest

from agentd.llm.drivers import answer_head
from agentd.llm.drivers.answer_head import HeadResponse, parse_head


def _lines(head: bytes) -> list[bytes]:
    return http.client._read_headers(io.BytesIO(head))


def _stock(head: bytes) -> http.client.HTTPMessage:
    return http.client.parse_headers(io.BytesIO(head))


FAST_HEADS = [
    b"Content-Type: application/json\r\nContent-Length: 12\r\n\r\n",
    b"content-type:application/json\r\nX-Empty:\r\nX-Tab:\t tabbed \t\r\n\r\n",
    b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nVia: x\r\n\r\n",  # repeated names, in order
    b"X-Latin: caf\xe9\r\nX-Colons: a:b:c\r\n\r\n",
    b"X-Vt: \x0bv\x0c\r\nX-Edge: Xylophone FOX\r\n\r\n",  # only spaces and tabs are stripped, at the start
    b"Bare-LF: yes\nOther: 2\n\n",
    b"\r\n",  # no headers at all
    b"",  # the connection closed before the blank line
    b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n",
]
STOCK_HEADS = [  # (left to the stock parser)
    b"Folded: one\r\n  two\r\nAfter: 3\r\n\r\n",  # a continuation line
    b"No colon here\r\nX-A: 1\r\n\r\n",
    b"From sender\r\nX-A: 1\r\n\r\n",
    b": empty name\r\n\r\n",
    b"Bad Name: 1\r\n\r\n",
    b"X-Cr: a\rb\r\n\r\n",  # a lone CR inside a value
    b"Content-Type: multipart/mixed; boundary=zz\r\n\r\n",
    b"Content-Type: message/rfc822\r\n\r\n",
    b"Content-Type:  Multipart/Related\r\n\r\n",
]
HEADS = FAST_HEADS + STOCK_HEADS


@pytest.mark.parametrize("head", HEADS)
def test_a_head_parses_to_what_the_stock_parser_makes_of_it(head: bytes) -> None:
    mine, stock = parse_head(_lines(head)), _stock(head)
    assert type(mine) is http.client.HTTPMessage
    assert mine.items() == stock.items()
    assert [type(d) for d in mine.defects] == [type(d) for d in stock.defects]
    assert type(mine.get_payload()) is type(stock.get_payload())
    assert mine.as_string() == stock.as_string()
    assert mine.is_multipart() == stock.is_multipart()


def test_plain_lines_take_the_fast_path_and_anything_else_the_stock_parser(monkeypatch) -> None:
    calls = []
    real = answer_head._stock
    monkeypatch.setattr(answer_head, "_stock", lambda lines: calls.append(lines) or real(lines))
    for head in FAST_HEADS:
        parse_head(_lines(head))
    assert calls == []
    for head in STOCK_HEADS:
        parse_head(_lines(head))
    assert len(calls) == len(STOCK_HEADS)


def test_values_are_stored_as_the_feed_parser_stores_them() -> None:
    message = parse_head(_lines(b"A:  x y \t\r\nB:\tz\r\nA: 2\r\n\r\n"))
    assert message.items() == [("A", "x y \t"), ("B", "z"), ("A", "2")]
    assert message.get_all("a") == ["x y \t", "2"]
    assert message.defects == []


class _Socket:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))


def _answers(raw: bytes, method: str = "POST") -> tuple[http.client.HTTPResponse, HeadResponse]:
    stock, mine = http.client.HTTPResponse(_Socket(raw), method=method), HeadResponse(_Socket(raw), method=method)
    stock.begin()
    mine.begin()
    return stock, mine


FIELDS = ("status", "code", "reason", "version", "chunked", "chunk_left", "length", "will_close")

ANSWERS = [
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\n{}{}", "POST"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", "POST"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nContent-Length: 9\r\n\r\n2\r\nhi\r\n0\r\n\r\n", "POST"),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", "POST"),
    (b"HTTP/1.1 200 OK\r\n\r\nno length, so until the end", "POST"),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "POST"),
    (b"HTTP/0.9 200 OK\r\nContent-Length: 2\r\n\r\nok", "POST"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "POST"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "GET"),
    (b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok", "POST"),
    (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok", "POST"),
    (b"HTTP/1.0 200 OK\r\nProxy-Connection: keep-alive\r\nContent-Length: 2\r\n\r\nok", "POST"),
    (b"HTTP/1.1 100 Continue\r\nX-Skip: 1\r\n\r\nHTTP/1.1 201 Created  \r\nContent-Length: 2\r\n\r\nok", "POST"),
    (b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n", "POST"),
    (b"HTTP/1.1 304 Not Modified\r\n\r\n", "GET"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\nbody", "POST"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nbody", "POST"),
    (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nbroke", "POST"),
    (b"HTTP/1.1 502 Bad Gateway\r\nFolded: a\r\n b\r\nContent-Length: 2\r\n\r\nno", "POST"),
]


@pytest.mark.parametrize("raw,method", ANSWERS)
def test_an_answer_begins_as_the_stock_response_begins_it(raw: bytes, method: str) -> None:
    stock, mine = _answers(raw, method)
    assert {f: getattr(mine, f) for f in FIELDS} == {f: getattr(stock, f) for f in FIELDS}
    assert mine.headers.items() == stock.headers.items()
    assert mine.msg is mine.headers
    assert mine.read() == stock.read()
    mine.begin()  # (a second call changes nothing)
    assert mine.status == stock.status


@pytest.mark.parametrize("raw,error", [
    (b"HTTP/2.0 200 OK\r\n\r\n", http.client.UnknownProtocol),
    (b"garbage\r\n\r\n", http.client.BadStatusLine),
    (b"", http.client.RemoteDisconnected),
    (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", http.client.HTTPException),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n", http.client.LineTooLong),
])
def test_a_broken_answer_fails_as_the_stock_response_fails(raw: bytes, error: type) -> None:
    with pytest.raises(error) as stock_error:
        http.client.HTTPResponse(_Socket(raw), method="POST").begin()
    with pytest.raises(error) as my_error:
        HeadResponse(_Socket(raw), method="POST").begin()
    assert type(my_error.value) is type(stock_error.value)
    assert str(my_error.value) == str(stock_error.value)


def test_provider_connections_use_it() -> None:
    from agentd.llm.drivers import guard

    assert guard._TrackedHTTPConnection.response_class is HeadResponse
    assert guard._TrackedHTTPSConnection.response_class is HeadResponse


def test_email_errors_module_is_what_defects_come_from() -> None:
    # (a guard on the comparison above: the stock parser does record defects for a bad head)
    assert any(isinstance(d, email.errors.MessageDefect) for d in _stock(b"No colon here\r\n\r\n").defects)
