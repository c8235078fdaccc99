"""agentd/api/__init__.py exactly: what `create_app` configures (body cap, key order, the
kernel, pool stats and the start gate's limiter, asset folders, every blueprint) and where
`_asset_dir` finds templates and static files. In process."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

import agentd
from agentd import api
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

REPO = Path(agentd.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    tmp = tmp_path_factory.mktemp("init")
    k = Kernel.open(parse_config(with_test_db({}, tmp), tmp))
    yield k
    k.close()


def test_asset_dir() -> None:
    assert api._asset_dir("templates") == str(REPO / "templates")
    assert api._asset_dir("static") == str(REPO / "static")
    # Not in the source tree: where an install puts it.
    assert api._asset_dir("nothing-here") == str(Path(sys.prefix) / "share" / "agentd" / "nothing-here")


def test_create_app_configuration(kernel: Kernel) -> None:
    app = api.create_app(kernel)
    assert app.name == "agentd"
    assert app.config["MAX_CONTENT_LENGTH"] == 16 * 1024 * 1024
    assert type(app.json).__name__ == "CachedEncoderProvider" and app.json.sort_keys is False
    assert app.json.sort_keys is False
    assert app.extensions["agentd.kernel"] is kernel
    assert app.extensions["agentd.pool_stats"]() == {}
    assert "agentd.limiter" not in app.extensions
    assert app.template_folder == str(REPO / "templates")
    assert app.static_folder == str(REPO / "static")
    assert app.static_url_path == "/static"
    assert list(app.blueprints) == ["system", "agents", "memory", "stream", "openai", "responses", "embeddings",
                                    "catalog", "workflows", "pages", "docs", "channels", "cluster", "mcp", "metrics",
                                    "triggers", "tasks", "tools", "uploads", "a2a", "skills", "cron", "keys", "webhooks",
                                    "sockets"]
    answer = app.test_client().get("/api/health", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert [(k, v) for k, v in answer.headers.items() if k.lower() == "x-agentd-daemon"] == [
        ("X-Agentd-Daemon", kernel.cluster.id)] and kernel.cluster.id


def test_create_app_with_pool_stats_and_limiter(kernel: Kernel) -> None:
    from agentd.api.ratelimit import GcraLimiter

    limiter = GcraLimiter(1.0, 3)   # the start gate's: this app must count on it, not on its own

    def stats() -> dict:
        return {"threads": 3}

    app = api.create_app(kernel, stats, limiter=limiter)
    assert app.extensions["agentd.pool_stats"] is stats
    assert app.extensions["agentd.limiter"] is limiter
    client = app.test_client()
    r = client.get("/api/health", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert r.status_code == 200
    r = client.get("/static/does-not-exist.css", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert r.status_code == 404


def test_url_builders_are_compiled_when_first_used(kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the app compiles none of the routes' URL builders (a large part of a start);
    each is compiled once, the first time it builds a URL, and builds what Werkzeug's would."""
    from flask import url_for
    from werkzeug.routing import Rule

    compiled: list[str] = []
    werkzeug_compile = Rule._compile_builder

    def counting(rule: Rule, append_unknown: bool = True):  # type: ignore[no-untyped-def]
        compiled.append(rule.endpoint)
        return werkzeug_compile(rule, append_unknown)

    monkeypatch.setattr(Rule, "_compile_builder", counting)
    app = api.create_app(kernel)
    assert len(list(app.url_map.iter_rules())) > 200
    assert compiled == [], "BUG: the app compiled URL builders while it was built"
    with app.test_request_context():
        assert url_for("pages.agent_page", agent_id="a b") == "/agents/a%20b"
        assert url_for("pages.agent_page", agent_id="c", tab="memory") == "/agents/c?tab=memory"
        assert url_for("static", filename="app.css") == "/static/app.css"
        assert url_for("pages.agent_page", agent_id="d") == "/agents/d"
    # url_for uses the builder that appends unknown arguments as the query: one per route used.
    assert sorted(compiled) == ["pages.agent_page", "static"], compiled
