"""Reading a provider answer's status line and headers for less CPU than http.client does.

http.client hands the header lines of every answer to the `email` package's feed parser,
a general MIME parser: about 30 µs of a model call's CPU (some 5 % of a `/v1` message
end to end), for the handful of `Name: value` lines a provider sends. `HeadResponse`
parses such lines directly into the same `HTTPMessage` the feed parser would build (one
`set_raw` per line, as the parser itself stores them under the compat32 policy), and
hands anything else (folded lines, a line without a colon, a multipart or message body
type) to the stock parser, so the result never differs from http.client's.
"""

from __future__ import annotations

import email.parser
import http.client
import re

# A header line the feed parser stores as is: a name of printable characters without a
# colon or space, a colon, a value without a line break inside it.
_PLAIN_LINE = re.compile(rb"[!-9;-~]+:[^\r\n]*\r?\n")
_END = (b"\r\n", b"\n", b"")
# Body types for which the feed parser goes on to parse the (absent) body and may add
# defects or a payload: left to it.
_PARSED_BODIES = ("multipart", "message")


def parse_head(lines: list[bytes]) -> http.client.HTTPMessage:
    """The header lines of an answer (as `http.client` reads them, the blank line last) as
    the `HTTPMessage` that `http.client.parse_headers` makes of them."""
    message = http.client.HTTPMessage()
    for line in lines:
        if line in _END:
            break
        if _PLAIN_LINE.fullmatch(line) is None:
            return _stock(lines)
        name, value = line.decode("iso-8859-1").split(":", 1)
        message.set_raw(name, value.lstrip(" \t").rstrip("\r\n"))
    content_type = message.get("content-type")
    if content_type and content_type.split("/", 1)[0].strip().lower() in _PARSED_BODIES:
        return _stock(lines)
    message.set_payload("")  # (the feed parser's: the empty body after the blank line)
    return message


def _stock(lines: list[bytes]) -> http.client.HTTPMessage:
    text = b"".join(lines).decode("iso-8859-1")
    return email.parser.Parser(_class=http.client.HTTPMessage).parsestr(text)


class HeadResponse(http.client.HTTPResponse):
    """`http.client.HTTPResponse` with the headers read by `parse_head`; everything else,
    the body included, is the stock class's."""

    def begin(self) -> None:
        # The stock `begin`, step for step, but for the header parser it calls.
        if self.headers is not None:  # (already begun)
            return
        while True:  # an interim 100 Continue answer is skipped, headers and all
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            http.client._read_headers(self.fp)
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = parse_head(http.client._read_headers(self.fp))

        encoding = self.headers.get("transfer-encoding")
        self.chunked = bool(encoding) and encoding.lower() == "chunked"
        if self.chunked:
            self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:  # a nonsensical negative length is ignored
                    self.length = None
        if (status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or 100 <= status < 200
                or self._method == "HEAD"):
            self.length = 0  # no body, whatever the headers say
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True  # the body ends when the connection does
