"""Cross-site and foreign-Host requests refused before their body is read.

The request guard (agentd/api/guard.py) runs in the app, and waitress calls the app
only once the whole body has arrived: a page could still make the daemon read (and
buffer) a body it is going to refuse, or hold a connection open by never sending the
body it announced; with `Expect: 100-continue` waitress even invited the body. Here the
same policies (agentd/server/webguard.py) judge a request as soon as its headers are parsed,
while its body is still on the way: a refused one is answered at once, the same status
and body as the guard's, and its connection is closed without reading the rest.

A request that arrived whole (no body, or headers and body in one read) is left to the
app's guard, which answers it with the app's full set of headers. Behind trusted
proxies nothing is judged here: the forwarded Host and scheme are the app's to apply
(agentd/server/proxy.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from functools import partial
from typing import Any, Callable

from waitress.parser import HTTPRequestParser
from waitress.task import ErrorTask
from waitress.utilities import Error

from agentd.server.websocket import servers_of
from agentd.config import Config
from agentd.server.webguard import CROSS_SITE_MESSAGE, HOST_MESSAGE, HostPolicy, OriginPolicy, allowed_origins

log = logging.getLogger("agentd.http")

Check = Callable[[HTTPRequestParser], "tuple[int, str] | None"]


class EarlyRefusal(Error):
    """The guard's refusal, answered by waitress before the app is called."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = "Forbidden" if code == 403 else "Bad Request"

    def message(self) -> str:
        return self.body

    def to_response(self, ident: str | None = None) -> tuple[str, list[tuple[str, str]], bytes]:
        return json_error(self.code, self.reason, self.message())


def json_error(code: int, reason: str, message: str) -> tuple[str, list[tuple[str, str]], bytes]:
    """Status line, headers and body of an error waitress answers itself, in the API's JSON shape."""
    body = json.dumps({"error": message}).encode("utf-8")
    headers = [("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"),
               ("Cache-Control", "no-store"), ("X-Request-Id", uuid.uuid4().hex)]
    return f"{code} {reason}", headers, body


class JsonErrorTask(ErrorTask):
    """waitress's own errors (a malformed request line or Content-Length, headers too large,
    a body past its limit) as `{"error": ...}` JSON, like every other error of the API."""

    def execute(self) -> None:
        error = self.request.error
        message = error.message() if isinstance(error, EarlyRefusal) else f"{error.reason.lower()}: {error.body}"
        status, headers, body = json_error(error.code, error.reason, message)
        self.status = status
        self.response_headers.extend(headers)
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class GuardedParser(HTTPRequestParser):
    """waitress's request parser, asking `check` once the headers are in and a body is due."""

    def __init__(self, adj: Any, check: Check) -> None:
        super().__init__(adj)
        self._check = check

    def received(self, data: bytes) -> int:
        headers_were_in = self.headers_finished
        consumed = super().received(data)
        if headers_were_in or not self.headers_finished or self.completed or self.error is not None:
            return consumed
        refusal = self._check(self)
        if refusal is None:
            return consumed
        log.info("refused before its body: %s %s (%s)", self.command, self.path, refusal[1])
        self.error = EarlyRefusal(*refusal)
        self.completed = True
        self.expect_continue = False  # no "100 Continue" for a body nobody will read
        # The rest of this read is the refused body: consumed, never parsed as a request.
        return len(data)


def request_check(config: Config) -> Check:
    """The guard's decision from the parsed headers alone (no forwarding headers applied)."""
    hosts = HostPolicy(config.host, config.api.allowed_hosts)
    origins = OriginPolicy(config.port, allowed_origins(config))

    def check(parser: HTTPRequestParser) -> tuple[int, str] | None:
        headers = parser.headers
        host = headers.get("HOST")
        if not hosts.allows(host):
            return 400, HOST_MESSAGE
        if origins.refuses(parser.command, headers.get("ORIGIN"), headers.get("SEC_FETCH_SITE"),
                           f"{parser.url_scheme}://{host or ''}", headers.get("UPGRADE")):
            return 403, CROSS_SITE_MESSAGE
        return None

    return check


def install(server: Any, config: Config) -> None:
    """Give `server`'s connections the guarded parser (not behind trusted proxies) and JSON
    errors (call after websocket.install)."""
    members: dict[str, Any] = {"error_task_class": JsonErrorTask}
    if not config.api.trusted_proxies:
        check = request_check(config)
        members["parser_class"] = property(lambda self: partial(GuardedParser, check=check))
    for srv in servers_of(server):
        base = srv.channel_class
        srv.channel_class = type("GuardedChannel", (base,), {
            "__doc__": f"{base.__name__} whose requests are judged once their headers are in.", **members})
