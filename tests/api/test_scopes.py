"""Route × scope: every route of the app (the Flask url_map, dashboard and sockets included)
has an entry in agentd/api/scopes.py, and a key holding one scope reaches exactly the
routes that need it (403 naming the scope elsewhere). The views are replaced by stubs so
only the auth hooks run; the kernel, its keys and the hooks are real. In process."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Iterator

import pytest
from flask import Flask

from agentd.api import create_app, dashauth
from agentd.api.scopes import ENDPOINT_SCOPES, PUBLIC
from agentd.apikeys import SCOPES
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

ADMIN = "scope-admin"
LOCAL = {"REMOTE_ADDR": "127.0.0.1"}
STUB_STATUS = 299


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    tmp: Path = tmp_path_factory.mktemp("scopes")
    data = {"api_key": ADMIN, "api": {"rate_limit_per_second": 100000, "rate_limit_burst": 100000}}
    kernel = Kernel.open(parse_config(with_test_db(data, tmp), tmp))
    app = create_app(kernel)
    yield app
    kernel.close()


def _routes(app: Flask) -> list[tuple[str, str, str]]:
    """(endpoint, method, rule) of every route."""
    return sorted((r.endpoint, m, r.rule) for r in app.url_map.iter_rules()
                  for m in (r.methods or set()) - {"HEAD", "OPTIONS"})


def test_every_route_has_a_scope(app: Flask) -> None:
    missing = sorted({e for e, _, _ in _routes(app)} - set(ENDPOINT_SCOPES))
    assert missing == [], f"add these endpoints to agentd/api/scopes.py: {missing}"
    assert set(ENDPOINT_SCOPES.values()) <= set(SCOPES) | {PUBLIC}


def test_a_new_route_without_a_scope_fails_closed(app: Flask) -> None:
    from agentd.api.scopes import scope_of

    assert scope_of("nobody.new_route") == "admin"


def _url(rule: str, agent_id: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1).split(":")[-1]
        return agent_id if name == "agent_id" else {"decision": "approve", "filename": "app.css"}.get(name, "x")
    return re.sub(r"<([^>]+)>", value, rule)


def test_route_by_scope(app: Flask) -> None:
    kernel = app.extensions["agentd.kernel"]
    agent_id = kernel.agents.spawn('name = "scoped-target"\n').id
    tokens = {scope: kernel.keys.create({"name": f"only-{scope}", "scopes": [scope]})["key"] for scope in SCOPES}
    client = app.test_client()
    client.get("/login", environ_base=LOCAL)  # a dashboard session, for the forms' CSRF token
    cookie = client.get_cookie(dashauth.COOKIE)
    sid = app.extensions["agentd.sessions"].read(cookie.value)["sid"]
    csrf = app.extensions["agentd.sessions"].csrf_for(sid)
    saved = dict(app.view_functions)
    for endpoint in saved:
        app.view_functions[endpoint] = lambda **_: ("", STUB_STATUS)
    try:
        failures = []
        for endpoint, method, rule in _routes(app):
            needed = ENDPOINT_SCOPES[endpoint]
            url = _url(rule, agent_id)
            for scope, token in tokens.items():
                headers = {"Authorization": f"Bearer {token}", dashauth.CSRF_HEADER: csrf}
                if endpoint.startswith("sockets."):  # (a WebSocket route matches only a handshake)
                    headers.update({"Upgrade": "websocket", "Connection": "Upgrade"})
                data = {dashauth.CSRF_FIELD: csrf} if method == "POST" and not rule.startswith(("/api", "/v1")) \
                    else None
                r = client.open(url, method=method, headers=headers, data=data, environ_base=LOCAL)
                allowed = needed is None or scope == "admin" or scope == needed
                if allowed and r.status_code != STUB_STATUS:
                    failures.append(f"{method} {rule} with {scope}: {r.status_code} {r.get_data(as_text=True)[:120]}")
                if not allowed:
                    body = html.unescape(r.get_data(as_text=True))
                    if r.status_code != 403 or f"missing scope '{needed}'" not in body:
                        failures.append(f"{method} {rule} with {scope}: {r.status_code} {body[-300:]}")
        assert failures == []
    finally:
        app.view_functions.update(saved)
